"""ModernBERT checkpoints as transformers writes them: config fields and tensor names, both ways.

transformers' `ModernBertModel` / `ModernBertForMaskedLM` (`config.json` with model_type
"modernbert", `model.safetensors`) <-> this project's `bert/...`, `cls/predictions/...` names of
`bert_jax.families.modernbert.model`. `bert_jax.io.checkpoints` reads and writes the files; this
module is only the renaming and the config translation.

| transformers                              | bert_jax                                       |
|-------------------------------------------|------------------------------------------------|
| model.embeddings.tok_embeddings.weight    | bert/embeddings/word_embeddings/embedding      |
| model.embeddings.norm.{weight,bias}       | bert/embeddings/norm/{scale,bias}              |
| model.layers.{i}.attn.Wqkv.weight         | bert/encoder/layer_{i}/attn/Wqkv/kernel (T)    |
| model.layers.{i}.{attn_norm,mlp_norm,...} | bert/encoder/layer_{i}/{attn_norm,mlp_norm,...}|
| model.final_norm.weight                   | bert/final_norm/scale                          |
| head.{dense,norm}.*                       | cls/predictions/transform/{dense,norm}/*       |
| decoder.bias (decoder.weight: tied)       | cls/predictions/output_bias                    |

`ModernBertModel`'s keys have no `model.` prefix. The config: `layer_types` (and the older
`global_attn_every_n_layers`) <-> `global_attn_every_n_layers`; `rope_parameters` (and the older
`global_rope_theta` / `local_rope_theta`) <-> the two thetas; `norm_eps` <-> `layer_norm_eps`;
`mlp_dropout` (= `embedding_dropout`) <-> `hidden_dropout_prob`; `attention_dropout` (one rate,
transformers drops the probabilities and the attention output with it) <->
`attention_probs_dropout_prob` and `attention_output_dropout_prob` (written apart beside it too,
read back first); `hidden_activation` <-> `hidden_act`.
"""
import dataclasses
import re
from typing import Any, Dict, List

import jax
import numpy as np

from bert_jax.families.base import Flat
from bert_jax.families.modernbert import model as modern
from bert_jax.families.modernbert.config import ModernBertConfig
from bert_jax.model.config import BertConfig

# Fields that are named alike in both configs.
_SAME = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "max_position_embeddings", "initializer_range",
         "initializer_cutoff_factor", "norm_bias", "attention_bias", "mlp_bias", "decoder_bias",
         "classifier_bias", "classifier_activation", "classifier_pooling", "local_attention",
         "pad_token_id")


def _global_every(layer_types: List[str], source: str) -> int:
  """N such that layer i is global exactly when i % N == 0, from transformers' `layer_types`."""
  globals_ = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
  if globals_ == list(range(len(layer_types))):
    return 1
  if len(globals_) > 1:
    every = globals_[1]
  else:
    every = len(layer_types)
  expected = ["full_attention" if i % every == 0 else "sliding_attention"
              for i in range(len(layer_types))]
  if layer_types != expected:
    raise ValueError(f"{source}: layer_types {layer_types} is not the ModernBERT pattern (layer "
                     "i global exactly when i % N == 0), which is all bert_jax computes")
  return every


def bert_config_from_huggingface(values: Dict[str, Any], source: str) -> ModernBertConfig:
  """A `ModernBertConfig` from transformers' ModernBERT `config.json`."""
  fields = dataclasses.asdict(ModernBertConfig())
  fields.update({k: values[k] for k in _SAME if k in values})
  fields["hidden_act"] = values.get("hidden_activation", fields["hidden_act"])
  fields["layer_norm_eps"] = values.get("norm_eps", fields["layer_norm_eps"])
  fields["hidden_dropout_prob"] = float(values.get("mlp_dropout", 0.0))
  # transformers' one attention rate drops both the probabilities and the block's output; a
  # config bert_jax exported records its two rates apart (`huggingface_config`).
  attention = float(values.get("attention_dropout", 0.0))
  fields["attention_probs_dropout_prob"] = float(
      values.get("attention_probs_dropout_prob", attention))
  fields["attention_output_dropout_prob"] = float(
      values.get("attention_output_dropout_prob", attention))
  if float(values.get("embedding_dropout", 0.0)) != fields["hidden_dropout_prob"]:
    raise ValueError(f"{source}: embedding_dropout {values.get('embedding_dropout')} differs "
                     f"from mlp_dropout {values.get('mlp_dropout')}; bert_jax has one rate for "
                     "both (hidden_dropout_prob)")
  if values.get("layer_types"):
    fields["global_attn_every_n_layers"] = _global_every(list(values["layer_types"]), source)
  elif "global_attn_every_n_layers" in values:
    fields["global_attn_every_n_layers"] = int(values["global_attn_every_n_layers"])
  rope = values.get("rope_parameters") or {}
  for kind, field, legacy in (("full_attention", "global_rope_theta", "global_rope_theta"),
                              ("sliding_attention", "local_rope_theta", "local_rope_theta")):
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      raise ValueError(f"{source}: rope_parameters[{kind!r}] has rope_type "
                       f"{params['rope_type']!r}; bert_jax computes the default rotary form only")
    theta = params.get("rope_theta", values.get(legacy))
    if theta is not None:
      fields[field] = float(theta)
  try:
    return ModernBertConfig(**fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"Invalid ModernBERT config in {source}: {e}") from e


