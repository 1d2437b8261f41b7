"""Fine-tuning heads and their losses (spec section 5): the only new parameters of a task.

A head is a Flax module called as `head(encoder_outputs, batch, deterministic)` and returning a
dict of float32 arrays (`bert_jax.tasks.framework.finetuning.FineTuningModel` builds the encoder around it; its
parameters live under `head/...`, which is what "not loaded from the checkpoint" means).
`encoder_outputs` is `BertModel`'s dict with any leading example axes kept, e.g. for multiple
choice pooled_output is [B, C, H]. A head's `kernels` field takes the encoder's
`BertConfig.kernels`, so that its dropout and output layer use the same forms
(bert_jax/model/kernels.py); its `init_std` and an unset `dropout_rate` are the encoder
family's (`Family.head_settings`: transformers' choices for that family's task classes).

A loss is `loss(outputs, batch) -> (row_loss [B], row_weight [B])`; the fine-tuning loop masks
padding rows and divides: loss = sum(row_loss * mask) / sum(row_weight * mask). Classification
uses weight 1 per row (the mean over examples); a token-level task returns the sum of its token
losses and the number of scored tokens per row (the mean over scored tokens).

Shape letters: B batch, C choices, S sequence, H hidden, K labels.
"""
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.kernels import select as select_kernels

# The original classifier's initialiser: truncated normal (+-2 std), stddev 0.02, zero bias; a
# model family may start its heads with another std (`Family.head_settings`: ModernBERT's).
INIT_STDDEV = 0.02
# Dropout before the output layer where neither the task nor the family says (BERT's).
DROPOUT_RATE = 0.1


def _output_layer(features: int, name: str, kernels_spec: str,
                  init_std: float = INIT_STDDEV) -> nn.Dense:
  # Computed in float32 whatever the encoder's dtype: these logits feed softmax / MSE directly.
  return nn.Dense(features, dtype=jnp.float32, param_dtype=jnp.float32,
                  kernel_init=nn.initializers.truncated_normal(stddev=init_std),
                  bias_init=nn.initializers.zeros_init(), name=name,
                  dot_general=select_kernels(kernels_spec).dense_dot_general)


def _rate(dropout_rate: Optional[float]) -> float:
  return DROPOUT_RATE if dropout_rate is None else dropout_rate


def token_features(encoder_outputs) -> jnp.ndarray:
  """What a token-level head reads [B, S, H] (float32): the encoder family's per-token head
  (`token_output`: ModernBERT's prediction head on every token, as transformers' token and span
  classes apply it) where it has one, else the last layer."""
  return encoder_outputs.get("token_output", encoder_outputs["sequence_output"]).astype(
      jnp.float32)


class ClassificationHead(nn.Module):
  """logits = W . dropout(C) on the pooled [CLS] output C (spec section 5).

  num_labels=1 is regression (STS-B): `logits[..., 0]` is the predicted score.
  """
  num_labels: int
  dropout_rate: Optional[float] = None   # None: DROPOUT_RATE, or the family's (FineTuningModel)
  kernels: str = "auto"       # BertConfig.kernels: the encoder's choice of building blocks
  init_std: float = INIT_STDDEV

  @nn.compact
  def __call__(self, encoder_outputs, batch, deterministic: bool):
    del batch
    pooled = encoder_outputs["pooled_output"].astype(jnp.float32)           # [B, H]
    dropout = select_kernels(self.kernels).Dropout(_rate(self.dropout_rate))
    pooled = dropout(pooled, deterministic=deterministic)
    logits = _output_layer(self.num_labels, "classifier", self.kernels,
                           self.init_std)(pooled)                           # [B, K]
    return {"logits": logits}


class MultipleChoiceHead(nn.Module):
  """One score per (context, ending) pair from its pooled [CLS]; softmax over the choices (SWAG)."""
  dropout_rate: Optional[float] = None
  kernels: str = "auto"       # BertConfig.kernels
  init_std: float = INIT_STDDEV

  @nn.compact
  def __call__(self, encoder_outputs, batch, deterministic: bool):
    del batch
    pooled = encoder_outputs["pooled_output"].astype(jnp.float32)           # [B, C, H]
    dropout = select_kernels(self.kernels).Dropout(_rate(self.dropout_rate))
    pooled = dropout(pooled, deterministic=deterministic)
    scores = _output_layer(1, "classifier", self.kernels, self.init_std)(pooled)[..., 0]  # [B, C]
    return {"logits": scores}


