"""The pre-training model of the families that train the masked LM alone (ModernBERT, RoBERTa):
a family's encoder under `bert/` and its masked-LM head under `cls/predictions/`, called as
BERT's `BertForPreTraining` is (no NSP: `use_nsp` must be False).

Shape letters: B batch, S sequence, H hidden, P predictions, V vocabulary.
"""
from typing import Any, Callable, Dict

import flax.linen as nn

from bert_jax.model.layers import gather_positions

Array = Any


class _Heads(nn.Module):
  """The `cls` scope, so the head lives at `cls/predictions/...` as BERT's does."""
  config: Any
  head: Callable      # (config, name) -> the family's masked-LM head: (hidden, attend) -> logits

  @nn.compact
  def __call__(self, hidden, embedding_attend):
    return self.head(self.config, name="predictions")(hidden, embedding_attend)


class MaskedLM(nn.Module):
  """Encoder + masked-LM head. Returns the encoder's outputs and mlm_logits [B, P or S, V]
  (float32; at `masked_lm_positions` [B, P] only, when given)."""
  config: Any
  encoder: Callable   # (config, add_pooling_layer) -> the family's encoder module
  head: Callable      # (config, name) -> the family's masked-LM head module
  use_nsp: bool = False

  def setup(self):
    if self.use_nsp:
      raise ValueError(f"architecture={self.config.architecture!r} has no next-sentence head: "
                       "use --config.objective=mlm")
    self.bert = self.encoder(self.config, add_pooling_layer=False)
    self.cls = _Heads(self.config, self.head)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               masked_lm_positions=None, position_ids=None, deterministic: bool = True,
               output_hidden_states: bool = False, cls_positions=None) -> Dict[str, Array]:
    del cls_positions   # no NSP: nothing is read per packed pair
    outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                        deterministic=deterministic, output_hidden_states=output_hidden_states)
    hidden = outputs["sequence_output"]
    if masked_lm_positions is not None:
      hidden = gather_positions(hidden, masked_lm_positions)                  # [B, P, H]
    outputs["mlm_logits"] = self.cls(hidden, self.bert.attend)                # [B, P|S, V]
    return outputs
