"""BERT's pre-training model (Devlin et al. 2018): the shared post-LN encoder
(`bert_jax.model.post_ln`) with the masked LM and next-sentence prediction heads, under the
released checkpoints' names (`bert/...`, `cls/predictions/...`, `cls/seq_relationship/...`).

Shape letters: B batch, S sequence, H hidden, P predictions, V vocabulary, K pairs in a row.
"""
from typing import Any, Dict

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.model.config import BertConfig
from bert_jax.model.layers import blocks, gather_positions, kernel_init, zeros
from bert_jax.model.post_ln import BertModel, BertPredictions

Array = Any


class BertPreTrainingHeads(nn.Module):
  """`cls/predictions` (masked LM) and `cls/seq_relationship` (NSP), as in the original."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, pooled_output, masked_lm_positions, embedding_attend):
    hidden = sequence_output
    if masked_lm_positions is not None:
      hidden = gather_positions(sequence_output, masked_lm_positions)   # [B, P, H]
    mlm_logits = BertPredictions(self.config, name="predictions")(hidden, embedding_attend)
    nsp_logits = None
    if pooled_output is not None:
      nsp_logits = nn.Dense(2, dtype=jnp.float32, param_dtype=jnp.float32,
                            kernel_init=kernel_init(self.config, ("embed", None)),
                            bias_init=zeros((None,)), name="seq_relationship",
                            dot_general=blocks(self.config).dense_dot_general)(pooled_output)
    return mlm_logits, nsp_logits


class BertForPreTraining(nn.Module):
  """Encoder + masked LM + next-sentence prediction heads.

  With `masked_lm_positions` [B, P] the MLM head sees only those positions (logits [B, P, V]);
  without, every position (logits [B, S, V]; the left-to-right ablation predicts every next
  token). `use_nsp=False` drops the NSP head (the "No NSP" ablation). Packed rows (several
  pairs per row) pass a block-diagonal [B, S, S] `attention_mask`, per-pair `position_ids` and
  `cls_positions` [B, K]; NSP is then classified per pair.
  """
  config: BertConfig
  use_nsp: bool = True

  def setup(self):
    self.bert = BertModel(self.config, add_pooling_layer=True)
    self.cls = BertPreTrainingHeads(self.config)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               masked_lm_positions=None, position_ids=None, deterministic: bool = True,
               output_hidden_states: bool = False, cls_positions=None) -> Dict[str, Array]:
    outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                        deterministic=deterministic, output_hidden_states=output_hidden_states,
                        cls_positions=cls_positions)
    pooled = outputs["pooled_output"] if self.use_nsp else None
    mlm_logits, nsp_logits = self.cls(outputs["sequence_output"], pooled, masked_lm_positions,
                                      self.bert.attend)
    outputs["mlm_logits"] = mlm_logits                        # [B, P or S, V] float32
    if nsp_logits is not None:
      outputs["nsp_logits"] = nsp_logits                      # [B, 2] or [B, K, 2] float32
    return outputs
