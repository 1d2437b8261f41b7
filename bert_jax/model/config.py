"""`BertConfig`: the fields of a released `bert_config.json` / Hugging Face `config.json`.

The named sizes follow the original release (spec section 1): base and large from the paper, and
the small-model grid (L in {2,...,12} x H in {128,...,768}, A = H / 64, intermediate = 4H).
"""
import dataclasses
import json
import os
from typing import Any, Dict, Optional

# Activation names as checkpoints spell them. "gelu" is the exact erf form (Hugging Face);
# the original TensorFlow code's `gelu` is the tanh approximation, which is "gelu_tanh" here.
ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu",
               "silu", "swish", "tanh")
ATTENTIONS = ("auto", "xla", "splash", "cudnn")
# jax.checkpoint_policies that take no arguments (what `remat_policy` may name).
REMAT_POLICIES = ("nothing_saveable", "everything_saveable", "dots_saveable",
                  "dots_with_no_batch_dims_saveable")
DTYPES = ("float32", "bfloat16", "float16")
# The block a config describes (`BertConfig.architecture`): the 2018 encoder, or the ModernBERT
# family (bert_jax/model/modern.py).
ARCHITECTURES = ("bert", "modernbert")
NORM_TYPES = ("layernorm", "rmsnorm")
POOLINGS = ("cls", "mean")

# name: (num_hidden_layers, hidden_size); heads = hidden / 64, intermediate = 4 * hidden.
NAMED_SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

# ModernBERT's released sizes (Warner et al. 2024, Table 3): name: (layers, hidden, GLU width,
# heads). The vocabulary, 50,368, is a multiple of 64 (the tokenizer's 50,280 padded).
MODERN_SIZES = {
    "modernbert-base": (22, 768, 1152, 12),
    "modernbert-large": (28, 1024, 2624, 16),
}


