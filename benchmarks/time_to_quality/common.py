"""Names shared by the stages, and the JSON/JSON-lines files they write and read."""
import json
import os
from typing import Dict, List, Sequence

import numpy as np


# The four sides, in the order they are run and shown: BERT's recipe (bert_jax, transformers'
# BertForPreTraining), then the modern recipe (bert_jax's ModernBERT family, transformers'
# ModernBertForMaskedLM).
SIDES = ("bert_jax", "transformers", "bert_jax_modern", "hf_modern")
RECIPE = {"bert_jax": "bert", "transformers": "bert", "bert_jax_modern": "modern",
          "hf_modern": "modern"}
FRAMEWORK = {"bert_jax": "jax", "transformers": "torch", "bert_jax_modern": "jax",
             "hf_modern": "torch"}
COLORS = {"bert_jax": "tab:blue", "transformers": "tab:orange", "bert_jax_modern": "tab:green",
          "hf_modern": "tab:red"}
# The held-out sets every side is scored on (the same instances and masks for all four, masked
# once at 15%; the package docstring says why both): the held-out documents as BERT's NSP pairs,
# and as contiguous text (the modern recipe's rows).
EVAL_SETS = ("pairs", "text")
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


def metric(row: dict, eval_set: str, name: str):
  """`name` (mlm_loss, mlm_accuracy, nsp_accuracy, ...) on `eval_set` of a curve row, or None.
  A curve written before the text set existed has the pairs set's metrics unprefixed."""
  if f"{eval_set}_{name}" in row:
    return row[f"{eval_set}_{name}"]
  return row.get(name) if eval_set == "pairs" else None


def prefixed(eval_set: str, metrics: Dict[str, float]) -> Dict[str, float]:
  return {f"{eval_set}_{k}": v for k, v in metrics.items()}


def recipe_settings(args, side: str) -> Dict[str, object]:
  """The flags of the side's recipe, kept in its summary.json (what the report describes)."""
  names = ["size", "batch", "seq", "warmup_proportion", "threads"]
  names += (["lr"] if RECIPE[side] == "bert" else
            ["modern_lr", "modern_masking", "local_attention", "batch_warmup_start",
             "batch_warmup_fraction", "decay_fraction"])
  return {name: getattr(args, name) for name in names if hasattr(args, name)}
