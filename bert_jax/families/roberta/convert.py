"""RoBERTa's and XLM-RoBERTa's tensor names and config in transformers, both ways.

transformers' `RobertaForMaskedLM` / `XLMRobertaForMaskedLM` (`roberta.`, `lm_head.`) and
`RobertaModel` (no prefix) <-> this project's flat names of `bert_jax.families.roberta.model`:

| transformers                          | bert_jax                                      |
|---------------------------------------|-----------------------------------------------|
| roberta.{embeddings,encoder,pooler}.* | bert/... (the post-LN encoder's names)        |
| lm_head.dense.{weight,bias}           | cls/predictions/transform/dense/{kernel,bias}  |
| lm_head.layer_norm.{weight,bias}      | cls/predictions/transform/LayerNorm/{scale,bias} |
| lm_head.bias (= lm_head.decoder.bias) | cls/predictions/output_bias                   |
| lm_head.decoder.weight                | tied to the word embeddings                   |
"""
from typing import Any, Dict

import numpy as np

from bert_jax.families.base import Flat
from bert_jax.families.roberta.config import RobertaConfig
from bert_jax.model import post_ln_names

# Fields named alike in transformers' config and ours.
_SAME = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
         "max_position_embeddings", "type_vocab_size", "initializer_range", "layer_norm_eps",
         "pad_token_id", "bos_token_id", "eos_token_id")
# Our LM-head transform's modules -> transformers' names in `lm_head.`.
_HEAD_MODULES = {"dense": "dense", "LayerNorm": "layer_norm"}


def config_from_huggingface(values: Dict[str, Any], source: str) -> RobertaConfig:
  fields = {k: values[k] for k in _SAME if k in values}
  if fields.get("hidden_act") == "gelu_pytorch_tanh":
    fields["hidden_act"] = "gelu_tanh"
  if values.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(f"{source}: position_embedding_type "
                     f"{values['position_embedding_type']!r}; bert_jax computes RoBERTa's "
                     "absolute positions only")
  try:
    return RobertaConfig(huggingface_type=values["model_type"], **fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"Invalid RoBERTa config in {source}: {e}") from e


def huggingface_config(config: RobertaConfig, architecture: str) -> Dict[str, Any]:
  values = {k: getattr(config, k) for k in _SAME}
  if values["hidden_act"] == "gelu_tanh":
    values["hidden_act"] = "gelu_pytorch_tanh"
  values.update(model_type=config.huggingface_type, architectures=[architecture],
                position_embedding_type="absolute", tie_word_embeddings=True)
  return values


def flat_from_huggingface(state: Dict[str, np.ndarray]) -> Flat:
  """transformers' RobertaForMaskedLM / RobertaModel (and XLM-R's) state -> flat names."""
  encoder, flat = {}, {}
  for key, value in state.items():
    if key == "lm_head.decoder.weight":
      continue   # tied to the word embeddings (checked by the family: `base.check_tied`)
    if key in ("lm_head.bias", "lm_head.decoder.bias"):
      flat["cls/predictions/output_bias"] = np.asarray(value)
    elif key.startswith("lm_head."):
      module, leaf = key[len("lm_head."):].split(".")
      ours = {v: k for k, v in _HEAD_MODULES.items()}[module]
      value = np.asarray(value)
      if leaf == "weight":
        leaf, value = ("kernel", value.T) if ours == "dense" else ("scale", value)
      flat[f"cls/predictions/transform/{ours}/{leaf}"] = value
    else:   # RobertaForMaskedLM's `roberta.`, or RobertaModel's keys without a prefix
      encoder[key[len("roberta."):] if key.startswith("roberta.") else key] = value
  flat.update(post_ln_names.flat_from_torch(encoder))
  return flat


def huggingface_state(flat: Flat) -> Dict[str, np.ndarray]:
  """Flat names -> RobertaForMaskedLM's keys with the LM head (no pooler: the masked LM has
  none), RobertaModel's without."""
  has_head = any(k.startswith("cls/") for k in flat)
  encoder = {k: v for k, v in flat.items()
             if k.startswith("bert/") and not (has_head and k.startswith("bert/pooler/"))}
  state = post_ln_names.torch_from_flat(encoder)
  if not has_head:
    return state
  state = {f"roberta.{k}": v for k, v in state.items()}
  for name, value in flat.items():
    if not name.startswith("cls/predictions/transform/"):
      continue
    module, leaf = name.split("/")[-2:]
    value = np.asarray(value, np.float32)
    state[f"lm_head.{_HEAD_MODULES[module]}.{'bias' if leaf == 'bias' else 'weight'}"] = (
        np.ascontiguousarray(value.T if leaf == "kernel" else value))
  bias = np.ascontiguousarray(flat["cls/predictions/output_bias"], dtype=np.float32)
  state["lm_head.bias"] = bias
  state["lm_head.decoder.bias"] = bias.copy()
  state["lm_head.decoder.weight"] = state["roberta.embeddings.word_embeddings.weight"].copy()
  return state