@dataclasses.dataclass
class BertConfig:
  """Architecture of a BERT encoder (the checkpoint's fields) plus how to compute it."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  # Not part of a checkpoint: how the model is computed.
  dtype: str = "float32"           # compute dtype; parameters always stay float32
  causal_attention: bool = False   # left-to-right ablation (spec section 6)
  scan_layers: bool = False        # one compiled layer body scanned L times (faster compiles)
  remat: bool = False              # rematerialise each layer in the backward pass (less memory)
  # With remat, what a layer keeps from its forward pass (a `jax.checkpoint_policies` name):
  # "nothing_saveable" recomputes the whole layer; "dots_with_no_batch_dims_saveable" keeps the
  # matmul outputs and recomputes only the elementwise work (LayerNorm, GELU, dropout, softmax).
  remat_policy: str = "nothing_saveable"
  # Attention logits (q k^T) written in float32 (True) or in the compute dtype and upcast for the
  # softmax (False: under bfloat16, BERT-base steps 1.04x faster at seq 128 and 1.12x at 512 on an
  # H100, logits rounded to bfloat16 as PyTorch autocast does). XLA attention only; cuDNN's keeps
  # float32 logits inside its kernel.
  float32_attention_logits: bool = True
  # The hand-tuned building blocks (bert_jax/model/ops.py) or their textbook JAX/Flax forms, as
  # bert_jax/model/kernels.py chooses: "auto" (what measured faster on the backend the model is
  # traced for), "tuned", "textbook", plus any parts to take in textbook form, e.g.
  # "tuned,plain_bias" (kernels.PARTS). The same function either way; only the speed differs.
  kernels: str = "auto"
  # How attention is computed (bert_jax/model/modeling.py `attention_kind`): "xla" (einsums,
  # [B, N, S, S] probabilities in HBM), "splash" (the Pallas TPU flash-attention kernel; interpret
  # mode on CPU; no attention-probability dropout), "cudnn" (cuDNN's fused kernel on GPU; no
  # dropout either), or "auto": splash on TPU and cuDNN on GPU where the attention dropout is 0,
  # else xla.
  attention: str = "auto"

  # ---- The block. "bert": the 2018 encoder (post-LN, learned positions, token types, GELU MLP,
  # biases everywhere); the fields below it are then unused and never written. "modernbert": the
  # ModernBERT family (bert_jax/model/modern.py; names as transformers' ModernBertConfig):
  # pre-norm, rotary positions, no token types, GLU MLP, alternating local/global attention, its
  # own MLM head and initialisation. hidden_dropout_prob is its embedding and MLP dropout,
  # attention_probs_dropout_prob its attention dropout, layer_norm_eps its norm_eps.
  architecture: str = "bert"
  norm_type: str = "layernorm"      # layernorm | rmsnorm (the norm of every block and head)
  norm_bias: bool = False           # biases of the norms
  attention_bias: bool = False      # biases of Wqkv and the attention output Wo
  mlp_bias: bool = False            # biases of the MLP's Wi and Wo
  decoder_bias: bool = True         # the bias of the tied MLM decoder
  classifier_bias: bool = False     # the bias of the prediction head's dense layer
  classifier_activation: str = "gelu"   # the prediction / classification head's activation
  classifier_pooling: str = "cls"   # what a sequence classifier reads: cls | mean (real tokens)
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
  pad_token_id: int = 0             # the padding id transformers' ModernBertConfig records

  # Fields that describe the computation, not the checkpoint; never written to bert_config.json.
  RUNTIME_FIELDS = ("dtype", "causal_attention", "scan_layers", "remat", "remat_policy",
                    "float32_attention_logits", "kernels", "attention")
  # The block fields of the ModernBERT family; a BERT config neither writes nor reads them.
  MODERN_FIELDS = ("norm_type", "norm_bias", "attention_bias", "mlp_bias", "decoder_bias",
                   "classifier_bias", "classifier_activation", "classifier_pooling", "glu",
                   "global_attn_every_n_layers", "local_attention", "global_rope_theta",
                   "local_rope_theta", "initializer_cutoff_factor", "pad_token_id")

  def __post_init__(self):
    self.validate()

  def validate(self) -> None:
    def fail(field, why):
      raise ValueError(f"BertConfig.{field}={getattr(self, field)!r}: {why}")
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings", "type_vocab_size"):
      if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
        fail(field, "must be a positive integer")
    if self.hidden_size % self.num_attention_heads:
      fail("hidden_size", f"must be divisible by num_attention_heads={self.num_attention_heads}")
    if self.hidden_act not in ACTIVATIONS:
      fail("hidden_act", f"unknown activation; expected one of {ACTIVATIONS}")
    if self.dtype not in DTYPES:
      fail("dtype", f"expected one of {DTYPES}")
    for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
      if not 0.0 <= getattr(self, field) < 1.0:
        fail(field, "must be in [0, 1)")
    if self.remat_policy not in REMAT_POLICIES:
      fail("remat_policy", f"expected one of {REMAT_POLICIES}")
    if self.attention not in ATTENTIONS:
      fail("attention", f"expected one of {ATTENTIONS}")
    if self.architecture not in ARCHITECTURES:
      fail("architecture", f"expected one of {ARCHITECTURES}")
    if self.is_modern:
      self._validate_modern(fail)
    # Imported here: kernels brings in JAX and Flax, and reading a config should not need them.
    from bert_jax.model import kernels
    try:
      kernels.parse(self.kernels)
    except ValueError:
      fail("kernels", f"expected at most one of {kernels.CHOICES} and any parts of "
                      f"{kernels.PARTS}, comma-separated")

  def _validate_modern(self, fail) -> None:
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

  @property
  def is_modern(self) -> bool:
    return self.architecture == "modernbert"

  def is_global_layer(self, index: int) -> bool:
    """Whether layer `index` attends globally (always, for BERT)."""
    return (not self.is_modern or not self.local_attention
            or index % self.global_attn_every_n_layers == 0)

  @property
  def window(self) -> int:
    """Keys on each side of a query in a local layer (transformers' `sliding_window`)."""
    return self.local_attention // 2

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @classmethod
  def named(cls, size: str, **overrides) -> "BertConfig":
    """A size from the original release (tiny, mini, small, medium, base, large) or ModernBERT's
    (modernbert-base, modernbert-large: the ModernBERT architecture with its released fields)."""
    if size in MODERN_SIZES:
      layers, hidden, glu_width, heads = MODERN_SIZES[size]
      fields = dict(modern_defaults(), num_hidden_layers=layers, hidden_size=hidden,
                    intermediate_size=glu_width, num_attention_heads=heads)
      fields.update(overrides)
      return cls(**fields)
    if size not in NAMED_SIZES:
      raise ValueError(f"Unknown BERT size {size!r}; expected one of "
                       f"{sorted(NAMED_SIZES) + sorted(MODERN_SIZES)}")
    layers, hidden = NAMED_SIZES[size]
    fields = dict(num_hidden_layers=layers, hidden_size=hidden,
                  num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
    fields.update(overrides)
    return cls(**fields)

  @classmethod
  def from_dict(cls, values: Dict[str, Any], source: Optional[str] = None) -> "BertConfig":
    """Reads the known fields; other keys (Hugging Face extras such as `model_type`) are ignored."""
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in values.items() if k in known}
    if "layer_norm_eps" not in values and "layer_norm_epsilon" in values:
      kwargs["layer_norm_eps"] = values["layer_norm_epsilon"]
    try:
      return cls(**kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f"Invalid BERT config{' in ' + source if source else ''}: {e}") from e

  @classmethod
  def from_json_string(cls, text: str, source: Optional[str] = None) -> "BertConfig":
    """Parses a JSON config; `source` (a path or URL) names it in errors. File I/O, local or
    gs://, is the caller's (bert_jax.io.checkpoints.read_config)."""
    try:
      values = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{source or 'BERT config'}: not valid JSON ({e})") from e
    return cls.from_dict(values, source=source)

  @classmethod
  def from_json_file(cls, path: str) -> "BertConfig":
    """Local files only; bert_jax.io.checkpoints.read_config also takes gs:// URLs."""
    if not os.path.exists(path):
      raise FileNotFoundError(f"BERT config file not found: {path}")
    with open(path, encoding="utf-8") as f:
      return cls.from_json_string(f.read(), source=path)

  def to_dict(self, include_runtime: bool = True) -> Dict[str, Any]:
    values = dataclasses.asdict(self)
    if not include_runtime:
      for field in self.RUNTIME_FIELDS:
        values.pop(field)
    if not self.is_modern:   # a BERT config's files stay what they were
      values.pop("architecture")
      for field in self.MODERN_FIELDS:
        values.pop(field)
    return values

  def to_json_string(self, include_runtime: bool = False) -> str:
    return json.dumps(self.to_dict(include_runtime), indent=2, sort_keys=True) + "\n"

  def to_json_file(self, path: str, include_runtime: bool = False) -> None:
    """Local files only; bert_jax.io.checkpoints.write_config also takes gs:// URLs."""
    with open(path, "w", encoding="utf-8") as f:
      f.write(self.to_json_string(include_runtime))

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)


