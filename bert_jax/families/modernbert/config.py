"""`ModernBertConfig`: the ModernBERT family's fields (names as transformers' ModernBertConfig)
on the shared base, its released sizes, and its counterpart of a BERT size."""
import dataclasses
from typing import Any, ClassVar, Dict

from bert_jax.model.config import ACTIVATIONS, BertConfig

NORM_TYPES = ("layernorm", "rmsnorm")
POOLINGS = ("cls", "mean")


@dataclasses.dataclass
class ModernBertConfig(BertConfig, family="modernbert"):
  """Pre-norm blocks, rotary positions, no token types, GLU MLP, alternating local/global
  attention, its own MLM head and initialisation (bert_jax/families/modernbert/model.py).
  hidden_dropout_prob is its embedding and MLP dropout, attention_probs_dropout_prob the dropout of
  the attention probabilities and attention_output_dropout_prob that of the attention block's
  output (ModernBERT's own training has the two apart: 0.0 and 0.1), layer_norm_eps its norm_eps. The defaults are ModernBERT-base's shared fields
  (transformers' ModernBertConfig, answerdotai/ModernBERT-base's config.json)."""
  vocab_size: int = 50368            # the tokenizer's 50,280 padded to a multiple of 64
  hidden_dropout_prob: float = 0.0
  attention_probs_dropout_prob: float = 0.0
  # The dropout after the attention block's output projection (Wo). transformers' ModernBERT
  # has one `attention_dropout` for both (read into both; convert.py), and a config written
  # before this field had one rate for both (`from_dict` reads it so).
  attention_output_dropout_prob: float = 0.0
  max_position_embeddings: int = 8192
  type_vocab_size: int = 1
  layer_norm_eps: float = 1e-5
  architecture: str = "modernbert"
  norm_type: str = "layernorm"      # layernorm | rmsnorm (the norm of every block and head)
  norm_bias: bool = False           # biases of the norms
  attention_bias: bool = False      # biases of Wqkv and the attention output Wo
  mlp_bias: bool = False            # biases of the MLP's Wi and Wo
  decoder_bias: bool = True         # the bias of the tied MLM decoder
  classifier_bias: bool = False     # the bias of the prediction head's dense layer
  classifier_activation: str = "gelu"   # the prediction / classification head's activation
  classifier_pooling: str = "mean"  # what a sequence classifier reads: cls | mean (real tokens)
  # hidden_act names the GLU's activation: gelu -> GeGLU (ModernBERT), silu -> SwiGLU. False:
  # BERT's dense -> activation -> dense MLP in the pre-norm block.
  glu: bool = True
  # Attention: every global_attn_every_n_layers-th layer (0, N, 2N, ...) attends globally, the
  # others within a sliding window `local_attention` wide in total: a query at i sees the keys j
  # with |i - j| <= local_attention // 2 (transformers' semantics). local_attention = 0: all global.
  global_attn_every_n_layers: int = 3
  local_attention: int = 128
  global_rope_theta: float = 160_000.0   # rotary base of the global layers
  local_rope_theta: float = 10_000.0     # rotary base of the local layers
  # ModernBERT's initialisation: truncated normal cut at +-cutoff std; residual outputs (each
  # Wo, the head's dense) with std initializer_range / sqrt(2 L).
  initializer_cutoff_factor: float = 2.0
  pad_token_id: int = 50283         # the padding id transformers' ModernBertConfig records

  # ModernBERT's released sizes (Warner et al. 2024, Table 3).
  SIZES: ClassVar[Dict[str, Dict[str, Any]]] = {
      "modernbert-base": dict(num_hidden_layers=22, hidden_size=768, intermediate_size=1152,
                              num_attention_heads=12),
      "modernbert-large": dict(num_hidden_layers=28, hidden_size=1024, intermediate_size=2624,
                               num_attention_heads=16),
  }

  @classmethod
  def older_values(cls, values: Dict[str, Any]) -> Dict[str, Any]:
    """A config written before `attention_output_dropout_prob` applied its attention rate to the
    output too, and still does."""
    if "attention_output_dropout_prob" in values:
      return values
    return dict(values, attention_output_dropout_prob=values.get(
        "attention_probs_dropout_prob", cls.attention_probs_dropout_prob))

  def validate_family(self, fail) -> None:
    if not 0.0 <= self.attention_output_dropout_prob < 1.0:
      fail("attention_output_dropout_prob", "must be in [0, 1)")
    if self.norm_type not in NORM_TYPES:
      fail("norm_type", f"expected one of {NORM_TYPES}")
    if self.classifier_pooling not in POOLINGS:
      fail("classifier_pooling", f"expected one of {POOLINGS}")
    if self.classifier_activation not in ACTIVATIONS:
      fail("classifier_activation", f"unknown activation; expected one of {ACTIVATIONS}")
    if self.head_dim % 2:
      fail("hidden_size", "rotary positions need an even head_dim (hidden_size / heads)")
    if not isinstance(self.global_attn_every_n_layers, int) or self.global_attn_every_n_layers < 1:
      fail("global_attn_every_n_layers", "must be a positive integer")
    if not isinstance(self.local_attention, int) or self.local_attention < 0 or (
        self.local_attention % 2):
      fail("local_attention", "must be 0 (no local layers) or an even number of tokens (the "
                              "window's total width: local_attention // 2 on each side)")
    for field in ("global_rope_theta", "local_rope_theta", "initializer_cutoff_factor"):
      if not getattr(self, field) > 0:
        fail(field, "must be positive")
    if self.causal_attention:
      fail("causal_attention", "the left-to-right ablation is BERT's (architecture='bert')")
    if not 0 <= self.pad_token_id < self.vocab_size:
      fail("pad_token_id", f"must be an id of the vocabulary (vocab_size={self.vocab_size}): "
                           "the tokenizer's [PAD]")

  def is_global_layer(self, index: int) -> bool:
    """Whether layer `index` attends globally."""
    return not self.local_attention or index % self.global_attn_every_n_layers == 0

  @property
  def window(self) -> int:
    """Keys on each side of a query in a local layer (transformers' `sliding_window`)."""
    return self.local_attention // 2


def glu_width(intermediate_size: int) -> int:
  """The GLU width that gives a MLP BERT's weights: 2/3 of BERT's intermediate size (a GLU has
  three matrices to BERT's two), rounded to a multiple of 64 (mini: 1,024 -> 704; tiny: 512 ->
  320)."""
  return 64 * max(1, round(2 * intermediate_size / 3 / 64))


def modern_counterpart(bert: BertConfig, **overrides) -> ModernBertConfig:
  """The ModernBERT-family model of about `bert`'s size, for comparing the two blocks: `bert`'s
  layers, width, heads, vocabulary and compute settings, the MLP's weights kept (`glu_width`),
  ModernBERT's other fields (the class defaults: every third layer global, no biases, no
  dropout); `overrides` last (e.g. the window, the rotary bases, the vocabulary's [PAD])."""
  fields = dict(num_hidden_layers=bert.num_hidden_layers, hidden_size=bert.hidden_size,
                num_attention_heads=bert.num_attention_heads,
                intermediate_size=glu_width(bert.intermediate_size), vocab_size=bert.vocab_size,
                **{name: getattr(bert, name) for name in BertConfig.RUNTIME_FIELDS})
  fields.update(overrides)
  return ModernBertConfig(**fields)
