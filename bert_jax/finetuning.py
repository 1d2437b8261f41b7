r"""The one fine-tuning loop shared by every task (GLUE, SWAG, SQuAD, NER, feature-based).

A task is a `Task`: a small dataclass of plain functions. The loop knows nothing else about it.

    Task(
      name="mrpc",
      read_examples=lambda split: [...],          # split name -> list of examples (any objects)
      make_features=lambda examples, tokenizer, split: Features(...),
      make_head=lambda: heads.ClassificationHead(num_labels=2),
      loss=heads.classification_loss,             # (outputs, batch) -> (row_loss [B], row_weight [B])
      predict=lambda examples, features, outputs: [...],   # one prediction per example
      metrics=lambda examples, predictions: {"f1": .., "accuracy": ..},
      write_predictions=lambda workdir, split, examples, predictions: [paths written],
      best_metric="f1",                           # key of metrics() that selects the checkpoint
      eval_splits=("dev",), test_splits=("test",))

* `make_features` returns `Features(arrays, example_index, meta)`: `arrays` are fixed-shape numpy
  arrays with one leading row axis (the model inputs `input_ids`, `input_mask`, `segment_ids`
  [rows, S] or [rows, C, S] for multiple choice, plus the labels the loss reads);
  `example_index` [rows] says which example a row belongs to (several rows per example: SQuAD's
  windows); `meta` is anything `predict` needs and the loop never touches (token maps).
  Test splits (no labels) must still give every array `loss` would read (zeros are fine); the loop
  computes a loss only on `eval_splits`.
* `make_head()` returns a Flax module called as `head(encoder_outputs, batch, deterministic)`;
  see `bert_jax.heads`. Its parameters are `head/...`; they are the only ones not loaded from
  `config.init_checkpoint` (`Task.new_params` regexes; everything else must match the
  checkpoint or the run stops with the names).
* `predict(examples, features, outputs)` gets the head outputs of *every* row of the split, in
  row order (numpy, leading axis rows): SQuAD-style post-processing over all windows of an
  example lives there. `metrics(examples, predictions)` -> {name: float}.
* `write_predictions(workdir, split, examples, predictions)` writes the task's files for any
  eval or test split and returns their paths.
* Length buckets (`config.length_bucket` = N > 0): each batch's token axis is cut to the
  smallest multiple of N that holds its longest row, and evaluation runs rows shortest first.
  The model inputs are cut; so are the feature arrays named in `Task.token_features` (token
  axis last, e.g. NER's `label_ids`). Head outputs named in `Task.token_outputs` ([rows, S, ...],
  e.g. span logits) come back padded to the features' length with `CUT_TOKEN_OUTPUT` at the
  positions that were cut (padding: no real token is ever there).
* `output_hidden_states=True` passes all layers to the head (`hidden_states` [L+1, B, S, H]);
  `freeze_encoder=True` trains the head only (the feature-based approach, spec section 5.3): the
  encoder runs without dropout and gets no gradient or update.

What the loop does (spec section 5): the encoder from `config.init_checkpoint` (any format
`checkpoints.load_pretrained` reads), the vocabulary from the checkpoint's directory (`vocab.txt`)
unless `config.vocab_file` / `config.spm_model_file` is given, and a clear error if its size is
not the encoder's; AdamW as the original with linear warm-up over the first
`config.warmup_proportion` of the steps; `config.num_train_epochs` passes over the training rows
(shuffled per epoch from `config.seed`; the batch of step s is a pure function of s, so a resumed
run sees the same batches); dropout randomness `fold_in(rng, step)`; evaluation on the *whole*
eval split after every epoch (or every `config.eval_every_steps`), the last partial batch padded
and masked, never dropped; the best parameters by `task.best_metric` kept in `WORKDIR/best/`
(an encoder `load_pretrained` reads, plus `head.safetensors`); at the end the best parameters
predict every eval and test split.

Output files: `WORKDIR/metrics.jsonl` (train and eval lines), `WORKDIR/results.json`
({"task", "best_metric", "best_value", "best_step", "<split>": {metrics}, ...}), the task's
prediction files, `WORKDIR/checkpoints/` (written at every evaluation and every
`config.checkpoint_every_steps`; resume: run the same command again), `WORKDIR/best/`.

Shape letters: B batch, S sequence, H hidden, L layers.
"""
import dataclasses
import functools
import json
import math
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import traverse_util

from bert_jax import checkpoints, modeling, optim, parallel, sharding, tokenization
from bert_jax import training_checkpoints as tc
from bert_jax.config import BertConfig
from bert_jax.extract_features import truncate_seq_pair
from bert_jax.length_buckets import bucket_length, row_lengths
from bert_jax.metric_writers import MetricWriter

