"""Names shared by the stages, and the JSON/JSON-lines files they write and read."""
import json
import os
from typing import Dict, List, Sequence

import numpy as np


SIDES = ("bert_jax", "transformers")
COLORS = {"bert_jax": "tab:blue", "transformers": "tab:orange"}
EVAL_BATCH = 64
DATA_DONE = "DONE.json"
DEFAULT_TEXT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "shared", "data", "text")
DEFAULT_GLUE_DIR = os.path.join(os.path.dirname(DEFAULT_TEXT_DIR), "glue")
Batch = Dict[str, np.ndarray]


def write_json(path: str, value) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(temporary, path)


def read_jsonl(path: str) -> List[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue   # a torn last line of a killed run
  return rows


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  os.replace(temporary, path)


def append_jsonl(path: str, row: dict) -> None:
  with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")
