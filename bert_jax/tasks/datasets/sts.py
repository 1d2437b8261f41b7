r"""Semantic textual similarity of sentence vectors: `evaluate_sts` on GLUE's STS-B file.

The sentence pairs and gold scores (0-5) of a GLUE-format STS-B TSV (`dev.tsv`: header,
`sentence1`, `sentence2`, `score` columns; read and checked by `glue.read_tsv`, errors naming the
file and line); each sentence embedded by `encode_fn` (texts -> [N, D] float32), each pair scored
by the cosine similarity of its two vectors, and the scores correlated with the gold ones:
Spearman's rank correlation (sentence-transformers' `EmbeddingSimilarityEvaluator` headline,
"spearman_cosine") and Pearson's, as fractions in [-1, 1].
"""
from typing import Callable, Dict, List

import numpy as np
from scipy import stats

from bert_jax.tasks.datasets import glue

EncodeFn = Callable[[List[str]], np.ndarray]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Row-wise cosine similarity of [N, D] and [N, D] -> [N], in float64 (a zero vector: 0)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)                 # [N]
  return np.sum(a * b, axis=1) / np.maximum(norms, 1e-12)


def evaluate_sts(encode_fn: EncodeFn, path: str) -> Dict[str, float]:
  """{"spearman_cosine", "pearson_cosine", "pairs"} of the model `encode_fn` on the STS-B file
  `path` (see the module docstring)."""
  examples = glue.read_tsv(glue.spec_for("stsb"), path, labelled=True)
  if len(examples) < 2:
    raise ValueError(f"{path}: {len(examples)} sentence pair(s); a correlation needs 2 or more")
  first = np.asarray(encode_fn([e.text_a for e in examples]), np.float32)        # [N, D]
  second = np.asarray(encode_fn([e.text_b for e in examples]), np.float32)       # [N, D]
  similarity = cosine(first, second)                                             # [N]
  gold = np.asarray([float(e.label) for e in examples], np.float64)              # [N]
  return {"spearman_cosine": float(stats.spearmanr(similarity, gold).statistic),
          "pearson_cosine": float(stats.pearsonr(similarity, gold).statistic),
          "pairs": len(examples)}
