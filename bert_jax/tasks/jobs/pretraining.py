"""Pre-training: the job (`make_job`): the paper's losses, the train step, evaluation and the
tf.data inputs. It runs as every job does, `registry.run_job(config, workdir)` ->
`runtime.job.run(registry.job(config, workdir), ...)`: checkpoints and exact resume.

`train_step(state, batch, rng)` is a pure function, jitted once over the device mesh with the batch
sharded along `data`; dropout randomness is `fold_in(rng, step)`, so a resumed run draws exactly
what an uninterrupted one would. A non-finite loss or gradient leaves parameters and optimizer
state unchanged (the step is skipped and counted); the loop aborts after
`config.max_consecutive_skips` skips in a row.

Objectives (`config.objective`, spec sections 2 and 6):
  mlm_nsp  masked LM + next-sentence prediction (the paper)
  mlm      masked LM only (the "No NSP" ablation)
  ltr      left-to-right LM, no NSP: causal attention, every next token is a target

Beside it, with explicit arguments: `init_checkpoint.py` (a checkpoint's architecture and
vocabulary adopted, its weights loaded into a fresh run) and `pretraining_data.py` (the demo corpus
or the user's text files built into WORKDIR/data); `prepare` and `adopt_checkpoint` translate the
config for them.
"""
import functools
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import families
from bert_jax.io import training_checkpoints as tc
from bert_jax.model import growth, kernels, layers
from bert_jax.model.config import BertConfig
from bert_jax.parallel import sharding
from bert_jax.runtime import batch_ramp, config_names, optim, outputs
from bert_jax.runtime import step as step_core
from bert_jax.runtime.job import Batches, Job
from bert_jax.runtime.loop import LoopSettings, NonFiniteLossError, Throughput
from bert_jax.runtime.state import TrainState
from bert_jax.tasks.jobs import init_checkpoint, pretraining_data
from data_pipelines import features as F
from data_pipelines import packing

OBJECTIVES = ("mlm_nsp", "mlm", "ltr")


__all__ = ["NonFiniteLossError", "TrainState"]  # re-exported from bert_jax.runtime


# ----------------------------------------------------------------------------------- model


def bert_config_from(config: ml_collections.ConfigDict) -> BertConfig:
  """The model config a pre-training config trains: `config.model` as its family's config class,
  with causal attention for the `ltr` objective."""
  fields = dict(config.model)
  if config.objective == "ltr":
    fields["causal_attention"] = True
  return BertConfig.from_dict(fields, source="config.model")


def build_model(config: ml_collections.ConfigDict):
  """The pre-training model of the config's family (`Family.pretraining_model`): BERT's masked
  LM + NSP, or a family's masked LM alone, as the objective and the family allow."""
  if config.objective not in OBJECTIVES:
    raise ValueError(f"config.objective={config.objective!r}: expected one of {OBJECTIVES} "
                     "('' in an experiment: the model family's first)")
  bert_config = bert_config_from(config)
  family = families.of(bert_config)
  family.check_objective(config.objective)
  return family.pretraining_model(bert_config, use_nsp=config.objective == "mlm_nsp")


# ----------------------------------------------------------------------------------- losses


def weighted_cross_entropy(logits, labels, weights, kernels_spec: str = "auto"):
  """(sum of weighted nll, sum of weighted correct, sum of weights) over all positions.

  logits [..., V], labels and weights [...]. nll = -log_softmax(logits)[label]; a prediction
  counts as correct when the label's logit is the maximum (argmax up to exact ties). The
  gradient is `ops.softmax_cross_entropy`'s, written out (faster than autodiff's on CPU), unless
  `kernels_spec` (`BertConfig.kernels`) asks for the textbook form.
  """
  nll, correct = kernels.softmax_cross_entropy(logits, labels, kernels_spec)                    # [...], [...]
  return jnp.sum(nll * weights), jnp.sum(correct * weights), jnp.sum(weights)


def ltr_targets(batch) -> Tuple[jax.Array, jax.Array]:
  """Next-token labels [B, S] and weights: position t predicts token t+1 of the same sequence."""
  ids = batch["input_ids"]
  mask = batch["input_mask"].astype(jnp.float32)
  labels = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
  weights = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
  if packing.SEQUENCE_IDS in batch:   # packed rows: the last token of a sequence predicts nothing
    sequence = batch[packing.SEQUENCE_IDS]                                         # [B, S]
    same = jnp.concatenate([sequence[:, 1:] == sequence[:, :-1],
                            jnp.zeros_like(sequence[:, :1], bool)], axis=1)
    weights = weights * same
  return labels, weights


