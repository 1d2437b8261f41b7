"""The one way a model runs for inference: rows of numpy arrays in fixed-size batches.

Fine-tuning's evaluation and prediction (`finetuning.Predictor`: encoder + head), feature
extraction (`bert_jax.extract_features`), sentence embeddings (`encoder_embeddings`:
`bert_jax.embed`, retrieval evaluation) and the feature-based tagger's frozen encoder all run
through `BatchedInference`:
* every batch has `batch_size` rows: a short last batch repeats its first row, and the outputs of
  the repeated rows are dropped (one compiled shape for the whole input);
* the token axis is cut, or padded with zeros, to the smallest multiple of `length_bucket` that
  holds the batch's longest row (`bucket_length`), or to `max_length` without buckets;
* over a whole split, rows run shortest first when bucketed and come back in row order, token
  outputs padded back to the full length with `pad_value`;
* on a device mesh, each batch is split along `data` (this host's rows) and the outputs gathered.

Shape letters: B batch, S sequence, H hidden, L layers.
"""
from typing import Callable, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import families
from bert_jax.model import pooling
from bert_jax.parallel import sharding
from bert_jax.runtime.length_buckets import bucket_length, row_lengths

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


def encoder_hidden_states(bert_config, dtype=None) -> Callable[[Dict, Dict], Dict]:
  """(params, batch) -> {"hidden_states": [B, L+1, S, H]}: the encoder's embeddings and every
  layer, batch first; cast to `dtype` if given."""
  model = families.of(bert_config).encoder(bert_config, add_pooling_layer=False)

  def apply(params, batch):
    out = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                      batch["segment_ids"], deterministic=True, output_hidden_states=True)
    hidden = jnp.swapaxes(out["hidden_states"], 0, 1)                      # [B, L+1, S, H]
    return {"hidden_states": hidden.astype(dtype) if dtype is not None else hidden}
  return apply


def encoder_embeddings(bert_config, how: str = "mean",
                       normalized: bool = False) -> Callable[[Dict, Dict], Dict]:
  """(params, batch) -> {"embedding": [B, H] float32}: the encoder's last layer pooled
  (`pooling.embed`: mean, cls or last, unit length when `normalized`), as sentence-transformers."""
  model = families.of(bert_config).encoder(bert_config, add_pooling_layer=False)

  def apply(params, batch):
    out = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                      batch["segment_ids"], deterministic=True)
    return {"embedding": pooling.embed(out["sequence_output"], batch["input_mask"], how,
                                       normalized)}
  return apply


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def host_slice(batch: Dict, global_batch: int) -> Dict:
  """This process's rows of a global batch (jit over a multi-host mesh takes per-host slices)."""
  count, index = jax.process_count(), jax.process_index()
  if count == 1:
    return batch
  per_host = global_batch // count
  return {k: v[index * per_host:(index + 1) * per_host] for k, v in batch.items()}


class BatchedInference:
  """`apply(params, batch) -> {name: [B, ...]}` jitted and run over rows; see the module
  docstring.

  token_inputs: arrays whose last axis is the token axis (cut with the model inputs).
  token_outputs: outputs [B, S, ...] padded back to the full length by `__call__`.
  mask_key: if given, each batch carries a row mask there (1 real row, 0 repeated row).
  mesh, params_sharding: where it runs (default: jax's default device, parameters as given).
  """

  def __init__(self, apply: Callable, batch_size: int, *, length_bucket: int = 0,
               token_inputs: Sequence[str] = MODEL_INPUTS, token_outputs: Sequence[str] = (),
               pad_value: float = 0.0, mask_key: Optional[str] = None, mesh=None,
               params_sharding=None):
    self.length_bucket = length_bucket
    self.token_inputs, self.token_outputs = tuple(token_inputs), tuple(token_outputs)
    self.pad_value, self.mask_key, self.mesh = pad_value, mask_key, mesh
    if mesh is None:
      self.batch_size, self.params_sharding = batch_size, None
      self._apply = jax.jit(apply)
      return
    self.batch_size = _round_up(batch_size, mesh.shape["data"])
    self.params_sharding = params_sharding or sharding.replicated(mesh)
    self._apply = jax.jit(apply, in_shardings=(self.params_sharding, sharding.batch_sharding(mesh)),
                          out_shardings=sharding.replicated(mesh))

  def place(self, params):
    """Host parameters (e.g. the best checkpoint) placed where the batches run."""
    if self.mesh is None:
      return params
    return sharding.place(params, self.params_sharding)

  def batch(self, params, arrays: Dict[str, np.ndarray], rows: np.ndarray,
            max_length: int) -> Dict[str, np.ndarray]:
    """The outputs [len(rows), ...] of `rows` of `arrays` (at most batch_size of them), run as
    one batch at its bucket length (at most `max_length`); token outputs at that length."""
    real = len(rows)
    index = np.concatenate([rows, np.full(self.batch_size - real, rows[0])])
    lengths = row_lengths(arrays["input_mask"][rows])
    length = bucket_length(lengths, self.length_bucket, max_length)
    batch = {k: (self._fit(v[index], length) if k in self.token_inputs else v[index])
             for k, v in arrays.items()}
    if self.mask_key:
      batch[self.mask_key] = (np.arange(self.batch_size) < real).astype(np.float32)
    if self.mesh is not None:
      batch = sharding.shard_batch(host_slice(batch, self.batch_size), self.mesh)
    outputs = jax.device_get(self._apply(params, batch))
    return {k: np.asarray(v)[:real] for k, v in outputs.items()}

  def __call__(self, params, arrays: Dict[str, np.ndarray],
               progress: Optional[Callable[[int, int], None]] = None) -> Dict[str, np.ndarray]:
    """The outputs of every row of `arrays` exactly once, in row order; `progress(done, total)`
    after each batch, if given."""
    params = self.place(params)
    n, b = len(arrays["input_ids"]), self.batch_size
    max_length = arrays["input_ids"].shape[-1]
    # Shortest first when cutting, so that rows of like length share a batch (and its length).
    order = (np.argsort(row_lengths(arrays["input_mask"]), kind="stable") if self.length_bucket
             else np.arange(n))
    pieces = []
    for start in range(0, n, b):
      outputs = self.batch(params, arrays, order[start:start + b], max_length)
      pieces.append({k: self._pad_back(k, v, max_length) for k, v in outputs.items()})
      if progress is not None:
        progress(len(pieces), -(-n // b))
    outputs = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]} if pieces else {}
    if self.length_bucket:
      outputs = {k: v[np.argsort(order)] for k, v in outputs.items()}   # back to row order
    return outputs

  @staticmethod
  def _fit(x: np.ndarray, length: int) -> np.ndarray:
    """The token axis (last) of `x` cut, or padded with zeros, to `length`."""
    if x.shape[-1] >= length:
      return x[..., :length]
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, length - x.shape[-1])])

  def _pad_back(self, name: str, x: np.ndarray, max_length: int) -> np.ndarray:
    """A token output [rows, S', ...] of a cut batch -> [rows, max_length, ...]."""
    if name not in self.token_outputs or x.shape[1] == max_length:
      return x
    widths = [(0, 0), (0, max_length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return np.pad(x, widths, constant_values=self.pad_value)
