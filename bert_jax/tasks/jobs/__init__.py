"""Jobs that are not one fine-tuning task: pre-training, the feature-based tagger, the ablations."""
