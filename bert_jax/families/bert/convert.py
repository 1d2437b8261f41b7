"""BERT's tensor names in transformers' and the original TF release's checkpoints, both ways.

transformers' `BertModel` / `BertForPreTraining` (`bert.`, `cls.`) and the TF1 variables of the
original release <-> this project's flat names (`bert/encoder/layer_{i}/...`, `cls/...`).
`bert_jax.io.checkpoints` reads and writes the files; this module is only the renaming.
"""
import re
from typing import Dict

import numpy as np

from bert_jax.families.base import Flat
from bert_jax.model import post_ln_names


def flat_from_huggingface(state: Dict[str, np.ndarray]) -> Flat:
  """Renames transformers' BertModel / BertForPreTraining keys to this project's names."""
  encoder, flat = {}, {}
  decoder_bias = None
  for key, value in state.items():
    if key.startswith("cls.predictions.decoder.weight"):
      continue  # tied to the word embeddings (checked by the family: `base.check_tied`)
    if key == "cls.predictions.decoder.bias":
      decoder_bias = np.asarray(value)
    elif key == "cls.predictions.bias":
      flat["cls/predictions/output_bias"] = np.asarray(value)
    elif key.startswith("cls."):
      encoder_like = post_ln_names.flat_from_torch({key[len("cls."):]: value})
      flat.update({"cls/" + k[len("bert/"):]: v for k, v in encoder_like.items()})
    else:   # BertForPreTraining's `bert.`, or BertModel's keys without a prefix
      encoder[key[len("bert."):] if key.startswith("bert.") else key] = value
  flat.update(post_ln_names.flat_from_torch(encoder))
  if "cls/predictions/output_bias" not in flat and decoder_bias is not None:
    flat["cls/predictions/output_bias"] = decoder_bias
  return flat


def huggingface_state(flat: Flat) -> Dict[str, np.ndarray]:
  """transformers' state dict (torch Linear weights [out, in], float32): BertForPreTraining's
  keys (`bert.`, `cls.`) with the pre-training heads, BertModel's (no prefix) without."""
  has_heads = any(k.startswith("cls/") for k in flat)
  encoder = post_ln_names.torch_from_flat({k: v for k, v in flat.items() if k.startswith("bert/")})
  if not has_heads:
    return encoder
  state = {f"bert.{k}": v for k, v in encoder.items()}
  heads = {"bert/" + k[len("cls/"):]: v for k, v in flat.items()
           if k.startswith("cls/") and k != "cls/predictions/output_bias"}
  state.update({f"cls.{k}": v for k, v in post_ln_names.torch_from_flat(heads).items()})
  state["cls.predictions.bias"] = np.ascontiguousarray(flat["cls/predictions/output_bias"],
                                                       dtype=np.float32)
  # transformers ties these to the embeddings and bias; written so no key is reported missing.
  state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].copy()
  state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].copy()
  return state


_TF_SKIP = re.compile(r"(adam_[mv]|global_step|bad_steps|good_steps|loss_scale|"
                      r"Momentum|LAMB|beta[12]_power)")


def flat_from_tf(variables: Dict[str, np.ndarray]) -> Flat:
  """The original release's TF1 variables -> this project's names (optimizer slots skipped)."""
  flat: Flat = {}
  for name, value in variables.items():
    if _TF_SKIP.search(name):
      continue
    parts = name.split("/")
    if parts[-1] in ("gamma", "beta"):
      parts[-1] = "scale" if parts[-1] == "gamma" else "bias"
    elif parts[-1].endswith("_embeddings"):
      parts.append("embedding")
    elif name == "cls/seq_relationship/output_weights":
      parts, value = ["cls", "seq_relationship", "kernel"], value.T  # stored [2, H]
    elif name == "cls/seq_relationship/output_bias":
      parts = ["cls", "seq_relationship", "bias"]
    flat["/".join(parts)] = value
  return flat


def tf_from_flat(flat: Flat) -> Dict[str, np.ndarray]:
  """This project's names -> the original release's TF1 variable names."""
  variables = {}
  for name, value in flat.items():
    parts = name.split("/")
    if parts[-1] == "embedding":
      parts = parts[:-1]
    elif parts[-1] in ("scale", "bias") and parts[-2] == "LayerNorm":
      parts[-1] = "gamma" if parts[-1] == "scale" else "beta"
    if name == "cls/seq_relationship/kernel":
      parts, value = ["cls", "seq_relationship", "output_weights"], value.T
    elif name == "cls/seq_relationship/bias":
      parts = ["cls", "seq_relationship", "output_bias"]
    variables["/".join(parts)] = np.asarray(value, np.float32)
  return variables