def loss_terms(model, params, batch, objective: str, rng=None, deterministic=True):
  """Sums (not means) of the loss terms, so they aggregate exactly across batches and devices."""
  example_weight = batch.get("example_weight")
  positions = None if objective == "ltr" else batch["masked_lm_positions"]
  packed = packing.SEQUENCE_IDS in batch   # packed pairs, or documents as sequences
  outputs = model.apply(
      {"params": params}, batch["input_ids"],
      packing.attention_mask(batch) if packed else batch["input_mask"], batch["segment_ids"],
      masked_lm_positions=positions, position_ids=batch.get("position_ids"),
      cls_positions=batch.get("cls_positions"), deterministic=deterministic,
      rngs=None if deterministic else {"dropout": rng})
  if objective == "ltr":
    labels, weights = ltr_targets(batch)
  else:
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"].astype(jnp.float32)
  if example_weight is not None:
    weights = weights * example_weight[:, None]
  terms = {}
  terms["mlm_nll"], terms["mlm_correct"], terms["mlm_weight"] = weighted_cross_entropy(
      outputs["mlm_logits"], labels, weights, model.config.kernels)
  if "nsp_logits" in outputs:
    if packed:  # one NSP label per packed pair, [B, K], padding pairs weighted 0
      nsp_labels, nsp_w = batch["next_sentence_labels"], batch["nsp_weights"].astype(jnp.float32)
    else:
      nsp_labels = batch["next_sentence_labels"].reshape(-1)
      nsp_w = jnp.ones(nsp_labels.shape, jnp.float32)
    if example_weight is not None:
      nsp_w = nsp_w * example_weight.astype(jnp.float32).reshape(
          example_weight.shape + (1,) * (nsp_w.ndim - 1))
    terms["nsp_nll"], terms["nsp_correct"], terms["nsp_weight"] = weighted_cross_entropy(
        outputs["nsp_logits"], nsp_labels, nsp_w, model.config.kernels)
  return terms


def loss_from_terms(terms) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """The original losses: MLM = sum(w * nll) / (sum(w) + 1e-5); NSP = mean; total = sum."""
  mlm_loss = terms["mlm_nll"] / (terms["mlm_weight"] + 1e-5)
  metrics = {"mlm_loss": mlm_loss,
             "mlm_accuracy": terms["mlm_correct"] / (terms["mlm_weight"] + 1e-5)}
  loss = mlm_loss
  if "nsp_nll" in terms:
    nsp_loss = terms["nsp_nll"] / jnp.maximum(terms["nsp_weight"], 1e-5)
    metrics.update(nsp_loss=nsp_loss,
                   nsp_accuracy=terms["nsp_correct"] / jnp.maximum(terms["nsp_weight"], 1e-5))
    loss = loss + nsp_loss
  metrics["loss"] = loss
  return loss, metrics


# ----------------------------------------------------------------------------------- step


def _target_weights(batch, objective):
  """Per-position loss weights; they depend on the data only, not the model."""
  if objective == "ltr":
    _, weights = ltr_targets(batch)
  else:
    weights = batch["masked_lm_weights"].astype(jnp.float32)
  return weights


def pretraining_objective(model, objective: str) -> step_core.Objective:
  """The paper's loss for the step core: MLM = sum(w * nll) / (sum(w) + 1e-5) and NSP = mean
  over sequences (spec), both normalised by the whole (global) batch's totals."""

  def totals(batch):
    nsp_count = (jnp.sum(batch["nsp_weights"].astype(jnp.float32)) if "nsp_weights" in batch
                 else jnp.asarray(batch["input_ids"].shape[0], jnp.float32))
    return {"mlm": jnp.sum(_target_weights(batch, objective)), "nsp": nsp_count}

  def terms(params, batch, rng):
    return loss_terms(model, params, batch, objective, rng, deterministic=False)

  def loss(t, total):
    value = t["mlm_nll"] / (total["mlm"] + 1e-5)
    if "nsp_nll" in t:
      value = value + t["nsp_nll"] / total["nsp"]
    return value

  return step_core.Objective(totals=totals, terms=terms, loss=loss,
                             metrics=lambda t: loss_from_terms(t)[1])


