"""What a model family is to the rest of bert_jax: `Family`, one object per family folder.

Everything that differs between encoder families is asked of the config's family, never switched
on by name: its modules, its rules (objectives it trains, position limit, token types), its
conversion to and from transformers (and TF, for BERT), its layer layout and its FLOPs. The jobs,
the checkpoint layer and the tools hold one `Family` (`bert_jax.families.of(config)`) and call it.

Names every family keeps so the jobs are the same for all: the encoder under `bert/`, the masked
LM head under `cls/predictions/`, a sequence classifier's pooling under `bert/pooler/`. A flat
parameter dict ("Flat") uses those names joined by "/" in the per-layer layout (`layer_{i}`).
"""
from typing import Any, Dict, Optional, Tuple

import numpy as np

from bert_jax.model.config import BertConfig

Flat = Dict[str, np.ndarray]

# The heads a transformers export may ask a family for (`Family.huggingface_class`).
HEADS = ("encoder", "masked_lm", "pretraining", "sequence_classification", "multiple_choice",
         "token_classification", "question_answering")


class Family:
  """One encoder family; a subclass per folder under `bert_jax/families/`."""
  name: str = ""
  # transformers' `model_type` values whose config.json this family reads.
  huggingface_model_types: Tuple[str, ...] = ()
  # The pre-training objectives it trains (`config.objective`), the first its default.
  objectives: Tuple[str, ...] = ("mlm",)
  # Whether segment (token type) ids reach the model; without, a pair's ids are all 0.
  token_types: bool = False
  # Parameters of the encoder a checkpoint may lack (regexes on flat names).
  optional_parameters: Tuple[str, ...] = (r"bert/pooler/",)
  # The pre-training heads a checkpoint may have, each all there or absent.
  pretraining_heads: Tuple[str, ...] = ("cls/predictions",)
  # Special tokens transformers' config records for this family (config field: tokenizer id).
  special_token_ids: Tuple[Tuple[str, str], ...] = (("pad_token_id", "pad_id"),)
  # transformers' class of each head (`HEADS`); a head missing here has none in transformers.
  huggingface_classes: Dict[str, str] = {}

  # ---- modules
  def encoder(self, config: BertConfig, add_pooling_layer: bool = True,
              name: Optional[str] = None):
    raise NotImplementedError

  def pretraining_model(self, config: BertConfig, use_nsp: bool):
    raise NotImplementedError

  # ---- rules
  def check_objective(self, objective: str) -> None:
    if objective not in self.objectives:
      raise ValueError(f"config.objective={objective!r}: config.model.architecture="
                       f"{self.name!r} trains {' or '.join(self.objectives)}; use "
                       f"--config.objective={self.objectives[0]}")

  def max_positions(self, config: BertConfig) -> Optional[int]:
    """The longest sequence the model takes (its position table), or None (no table: rotary)."""
    return config.max_position_embeddings

  def check_length(self, config: BertConfig, max_seq_length: int, what: str) -> None:
    """A clear error if `max_seq_length` runs past the position table; `what` names the source."""
    limit = self.max_positions(config)
    if limit is not None and max_seq_length > limit:
      raise ValueError(f"config.max_seq_length={max_seq_length} exceeds the position table of "
                       f"{what} ({limit} positions: max_position_embeddings="
                       f"{config.max_position_embeddings}); use --config.max_seq_length<={limit}")

  def check_tokenizer(self, config: BertConfig, tokenizer, source: str) -> None:
    """A clear error if the vocabulary `source` (its `tokenizer`) is not the model's: larger than
    `vocab_size`, or (families that record it) another padding id than `pad_token_id`."""
    if tokenizer.vocab_size > config.vocab_size:
      raise ValueError(f"{source} has {tokenizer.vocab_size} tokens but config.model.vocab_size="
                       f"{config.vocab_size}")
    # A family whose config records the padding id (ModernBERT, RoBERTa) must have the vocabulary's.
    if hasattr(config, "pad_token_id") and config.pad_token_id != tokenizer.pad_id:
      raise ValueError(f"config.model.pad_token_id={config.pad_token_id} but the padding token "
                       f"of {source} has id {tokenizer.pad_id}: set "
                       f"--config.model.pad_token_id={tokenizer.pad_id}")

  def with_pooler(self, pretrained: Dict) -> Dict:
    """A checkpoint's parameters as a fine-tuned encoder starts from: the pooler as the
    checkpoint has it (a fresh one where it has none)."""
    return pretrained

  def head_settings(self, config: BertConfig) -> Dict[str, Any]:
    """How a fine-tuning head's output layer starts (`init_std`) and its dropout where the task
    sets none (`dropout_rate`): transformers' choices for the family's task classes. BERT's:
    the original classifier's truncated normal with the config's initializer_range, dropout
    0.1."""
    return {"init_std": config.initializer_range, "dropout_rate": 0.1}

  # ---- layouts
  def stack_layers(self, encoder: Dict, config: BertConfig) -> None:
    """Per-layer `encoder/layer_{i}` -> the scanned layout, in place."""
    import jax
    layers = [encoder.pop(f"layer_{i}") for i in range(config.num_hidden_layers)]
    encoder["layer"] = {"layer": jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}

  def unstack_layers(self, encoder: Dict, config: BertConfig) -> None:
    """The scanned layout -> per-layer `encoder/layer_{i}`, in place."""
    import jax
    stacked = encoder.pop("layer")["layer"]
    for i in range(config.num_hidden_layers):
      encoder[f"layer_{i}"] = jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), stacked)

  # ---- FLOPs
  def training_flops(self, config: BertConfig, *, rows: int, seq_len: int, predictions: float,
                     pairs: float) -> float:
    raise NotImplementedError

  def kernel_training_flops(self, config: BertConfig, rows: int, seq_len: int) -> float:
    """The training FLOPs a step spends inside the splash-attention kernels when it is compiled
    for a TPU (0 where attention is not splash there): XLA's cost analysis counts a custom call
    as almost nothing (a BERT-base forward and backward compiled for v5e: 1.6 MFLOP), so reports
    add this analytic count."""
    from bert_jax.model import kernels, layers
    with kernels.compiling_for("tpu"):
      kind = layers.attention_kind(config, deterministic=False, seq_len=seq_len)
    return self.splash_flops(config, rows, seq_len) if kind == "splash" else 0.0

  def splash_flops(self, config: BertConfig, rows: int, seq_len: int) -> float:
    """FLOPs inside the splash kernels of a training step (every layer global by default)."""
    from bert_jax.model import splash
    return config.num_hidden_layers * splash.attention_flops(
        rows, config.num_attention_heads, seq_len, config.head_dim, config.causal_attention)

  # ---- transformers
  def config_from_huggingface(self, values: Dict[str, Any], source: str) -> BertConfig:
    raise NotImplementedError

  def huggingface_config(self, config: BertConfig, architecture: str) -> Dict[str, Any]:
    raise NotImplementedError

  def flat_from_huggingface(self, state: Dict[str, np.ndarray], source: str = "") -> Flat:
    """transformers' state dict -> flat names; an untied decoder is an error naming `source`."""
    raise NotImplementedError

  def huggingface_state(self, flat: Flat) -> Dict[str, np.ndarray]:
    """transformers' keys of an encoder (with its pre-training heads if `flat` has them)."""
    raise NotImplementedError

  def huggingface_classes_of(self, config: BertConfig) -> Dict[str, str]:
    """{head: transformers' class} of a model of this family."""
    return self.huggingface_classes

  def pretrained_head(self, config: BertConfig) -> str:
    """The head of a pre-trained checkpoint's export: the family's pre-training class where it
    has one (BERT's masked LM + NSP), else its masked LM."""
    return "pretraining" if "pretraining" in self.huggingface_classes_of(config) else "masked_lm"

  def huggingface_class(self, config: BertConfig, head: str, source: str = "") -> str:
    """transformers' class of `head` (`HEADS`), or a clear error naming the head and family."""
    classes = self.huggingface_classes_of(config)
    if head not in classes:
      raise ValueError(f"{source + ': ' if source else ''}transformers has no {self.name} class "
                       f"for the {head.replace('_', ' ')} head; export --format=saved_model")
    return classes[head]

  def huggingface_task_state(self, head: str, bert: Flat, output: Flat) -> Dict[str, np.ndarray]:
    """transformers' state of a fine-tuned model: the encoder (`bert`, flat, with its pooler when
    the task reads one) and the task's output layer (`output`: {"kernel": [H, K], "bias": [K]})
    under the names of `huggingface_class(head)`."""
    raise NotImplementedError

  # ---- TF (the original release's checkpoints)
  def flat_from_tf(self, variables: Dict[str, np.ndarray]) -> Flat:
    raise ValueError(f"A TF1 checkpoint holds the original BERT's variables, not {self.name}'s")

  def tf_from_flat(self, flat: Flat) -> Dict[str, np.ndarray]:
    raise ValueError(f"A TF1 checkpoint holds the original BERT's variables; a {self.name} model "
                     "exports to transformers' format (export_huggingface) or save_pretrained")


def check_tied(state: Dict[str, np.ndarray], decoder: str, embeddings: Tuple[str, ...],
               source: str) -> None:
  """A masked-LM decoder weight saved beside the token embeddings must equal them: the families'
  decoders are tied, so an untied one would otherwise be dropped on import without a word."""
  table = next((state[k] for k in embeddings if k in state), None)
  if decoder in state and table is not None and not np.array_equal(np.asarray(state[decoder]),
                                                                    np.asarray(table)):
    raise ValueError(f"{source}: {decoder} differs from the token embeddings ({embeddings[0]}): "
                     "an untied masked-LM decoder, which bert_jax's tied head cannot hold")


def linear_weight(kernel: np.ndarray) -> np.ndarray:
  """A Flax kernel [in, out] as torch's Linear weight [out, in] (float32, contiguous)."""
  return np.ascontiguousarray(np.asarray(kernel, np.float32).T)