RESULTS_FILE = "results.json"
BEST_DIR = "best"
HEAD_FILE = "head.safetensors"
BEST_INFO = "best.json"
SPM_COPY = "spm.model"  # the SentencePiece model saved beside a best/ checkpoint
MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")
# Row mask the loop adds to every batch: 1 for real rows, 0 for the padding of a last eval batch.
EXAMPLE_MASK = "example_mask"
# What a token output holds at the positions a length bucket cut off (all padding): low enough
# that no argmax or top-k over positions picks one, finite so that sums of two stay finite.
CUT_TOKEN_OUTPUT = -1e9


# ----------------------------------------------------------------------------------- interface


@dataclasses.dataclass
class Features:
  """Fixed-shape arrays of one split (leading axis: rows) and what predict() needs besides."""
  arrays: Dict[str, np.ndarray]
  example_index: np.ndarray          # [rows] int: the example each row was made from
  meta: Any = None                   # task-specific (e.g. SQuAD token -> word maps); loop ignores

  def __post_init__(self):
    rows = {k: v.shape[0] for k, v in self.arrays.items()}
    if len(set(rows.values()) | {len(self.example_index)}) != 1:
      raise ValueError(f"Features: arrays disagree on the number of rows: {rows}, "
                       f"example_index has {len(self.example_index)}")
    for name in MODEL_INPUTS:
      if name not in self.arrays:
        raise ValueError(f"Features: missing model input {name!r} (have {sorted(self.arrays)})")

  @property
  def num_rows(self) -> int:
    return len(self.example_index)


@dataclasses.dataclass(frozen=True)
class Task:
  """Everything task-specific about fine-tuning; see the module docstring."""
  name: str
  read_examples: Callable[[str], Sequence[Any]]
  make_features: Callable[[Sequence[Any], Any, str], Features]
  make_head: Callable[[], nn.Module]
  loss: Callable[[Dict, Dict], Tuple[jax.Array, jax.Array]]
  predict: Callable[[Sequence[Any], Features, Dict[str, np.ndarray]], List[Any]]
  metrics: Callable[[Sequence[Any], List[Any]], Dict[str, float]]
  write_predictions: Callable[[str, str, Sequence[Any], List[Any]], List[str]]
  best_metric: str
  eval_splits: Tuple[str, ...] = ("dev",)
  test_splits: Tuple[str, ...] = ()
  train_split: str = "train"
  higher_is_better: bool = True
  output_hidden_states: bool = False
  freeze_encoder: bool = False
  new_params: Tuple[str, ...] = (r"head/.*",)
  # Length buckets (see the module docstring): feature arrays besides the model inputs whose
  # last axis is the token axis, and head outputs [rows, S, ...] with the token axis second.
  token_features: Tuple[str, ...] = ()
  token_outputs: Tuple[str, ...] = ()


# ----------------------------------------------------------------------------------- model


class FineTuningModel(nn.Module):
  """BertModel (params `bert/...`, as in the checkpoints) + a task head (params `head/...`).

  Model inputs may carry extra leading axes ([B, C, S] for multiple choice): they are folded
  into the batch for the encoder and restored on its outputs, so heads see [B, C, ...].
  """
  bert_config: BertConfig
  head: nn.Module
  output_hidden_states: bool = False
  freeze_encoder: bool = False

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    ids = batch["input_ids"]
    lead, seq_len = ids.shape[:-1], ids.shape[-1]
    fold = lambda x: x.reshape((-1, seq_len))                                # [..., S] -> [N, S]
    encoder = modeling.BertModel(self.bert_config, name="bert")
    outputs = encoder(fold(ids), fold(batch["input_mask"]), fold(batch["segment_ids"]),
                      deterministic=deterministic or self.freeze_encoder,
                      output_hidden_states=self.output_hidden_states)
    unfold = {
        "sequence_output": lambda x: x.reshape(lead + x.shape[1:]),          # [..., S, H]
        "pooled_output": lambda x: x.reshape(lead + x.shape[1:]),            # [..., H]
        "hidden_states": lambda x: x.reshape(x.shape[:1] + lead + x.shape[2:]),  # [L+1, ..., S, H]
    }
    outputs = {k: unfold[k](v) for k, v in outputs.items()}
    if self.freeze_encoder:
      outputs = jax.lax.stop_gradient(outputs)
    return self.head(outputs, batch, deterministic)


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


# ----------------------------------------------------------------------------------- steps


def _masked_mean_terms(task_loss, outputs, batch):
  """(sum of row losses, sum of row weights) over real rows (the padding mask applied)."""
  row_loss, row_weight = task_loss(outputs, batch)
  mask = batch[EXAMPLE_MASK].astype(jnp.float32)                             # [B]
  return jnp.sum(row_loss * mask), jnp.sum(row_weight * mask)