def huggingface_config(config: BertConfig, architecture: str) -> Dict[str, Any]:
  """transformers' ModernBERT `config.json` fields of `config` for the class `architecture`.

  Both the current form (`layer_types`, `rope_parameters`) and the older one
  (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`) are written, so that
  transformers before and after v5 read the same model."""
  if config.norm_type != "layernorm" or not config.glu:
    raise ValueError(f"transformers' ModernBERT has LayerNorm and a GLU MLP; this model has "
                     f"norm_type={config.norm_type!r}, glu={config.glu}: export it with "
                     "bert_jax's own format (save_pretrained) instead")
  values = {k: getattr(config, k) for k in _SAME}
  layer_types = ["full_attention" if config.is_global_layer(i) else "sliding_attention"
                 for i in range(config.num_hidden_layers)]
  values.update(
      model_type="modernbert", architectures=[architecture],
      hidden_activation=config.hidden_act, norm_eps=config.layer_norm_eps,
      mlp_dropout=config.hidden_dropout_prob, embedding_dropout=config.hidden_dropout_prob,
      attention_dropout=config.attention_probs_dropout_prob, classifier_dropout=0.0,
      # transformers applies `attention_dropout` to the probabilities and the output alike; the
      # two rates are kept apart beside it, so bert_jax reads back what it wrote.
      attention_probs_dropout_prob=config.attention_probs_dropout_prob,
      attention_output_dropout_prob=config.attention_output_dropout_prob,
      layer_types=layer_types,
      rope_parameters={"full_attention": {"rope_type": "default",
                                          "rope_theta": config.global_rope_theta},
                       "sliding_attention": {"rope_type": "default",
                                             "rope_theta": config.local_rope_theta}},
      global_attn_every_n_layers=(config.global_attn_every_n_layers if config.local_attention
                                  else 1),
      global_rope_theta=config.global_rope_theta, local_rope_theta=config.local_rope_theta,
      tie_word_embeddings=True)
  return values


def _rename_to_ours(key: str) -> str:
  key = re.sub(r"^model\.", "", key)
  key = re.sub(r"^layers\.(\d+)\.", r"encoder.layer_\1.", key)
  key = key.replace("embeddings.tok_embeddings.", "embeddings.word_embeddings.")
  if key.startswith("head."):
    return "cls/predictions/transform/" + key[len("head."):].replace(".", "/")
  return "bert/" + key.replace(".", "/")


def flat_from_huggingface(state: Dict[str, np.ndarray]) -> Flat:
  """transformers' ModernBertModel / ModernBertForMaskedLM state -> this project's flat names."""
  flat: Flat = {}
  for key, value in state.items():
    value = np.asarray(value)
    if key == "decoder.weight":
      continue  # tied to the token embeddings (`base.check_tied`)
    if key == "decoder.bias":
      flat["cls/predictions/output_bias"] = value
      continue
    name = _rename_to_ours(key)
    parts = name.split("/")
    leaf, module = parts[-1], parts[-2]
    if leaf == "weight":
      if module == "word_embeddings":
        parts[-1] = "embedding"
      elif module.endswith("norm"):
        parts[-1] = "scale"
      else:
        parts[-1], value = "kernel", value.T   # torch Linear stores [out, in]
    flat["/".join(parts)] = value
  return flat


def huggingface_state(flat: Flat) -> Dict[str, np.ndarray]:
  """This project's flat names (per-layer layout) -> transformers' state dict:
  ModernBertForMaskedLM's
  keys with the MLM head, ModernBertModel's without."""
  has_head = any(k.startswith("cls/") for k in flat)
  state = {}
  for name, value in flat.items():
    if name.startswith("bert/pooler/"):
      continue   # the classifier's pooling head: a task export's (`head.`), not the encoder's
    if name == "cls/predictions/output_bias":
      state["decoder.bias"] = value
      continue
    parts = name.split("/")
    leaf = parts[-1]
    if leaf == "kernel":
      leaf, value = "weight", value.T
    elif leaf in ("scale", "embedding"):
      leaf = "weight"
    if parts[0] == "cls":
      key = ".".join(["head"] + parts[3:-1] + [leaf])
    else:
      path = ".".join(parts[1:-1] + [leaf])
      path = re.sub(r"^encoder\.layer_(\d+)\.", r"layers.\1.", path)
      path = path.replace("embeddings.word_embeddings.", "embeddings.tok_embeddings.")
      key = ("model." + path) if has_head else path
    state[key] = np.ascontiguousarray(value, dtype=np.float32)
  if has_head:
    state["decoder.weight"] = state["model.embeddings.tok_embeddings.weight"].copy()
  return state


# ----------------------------------------------------------------------------- scanned layout


def stack_layers(encoder: Dict, config: BertConfig) -> None:
  """In place: per-layer `layer_{i}` (i >= 1) -> scanned groups `layer/layer_{k}` with a leading
  axis G (bert_jax.model.modern: layer 0 stays apart, then groups of one local/global period)."""
  modern.check_scannable(config)
  size = modern.group_size(config)
  groups = (config.num_hidden_layers - 1) // size
  layers = {i: encoder.pop(f"layer_{i}") for i in range(1, config.num_hidden_layers)}
  encoder["layer"] = {
      f"layer_{k}": jax.tree_util.tree_map(
          lambda *xs: np.stack(xs), *[layers[1 + g * size + k] for g in range(groups)])
      for k in range(size)}


def unstack_layers(encoder: Dict) -> None:
  """In place: the scanned groups back to per-layer `layer_{i}` (the group size is the number of
  positions stored)."""
  stacked = encoder.pop("layer")
  size = len(stacked)
  for k, tree in stacked.items():
    position = int(k.split("_")[1])
    groups = jax.tree_util.tree_leaves(tree)[0].shape[0]
    for g in range(groups):
      encoder[f"layer_{1 + g * size + position}"] = jax.tree_util.tree_map(
          lambda x, g=g: np.asarray(x[g]), tree)
