"""`RobertaConfig`: RoBERTa's and XLM-RoBERTa's fields on the shared base (names as
transformers' RobertaConfig / XLMRobertaConfig), and their released sizes."""
import dataclasses
from typing import Any, ClassVar, Dict

from bert_jax.model.config import BertConfig

HUGGINGFACE_TYPES = ("roberta", "xlm-roberta")


def _size(layers: int, hidden: int, **fields) -> Dict[str, Any]:
  return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
              intermediate_size=4 * hidden, **fields)


@dataclasses.dataclass
class RobertaConfig(BertConfig, family="roberta"):
  """BERT's post-LN encoder with RoBERTa's embeddings: learned positions numbered from
  `pad_token_id + 1` over the non-padding tokens (so `max_position_embeddings` - 2 tokens fit),
  one token type, LayerNorm eps 1e-5, the masked LM's dense + norm + tied decoder, no NSP. The
  defaults are roberta-base's (Liu et al. 2019; transformers' RobertaConfig)."""
  vocab_size: int = 50265
  max_position_embeddings: int = 514
  type_vocab_size: int = 1
  layer_norm_eps: float = 1e-5
  architecture: str = "roberta"
  pad_token_id: int = 1              # <pad>; also the padding index of the position table
  bos_token_id: int = 0              # <s>
  eos_token_id: int = 2              # </s>
  # transformers' model type of the checkpoint: "roberta" or "xlm-roberta" (the same model,
  # XLM-R's class names and SentencePiece vocabulary).
  huggingface_type: str = "roberta"

  SIZES: ClassVar[Dict[str, Dict[str, Any]]] = {
      "roberta-base": _size(12, 768),
      "roberta-large": _size(24, 1024),
      "xlm-roberta-base": _size(12, 768, vocab_size=250002, huggingface_type="xlm-roberta"),
      "xlm-roberta-large": _size(24, 1024, vocab_size=250002, huggingface_type="xlm-roberta"),
  }

  def validate_family(self, fail) -> None:
    if self.huggingface_type not in HUGGINGFACE_TYPES:
      fail("huggingface_type", f"expected one of {HUGGINGFACE_TYPES}")
    for field in ("pad_token_id", "bos_token_id", "eos_token_id"):
      if not 0 <= getattr(self, field) < self.vocab_size:
        fail(field, f"must be an id of the vocabulary (vocab_size={self.vocab_size})")
    if self.max_position_embeddings <= self.pad_token_id + 1:
      fail("max_position_embeddings", f"must exceed pad_token_id + 1 = {self.pad_token_id + 1}: "
                                      "positions are numbered from there")
    if self.causal_attention:
      fail("causal_attention", "the left-to-right ablation is BERT's (architecture='bert')")

  @property
  def position_offset(self) -> int:
    """Where the first token's position is in the table (padding_idx + 1)."""
    return self.pad_token_id + 1
