"""A tiny embedding run's inputs: a random tiny encoder without dropout (so that the paths that
draw other dropout masks, several devices under pmap and gradient caching, can be compared
exactly), a pairs file of the fixture words, and the `:quick` config on them."""
import json
import os

import numpy as np

from experiments import embeddings as embeddings_experiment
from tests import finetuning_fixtures as ftx

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def write_pairs(path: str, rows: int = 32, seed: int = 0) -> str:
  """`rows` JSON lines; every other row with 1-3 hard negatives (a string or a list)."""
  rng = np.random.default_rng(seed)
  with open(path, "w", encoding="utf-8") as f:
    for i in range(rows):
      row = {"query": ftx.sentence(rng), "positive": ftx.sentence(rng)}
      if i % 4 == 1:
        row["negative"] = ftx.sentence(rng)
      elif i % 4 == 3:
        row["negative"] = [ftx.sentence(rng) for _ in range(1 + i % 3)]
      f.write(json.dumps(row) + "\n")
  return path


def quick_config(root: str, **overrides):
  """`experiments/embeddings.py:quick` on a tiny encoder and a 32-row pairs file in `root`."""
  os.makedirs(root, exist_ok=True)
  config = embeddings_experiment.get_config("quick")
  config.init_checkpoint = ftx.write_checkpoint(os.path.join(root, "ckpt"), **NO_DROPOUT)
  config.data.train_file = write_pairs(os.path.join(root, "pairs.jsonl"))
  config.max_seq_length, config.data.max_query_length = 16, 8
  for key, value in overrides.items():
    section, _, field = key.rpartition(".")
    (config[section] if section else config)[field] = value
  return config
