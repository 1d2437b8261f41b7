"""Host-side data: vocabularies, the pre-training data builder and the tf.data input pipeline."""
