"""`BertConfig`: the fields every encoder family shares, and BERT's (`bert_config.json`).

Each other family's config is a subclass in its folder (`bert_jax/families/<name>/config.py`,
e.g. `ModernBertConfig`) that adds its own fields and sizes and names itself with
`family=...`; `BertConfig.from_dict` and `BertConfig.named` hand a dict or a size to the class of
its family (`architecture`), so a config written by any family reads back as that family's.

BERT's named sizes follow the original release (spec section 1): base and large from the paper,
and the small-model grid (L in {2,...,12} x H in {128,...,768}, A = H / 64, intermediate = 4H).
"""
import dataclasses
import importlib
import json
import os
from typing import Any, ClassVar, Dict, Optional

# Activation names as checkpoints spell them. "gelu" is the exact erf form (Hugging Face);
# the original TensorFlow code's `gelu` is the tanh approximation, which is "gelu_tanh" here.
ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu",
               "silu", "swish", "tanh")
ATTENTIONS = ("auto", "xla", "splash", "cudnn")
# jax.checkpoint_policies that take no arguments (what `remat_policy` may name).
REMAT_POLICIES = ("nothing_saveable", "everything_saveable", "dots_saveable",
                  "dots_with_no_batch_dims_saveable")
DTYPES = ("float32", "bfloat16", "float16")

# name: (num_hidden_layers, hidden_size); heads = hidden / 64, intermediate = 4 * hidden.
NAMED_SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
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
  # How attention is computed (bert_jax/model/layers.py `attention_kind`): "xla" (einsums,
  # [B, N, S, S] probabilities in HBM), "splash" (the Pallas TPU flash-attention kernel; interpret
  # mode on CPU; no attention-probability dropout), "cudnn" (cuDNN's fused kernel on GPU; no
  # dropout either), or "auto": splash on TPU and cuDNN on GPU where the attention dropout is 0,
  # else xla.
  attention: str = "auto"

  # The family (`bert_jax.families`): "bert" here; each family's subclass has its own name.
  architecture: str = "bert"

  # Fields that describe the computation, not the checkpoint; never written to bert_config.json.
  RUNTIME_FIELDS = ("dtype", "causal_attention", "scan_layers", "remat", "remat_policy",
                    "float32_attention_logits", "kernels", "attention")
  # The named sizes of this class: name -> field values (BERT's: the original release's).
  SIZES: ClassVar[Dict[str, Dict[str, Any]]] = {
      name: dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                 intermediate_size=4 * hidden)
      for name, (layers, hidden) in NAMED_SIZES.items()}
  # Every family's config class by its name, filled in as each subclass is defined.
  _FAMILY_CLASSES: ClassVar[Dict[str, type]] = {}
  # Whether `architecture` goes into the files (every family's but BERT's).
  WRITES_ARCHITECTURE: ClassVar[bool] = False

  def __init_subclass__(cls, family: Optional[str] = None, **kwargs):
    super().__init_subclass__(**kwargs)
    if family:
      BertConfig._FAMILY_CLASSES[family] = cls
      cls.WRITES_ARCHITECTURE = True

  @staticmethod
  def family_class(name: str) -> type:
    """The config class of the family `name`. The family folders define their classes when
    `bert_jax.families` is imported: imported here by name, so a config can be read before any
    model code is (and the model layer does not depend on the families)."""
    if name not in BertConfig._FAMILY_CLASSES:
      importlib.import_module("bert_jax.families")
    if name not in BertConfig._FAMILY_CLASSES:
      raise ValueError(f"BertConfig.architecture={name!r}: expected one of "
                       f"{sorted(BertConfig._FAMILY_CLASSES)}")
    return BertConfig._FAMILY_CLASSES[name]

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
    if self.family_class(self.architecture) is not type(self):
      fail("architecture", f"is {self.family_class(self.architecture).__name__}'s family, not "
                           f"{type(self).__name__}'s (read configs with BertConfig.from_dict)")
    self.validate_family(fail)
    # Imported here: kernels brings in JAX and Flax, and reading a config should not need them.
    from bert_jax.model import kernels
    try:
      kernels.parse(self.kernels)
    except ValueError:
      fail("kernels", f"expected at most one of {kernels.CHOICES} and any parts of "
                      f"{kernels.PARTS}, comma-separated")

  def validate_family(self, fail) -> None:
    """The checks of a family's own fields (`fail(field, why)` raises); BERT has none."""

  @classmethod
  def older_values(cls, values: Dict[str, Any]) -> Dict[str, Any]:
    """`values` of a config written by an older bert_jax, as this version reads them (a family's
    field added since, say); BERT's are read as they are."""
    return values

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @classmethod
  def named(cls, size: str, **overrides) -> "BertConfig":
    """A named size of this class, or of any family when asked of `BertConfig` (BERT's tiny ...
    large; modernbert-base; roberta-base; ...)."""
    classes = [cls]
    if cls is BertConfig:
      importlib.import_module("bert_jax.families")   # every family's class defined (as above)
      classes += [c for c in BertConfig._FAMILY_CLASSES.values() if c is not BertConfig]
    for candidate in classes:
      if size in candidate.SIZES:
        fields = dict(candidate.SIZES[size], **overrides)
        # A size with another family's architecture (a BERT size as a ModernBERT, say).
        target = cls.family_class(fields.get("architecture", candidate.architecture))
        return target(**fields)
    known = sorted(name for c in classes for name in c.SIZES)
    raise ValueError(f"Unknown model size {size!r}; expected one of {known}")

  @classmethod
  def create(cls, **fields) -> "BertConfig":
    """The config of `fields`' family (`architecture`; none: this class's): every field must be
    one of that family's."""
    return cls.family_class(fields.get("architecture", cls.architecture))(**fields)

  @classmethod
  def from_dict(cls, values: Dict[str, Any], source: Optional[str] = None) -> "BertConfig":
    """The config of `values`' family (`architecture`; none: this class's) from its known fields;
    other keys (Hugging Face extras such as `model_type`) are ignored."""
    family = values.get("architecture") or cls.__dataclass_fields__["architecture"].default
    try:
      target = cls.family_class(family)
    except ValueError as e:
      raise ValueError(f"Invalid config{' in ' + source if source else ''}: {e}") from e
    values = target.older_values(values)
    known = {f.name for f in dataclasses.fields(target)}
    kwargs = {k: v for k, v in values.items() if k in known}
    if "layer_norm_eps" not in values and "layer_norm_epsilon" in values:
      kwargs["layer_norm_eps"] = values["layer_norm_epsilon"]
    try:
      return target(**kwargs)
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
    if not self.WRITES_ARCHITECTURE:   # BERT's files stay what the original release wrote
      values.pop("architecture")
    return values

  def to_json_string(self, include_runtime: bool = False) -> str:
    return json.dumps(self.to_dict(include_runtime), indent=2, sort_keys=True) + "\n"

  def to_json_file(self, path: str, include_runtime: bool = False) -> None:
    """Local files only; bert_jax.io.checkpoints.write_config also takes gs:// URLs."""
    with open(path, "w", encoding="utf-8") as f:
      f.write(self.to_json_string(include_runtime))

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)


BertConfig._FAMILY_CLASSES["bert"] = BertConfig
