"""A larger model initialised from a smaller trained one: weight tiling with Gopher's layer
mapping, as ModernBERT-large was initialised from ModernBERT-base (Warner et al. 2024, section
2.2.4; AnswerDotAI/ModernBERT `init_model_from_pretrained`, whose modes these are).

Every parameter of the larger model takes the smaller model's parameter of the same name, grown
along each axis where the larger one is wider (`tile`):
  tile_from_middle  the small array at the centre and its periodic extension around it: index j
                    of a new axis of size N takes the small one's (j - (N - n) // 2) mod n
                    (ModernBERT's "center tiling", its default);
  tile_from_edge    the periodic extension from index 0: j mod n;
  center            the small array at the centre, the larger model's fresh initialisation
                    around it.
Fused matrices are grown part by part: the attention's Wqkv as q, k and v, a GLU's Wi as its input
and gate halves (the parts are the output axis' equal splits). Layers: the larger model's layer i
takes the smaller model's layer round(i * L_small / L_large) (Python's rounding, as theirs); a
parameter the smaller layer lacks (ModernBERT's first layer has no attention norm) keeps the fresh
initialisation. The vocabulary must be the same.

Parameters are per-layer host trees (`encoder/layer_{i}`), as `bert_jax.io.checkpoints` loads
them.
"""
from typing import Any, Dict

import numpy as np

from bert_jax.model.config import BertConfig

MODES = ("tile_from_middle", "tile_from_edge", "center")
# Fields the larger model may grow in (the others, the vocabulary first, must be equal).
GROWING_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def tile(small: np.ndarray, fresh: np.ndarray, mode: str) -> np.ndarray:
  """`small` grown to `fresh`'s shape (each axis at least as large) by `mode`."""
  small, fresh = np.asarray(small), np.asarray(fresh)
  if small.ndim != fresh.ndim or any(s > f for s, f in zip(small.shape, fresh.shape)):
    raise ValueError(f"cannot grow shape {small.shape} into {fresh.shape}")
  if mode == "center":
    grown = fresh.copy()
    grown[tuple(slice((f - s) // 2, (f - s) // 2 + s)
                for s, f in zip(small.shape, fresh.shape))] = small
    return grown
  if mode not in MODES:
    raise ValueError(f"tiling mode {mode!r}: expected one of {MODES}")
  grown = small
  for axis, (s, f) in enumerate(zip(small.shape, fresh.shape)):
    offset = (f - s) // 2 if mode == "tile_from_middle" else 0
    grown = np.take(grown, (np.arange(f) - offset) % s, axis=axis)
  return grown.astype(fresh.dtype)


def _tile_parts(small: np.ndarray, fresh: np.ndarray, mode: str, parts: int) -> np.ndarray:
  # A fused [in, parts * out] kernel (or [parts * out] bias): each part grown on its own.
  if parts == 1:
    return tile(small, fresh, mode)
  pieces = zip(np.split(np.asarray(small), parts, axis=-1),
               np.split(np.asarray(fresh), parts, axis=-1))
  return np.concatenate([tile(s, f, mode) for s, f in pieces], axis=-1)


def _fused_parts(path: str, config: BertConfig) -> int:
  """How many equal parts the parameter at `path` fuses along its output axis."""
  if "/Wqkv/" in path:
    return 3
  if "/mlp/Wi/" in path and config.glu:   # the GLU's fused halves (ModernBERT's Wi)
    return 2
  return 1


def _grow_tree(small: Dict, fresh: Dict, mode: str, config: BertConfig, path: str) -> Dict:
  grown = {}
  for name, value in fresh.items():
    here = f"{path}/{name}"
    if name not in small:
      grown[name] = value    # the smaller model has none: the fresh initialisation
    elif isinstance(value, dict):
      grown[name] = _grow_tree(small[name], value, mode, config, here)
    else:
      grown[name] = _tile_parts(small[name], value, mode, _fused_parts(here + "/", config))
  return grown


def check_growable(small: BertConfig, large: BertConfig) -> None:
  """Raises naming the field when `large` cannot be initialised from `small` by tiling."""
  for field in ("architecture", "vocab_size", "type_vocab_size", "glu"):
    if getattr(small, field) != getattr(large, field):
      raise ValueError(f"tiling grows a model only in {GROWING_FIELDS}; {field} differs "
                       f"({getattr(small, field)!r} -> {getattr(large, field)!r})")
  for field in GROWING_FIELDS:
    if getattr(large, field) < getattr(small, field):
      raise ValueError(f"tiling grows a model, never shrinks it: {field} "
                       f"{getattr(small, field)} -> {getattr(large, field)}")
  if large.head_dim != small.head_dim:
    raise ValueError(f"tiling keeps the head size: {small.head_dim} -> {large.head_dim} "
                     "(hidden_size / num_attention_heads)")


def layer_mapping(small_layers: int, large_layers: int):
  """The smaller model's layer each of the larger model's layers starts from (Gopher's), within
  the smaller model (Python's rounding takes 3 * 2 / 4 = 1.5 to 2, past a 2-layer model)."""
  return [min(round(i * small_layers / large_layers), small_layers - 1)
          for i in range(large_layers)]


def grow(small_params: Dict[str, Any], small: BertConfig, fresh_params: Dict[str, Any],
         large: BertConfig, mode: str) -> Dict[str, Any]:
  """`fresh_params` (the larger model's initialisation, per-layer host arrays) with every
  parameter grown from `small_params` (the smaller model's, same layout)."""
  check_growable(small, large)
  # The smaller model's layers under the names of the larger model's layers they start.
  body = small_params["bert"] if "bert" in small_params else small_params
  mapped = {f"layer_{i}": body["encoder"][f"layer_{j}"]
            for i, j in enumerate(layer_mapping(small.num_hidden_layers,
                                                large.num_hidden_layers))}
  body = {**body, "encoder": mapped}
  small_params = {**small_params, "bert": body} if "bert" in small_params else body
  return _grow_tree(small_params, fresh_params, mode, large, "")
