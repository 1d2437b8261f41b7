r"""The one fine-tuning loop shared by every task (GLUE, SWAG, SQuAD, NER, feature-based).

A task is a `Task` (`bert_jax.tasks.framework.task`: one class per task, with its data,
features, head, loss, predictions, metrics and files); the loop knows nothing else about it.
`tasks.registry` finds a task by `config.task`.

What the loop does (spec section 5): the encoder from `config.init_checkpoint` (any format
`checkpoints.load_pretrained` reads), the vocabulary from the checkpoint's directory (`vocab.txt`,
`spm.model` or `tokenizer.json`) unless `config.tokenizer.vocab_file` / `spm_model_file` /
`tokenizer_file` is given, and a clear error if its size is not the encoder's; AdamW as the original
with linear warm-up over the first `config.warmup_proportion` of the steps;
`config.num_train_epochs` passes over the training rows (shuffled per epoch from `config.seed`; the
batch of step s is a pure function of s, so a resumed run sees the same batches); dropout randomness
`fold_in(rng, step)`; evaluation on the *whole* eval split after every epoch (or every
`config.eval_every_steps`), the last partial batch padded and masked, never dropped; the best
parameters by `task.best_metric` kept in `WORKDIR/best/` (`best_model`: an encoder `load_pretrained`
reads, plus `head.safetensors`); at the end the best parameters predict every eval and test split.

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
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import traverse_util

from bert_jax import parallel
from bert_jax.io import checkpoints, filesystem
from bert_jax import families
from bert_jax.model.config import BertConfig
from bert_jax.parallel import sharding
from bert_jax.runtime import config_names, optim, outputs
from bert_jax.runtime import step as step_core
from bert_jax.runtime.inference import BatchedInference, host_slice
from bert_jax.runtime.length_buckets import bucket_length, row_lengths
from bert_jax.runtime import job as jobs
from bert_jax.runtime.job import Batches, Job
from bert_jax.runtime.loop import LoopSettings, Throughput
from bert_jax.runtime.state import TrainState
from bert_jax.tasks.framework import best_model
from bert_jax.tasks.framework.task import (  # noqa: F401 (the loop's names for them)
    MODEL_INPUTS, Features, FunctionTask, Task)
from bert_jax.text import tokenization

RESULTS_FILE = "results.json"
# Row mask the loop adds to every batch: 1 for real rows, 0 for the padding of a last eval batch.
EXAMPLE_MASK = "example_mask"
# What a token output holds at the positions a length bucket cut off (all padding): low enough
# that no argmax or top-k over positions picks one, finite so that sums of two stay finite.
CUT_TOKEN_OUTPUT = -1e9


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

  def __post_init__(self):
    # A head's `kernels` (its dropout and output layer) is the encoder's choice, whatever the
    # task's make_head() left it at: `--config.model.kernels` names every module of the model.
    # Its initialisation and unset dropout are the encoder family's (`Family.head_settings`).
    settings = dict(families.of(self.bert_config).head_settings(self.bert_config),
                    kernels=self.bert_config.kernels)
    if _has_field(self.head, "dropout_rate") and self.head.dropout_rate is not None:
      settings.pop("dropout_rate")   # the task's (config.head_dropout) stays
    changes = {k: v for k, v in settings.items()
               if _has_field(self.head, k) and getattr(self.head, k) != v}
    if changes:
      object.__setattr__(self, "head", self.head.clone(**changes))
    super().__post_init__()

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    ids = batch["input_ids"]
    lead, seq_len = ids.shape[:-1], ids.shape[-1]
    fold = lambda x: x.reshape((-1, seq_len))                                # [..., S] -> [N, S]
    encoder = families.of(self.bert_config).encoder(self.bert_config, name="bert")
    outputs = encoder(fold(ids), fold(batch["input_mask"]), fold(batch["segment_ids"]),
                      deterministic=deterministic or self.freeze_encoder,
                      output_hidden_states=self.output_hidden_states,
                      token_head=getattr(self.head, "reads_tokens", False))
    unfold = {
        "sequence_output": lambda x: x.reshape(lead + x.shape[1:]),          # [..., S, H]
        "token_output": lambda x: x.reshape(lead + x.shape[1:]),             # [..., S, H]
        "pooled_output": lambda x: x.reshape(lead + x.shape[1:]),            # [..., H]
        "hidden_states": lambda x: x.reshape(x.shape[:1] + lead + x.shape[2:]),  # [L+1, ..., S, H]
    }
    outputs = {k: unfold[k](v) for k, v in outputs.items()}
    if self.freeze_encoder:
      outputs = jax.lax.stop_gradient(outputs)
    return self.head(outputs, batch, deterministic)


def _has_field(module: nn.Module, name: str) -> bool:
  return any(f.name == name for f in dataclasses.fields(module))


# ----------------------------------------------------------------------------------- steps


def finetuning_objective(model, task_loss, row_weight=None) -> step_core.Objective:
  """The task's loss for the step core: the mean of row losses over real rows, weighted by the
  rows' weights (1 per row, or scored tokens for tagging) of the whole (global) batch."""

  def mask(batch):
    return batch[EXAMPLE_MASK].astype(jnp.float32)                           # [B]

  def totals(batch):
    weight = row_weight(batch) if row_weight is not None else jnp.ones_like(mask(batch))
    return {"weight": jnp.sum(weight * mask(batch))}

  def terms(params, batch, rng):
    outputs = model.apply({"params": params}, batch, deterministic=False, rngs={"dropout": rng})
    row_loss, weight = task_loss(outputs, batch)                             # [B], [B]
    return {"loss_sum": jnp.sum(row_loss * mask(batch)),
            "weight_sum": jnp.sum(weight * mask(batch))}

  return step_core.Objective(
      totals=totals, terms=terms,
      loss=lambda t, total: t["loss_sum"] / jnp.maximum(total["weight"], 1e-6),
      metrics=lambda t: {})


