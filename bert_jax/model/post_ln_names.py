"""transformers' tensor names of the post-LN encoder (`bert_jax.model.post_ln`), both ways.

Below its prefix (`bert.`, `roberta.`, none for the bare encoder class) transformers' BERT and
RoBERTa encoders name their tensors alike: `embeddings.word_embeddings.weight`,
`encoder.layer.3.attention.self.query.weight` ([out, in]), `pooler.dense.weight`. Here they are
this project's `bert/embeddings/word_embeddings/embedding`, `bert/encoder/layer_3/attention/
self/query/kernel` ([in, out]), `bert/pooler/dense/kernel`. Each family's conversion adds its
prefix and its heads.
"""
import re
from typing import Dict

import numpy as np

Flat = Dict[str, np.ndarray]


def flat_from_torch(state: Dict[str, np.ndarray]) -> Flat:
  """{key below the prefix: torch tensor} -> {`bert/...`: array} (buffers skipped)."""
  flat: Flat = {}
  for key, value in state.items():
    if key.endswith("position_ids") or key.endswith("token_type_ids"):
      continue   # buffers
    value = np.asarray(value)
    parts = ["bert"] + re.sub(r"(^|\.)layer\.(\d+)\.", r"\1layer_\2.", key).split(".")
    leaf, module = parts[-1], parts[-2]
    if leaf in ("gamma", "beta"):  # old-style LayerNorm names
      leaf = "scale" if leaf == "gamma" else "bias"
    elif leaf == "weight":
      if module == "LayerNorm":
        leaf = "scale"
      elif module.endswith("embeddings"):
        leaf = "embedding"
      else:
        leaf, value = "kernel", value.T  # torch Linear stores [out, in]
    flat["/".join(parts[:-1] + [leaf])] = value
  return flat


def torch_from_flat(flat: Flat) -> Dict[str, np.ndarray]:
  """{`bert/...`: array} -> {key below the prefix: float32 torch-layout array}."""
  state = {}
  for name, value in flat.items():
    parts = name.split("/")[1:]
    leaf = parts[-1]
    if leaf == "kernel":
      leaf, value = "weight", value.T
    elif leaf in ("scale", "embedding"):
      leaf = "weight"
    path = [p.replace("layer_", "layer.") if re.fullmatch(r"layer_\d+", p) else p
            for p in parts[:-1]]
    state[".".join(path + [leaf])] = np.ascontiguousarray(value, dtype=np.float32)
  return state