def modern_defaults() -> Dict[str, Any]:
  """The fields ModernBERT's released checkpoints share (transformers' ModernBertConfig defaults,
  answerdotai/ModernBERT-base's config.json), the block fields included."""
  return dict(architecture="modernbert", vocab_size=50368, hidden_act="gelu", glu=True,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              max_position_embeddings=8192, type_vocab_size=1, layer_norm_eps=1e-5,
              norm_type="layernorm", norm_bias=False, attention_bias=False, mlp_bias=False,
              decoder_bias=True, classifier_bias=False, classifier_activation="gelu",
              classifier_pooling="mean", global_attn_every_n_layers=3, local_attention=128,
              global_rope_theta=160_000.0, local_rope_theta=10_000.0,
              initializer_range=0.02, initializer_cutoff_factor=2.0, pad_token_id=50283)


def glu_width(intermediate_size: int) -> int:
  """The GLU width that gives a MLP BERT's weights: 2/3 of BERT's intermediate size (a GLU has
  three matrices to BERT's two), rounded to a multiple of 64 (mini: 1,024 -> 704; tiny: 512 ->
  320)."""
  return 64 * max(1, round(2 * intermediate_size / 3 / 64))


def modern_counterpart(bert: BertConfig, **overrides) -> BertConfig:
  """The ModernBERT-family model of about `bert`'s size, for comparing the two blocks: `bert`'s
  layers, width, heads, vocabulary and compute settings, the MLP's weights kept (`glu_width`),
  ModernBERT's other fields (`modern_defaults`: every third layer global, no biases, no dropout);
  `overrides` last (e.g. the window, the rotary bases, the vocabulary's [PAD])."""
  fields = dict(modern_defaults(), num_hidden_layers=bert.num_hidden_layers,
                hidden_size=bert.hidden_size, num_attention_heads=bert.num_attention_heads,
                intermediate_size=glu_width(bert.intermediate_size), vocab_size=bert.vocab_size,
                **{name: getattr(bert, name) for name in BertConfig.RUNTIME_FIELDS})
  fields.update(overrides)
  return BertConfig(**fields)
