"""Storage: the filesystem layer (`filesystem`, local paths and `gs://` alike), pretrained
checkpoints in and out (`checkpoints`), and training checkpoints (`training_checkpoints`)."""