def train_step(state: TrainState, batch, rng, *, model, tx, objective, schedule,
               grad_accum_steps: int = 1, axis_name: Optional[str] = None,
               warmup_start_rows: int = 0):
  """One optimizer update of pre-training: `runtime.step.train_step` with the paper's loss.

  `warmup_start_rows` (the batch warm-up's start batch, all devices together; 0: off): a batch
  of k such micro-batches is accumulated over k * `grad_accum_steps` micro-batches, so a step
  on the ramp holds as much in memory at once as its first step, and the update is the whole
  batch's (`runtime.batch_ramp`). k is read from the batch's shape: one compile per k."""
  metrics = {}
  if warmup_start_rows:
    # Under pmap the step sees this device's rows; under jit the global batch.
    rows = batch["input_ids"].shape[0] * (jax.device_count() if axis_name else 1)
    multiple, rest = divmod(rows, warmup_start_rows)
    if rest or not multiple:
      raise ValueError(f"a batch of {rows} rows is not a whole number of batch warm-up "
                       f"micro-batches ({warmup_start_rows} rows)")
    grad_accum_steps *= multiple
    metrics["batch_size"] = jnp.asarray(rows, jnp.float32)
  new_state, step_metrics = step_core.train_step(
      state, batch, rng, objective=pretraining_objective(model, objective), tx=tx,
      schedule=schedule, grad_accum_steps=grad_accum_steps, axis_name=axis_name)
  return new_state, dict(step_metrics, **metrics)


def eval_step(params, batch, *, model, objective):
  """Loss-term sums of one evaluation batch (padding examples carry example_weight 0)."""
  return loss_terms(model, params, batch, objective, deterministic=True)


# ----------------------------------------------------------------------------------- state


def create_train_state(config, model, tx, rng) -> TrainState:
  params = layers.init_params(model, rng, seq_len=min(config.max_seq_length, 8))
  return TrainState.create(params, tx)