def train_step(state: TrainState, batch, rng, *, model, tx, task_loss, schedule,
               axis_name: Optional[str] = None):
  """One AdamW update on one batch. Pure; dropout draws from fold_in(rng, step)."""
  step_rng = jax.random.fold_in(rng, state.step)
  total = (lambda x: jax.lax.psum(x, axis_name)) if axis_name else (lambda x: x)
  if axis_name:
    step_rng = jax.random.fold_in(step_rng, jax.lax.axis_index(axis_name))

  def loss_fn(params):
    outputs = model.apply({"params": params}, batch, deterministic=False,
                          rngs={"dropout": step_rng})
    loss_sum, weight_sum = _masked_mean_terms(task_loss, outputs, batch)
    # Normalised by the global weight, so per-device gradients sum to the batch gradient.
    return loss_sum / jnp.maximum(total(jax.lax.stop_gradient(weight_sum)), 1e-6)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  if axis_name:
    loss, grads = total((loss, grads))
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
             "param_norm": optax.tree.norm(params), "learning_rate": schedule(state.step)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def predict_step(params, batch, *, model, task_loss=None):
  """Head outputs of one batch (float32), plus per-row loss terms when `task_loss` is given."""
  outputs = model.apply({"params": params}, batch, deterministic=True)
  outputs = {k: v.astype(jnp.float32) for k, v in outputs.items()}
  if task_loss is not None:
    row_loss, row_weight = task_loss(outputs, batch)
    outputs["_row_loss"], outputs["_row_weight"] = row_loss, row_weight
  return outputs


# ----------------------------------------------------------------------------------- inputs


def find_vocab(config: ml_collections.ConfigDict) -> Tuple[Optional[str], Optional[str]]:
  """(vocab_file, spm_model_file): the config's if given, else the checkpoint directory's."""
  if config.get("vocab_file") or config.get("spm_model_file"):
    return config.get("vocab_file") or None, config.get("spm_model_file") or None
  path = config.init_checkpoint
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  for candidate in ("vocab.txt", os.path.join("data", "vocab.txt")):
    if os.path.exists(os.path.join(directory, candidate)):
      return os.path.join(directory, candidate), None
  if os.path.exists(os.path.join(directory, SPM_COPY)):  # a best/ dir of a SentencePiece run
    return None, os.path.join(directory, SPM_COPY)
  raise FileNotFoundError(
      f"No vocabulary: {directory} has no vocab.txt; pass --config.vocab_file=PATH "
      "(WordPiece) or --config.spm_model_file=PATH (SentencePiece).")


def create_tokenizer(config, bert_config: BertConfig):
  """The checkpoint's tokenizer; a vocabulary whose size is not the encoder's is an error."""
  vocab_file, spm_model_file = find_vocab(config)
  tokenization.validate_case_matches_checkpoint(config.do_lower_case, config.init_checkpoint)
  tokenizer = tokenization.create_tokenizer(vocab_file=vocab_file, spm_model_file=spm_model_file,
                                            do_lower_case=config.do_lower_case)
  if tokenizer.vocab_size != bert_config.vocab_size:
    raise ValueError(
        f"Vocabulary {vocab_file or spm_model_file} has {tokenizer.vocab_size} entries but the "
        f"checkpoint {config.init_checkpoint} has vocab_size={bert_config.vocab_size}: they do "
        "not belong together (pass the vocabulary the checkpoint was trained with).")
  return tokenizer


def encode_pairs(tokenizer, texts_a: Sequence[str], texts_b: Optional[Sequence[Optional[str]]],
                 max_seq_length: int) -> Dict[str, np.ndarray]:
  """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` -> input_ids, input_mask, segment_ids [N, S].

  Pair truncation removes tokens from the longer segment until the total fits
  max_seq_length - 3 (one segment: max_seq_length - 2), as in the original.
  """
  n = len(texts_a)
  ids_a = tokenizer.encode_batch(list(texts_a))
  has_b = texts_b is not None and any(t is not None for t in texts_b)
  ids_b = tokenizer.encode_batch([t or "" for t in texts_b]) if has_b else [[]] * n
  input_ids = np.zeros((n, max_seq_length), np.int32)                       # [N, S]
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  cls, sep = tokenizer.cls_id, tokenizer.sep_id
  for i in range(n):
    a, b = list(ids_a[i]), list(ids_b[i])
    if b:
      truncate_seq_pair(a, b, max_seq_length - 3)
      row = [cls] + a + [sep] + b + [sep]
      types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    else:
      a = a[:max_seq_length - 2]
      row, types = [cls] + a + [sep], [0] * (len(a) + 2)
    input_ids[i, :len(row)] = row
    segment_ids[i, :len(row)] = types
    input_mask[i, :len(row)] = 1
  return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}


def _rows(arrays: Dict[str, np.ndarray], index: np.ndarray, mask: np.ndarray) -> Dict:
  batch = {k: v[index] for k, v in arrays.items()}
  batch[EXAMPLE_MASK] = mask.astype(np.float32)
  return batch