# ----------------------------------------------------------------------------------- losses


def classification_loss(outputs, batch):
  """Softmax cross-entropy of `logits` [B, K] against `label_ids` [B]; weight 1 per row."""
  log_probs = jax.nn.log_softmax(outputs["logits"].astype(jnp.float32), axis=-1)   # [B, K]
  labels = batch["label_ids"].astype(jnp.int32)                                    # [B]
  nll = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]            # [B]
  return nll, jnp.ones_like(nll)


def regression_loss(outputs, batch):
  """Squared error of `logits[:, 0]` against `label_values` [B] (the original's MSE)."""
  predicted = outputs["logits"][:, 0].astype(jnp.float32)                          # [B]
  error = predicted - batch["label_values"].astype(jnp.float32)
  return error * error, jnp.ones_like(error)


# ------------------------------------------------------------------- span and token heads


class SpanHead(nn.Module):
  """SQuAD: a start vector S and an end vector E scored against every final hidden state T_i.

  start_logits_i = S . T_i + b_s, end_logits_i = E . T_i + b_e (one [H, 2] layer named
  `qa_outputs`, as in the original). No dropout and no padding mask, as the original:
  post-processing only ever reads passage positions (and [CLS] for the v2.0 null score).
  """
  kernels: str = "auto"       # BertConfig.kernels
  init_std: float = INIT_STDDEV
  # Asks the encoder for its family's per-token head (`token_features`; FineTuningModel).
  reads_tokens = True

  @nn.compact
  def __call__(self, encoder_outputs, batch, deterministic: bool):
    del batch, deterministic
    sequence = token_features(encoder_outputs)                               # [B, S, H]
    logits = _output_layer(2, "qa_outputs", self.kernels, self.init_std)(sequence)   # [B, S, 2]
    return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}    # [B, S] each


def span_loss(outputs, batch):
  """Mean of the start and end cross-entropies against `start_positions` / `end_positions` [B]
  (0 = [CLS]: the answer is not in this window, or there is none); weight 1 per row."""

  def nll(logits, positions):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)     # [B, S]
    return -jnp.take_along_axis(log_probs, positions.astype(jnp.int32)[:, None], axis=-1)[:, 0]

  loss = 0.5 * (nll(outputs["start_logits"], batch["start_positions"]) +
                nll(outputs["end_logits"], batch["end_positions"]))          # [B]
  return loss, jnp.ones_like(loss)


class TokenTaggingHead(nn.Module):
  """NER: logits = W . dropout(T_i) for every token (the word's label sits on its first piece)."""
  num_labels: int
  dropout_rate: Optional[float] = None
  kernels: str = "auto"       # BertConfig.kernels
  init_std: float = INIT_STDDEV
  reads_tokens = True         # see SpanHead

  @nn.compact
  def __call__(self, encoder_outputs, batch, deterministic: bool):
    del batch
    sequence = token_features(encoder_outputs)                               # [B, S, H]
    dropout = select_kernels(self.kernels).Dropout(_rate(self.dropout_rate))
    sequence = dropout(sequence, deterministic=deterministic)
    logits = _output_layer(self.num_labels, "classifier", self.kernels,
                           self.init_std)(sequence)                         # [B, S, K]
    return {"logits": logits}


# Label id of tokens that are not scored (continuation pieces, special tokens, padding).
IGNORE_LABEL = -100


def token_tagging_weight(batch):
  """Scored tokens per row [B]: the row weight of `token_tagging_loss`, from the labels alone."""
  return jnp.sum((batch["label_ids"] != IGNORE_LABEL).astype(jnp.float32), axis=-1)


def token_tagging_loss(outputs, batch):
  """Cross-entropy of `logits` [B, S, K] against `label_ids` [B, S], IGNORE_LABEL not scored.

  Returns the per-row sum and the number of scored tokens, so the loop's loss is the mean over
  scored tokens of the batch."""
  labels = batch["label_ids"].astype(jnp.int32)                              # [B, S]
  weight = (labels != IGNORE_LABEL).astype(jnp.float32)                      # [B, S]
  log_probs = jax.nn.log_softmax(outputs["logits"].astype(jnp.float32), axis=-1)   # [B, S, K]
  safe = jnp.where(labels == IGNORE_LABEL, 0, labels)
  nll = -jnp.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]   # [B, S]
  return jnp.sum(nll * weight, axis=-1), jnp.sum(weight, axis=-1)