def train_step(state: TrainState, batch, rng, *, model, tx, task_loss, schedule,
               row_weight=None, grad_accum_steps: int = 1, axis_name: Optional[str] = None):
  """One AdamW update: `runtime.step.train_step` with the task's loss."""
  return step_core.train_step(state, batch, rng,
                              objective=finetuning_objective(model, task_loss, row_weight),
                              tx=tx, schedule=schedule, grad_accum_steps=grad_accum_steps,
                              axis_name=axis_name)


def predict_step(params, batch, *, model, task_loss=None):
  """Head outputs of one batch (float32), plus per-row loss terms when `task_loss` is given."""
  outputs = model.apply({"params": params}, batch, deterministic=True)
  outputs = {k: v.astype(jnp.float32) for k, v in outputs.items()}
  if task_loss is not None:
    row_loss, row_weight = task_loss(outputs, batch)
    outputs["_row_loss"], outputs["_row_weight"] = row_loss, row_weight
  return outputs


# ----------------------------------------------------------------------------------- inputs


def find_vocab(config: ml_collections.ConfigDict
               ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
  """(vocab_file, spm_model_file, tokenizer_file): the config's if given, else the checkpoint
  directory's (vocab.txt, else spm.model, else tokenizer.json: `checkpoints.find_vocab`)."""
  given = (config.tokenizer.vocab_file, config.tokenizer.spm_model_file,
           config.tokenizer.tokenizer_file)
  if any(given):
    return tuple(p or None for p in given)
  return checkpoints.find_vocab(config.init_checkpoint)


def create_tokenizer(config, bert_config: BertConfig):
  """The checkpoint's tokenizer; a vocabulary whose size is not the encoder's is an error."""
  vocab_file, spm_model_file, tokenizer_file = find_vocab(config)
  do_lower_case = config.tokenizer.do_lower_case
  if not tokenizer_file:   # a tokenizer.json's own normalizer decides its casing
    tokenization.validate_case_matches_checkpoint(do_lower_case, config.init_checkpoint)
  tokenizer = tokenization.create_tokenizer(vocab_file=vocab_file, spm_model_file=spm_model_file,
                                            do_lower_case=do_lower_case,
                                            tokenizer_file=tokenizer_file)
  vocab = vocab_file or spm_model_file or tokenizer_file
  if tokenizer.vocab_size != bert_config.vocab_size:
    raise ValueError(
        f"Vocabulary {vocab} has {tokenizer.vocab_size} entries but the "
        f"checkpoint {config.init_checkpoint} has vocab_size={bert_config.vocab_size}: they do "
        "not belong together (pass the vocabulary the checkpoint was trained with).")
  check_checkpoint_vocabulary(tokenizer, vocab, config.init_checkpoint)
  return tokenizer


def _tokens(tokenizer) -> List[Optional[str]]:
  """A tokenizer's tokens in id order (WordPiece, SentencePiece and tokenizer.json alike)."""
  return [tokenizer.inv_vocab.get(i) for i in range(tokenizer.vocab_size)]


def check_checkpoint_vocabulary(tokenizer, vocab: str, checkpoint: str) -> None:
  """A vocabulary passed with a checkpoint (`config.tokenizer`) must hold the tokens of the one
  beside it, id for id: one of the same size but other tokens (another model's, one rebuilt from
  other text) passes the size check and feeds the encoder ids it learnt as other words. The two
  are compared token by token in id order; a checkpoint with no vocabulary beside
  it (a bare TF checkpoint) has nothing to compare with."""
  if not checkpoint:
    return
  try:
    beside = checkpoints.find_vocab(checkpoint)
  except FileNotFoundError:
    return
  theirs_path = next(p for p in beside if p)
  if filesystem.absolute(theirs_path) == filesystem.absolute(vocab):
    return
  theirs = tokenization.create_tokenizer(vocab_file=beside[0], spm_model_file=beside[1],
                                         tokenizer_file=beside[2],
                                         do_lower_case=tokenizer.do_lower_case)
  ours, their_tokens = _tokens(tokenizer), _tokens(theirs)
  if ours == their_tokens:
    return
  i = next((i for i, (a, b) in enumerate(zip(ours, their_tokens)) if a != b),
           min(len(ours), len(their_tokens)))
  line = (f", line {i + 1}" if getattr(tokenizer, "vocab_file", None) and beside[0]
          else "")   # two vocab.txt files: token id i is line i + 1
  here = ours[i] if i < len(ours) else "(none)"
  there = their_tokens[i] if i < len(their_tokens) else "(none)"
  raise ValueError(
      f"Vocabulary {vocab} is not the one beside the checkpoint {checkpoint} ({theirs_path}): "
      f"{len(ours)} and {len(their_tokens)} entries, first different at token id {i}{line}: "
      f"{here!r} in {vocab}, {there!r} in {theirs_path}. The encoder learnt each id as the "
      f"checkpoint's token: pass the vocabulary it was trained with, or none ({theirs_path} is "
      "then used).")


def select_rows(arrays: Dict[str, np.ndarray], index: np.ndarray, mask: np.ndarray) -> Dict:
  batch = {k: v[index] for k, v in arrays.items()}
  batch[EXAMPLE_MASK] = mask.astype(np.float32)
  return batch


def cut_tokens(batch: Dict, length: int, names: Sequence[str]) -> Dict:
  """`batch` with the token axis (last) of the arrays in `names` cut to `length`."""
  return {k: (v[..., :length] if k in names else v) for k, v in batch.items()}


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
  # Every runtime field is declared (finetuning_defaults); a best/ saved before one existed
  # (task_config.json) keeps the field's default.
  runtime = {k: config.model[k] for k in BertConfig.RUNTIME_FIELDS if k in config.model}
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


# ----------------------------------------------------------------------------------- evaluation


class Predictor:
  """Runs the model over a whole split (`runtime.inference.BatchedInference`): fixed batch size,
  the last batch padded and masked; with `length_bucket` N > 0 rows run shortest first, each
  batch cut to a multiple of N; the outputs come back in row order, token outputs padded back."""

  def __init__(self, model, task: Task, batch_size: int, mesh, params_sharding=None,
               length_bucket: int = 0):
    """`params_sharding`: how the parameters passed in are placed (the train state's layout
    under tensor parallelism); default replicated."""
    run = lambda loss: BatchedInference(
        functools.partial(predict_step, model=model, task_loss=loss), batch_size,
        length_bucket=length_bucket, token_inputs=MODEL_INPUTS + tuple(task.token_features),
        token_outputs=task.token_outputs, pad_value=CUT_TOKEN_OUTPUT, mask_key=EXAMPLE_MASK,
        mesh=mesh, params_sharding=params_sharding)
    self._with_loss, self._without_loss = run(task.loss), run(None)
    self.batch_size = self._with_loss.batch_size

  def __call__(self, params, features: Features, with_loss: bool):
    """({output name: [rows, ...] numpy}, mean loss or None) over every row exactly once."""
    outputs = (self._with_loss if with_loss else self._without_loss)(params, features.arrays)
    loss = None
    if with_loss and outputs:
      loss = float(outputs.pop("_row_loss").sum() / max(outputs.pop("_row_weight").sum(), 1e-6))
    return outputs, loss


@dataclasses.dataclass
class _Split:
  name: str
  examples: Sequence[Any]
  features: Features


def load_split(task: Task, split: str, tokenizer, limit: int = 0) -> _Split:
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


def is_better(value: float, best: Optional[float], higher: bool) -> bool:
  """Whether an evaluation's `value` beats the `best` so far (None or NaN: any finite value)."""
  if best is None or (isinstance(best, float) and math.isnan(best)):
    return not math.isnan(value)
  return value > best if higher else value < best


def check_config(config: ml_collections.ConfigDict) -> None:
  """Fails before any work on a field no run can use, naming it."""
  config_names.check(config)

  def fail(field, why):
    raise ValueError(f"config.{field}={config[field]!r}: {why}")
  for field in ("global_batch_size", "eval_batch_size", "max_seq_length"):
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


@dataclasses.dataclass
class Inputs:
  """What a run reads before it builds anything: the checkpoint's architecture, the vocabulary
  and the splits (the checkpoint's weights are read by a fresh run's warm start)."""
  bert_config: BertConfig
  tokenizer: Any
  train: _Split
  evals: List[_Split]


def read_inputs(task: Task, config, max_train_examples: Optional[int] = None,
                evaluation: bool = True) -> Inputs:
  """The inputs of a run; `max_train_examples` (default `config.data.max_train_examples`) reads
  less; `evaluation=False` reads no data where only the shapes matter (`--compile_for`: the
  task's `shape_examples`, no evaluation split)."""
  if not config.init_checkpoint:
    raise ValueError("config.init_checkpoint is empty: give a Hugging Face directory, a Google "
                     "TF checkpoint, a save_pretrained directory or a pre-training workdir.")
  bert_config = bert_config_for(config, checkpoints.load_pretrained_config(config.init_checkpoint))
  tokenizer = create_tokenizer(config, bert_config)
  families.of(bert_config).check_length(bert_config, config.max_seq_length,
                                        config.init_checkpoint)
  start = time.time()
  if max_train_examples is None:
    max_train_examples = config.data.max_train_examples
  if evaluation:
    train = load_split(task, task.train_split, tokenizer, max_train_examples)
  else:   # the shapes only (`--compile_for`): the task's data need not be there
    examples = task.shape_examples()
    train = _Split(task.train_split, examples,
                   task.make_features(examples, tokenizer, task.train_split))
  evals = [load_split(task, s, tokenizer, config.data.max_eval_examples)
           for s in (task.eval_splits if evaluation else ())]
  print(f"[{task.name}] {len(train.examples)} training examples ({train.features.num_rows} rows), "
        + ", ".join(f"{s.name}: {len(s.examples)}" for s in evals)
        + f"; features in {time.time() - start:.1f}s", flush=True)
  return Inputs(bert_config, tokenizer, train, evals)


def num_train_steps_for(config, num_rows: int) -> int:
  """Steps of `config.num_train_epochs` passes over the rows (0 epochs: predict only)."""
  if config.num_train_epochs == 0:
    return 0
  return max(1, int(num_rows * config.num_train_epochs / config.global_batch_size))


def optimizer_for(task: Task, config, num_train_steps: int, stacked=None):
  """AdamW with warm-up over `warmup_proportion` of the steps; the frozen encoder of the
  feature-based approach gets no update (and no Adam moments). `stacked`: the parameters'
  stacked-layer leaves (`optim.stacked_layers`), for the optimizers that look at a tensor as a
  whole (StableAdamW's clipping, LAMB's trust ratio)."""
  tx, schedule = optim.build_optimizer(config.optimizer, config.learning_rate,
                                       int(num_train_steps * config.warmup_proportion),
                                       max(num_train_steps, 1), config.schedule,
                                       stacked=stacked)
  if task.freeze_encoder:
    labels = lambda params: {k: ("frozen" if k == "bert" else "train") for k in params}
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
  return tx, schedule


def _warm_start(task: Task, config, bert_config: BertConfig, tx, state, par) -> TrainState:
  """A fresh run's state: the checkpoint's encoder (and head, for a best/ directory) in place of
  the freshly initialised one; the new head keeps its initialisation."""
  _, pretrained = checkpoints.load_pretrained(config.init_checkpoint)
  if filesystem.exists(filesystem.join(config.init_checkpoint, best_model.HEAD_FILE)):
    # A fine-tuned model (a best/ directory): its head is loaded too (shapes checked here).
    pretrained = dict(pretrained, head=best_model.read_head(config.init_checkpoint))
  pretrained = families.of(bert_config).with_pooler(pretrained)
  host = jax.device_get(par.checkpointable(state))
  params, not_loaded = merge_pretrained(
      host.params, checkpoints.to_model_layout(pretrained, bert_config), task.new_params,
      config.init_checkpoint)
  print(f"[{task.name}] loaded {config.init_checkpoint}; not loaded (new): "
        + ", ".join(not_loaded), flush=True)
  return par.place_state(host.replace(params=params, opt_state=tx.init(params)))


class _BestKeeper:
  """Evaluates every eval split, logs the metrics, and keeps the best parameters in best/."""

  def __init__(self, task: Task, config, inputs: Inputs, model, trainer):
    self.task, self.config, self.inputs, self.par = task, config, inputs, trainer.par
    self.predictor = Predictor(model, task, config.eval_batch_size, self.par.mesh,
                               self.par.params_sharding(), config.length_bucket)
    self.directory = filesystem.join(trainer.workdir, best_model.BEST_DIR)
    best = best_model.read_best_info(trainer.workdir) if trainer.resumed else None
    self.value = best["value"] if best else None

  def __call__(self, state, step: int) -> Dict[str, float]:
    params = self.par.checkpointable(state).params
    primary = self.inputs.evals[0]
    record = {}
    for split in self.inputs.evals:
      _, metrics = evaluate_split(self.task, self.predictor, params, split, with_metrics=True)
      record.update({(k if split is primary else f"{split.name}_{k}"): v
                     for k, v in metrics.items()})
    value = record[self.task.best_metric]
    if is_better(value, self.value, self.task.higher_is_better):
      self.value = value
      best_model.save_best(self.directory, self.inputs.bert_config, params,
                {"step": step, "metric": self.task.best_metric, "value": value,
                 "metrics": record}, self.inputs.tokenizer, self.config)
    return record


def _train_batches(task: Task, config, train: _Split) -> Tuple[Callable[[int], Dict], "TrainOrder"]:
  """next_batch(step) for the loop: a pure function of the step (exact resume needs no input
  state), cut to its length bucket, this host's rows."""
  order = TrainOrder(train.features.num_rows, config.global_batch_size, config.seed)
  lengths = row_lengths(train.features.arrays["input_mask"])
  max_length = train.features.arrays["input_ids"].shape[-1]

  def next_batch(step: int) -> Dict[str, np.ndarray]:
    index = order.batch_index(step)
    # The cut is decided on the global batch, so every host cuts its rows alike.
    length = bucket_length(lengths[index], config.length_bucket, max_length)
    batch = cut_tokens(select_rows(train.features.arrays, index, np.ones(len(index))), length,
                       MODEL_INPUTS + tuple(task.token_features))
    return host_slice(batch, config.global_batch_size)

  return next_batch, order


def _flops(bert_config: BertConfig, features: Features):
  """(model_flops, kernel_flops): rows -> the analytic training FLOPs of a step of full rows."""
  ids = features.arrays["input_ids"]
  per_row = int(np.prod(ids.shape[1:-1]))   # [B, C, S]: C sequences per row (multiple choice)
  c, s, family = bert_config, ids.shape[-1], families.of(bert_config)
  model_flops = lambda rows: family.training_flops(c, rows=rows * per_row, seq_len=s,
                                                   predictions=0, pairs=rows * per_row)
  return model_flops, lambda rows: family.kernel_training_flops(c, rows * per_row, s)


def make_job(task: Task, config: ml_collections.ConfigDict,
             inputs: Optional[Inputs] = None) -> Job:
  """Fine-tuning `config.init_checkpoint` on `task` (runtime.job): what trains and what
  `--compile_for` compiles. `inputs` default: `read_inputs(task, config)`."""
  inputs = inputs or read_inputs(task, config)
  num_train_steps = num_train_steps_for(config, inputs.train.features.num_rows)
  model = FineTuningModel(inputs.bert_config, task.make_head(), task.output_hidden_states,
                          task.freeze_encoder)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  rows = lambda n: select_rows(inputs.train.features.arrays, np.zeros(n, np.int64), np.ones(n))
  sample = rows(1)
  # Logical axes: with config.model_parallelism > 1 the encoder and its Adam moments are sharded
  # as in pre-training (the small task heads stay replicated); their `layers` axis
  # (scan_layers) tells the optimizer where one tensor holds many layers.
  param_axes = sharding.logical_axes(model.init, {"params": init_rng}, sample)
  tx, schedule = optimizer_for(task, config, num_train_steps,
                               stacked=optim.stacked_layers(param_axes))
  next_batch, order = _train_batches(task, config, inputs.train)
  model_flops, kernel_flops = _flops(inputs.bert_config, inputs.train.features)
  batch_size = config.global_batch_size
  return Job(
      name=task.name, model=model,
      init_state=lambda: TrainState.create(
          nn.unbox(model.init({"params": init_rng}, sample)["params"]), tx),
      param_axes=param_axes,
      train_step=functools.partial(
          train_step, model=model, tx=tx, task_loss=task.loss, schedule=schedule,
          row_weight=task.row_weight, grad_accum_steps=config.grad_accum_steps),
      eval_step=functools.partial(predict_step, model=model, task_loss=task.loss),
      example_batch=rows, example_eval_batch=rows,
      model_flops=model_flops, kernel_flops=kernel_flops,
      # Checkpoints for resume: at every evaluation, and every N steps in between if asked.
      settings=LoopSettings.from_config(config, num_train_steps, keep_checkpoints=1,
                                        async_checkpointing=False,
                                        checkpoint_at_evaluations=True),
      batches=lambda: Batches(next_batch), dropout_rng=dropout_rng,
      evaluator=functools.partial(_BestKeeper, task, config, inputs, model),
      eval_at=((lambda step: step % config.eval_every_steps == 0) if config.eval_every_steps
               else order.epoch_ends_at),
      eval_first=num_train_steps == 0,   # predict only: the checkpoint as it is
      warm_start=functools.partial(_warm_start, task, config, inputs.bert_config, tx),
      throughput=Throughput(rates=lambda sums, steps, seconds: {
          "examples_per_sec": steps * batch_size / seconds}),
      console_keys=("loss", "learning_rate"))


def job(task: Task, config: ml_collections.ConfigDict, workdir: Optional[str] = None, *,
        layers: Optional[int] = None) -> Job:
  """`task`'s fine-tuning job (`tasks.registry.job`). With `workdir` (made if needed) the job a
  run trains, every input read; without, the same step from the checkpoint's architecture and
  the first 4 training examples (the feature shapes), no evaluation split read: what
  `--compile_for` compiles. `layers`: the encoder unrolled at that many layers (the cost of a
  scanned step)."""
  check_config(config)
  if workdir is None:
    inputs = read_inputs(task, config, evaluation=False)
  else:
    filesystem.makedirs(workdir)
    inputs = read_inputs(task, config)
  if layers is not None:
    inputs = dataclasses.replace(inputs, bert_config=inputs.bert_config.replace(
        num_hidden_layers=layers, scan_layers=False))
  return make_job(task, config, inputs)


def _final_results(task: Task, config, inputs: Inputs, predictor: "Predictor", par, state,
                   workdir: str, step: int, num_train_steps: int,
                   train_seconds: float) -> Dict[str, Any]:
  """Predictions of every eval and test split by the best parameters; files and results.json."""
  best_dir = filesystem.join(workdir, best_model.BEST_DIR)
  if outputs.is_writer():   # a save stopped between its renames: its complete best/ in place
    best_model.settle_best(best_dir)
  if jax.process_count() > 1:   # the other processes read best/ once it is settled
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("best/ settled")
  best = best_model.read_best_info(workdir)
  if best is None:  # every evaluation was NaN: fall back to the last parameters
    best_model.save_best(best_dir, inputs.bert_config, par.checkpointable(state).params,
              {"step": step, "metric": task.best_metric, "value": float("nan"), "metrics": {}},
              inputs.tokenizer, config)
    best = best_model.read_best_info(workdir)
  params = best_model.load_best(best_dir, inputs.bert_config)
  results: Dict[str, Any] = {
      "task": task.name, "init_checkpoint": config.init_checkpoint, "seed": config.seed,
      "best_metric": task.best_metric, "best_value": best["value"], "best_step": best["step"],
      "higher_is_better": task.higher_is_better,
      "num_train_examples": len(inputs.train.examples), "num_train_steps": num_train_steps,
      "train_seconds": round(train_seconds, 1), "files": []}

  def write(split_name, examples, predictions):
    if outputs.is_writer():  # every process predicts (a collective); process 0 writes
      results["files"] += task.write_predictions(workdir, split_name, examples, predictions)

  for split in inputs.evals:
    predictions, metrics = evaluate_split(task, predictor, params, split, with_metrics=True)
    results[split.name] = metrics
    write(split.name, split.examples, predictions)
  if config.do_predict:
    for name in task.test_splits:
      try:
        split = load_split(task, name, inputs.tokenizer)
      except FileNotFoundError as e:  # test data is optional: dev metrics are the result
        logging.warning("No %s predictions: %s", name, e)
        print(f"[{task.name}] skipping test split {name!r}: {e}", flush=True)
        continue
      predictions, _ = evaluate_split(task, predictor, params, split, with_metrics=False)
      write(name, split.examples, predictions)
  results["files"] = [filesystem.relpath(p, workdir) for p in results["files"]]
  write_results(workdir, results)
  print(f"[{task.name}] best {task.best_metric}={best['value']:.4f} at step {best['step']}; "
        f"results in {filesystem.join(workdir, RESULTS_FILE)}", flush=True)
  return results


def write_results(workdir: str, results: Dict[str, Any]) -> None:
  if outputs.is_writer():
    filesystem.write_text(filesystem.join(workdir, RESULTS_FILE),
                          json.dumps(results, indent=2, sort_keys=True))


def train_and_evaluate(task: Task, config: ml_collections.ConfigDict,
                       workdir: str) -> Dict[str, Any]:
  """Fine-tunes `config.init_checkpoint` on `task`; returns (and writes) results.json's dict.

  A run stopped by SIGTERM saves a checkpoint and returns {"preempted": True, "step": N}."""
  check_config(config)
  workdir = filesystem.absolute(workdir)
  filesystem.makedirs(workdir)
  inputs = read_inputs(task, config)
  par = parallel.create(config)
  data_parallelism = sharding.mesh_shape(config)[0]   # devices / config.model_parallelism
  if config.global_batch_size % data_parallelism:
    raise ValueError(f"config.global_batch_size={config.global_batch_size} must be divisible "
                     f"by the {data_parallelism} data-parallel devices")
  job = make_job(task, config, inputs)
  start = time.time()
  outcome = jobs.run(job, workdir, par)
  if outcome.preempted:
    return {"task": task.name, "preempted": True,
            "step": int(np.asarray(par.metrics({"s": outcome.state.step})["s"]))}
  num_train_steps = job.settings.num_steps
  return _final_results(task, config, inputs, outcome.evaluate.predictor, par, outcome.state,
                        workdir, num_train_steps, num_train_steps, time.time() - start)


def run_task(task_class: Callable[[ml_collections.ConfigDict], Task],
             config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """The runner of a fine-tuning task's `config.task`: `config.seeds` restarts of the loop."""
  return run_with_seeds(lambda c, w: train_and_evaluate(task_class(c), c, w), config, workdir)


# ----------------------------------------------------------------------------------- restarts


def seed_spread(values: Sequence[float]) -> Dict[str, float]:
  """Mean and sample standard deviation (ddof=1: a few seeds are a sample of the run-to-run
  noise, not all of it; 0 for one value), with min, max and n. Every seed summary uses it."""
  values = np.asarray(values, np.float64)
  return dict(mean=float(values.mean()),
              std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
              min=float(values.min()), max=float(values.max()), n=int(len(values)))


def run_with_seeds(run_one: Callable[[ml_collections.ConfigDict, str], Dict],
                   config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """`config.seeds` restarts (seed, seed+1, ...) in WORKDIR/seed_<s>; the best one's files are
  copied to WORKDIR and results.json gets {"seeds": {...}, "summary": {metric:
  mean/std/min/max/n/best/values}} (std: the sample standard deviation, `seed_spread`).

  With seeds=1 the run goes straight into WORKDIR (no sub-directory)."""
  count = int(config.seeds)
  if count <= 1:
    return run_one(config, workdir)
  workdir = filesystem.absolute(workdir)
  filesystem.makedirs(workdir)
  runs = {}
  for i in range(count):
    seed_config = config_names.replaced(config, {"seed": config.seed + i, "seeds": 1})
    runs[seed_config.seed] = run_one(seed_config,
                                     filesystem.join(workdir, f"seed_{seed_config.seed}"))
    if runs[seed_config.seed].get("preempted"):
      return runs[seed_config.seed]
  first = next(iter(runs.values()))
  higher = first.get("higher_is_better", True)
  pick = max if higher else min
  best_seed = pick(runs, key=lambda s: runs[s]["best_value"])
  summary: Dict[str, Dict[str, float]] = {}
  for split in (k for k, v in first.items() if isinstance(v, dict)):
    for name in (n for n in first[split] if n != "loss"):
      values = np.array([runs[s][split][name] for s in runs], np.float64)
      summary[f"{split}/{name}"] = dict(seed_spread(values),
                                        best=float(values.max() if higher else values.min()),
                                        values=values.tolist())
  for name in runs[best_seed]["files"]:
    source = filesystem.join(workdir, f"seed_{best_seed}", name)
    if outputs.is_writer() and filesystem.exists(source):
      filesystem.copy(source, filesystem.join(workdir, name))
  results = dict(runs[best_seed], best_seed=best_seed, summary=summary,
                 seeds={str(s): {k: v for k, v in r.items() if k != "files"}
                        for s, r in runs.items()})
  write_results(workdir, results)
  print(f"[{first['task']}] {count} seeds: " + ", ".join(
      f"{k} mean={v['mean']:.4f} std={v['std']:.4f} best={v['best']:.4f}"
      for k, v in summary.items() if not k.endswith("/loss")), flush=True)
  return results