def _cut_tokens(batch: Dict, length: int, names: Sequence[str]) -> Dict:
  """`batch` with the token axis (last) of the arrays in `names` cut to `length`."""
  return {k: (v[..., :length] if k in names else v) for k, v in batch.items()}


def _host_slice(batch: Dict, global_batch: int) -> Dict:
  """This process's rows of a global batch (jit over a multi-host mesh takes per-host slices)."""
  count, index = jax.process_count(), jax.process_index()
  if count == 1:
    return batch
  per_host = global_batch // count
  return {k: v[index * per_host:(index + 1) * per_host] for k, v in batch.items()}


class TrainOrder:
  """Row order of training: a fresh permutation per epoch, concatenated. Batch s is a pure
  function of (seed, s), so a resumed run continues with exactly the next batch."""

  def __init__(self, num_rows: int, batch_size: int, seed: int):
    self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
    self._perms: Dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)}
    return self._perms[epoch]

  def batch_index(self, step: int) -> np.ndarray:
    positions = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
    epochs, offsets = positions // self.num_rows, positions % self.num_rows
    return np.array([self._perm(int(e))[o] for e, o in zip(epochs, offsets)])

  def epoch_ends_at(self, step: int) -> bool:
    """True if an epoch boundary falls inside the batches up to `step` (1-based count)."""
    return (step * self.batch_size) // self.num_rows > ((step - 1) * self.batch_size) // self.num_rows


# ----------------------------------------------------------------------------------- params


def bert_config_for(config, loaded: BertConfig) -> BertConfig:
  """The checkpoint's architecture with this run's settings (dtype, scan, remat, causal).

  Attention is bidirectional unless `config.model.causal_attention` asks for the left-to-right
  ablation (a model pre-trained with `objective=ltr` is fine-tuned left to right too).
  """
  runtime = {k: config.model[k] for k in BertConfig.RUNTIME_FIELDS if k in config.get("model", {})}
  return loaded.replace(**dict({"causal_attention": False}, **runtime))


def merge_pretrained(init_params: Dict, pretrained: Dict, new_params: Sequence[str],
                     source: str) -> Tuple[Dict, List[str]]:
  """The model's freshly initialised params with every checkpoint tensor it names copied in.

  Returns (params, names not loaded). A model parameter the checkpoint lacks is allowed only if
  it matches a `new_params` regex (the head) or is the pooler (Hugging Face BertModel exports may
  omit it; it is then initialised and listed). Checkpoint tensors the model has no use for (the
  pre-training heads `cls/...`) are skipped and listed in the log. A shape mismatch is an error.
  """
  model = {"/".join(k): v for k, v in traverse_util.flatten_dict(init_params).items()}
  ckpt = {"/".join(k): v for k, v in traverse_util.flatten_dict(pretrained).items()}
  allowed = [re.compile(p) for p in tuple(new_params) + (r"bert/pooler/.*",)]
  missing = sorted(set(model) - set(ckpt))
  unexplained = [k for k in missing if not any(r.fullmatch(k) for r in allowed)]
  wrong = [f"{k}: checkpoint {tuple(np.shape(ckpt[k]))} vs model {tuple(model[k].shape)}"
           for k in sorted(set(model) & set(ckpt)) if np.shape(ckpt[k]) != model[k].shape]
  if unexplained or wrong:
    raise checkpoints.CheckpointMismatchError(
        f"init_checkpoint {source} does not fit the fine-tuning model:\n"
        + (f"  missing ({len(unexplained)}): {', '.join(unexplained[:20])}\n" if unexplained else "")
        + (f"  mis-shaped ({len(wrong)}): {', '.join(wrong[:20])}\n" if wrong else ""))
  unused = sorted(set(ckpt) - set(model))
  if unused:
    logging.info("Not used from %s: %s", source, ", ".join(unused))
  merged = {k: (np.asarray(ckpt[k], np.float32) if k in ckpt else np.asarray(v))
            for k, v in model.items()}
  tree = traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in merged.items()})
  return tree, missing


def _flat(tree) -> Dict[str, np.ndarray]:
  return {"/".join(k): np.ascontiguousarray(np.asarray(v, np.float32))
          for k, v in traverse_util.flatten_dict(jax.device_get(tree)).items()}


