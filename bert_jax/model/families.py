"""The model of a config's family (`BertConfig.architecture`): BERT (`modeling`) or ModernBERT
(`modern`). Both families take the same calls and keep the encoder under `bert/` and the
masked-LM head under `cls/predictions/`, so every job builds its model here and is otherwise the
same for either."""
from typing import Optional

import flax.linen as nn

from bert_jax.model import modeling, modern
from bert_jax.model.config import BertConfig


def encoder(config: BertConfig, add_pooling_layer: bool = True,
            name: Optional[str] = None) -> nn.Module:
  """The encoder: `modeling.BertModel` or `modern.ModernBertModel` (the same call and outputs)."""
  cls = modern.ModernBertModel if config.is_modern else modeling.BertModel
  return cls(config, add_pooling_layer=add_pooling_layer, name=name)


def pretraining_model(config: BertConfig, use_nsp: bool) -> nn.Module:
  """Encoder + pre-training heads: BERT's masked LM (+ NSP), or ModernBERT's masked LM."""
  if config.is_modern:
    return modern.ModernBertForMaskedLM(config, use_nsp=use_nsp)
  return modeling.BertForPreTraining(config, use_nsp=use_nsp)
