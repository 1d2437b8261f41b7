"""What runs on a finished model: prediction on raw input, serving exports, `best/` loaded back,
and the TPU compile report."""