def save_best(directory: str, bert_config: BertConfig, params: Dict, info: Dict,
              tokenizer=None) -> None:
  """`directory`: an encoder `load_pretrained` reads, `head.safetensors`, `best.json` and the
  vocabulary (`vocab.txt` or `spm.model`): everything a later predict-only run needs."""
  import shutil
  from safetensors.numpy import save_file
  params = sharding.to_host(params)  # every process: gathers parameters split across hosts
  if jax.process_index() != 0:
    return
  checkpoints.save_pretrained(bert_config, {"bert": params["bert"]}, directory)
  if getattr(tokenizer, "spm_model_file", None):
    shutil.copyfile(tokenizer.spm_model_file, os.path.join(directory, SPM_COPY))
  elif getattr(tokenizer, "vocab_file", None):
    shutil.copyfile(tokenizer.vocab_file, os.path.join(directory, "vocab.txt"))
  save_file(_flat(params["head"]), os.path.join(directory, HEAD_FILE))
  with open(os.path.join(directory, BEST_INFO), "w", encoding="utf-8") as f:
    json.dump(info, f, indent=2, sort_keys=True)


def read_head(directory: str) -> Dict:
  """The task head's parameters saved by `save_best`."""
  from safetensors.numpy import load_file
  return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in
                                       load_file(os.path.join(directory, HEAD_FILE)).items()})


def load_best(directory: str, bert_config: BertConfig) -> Dict:
  _, encoder = checkpoints.load_pretrained(directory)
  encoder = checkpoints.to_model_layout(encoder, bert_config)
  return {"bert": encoder["bert"], "head": read_head(directory)}


def read_best_info(workdir: str) -> Optional[Dict]:
  path = os.path.join(workdir, BEST_DIR, BEST_INFO)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


# ----------------------------------------------------------------------------------- evaluation


