"""ModernBERT (Warner et al. 2024): pre-norm blocks, GeGLU, rotary positions, alternating
local/global attention, no token types, masked LM only; transformers' `ModernBert*` classes in
and out."""
from typing import Any, Dict, Optional

import numpy as np

from bert_jax.families import base
from bert_jax.families.modernbert import convert
from bert_jax.model import flops
from bert_jax.model.config import BertConfig


class ModernBertFamily(base.Family):
  name = "modernbert"
  huggingface_model_types = ("modernbert",)
  objectives = ("mlm",)
  token_types = False
  # Its masked LM has no pooler: a fine-tuned encoder has its classifier's pooling head there.
  optional_parameters = (r"bert/pooler/",)
  pretraining_heads = ("cls/predictions",)
  special_token_ids = (("pad_token_id", "pad_id"), ("cls_token_id", "cls_id"),
                       ("sep_token_id", "sep_id"), ("bos_token_id", "cls_id"),
                       ("eos_token_id", "sep_id"))
  huggingface_classes = {
      "encoder": "ModernBertModel", "masked_lm": "ModernBertForMaskedLM",
      "sequence_classification": "ModernBertForSequenceClassification",
      "multiple_choice": "ModernBertForMultipleChoice",
      "token_classification": "ModernBertForTokenClassification",
      "question_answering": "ModernBertForQuestionAnswering"}

  def encoder(self, config: BertConfig, add_pooling_layer: bool = True,
              name: Optional[str] = None):
    from bert_jax.families.modernbert.model import ModernBertModel
    return ModernBertModel(config, add_pooling_layer=add_pooling_layer, name=name)

  def pretraining_model(self, config: BertConfig, use_nsp: bool):
    from bert_jax.families.modernbert.model import masked_lm
    return masked_lm(config, use_nsp=use_nsp)

  def with_pooler(self, pretrained):
    """The classifier's pooling head (dense, activation, norm) starts as the checkpoint's MLM head
    transform where the checkpoint has no pooler of its own: transformers'
    ModernBertForSequenceClassification does the same (both are named `head.` there)."""
    transform = pretrained.get("cls", {}).get("predictions", {}).get("transform")
    if transform is None or "pooler" in pretrained["bert"]:
      return pretrained
    return dict(pretrained, bert=dict(pretrained["bert"], pooler=transform))

  def head_settings(self, config):
    """transformers' ModernBERT task classes: the classifier drawn with std hidden_size ** -0.5
    (its `final_out`, cut at +-2 std as every head here), classifier_dropout 0.0."""
    return {"init_std": config.hidden_size ** -0.5, "dropout_rate": 0.0}

  def max_positions(self, config: BertConfig) -> Optional[int]:
    return None   # rotary positions: no table to run past (a later phase may run longer)

  def training_flops(self, config, *, rows, seq_len, predictions, pairs):
    del pairs   # no NSP
    return flops.modern_training_flops(config, rows=rows, seq_len=seq_len,
                                       predictions=predictions)

  def splash_flops(self, config, rows, seq_len):
    # The local layers' kernels skip the blocks outside the band.
    from bert_jax.model import splash
    per_pair = splash.attention_flops(rows, config.num_attention_heads, seq_len,
                                      config.head_dim) / seq_len
    return sum(per_pair * flops.attended_keys(config, layer, seq_len)
               for layer in range(config.num_hidden_layers))

  def config_from_huggingface(self, values: Dict[str, Any], source: str) -> BertConfig:
    return convert.bert_config_from_huggingface(values, source)

  def huggingface_config(self, config: BertConfig, architecture: str) -> Dict[str, Any]:
    return convert.huggingface_config(config, architecture)

  def flat_from_huggingface(self, state, source=""):
    base.check_tied(state, "decoder.weight", ("model.embeddings.tok_embeddings.weight",
                                              "embeddings.tok_embeddings.weight"), source)
    return convert.flat_from_huggingface(state)

  def huggingface_state(self, flat):
    return convert.huggingface_state(flat)

  def huggingface_task_state(self, head, bert, output):
    """The encoder under `model.`, the task's prediction head (our `bert/pooler`: dense,
    activation, norm; on the pooled sequence, or on every token for the token and span
    classes) as `head.`, the output layer as `classifier` (every ModernBERT task class)."""
    encoder = {k: v for k, v in bert.items() if not k.startswith("bert/pooler/")}
    state = {f"model.{k}": v for k, v in convert.huggingface_state(encoder).items()}
    for name, value in bert.items():
      if name.startswith("bert/pooler/"):
        module, leaf = name.split("/")[-2:]
        state[f"head.{module}.{'weight' if leaf in ('kernel', 'scale') else leaf}"] = (
            base.linear_weight(value) if leaf == "kernel" else np.asarray(value, np.float32))
    state["classifier.weight"] = base.linear_weight(output["kernel"])
    state["classifier.bias"] = np.asarray(output["bias"], np.float32)
    return state

  def stack_layers(self, encoder, config):
    convert.stack_layers(encoder, config)

  def unstack_layers(self, encoder, config):
    convert.unstack_layers(encoder)


FAMILY = ModernBertFamily()