def adopt_checkpoint(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """`config.model_from_checkpoint`: the changes to `config` that make its architecture and
  tokenizer the init checkpoint's (`init_checkpoint.adopt_checkpoint`: its vocabulary and casing
  unless `config.tokenizer` names a vocabulary); empty without model_from_checkpoint. `config`
  itself is not changed."""
  if not config.model_from_checkpoint:
    return {}
  if not config.init_checkpoint:
    raise ValueError("config.model_from_checkpoint=True needs config.init_checkpoint (a Hugging "
                     "Face directory, a Google TF checkpoint, a save_pretrained directory or a "
                     "pre-training workdir)")
  tokenizer = config.tokenizer
  changes = init_checkpoint.adopt_checkpoint(
      config.init_checkpoint, config.max_seq_length, vocab_file=tokenizer.vocab_file,
      spm_model_file=tokenizer.spm_model_file, tokenizer_file=tokenizer.tokenizer_file,
      do_lower_case=tokenizer.do_lower_case)
  # config.model as a whole: the checkpoint's family's fields, the run's compute settings.
  model = {k: v for k, v in config.model.items() if k in BertConfig.RUNTIME_FIELDS}
  model.update({k[len("model."):]: changes.pop(k) for k in list(changes)
                if k.startswith("model.")})
  return dict(changes, model=model)


# ----------------------------------------------------------------------------------- loop


def evaluate(config, params, p_eval_step, par) -> Dict[str, float]:
  """Metrics over the held-out records (`config.eval_steps` batches, 0 = all of them).

  Each host reads its own shard; `p_eval_step` (from `par.compile_eval`) sums over all hosts,
  and a host whose shard ran out early feeds all-zero-weight batches until every host is done.
  """
  from data_pipelines import input_pipeline
  dataset = input_pipeline_for(config, training=False)
  blank = {k: np.zeros(spec.shape, spec.dtype.as_numpy_dtype)
           for k, spec in dataset.element_spec.items()}
  totals = None
  batches = sharding.lockstep(
      input_pipeline.PipelineIterator(dataset, source=config.data.eval_input_files,
                                      spec=record_spec(config, training=False)), blank)
  for i, batch in enumerate(batches):
    if config.eval_steps and i >= config.eval_steps:
      break
    terms = p_eval_step(params, par.put_batch(batch))
    totals = terms if totals is None else jax.tree_util.tree_map(jnp.add, totals, terms)
  if totals is None:
    raise ValueError(f"Evaluation data {config.data.eval_input_files} produced no batch")
  _, metrics = loss_from_terms(totals)
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def input_pipeline_for(config, training: bool, process_index: Optional[int] = None,
                       process_count: Optional[int] = None):
  """The tf.data pipeline for training or evaluation records, as the config describes.

  `process_index`/`process_count` default to this process's (each host reads its own shard).
  With `config.data.packing` the training batches are packed rows (evaluation never is).
  """
  from data_pipelines import input_pipeline, masking
  from bert_jax.text import tokenization
  files = config.data.input_files if training else config.data.eval_input_files
  packing_config = None
  if training and config.data.packing:
    if config.objective == "ltr":
      raise ValueError("config.data.packing needs an MLM objective (mlm_nsp or mlm): the "
                       "left-to-right targets of a packed row would cross from pair to pair")
    packing_config = packing.PackingConfig(window=config.data.packing_window,
                                           max_pairs_per_row=config.data.max_pairs_per_row)
  masking_config, special = None, None
  if config.data.masking == "dynamic" and config.objective != "ltr":
    masking_config = masking.MaskingConfig.from_mixture(
        config.data.mask_mixture, masked_lm_prob=(config.data.masked_lm_prob if training
                                                  else config.data.eval_masked_lm_prob),
        max_predictions_per_seq=config.max_predictions_per_seq,
        whole_word_mask=config.data.whole_word_mask, random_tokens=config.data.random_token_ids,
        # Held-out positions are BERT's for every recipe, as their rate is (eval_masked_lm_prob).
        selection=config.data.mask_selection if training else "count")
    tokenizer = tokenization.create_tokenizer(
        vocab_file=config.tokenizer.vocab_file or None,
        spm_model_file=config.tokenizer.spm_model_file or None,
        tokenizer_file=config.tokenizer.tokenizer_file or None,
        do_lower_case=config.tokenizer.do_lower_case)
    model_config = bert_config_from(config)
    vocabulary = (config.tokenizer.vocab_file or config.tokenizer.spm_model_file
                  or config.tokenizer.tokenizer_file)
    families.of(model_config).check_tokenizer(model_config, tokenizer, vocabulary)
    special = masking.SpecialTokens.from_tokenizer(tokenizer)
  ramp = batch_ramp.from_config(config)
  # With the batch warm-up the training input yields micro-batches of its start size (a step
  # takes as many as the ramp says: `_training_batches`).
  rows = ((ramp.start if ramp else config.global_batch_size) if training
          else config.eval_batch_size)
  return input_pipeline.create_pretraining_dataset(
      files, global_batch_size=rows,
      max_seq_length=config.max_seq_length,
      max_predictions_per_seq=config.max_predictions_per_seq, masking=masking_config,
      special=special, seed=config.seed, is_training=training,
      process_index=process_index, process_count=process_count,
      shuffle_buffer_size=config.data.shuffle_buffer_size, packing=packing_config,
      require_nsp_labels=config.objective == "mlm_nsp")


def record_spec(config, training: bool):
  """The features each training (or evaluation) record must hold, for naming a bad one."""
  from data_pipelines import input_pipeline
  return input_pipeline.feature_spec(
      config.data.input_files if training else config.data.eval_input_files,
      config.max_seq_length, config.max_predictions_per_seq)


def _pairs_in(batch) -> float:
  """Real sequences (NSP pairs) in this host's batch: one per row unless rows are packed."""
  if packing.NSP_WEIGHTS in batch:
    return float(np.sum(batch[packing.NSP_WEIGHTS]))
  return float(len(batch["input_ids"]))


def _throughput(config) -> Throughput:
  """Sequences (NSP pairs), row and real tokens per second.

  Sequences are NSP pairs (several per packed row); the global counts assume the other hosts'
  rows hold as many pairs and real tokens as this host's (exact with one host).
  """
  hosts = jax.process_count()

  def count(batch):  # host numpy: no device sync
    return {"pairs": _pairs_in(batch), "real_tokens": float(np.sum(batch["input_mask"])),
            "rows": float(len(batch["input_ids"])), "packed": float(packing.NSP_WEIGHTS in batch)}

  def rates(sums, steps, seconds):
    pairs = sums["pairs"] * hosts
    rows = sums["rows"] * hosts   # the rows each step trained (the batch warm-up varies them)
    # tokens_per_sec counts row positions (padding included); real_tokens_per_sec only the
    # non-padding tokens, the throughput that packing raises.
    rates = dict(sequences_per_sec=pairs / seconds,
                 tokens_per_sec=rows * config.max_seq_length / seconds,
                 real_tokens_per_sec=sums["real_tokens"] * hosts / seconds)
    if sums["packed"]:
      rates["pairs_per_row"] = pairs / rows
    return rates

  return Throughput(count, rates)


def prepare(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """The config the job runs in `workdir`: `config` (a copy) with the records (and a learned
  vocabulary) of the demo corpus or the text files built into WORKDIR/data filled in
  (`pretraining_data.prepare`; the workdir made if needed, any filesystem), its model config
  checked against the one an earlier run kept in the workdir (its checkpoints'); the job writes
  this run's there once it starts (`Job.record_start`)."""
  config = pretraining_data.prepare(config, workdir)
  tc.check_model_config(bert_config_from(config), workdir)   # written once the job starts
  return config


def example_batch(config, rows: int, packed: Optional[bool] = None) -> Dict[str, np.ndarray]:
  """A host batch with the shapes and dtypes the training pipeline gives the step (packed rows
  with `config.data.packing`, unless `packed` says otherwise: evaluation is never packed; rows of
  packed documents with `config.data.instances="documents"`, in training and evaluation alike)."""
  s, p = config.max_seq_length, config.max_predictions_per_seq
  ids = np.zeros((1, s), np.int32)
  ids[0, :4] = 1
  batch = {F.INPUT_IDS: ids, F.INPUT_MASK: (ids > 0).astype(np.int32),
           F.SEGMENT_IDS: np.zeros((1, s), np.int32),
           F.MASKED_LM_POSITIONS: np.zeros((1, p), np.int32),
           F.MASKED_LM_IDS: np.zeros((1, p), np.int32),
           F.MASKED_LM_WEIGHTS: np.zeros((1, p), np.float32),
           F.NEXT_SENTENCE_LABELS: np.zeros((1, 1), np.int32)}
  if config.data.instances == "documents":   # rows of packed documents, training and evaluation
    del batch[F.NEXT_SENTENCE_LABELS]
    batch[F.SEQUENCE_IDS] = batch[F.INPUT_MASK].copy()
    batch[F.POSITION_IDS] = np.arange(s, dtype=np.int32)[None] * batch[F.INPUT_MASK]
  elif config.data.packing if packed is None else packed:
    batch = packing.pack_batch(batch, config.data.max_pairs_per_row, p)
  return {k: np.repeat(v[:1], rows, axis=0) for k, v in batch.items()}


def _example_eval_batch(config, rows: int) -> Dict[str, np.ndarray]:
  batch = example_batch(config, rows, packed=False)
  batch["example_weight"] = np.ones(rows, np.float32)
  return batch


def model_flops(config, rows: int) -> float:
  """The analytic training FLOPs of a step of `rows` rows (`model.flops`)."""
  c = bert_config_from(config)
  s = config.max_seq_length
  pairs = rows * (config.data.max_pairs_per_row if config.data.packing else 1)
  return families.of(c).training_flops(c, rows=rows, seq_len=s,
                                       predictions=rows * config.max_predictions_per_seq,
                                       pairs=pairs)


class RampedBatches:
  """The batch warm-up's input: step s takes `ramp.multiple(s)` micro-batches of the start
  size from the tf.data iterator, concatenated. The checkpointed position is the iterator's
  (micro-batches); a replay to step s (a moved workdir) skips the micro-batches before it."""

  def __init__(self, iterator, ramp: batch_ramp.BatchRamp):
    self.iterator, self.ramp = iterator, ramp

  def next_batch(self, step: int):
    parts = [next(self.iterator) for _ in range(self.ramp.multiple(step))]
    if len(parts) == 1:
      return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def skip(self, steps: int) -> None:
    self.iterator.skip(self.ramp.micro_batches_before(steps))

  def save(self, directory: str) -> None:
    self.iterator.save(directory)

  def restore(self, directory: str) -> None:
    self.iterator.restore(directory)

  def close(self) -> None:
    self.iterator.close()


def _training_batches(config) -> Batches:
  """The training records through tf.data; the iterator's position is saved with checkpoints."""
  from data_pipelines import input_pipeline
  iterator = input_pipeline.PipelineIterator(lambda: input_pipeline_for(config, training=True),
                                             source=config.data.input_files,
                                             spec=record_spec(config, training=True))
  ramp = batch_ramp.from_config(config)
  if ramp is not None:
    ramped = RampedBatches(iterator, ramp)
    return Batches(ramped.next_batch, ramped)
  return Batches(lambda step: next(iterator), iterator)


def _evaluator(config, eval_step_fn):
  """trainer -> evaluate(state, step): the held-out records through the compiled eval step."""

  def evaluator(trainer):
    p_eval_step = trainer.par.compile_eval(eval_step_fn)
    return lambda state, step: evaluate(config, state.params, p_eval_step, trainer.par)

  return evaluator


def _keep_model_config(model_config: BertConfig, workdir: str) -> None:
  """WORKDIR/bert_config.json, written by process 0 once the job starts (`Job.record_start`)."""
  if outputs.is_writer():
    tc.keep_model_config(model_config, workdir)


def make_job(config: ml_collections.ConfigDict) -> Job:
  """The pre-training job `config` describes (runtime.job): what trains, what `--compile_for`
  compiles and what the benchmarks time. Nothing is read until the job runs."""
  model = build_model(config)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  # Logical axis names of the parameters: with model_parallelism > 1 or fsdp they shard the state;
  # their `layers` axis (scan_layers) tells the optimizer where one tensor holds many layers.
  param_axes = sharding.logical_axes(
      model.init, init_rng, jnp.zeros((1, min(config.max_seq_length, 8)), jnp.int32))
  tx, schedule = optim.create_optimizer(config, config.num_train_steps,
                                        stacked=optim.stacked_layers(param_axes))
  eval_fn = functools.partial(eval_step, model=model, objective=config.objective)
  evaluates = bool(config.eval_every_steps and config.data.eval_input_files)
  return Job(
      name="pretraining", model=model,
      init_state=lambda: create_train_state(config, model, tx, init_rng),
      param_axes=param_axes,
      train_step=functools.partial(train_step, model=model, tx=tx, objective=config.objective,
                                   schedule=schedule, grad_accum_steps=config.grad_accum_steps,
                                   warmup_start_rows=config.batch_warmup.start_batch_size),
      eval_step=eval_fn,
      example_batch=functools.partial(example_batch, config),
      example_eval_batch=functools.partial(_example_eval_batch, config),
      model_flops=functools.partial(model_flops, config),
      kernel_flops=lambda rows: families.of(model.config).kernel_training_flops(
          model.config, rows, config.max_seq_length),
      settings=LoopSettings.from_config(config, config.num_train_steps),
      batches=functools.partial(_training_batches, config), dropout_rng=dropout_rng,
      evaluator=_evaluator(config, eval_fn) if evaluates else None,
      eval_at=lambda step: evaluates and step % config.eval_every_steps == 0,
      # Where training starts from (continued pre-training: the released model on this corpus).
      eval_first=bool(config.eval_before_training),
      warm_start=(functools.partial(init_checkpoint.warm_start, config.init_checkpoint,
                                    bert_config_from(config), tx,
                                    tiling=config.init_tiling,
                                    optimizer_state=config.init_optimizer_state)
                  if config.init_checkpoint else None),
      record_start=functools.partial(_keep_model_config, bert_config_from(config)),
      throughput=_throughput(config),
      console_keys=("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "batch_size"))


def job_config(config: ml_collections.ConfigDict,
               workdir: Optional[str] = None) -> ml_collections.ConfigDict:
  """The config the job runs, in a copy: `config` checked, with what the init checkpoint decides
  (`adopt_checkpoint`) and, given a workdir, what WORKDIR/data decides (`prepare`)."""
  check_config(config)
  config = config_names.replaced(config, adopt_checkpoint(config))
  if not config.objective:   # the family's own (continued pre-training of any checkpoint)
    config = config_names.replaced(
        config, {"objective": families.of(bert_config_from(config)).objectives[0]})
  return prepare(config, workdir) if workdir is not None else config


def check_config(config: ml_collections.ConfigDict) -> None:
  """Fails before any work on a field that names another concept's field, or an unknown mode."""
  config_names.check(config)
  if config.init_tiling and config.init_tiling not in growth.MODES:
    raise ValueError(f"config.init_tiling={config.init_tiling!r}: expected '' or one of "
                     f"{growth.MODES}")
  if config.init_tiling and (not config.init_checkpoint or config.model_from_checkpoint):
    raise ValueError("config.init_tiling grows config.model from config.init_checkpoint: set "
                     "config.init_checkpoint (a smaller model) and keep "
                     "config.model_from_checkpoint=False")
  if config.init_tiling and config.init_optimizer_state:
    raise ValueError("config.init_optimizer_state=True carries an earlier phase's optimizer "
                     "state into a model of its size; config.init_tiling grows a smaller model, "
                     "whose optimizer state does not fit: set config.init_optimizer_state=False")