class Predictor:
  """Runs the model over a whole split: fixed batch size, the last batch padded and masked.

  With `length_bucket` N > 0 rows run shortest first, each batch cut to a multiple of N
  (`bucket_length`); the outputs come back in row order, token outputs padded back."""

  def __init__(self, model, task: Task, batch_size: int, mesh, params_sharding=None,
               length_bucket: int = 0):
    """`params_sharding`: how the parameters passed in are placed (the train state's layout
    under tensor parallelism); default replicated."""
    self.batch_size = _round_up(batch_size, mesh.shape["data"])
    self._mesh = mesh
    self._length_bucket = length_bucket
    self._token_features = MODEL_INPUTS + tuple(task.token_features)
    self._token_outputs = tuple(task.token_outputs)
    if params_sharding is None:
      params_sharding = sharding.replicated(mesh)
    self._params_sharding = params_sharding
    in_shardings = (params_sharding, sharding.batch_sharding(mesh))
    compile_ = lambda loss: jax.jit(
        functools.partial(predict_step, model=model, task_loss=loss),
        in_shardings=in_shardings, out_shardings=sharding.replicated(mesh))
    self._with_loss = compile_(task.loss)
    self._without_loss = compile_(None)

  def __call__(self, params, features: Features, with_loss: bool):
    """({output name: [rows, ...] numpy}, mean loss or None) over every row exactly once."""
    step = self._with_loss if with_loss else self._without_loss
    params = sharding.place(params, self._params_sharding)  # host copies (the best checkpoint)
    n, b = features.num_rows, self.batch_size
    max_length = features.arrays["input_ids"].shape[-1]
    lengths = row_lengths(features.arrays["input_mask"])
    # Shortest first when cutting, so that rows of like length share a batch (and its length).
    order = np.argsort(lengths, kind="stable") if self._length_bucket else np.arange(n)
    pieces: List[Dict[str, np.ndarray]] = []
    for start in range(0, n, b):
      rows = order[start:start + b]
      real = len(rows)
      index = np.concatenate([rows, np.full(b - real, rows[0])])  # padding repeats a real row
      mask = np.arange(b) < real
      length = bucket_length(lengths[rows], self._length_bucket, max_length)
      batch = _cut_tokens(_rows(features.arrays, index, mask), length, self._token_features)
      outputs = jax.device_get(step(params, sharding.shard_batch(_host_slice(batch, b),
                                                                 self._mesh)))
      pieces.append({k: self._pad_back(k, np.asarray(v)[:real], max_length)
                     for k, v in outputs.items()})
    outputs = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]} if pieces else {}
    if self._length_bucket:
      outputs = {k: v[np.argsort(order)] for k, v in outputs.items()}   # back to row order
    loss = None
    if with_loss and pieces:
      loss = float(outputs.pop("_row_loss").sum() / max(outputs.pop("_row_weight").sum(), 1e-6))
    return outputs, loss

  def _pad_back(self, name: str, x: np.ndarray, max_length: int) -> np.ndarray:
    """A token output [rows, S', ...] of a cut batch -> [rows, max_length, ...]."""
    if name not in self._token_outputs or x.shape[1] == max_length:
      return x
    widths = [(0, 0), (0, max_length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return np.pad(x, widths, constant_values=CUT_TOKEN_OUTPUT)


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


@dataclasses.dataclass
class _Split:
  name: str
  examples: Sequence[Any]
  features: Features


def _load_split(task: Task, split: str, tokenizer, limit: int = 0) -> _Split:
  examples = list(task.read_examples(split))
  if limit:
    examples = examples[:limit]
  if not examples:
    raise ValueError(f"Task {task.name}: split {split!r} has no examples")
  return _Split(split, examples, task.make_features(examples, tokenizer, split))


def evaluate_split(task: Task, predictor: Predictor, params, split: _Split,
                   with_metrics: bool) -> Tuple[List[Any], Dict[str, float]]:
  outputs, loss = predictor(params, split.features, with_loss=with_metrics)
  predictions = task.predict(split.examples, split.features, outputs)
  if len(predictions) != len(split.examples):
    raise ValueError(f"Task {task.name}: predict() returned {len(predictions)} predictions for "
                     f"{len(split.examples)} examples of split {split.name!r}")
  metrics = {}
  if with_metrics:
    metrics = {k: float(v) for k, v in task.metrics(split.examples, predictions).items()}
    metrics["loss"] = loss
  return predictions, metrics


# ----------------------------------------------------------------------------------- the loop


def _is_better(value: float, best: Optional[float], higher: bool) -> bool:
  if best is None or (isinstance(best, float) and math.isnan(best)):
    return not math.isnan(value)
  return value > best if higher else value < best


def check_config(config: ml_collections.ConfigDict) -> None:
  """Fails before any work on a field no run can use, naming it."""
  def fail(field, why):
    raise ValueError(f"config.{field}={config[field]!r}: {why}")
  for field in ("train_batch_size", "eval_batch_size", "max_seq_length"):
    if not isinstance(config[field], int) or config[field] < 1:
      fail(field, "must be a positive integer")
  if not config.learning_rate > 0:
    fail("learning_rate", "must be positive")
  if not config.num_train_epochs >= 0:
    fail("num_train_epochs", "must be >= 0 (0: predict only)")
  if not 0.0 <= config.warmup_proportion < 1.0:
    fail("warmup_proportion", "must be in [0, 1)")
  if not isinstance(config.length_bucket, int) or config.length_bucket < 0:
    fail("length_bucket", "must be an integer >= 0 (0: every batch padded to max_seq_length)")


def train_and_evaluate(task: Task, config: ml_collections.ConfigDict,
                       workdir: str) -> Dict[str, Any]:
  """Fine-tunes `config.init_checkpoint` on `task`; returns (and writes) results.json's dict."""
  check_config(config)
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  if not config.init_checkpoint:
    raise ValueError("config.init_checkpoint is empty: give a Hugging Face directory, a Google "
                     "TF checkpoint, a save_pretrained directory or a pre-training workdir.")
  loaded_config, pretrained = checkpoints.load_pretrained(config.init_checkpoint)
  bert_config = bert_config_for(config, loaded_config)
  if os.path.isfile(os.path.join(config.init_checkpoint, HEAD_FILE)):
    # A fine-tuned model (a best/ directory): its head is loaded too (shapes checked below).
    pretrained = dict(pretrained, head=read_head(config.init_checkpoint))
  tokenizer = create_tokenizer(config, bert_config)
  if config.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"config.max_seq_length={config.max_seq_length} exceeds the checkpoint's "
                     f"max_position_embeddings={bert_config.max_position_embeddings}")

  start = time.time()
  train = _load_split(task, task.train_split, tokenizer, config.data.get("max_train_examples", 0))
  evals = [_load_split(task, s, tokenizer, config.data.get("max_eval_examples", 0))
           for s in task.eval_splits]
  print(f"[{task.name}] {len(train.examples)} training examples ({train.features.num_rows} rows), "
        + ", ".join(f"{s.name}: {len(s.examples)}" for s in evals)
        + f"; features in {time.time() - start:.1f}s", flush=True)

  batch_size = config.train_batch_size
  data_parallelism = sharding.mesh_shape(config)[0]   # devices / config.model_parallelism
  if batch_size % data_parallelism:
    raise ValueError(f"config.train_batch_size={batch_size} must be divisible by the "
                     f"{data_parallelism} data-parallel devices")
  # num_train_epochs=0 predicts only (e.g. with a fine-tuned best/ directory as init_checkpoint).
  num_train_steps = (0 if config.num_train_epochs == 0 else
                     max(1, int(train.features.num_rows * config.num_train_epochs / batch_size)))
  warmup_steps = int(num_train_steps * config.warmup_proportion)
  opt_config = ml_collections.ConfigDict(dict(
      optimizer=config.optimizer, learning_rate=config.learning_rate, warmup_steps=warmup_steps))
  tx, schedule = optim.create_optimizer(opt_config, max(num_train_steps, 1))
  if task.freeze_encoder:
    # Feature-based approach: only the head is updated (no Adam moments kept for the encoder).
    labels = lambda params: {k: ("frozen" if k == "bert" else "train") for k in params}
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)

  model = FineTuningModel(bert_config, task.make_head(), task.output_hidden_states,
                          task.freeze_encoder)
  rng = jax.random.PRNGKey(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  sample = _rows(train.features.arrays, np.zeros(1, np.int64), np.ones(1))
  init_params = jax.jit(lambda r: nn.unbox(model.init({"params": r}, sample)["params"]))(init_rng)
  params, not_loaded = merge_pretrained(jax.device_get(init_params),
                                        checkpoints.to_model_layout(pretrained, bert_config),
                                        task.new_params, config.init_checkpoint)
  del pretrained
  print(f"[{task.name}] loaded {config.init_checkpoint}; not loaded (new): "
        + ", ".join(not_loaded), flush=True)

  par = parallel.create(config)
  # Logical axis names of the parameters: with config.model_parallelism > 1 the encoder and its
  # Adam moments are sharded as in pre-training (the small task heads stay replicated).
  param_axes = sharding.logical_axes(model.init, {"params": init_rng}, sample)
  state = par.init_state(lambda: TrainState(step=jnp.zeros((), jnp.int32),
                                            params=jax.tree_util.tree_map(jnp.asarray, params),
                                            opt_state=tx.init(params)), param_axes)
  step_fn = functools.partial(train_step, model=model, tx=tx, task_loss=task.loss,
                              schedule=schedule)
  p_train_step = par.compile_step(step_fn)
  length_bucket = config.length_bucket
  predictor = Predictor(model, task, config.eval_batch_size, par.mesh, par.params_sharding(),
                        length_bucket)

  checkpointer = tc.TrainingCheckpointer(workdir, keep=1, async_save=False)
  restored_step, restored = checkpointer.restore_latest(par.abstract_state(state))
  if restored is not None:
    state = par.from_checkpoint(restored)
    print(f"[{task.name}] resumed at step {restored_step}", flush=True)
  step = int(np.asarray(par.metrics({"s": state.step})["s"]))
  writer = MetricWriter(workdir, resume_step=step)
  best = read_best_info(workdir) if step else None
  best_value = best["value"] if best else None
  best_dir = os.path.join(workdir, BEST_DIR)
  order = TrainOrder(train.features.num_rows, batch_size, config.seed)
  log_every = max(1, config.log_every_steps)
  # Checkpoints for resume: at every evaluation, and every N steps in between if asked.
  checkpoint_every = config.get("checkpoint_every_steps", 0)
  primary = evals[0]

  def evaluate_and_keep_best(state, step):
    nonlocal best_value
    params = par.checkpointable(state).params
    record = {}
    for split in evals:
      _, metrics = evaluate_split(task, predictor, params, split, with_metrics=True)
      record.update({(k if split is primary else f"{split.name}_{k}"): v
                     for k, v in metrics.items()})
    writer.write(step, "eval", record)
    value = record[task.best_metric]
    shown = " ".join(f"{k}={v:.4f}" for k, v in sorted(record.items()))
    print(f"[{task.name}] eval step {step}/{num_train_steps} {shown}", flush=True)
    if _is_better(value, best_value, task.higher_is_better):
      best_value = value
      save_best(best_dir, bert_config, params, {"step": step, "metric": task.best_metric,
                                                 "value": value, "metrics": record}, tokenizer)

  start, window, window_steps = time.time(), time.time(), 0
  if num_train_steps == 0 and best_value is None:
    evaluate_and_keep_best(state, 0)
  train_lengths = row_lengths(train.features.arrays["input_mask"])
  train_max_length = train.features.arrays["input_ids"].shape[-1]
  while step < num_train_steps:
    index = order.batch_index(step)
    # The cut is decided on the global batch, so every host cuts its rows alike.
    length = bucket_length(train_lengths[index], length_bucket, train_max_length)
    batch = _cut_tokens(_rows(train.features.arrays, index, np.ones(len(index))), length,
                        MODEL_INPUTS + tuple(task.token_features))
    batch = _host_slice(batch, batch_size)
    state, metrics = p_train_step(state, par.put_batch(batch), dropout_rng)
    step += 1
    window_steps += 1
    if step % log_every == 0 or step == num_train_steps:
      host = {k: float(v) for k, v in par.metrics(metrics).items()}
      if not math.isfinite(host["loss"]):
        raise FloatingPointError(f"[{task.name}] non-finite training loss at step {step}; "
                                 "lower config.learning_rate or check the data.")
      host["examples_per_sec"] = window_steps * batch_size / max(time.time() - window, 1e-9)
      writer.write(step, "train", host)
      print(f"[{task.name}] step {step}/{num_train_steps} loss={host['loss']:.4f} "
            f"lr={host['learning_rate']:.3g}", flush=True)
      window, window_steps = time.time(), 0
    eval_now = (step % config.eval_every_steps == 0 if config.eval_every_steps
                else order.epoch_ends_at(step))
    if eval_now or step == num_train_steps:
      evaluate_and_keep_best(state, step)
    if eval_now or step == num_train_steps or (
        checkpoint_every and step % checkpoint_every == 0):
      checkpointer.save(step, par.checkpointable(state), force=True)
      window, window_steps = time.time(), 0
  checkpointer.close()
  train_seconds = time.time() - start

  # Final predictions and files from the best parameters.
  best = read_best_info(workdir)
  if best is None:  # every evaluation was NaN: fall back to the last parameters
    save_best(best_dir, bert_config, par.checkpointable(state).params,
              {"step": step, "metric": task.best_metric, "value": float("nan"), "metrics": {}},
              tokenizer)
    best = read_best_info(workdir)
  params = load_best(best_dir, bert_config)
  results: Dict[str, Any] = {
      "task": task.name, "init_checkpoint": config.init_checkpoint, "seed": config.seed,
      "best_metric": task.best_metric, "best_value": best["value"], "best_step": best["step"],
      "higher_is_better": task.higher_is_better,
      "num_train_examples": len(train.examples), "num_train_steps": num_train_steps,
      "train_seconds": round(train_seconds, 1), "files": []}
  for split in evals:
    predictions, metrics = evaluate_split(task, predictor, params, split, with_metrics=True)
    results[split.name] = metrics
    results["files"] += task.write_predictions(workdir, split.name, split.examples, predictions)
  if config.get("do_predict", True):
    for name in task.test_splits:
      try:
        split = _load_split(task, name, tokenizer)
      except FileNotFoundError as e:  # test data is optional: dev metrics are the result
        logging.warning("No %s predictions: %s", name, e)
        print(f"[{task.name}] skipping test split {name!r}: {e}", flush=True)
        continue
      predictions, _ = evaluate_split(task, predictor, params, split, with_metrics=False)
      results["files"] += task.write_predictions(workdir, name, split.examples, predictions)
  results["files"] = [os.path.relpath(p, workdir) for p in results["files"]]
  if jax.process_index() == 0:
    with open(os.path.join(workdir, RESULTS_FILE), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2, sort_keys=True)
  writer.close()
  print(f"[{task.name}] best {task.best_metric}={best['value']:.4f} at step {best['step']}; "
        f"results in {os.path.join(workdir, RESULTS_FILE)}", flush=True)
  return results


# ----------------------------------------------------------------------------------- restarts


def run_with_seeds(run_one: Callable[[ml_collections.ConfigDict, str], Dict],
                   config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """`config.seeds` restarts (seed, seed+1, ...) in WORKDIR/seed_<s>; the best one's files are
  copied to WORKDIR and results.json gets {"seeds": {...}, "summary": {metric: mean/std/best}}.

  With seeds=1 the run goes straight into WORKDIR (no sub-directory)."""
  import shutil
  count = int(config.get("seeds", 1))
  if count <= 1:
    return run_one(config, workdir)
  os.makedirs(workdir, exist_ok=True)
  runs = {}
  for i in range(count):
    seed_config = ml_collections.ConfigDict(config.to_dict())
    seed_config.seed = config.seed + i
    seed_config.seeds = 1
    runs[seed_config.seed] = run_one(seed_config, os.path.join(workdir, f"seed_{seed_config.seed}"))
  first = next(iter(runs.values()))
  higher = first.get("higher_is_better", True)
  pick = max if higher else min
  best_seed = pick(runs, key=lambda s: runs[s]["best_value"])
  summary: Dict[str, Dict[str, float]] = {}
  for split in (k for k, v in first.items() if isinstance(v, dict)):
    for name in (n for n in first[split] if n != "loss"):
      values = np.array([runs[s][split][name] for s in runs], np.float64)
      summary[f"{split}/{name}"] = {"mean": float(values.mean()), "std": float(values.std()),
                                    "best": float(values.max() if higher else values.min()),
                                    "values": values.tolist()}
  for name in runs[best_seed]["files"]:
    source = os.path.join(workdir, f"seed_{best_seed}", name)
    if jax.process_index() == 0 and os.path.exists(source):
      shutil.copy(source, os.path.join(workdir, name))
  results = dict(runs[best_seed], best_seed=best_seed, summary=summary,
                 seeds={str(s): {k: v for k, v in r.items() if k != "files"}
                        for s, r in runs.items()})
  if jax.process_index() == 0:
    with open(os.path.join(workdir, RESULTS_FILE), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2, sort_keys=True)
  print(f"[{first['task']}] {count} seeds: " + ", ".join(
      f"{k} mean={v['mean']:.4f} std={v['std']:.4f} best={v['best']:.4f}"
      for k, v in summary.items() if not k.endswith("/loss")), flush=True)
  return results
