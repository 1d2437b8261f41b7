"""The fine-tuning framework: the task protocol (`task`) and the one fine-tuning loop
(`finetuning`)."""
