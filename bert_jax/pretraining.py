"""Pre-training: the train step, evaluation, and the loop with checkpoints and exact resume.

`train_step(state, batch, rng)` is a pure function, jitted once over the device mesh with the batch
sharded along `data`; dropout randomness is `fold_in(rng, step)`, so a resumed run draws exactly
what an uninterrupted one would. A non-finite loss or gradient leaves parameters and optimizer
state unchanged (the step is skipped and counted); the loop aborts after
`config.max_consecutive_skips` skips in a row.

Objectives (`config.objective`, spec sections 2 and 6):
  mlm_nsp  masked LM + next-sentence prediction (the paper)
  mlm      masked LM only (the "No NSP" ablation)
  ltr      left-to-right LM, no NSP: causal attention, every next token is a target
"""
import functools
import os
import signal
import time
from typing import Any, Dict, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from bert_jax import checkpoints, modeling, ops, optim, parallel, sharding
from data_pipelines import packing
from bert_jax import training_checkpoints as tc
from bert_jax.config import BertConfig
from bert_jax.metric_writers import MetricWriter

OBJECTIVES = ("mlm_nsp", "mlm", "ltr")


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  consecutive_skips: jax.Array   # non-finite steps in a row (reset by a good step)
  total_skips: jax.Array


class NonFiniteLossError(RuntimeError):
  pass


# ----------------------------------------------------------------------------------- model


def bert_config_from(config: ml_collections.ConfigDict) -> BertConfig:
  fields = dict(config.model)
  if config.objective == "ltr":
    fields["causal_attention"] = True
  return BertConfig.from_dict(fields, source="config.model")


def build_model(config: ml_collections.ConfigDict) -> modeling.BertForPreTraining:
  if config.objective not in OBJECTIVES:
    raise ValueError(f"config.objective={config.objective!r}: expected one of {OBJECTIVES}")
  return modeling.BertForPreTraining(bert_config_from(config),
                                     use_nsp=config.objective == "mlm_nsp")


# ----------------------------------------------------------------------------------- losses


def weighted_cross_entropy(logits, labels, weights):
  """(sum of weighted nll, sum of weighted correct, sum of weights) over all positions.

  logits [..., V], labels and weights [...]. nll = -log_softmax(logits)[label]; a prediction
  counts as correct when the label's logit is the maximum (argmax up to exact ties). The
  gradient is `ops.softmax_cross_entropy`'s, written out (faster than autodiff's on CPU).
  """
  nll, correct = ops.softmax_cross_entropy(logits, labels)                    # [...], [...]
  return jnp.sum(nll * weights), jnp.sum(correct * weights), jnp.sum(weights)


def ltr_targets(batch) -> Tuple[jax.Array, jax.Array]:
  """Next-token labels [B, S] and weights: position t predicts token t+1 of the same sequence."""
  ids = batch["input_ids"]
  mask = batch["input_mask"].astype(jnp.float32)
  labels = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
  weights = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
  return labels, weights


def loss_terms(model, params, batch, objective: str, rng=None, deterministic=True):
  """Sums (not means) of the loss terms, so they aggregate exactly across batches and devices."""
  example_weight = batch.get("example_weight")
  positions = None if objective == "ltr" else batch["masked_lm_positions"]
  packed = "cls_positions" in batch
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
      outputs["mlm_logits"], labels, weights)
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
        outputs["nsp_logits"], nsp_labels, nsp_w)
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
  """Per-example and per-position loss weights; they depend on the data only, not the model."""
  if objective == "ltr":
    _, weights = ltr_targets(batch)
  else:
    weights = batch["masked_lm_weights"].astype(jnp.float32)
  return weights


def train_step(state: TrainState, batch, rng, *, model, tx, objective, schedule,
               grad_accum_steps: int = 1, axis_name: Optional[str] = None):
  """One optimizer update. Pure: the same (state, batch, rng) always gives the same result.

  With `grad_accum_steps` > 1 the batch is split into micro-batches whose losses are normalised by
  the *whole* batch's weight totals, so the summed gradient is the large batch's gradient exactly
  (up to float summation order), not a mean of per-micro-batch means. Under `pmap`
  (`axis_name` set) the same holds across devices: each device's loss is normalised by the global
  totals and the gradients are summed, which equals one device running the global batch.
  """
  step_rng = jax.random.fold_in(rng, state.step)
  total = (lambda x: jax.lax.psum(x, axis_name)) if axis_name else (lambda x: x)
  if axis_name:
    step_rng = jax.random.fold_in(step_rng, jax.lax.axis_index(axis_name))
  # Normalisers of the whole (global) batch (spec: MLM loss = sum(w * nll) / (sum(w) + 1e-5)).
  mlm_total = total(jnp.sum(_target_weights(batch, objective))) + 1e-5
  nsp_count = (jnp.sum(batch["nsp_weights"].astype(jnp.float32)) if "nsp_weights" in batch
               else jnp.asarray(batch["input_ids"].shape[0], jnp.float32))
  nsp_total = total(nsp_count)

  def loss_fn(params, micro_batch, micro_rng):
    terms = loss_terms(model, params, micro_batch, objective, micro_rng, deterministic=False)
    loss = terms["mlm_nll"] / mlm_total
    if "nsp_nll" in terms:
      loss = loss + terms["nsp_nll"] / nsp_total
    return loss, terms

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    (_, terms), grads = grad_fn(state.params, batch, step_rng)
  else:
    micro = jax.tree_util.tree_map(
        lambda x: x.reshape((grad_accum_steps, x.shape[0] // grad_accum_steps) + x.shape[1:]),
        batch)

    def accumulate(carry, xs):
      index, micro_batch = xs
      (_, t), g = grad_fn(state.params, micro_batch, jax.random.fold_in(step_rng, index))
      return jax.tree_util.tree_map(jnp.add, carry, (g, t)), None

    first = jax.tree_util.tree_map(lambda x: x[0], micro)
    zeros = jax.tree_util.tree_map(
        lambda s: jnp.zeros(s.shape, s.dtype),
        jax.eval_shape(lambda: (state.params, grad_fn(state.params, first, step_rng)[0][1])))
    (grads, terms), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))

  if axis_name:
    grads, terms = total((grads, terms))
  loss, metrics = loss_from_terms(terms)
  updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  # A non-finite step changes nothing but the counters.
  keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
  new_state = state.replace(
      step=state.step + 1,
      params=keep(new_params, state.params),
      opt_state=keep(new_opt_state, state.opt_state),
      consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1),
      total_skips=state.total_skips + jnp.where(finite, 0, 1))
  metrics = dict(metrics, grad_norm=grad_norm, param_norm=optax.tree.norm(new_state.params),
                 learning_rate=schedule(state.step), skipped=1.0 - finite.astype(jnp.float32))
  return new_state, metrics


def eval_step(params, batch, *, model, objective):
  """Loss-term sums of one evaluation batch (padding examples carry example_weight 0)."""
  return loss_terms(model, params, batch, objective, deterministic=True)


# ----------------------------------------------------------------------------------- state


def create_train_state(config, model, tx, rng) -> TrainState:
  params = modeling.init_params(model, rng, seq_len=min(config.max_seq_length, 8))
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    consecutive_skips=jnp.zeros((), jnp.int32),
                    total_skips=jnp.zeros((), jnp.int32))


def load_init_checkpoint(config, params):
  """Starts from a released (HF/TF) checkpoint or a phase-1 workdir; heads kept if present."""
  loaded_config, loaded = checkpoints.load_pretrained(config.init_checkpoint)
  ours = bert_config_from(config)
  for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "type_vocab_size"):
    if getattr(loaded_config, field) != getattr(ours, field):
      raise ValueError(f"init_checkpoint {config.init_checkpoint}: {field}="
                       f"{getattr(loaded_config, field)} but config.model.{field}="
                       f"{getattr(ours, field)}")
  if loaded_config.max_position_embeddings != ours.max_position_embeddings:
    raise ValueError(f"init_checkpoint {config.init_checkpoint}: max_position_embeddings differs")
  loaded = checkpoints.to_model_layout(loaded, ours)
  merged = flax.core.unfreeze(jax.tree_util.tree_map(np.asarray, params))
  merged["bert"] = loaded["bert"]
  if "cls" in loaded:
    if "seq_relationship" not in merged["cls"]:
      loaded["cls"].pop("seq_relationship", None)
    merged["cls"].update(loaded["cls"])
  else:
    logging.warning("init_checkpoint %s has no pre-training heads; they start from random "
                    "initialisation.", config.init_checkpoint)
  return jax.tree_util.tree_map(jnp.asarray, merged)


# ----------------------------------------------------------------------------------- loop


class _Preemption:
  """SIGTERM sets a flag; the loop saves at the next step boundary and exits cleanly.

  With several processes the hosts must save at the *same* step (a save is a collective), but
  each host's loop runs ahead of its devices by a different amount. There jax's preemption
  service (started by `jax.distributed.initialize`) catches SIGTERM on any host and
  `reached(step)` becomes True on every host at one agreed step: the service's C++ handler
  replaces the default one at initialisation (so no Python handler may be installed, it would
  take the signal from the service), polls for the signal once a second, and agrees on one
  more than the largest step any host has passed to `reached`, which therefore must be called
  with every step on every host (tests/test_multihost_preemption.py).
  """

  def __init__(self):
    self.requested = False
    self._previous = None
    self._multihost = jax.process_count() > 1

  def reached(self, step: int) -> bool:
    """Call once per step on every host: True when this is the step to save and stop at."""
    if self._multihost:
      from jax.experimental import multihost_utils
      self.requested = multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def __enter__(self):
    if self._multihost:  # the preemption service owns SIGTERM (see the class docstring)
      return self
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. a notebook worker): no handler
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True
    print("SIGTERM received: saving a checkpoint at the next step boundary.", flush=True)

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


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
      input_pipeline.PipelineIterator(dataset, source=config.data.eval_input_files), blank)
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
  from bert_jax import tokenization
  files = config.data.input_files if training else config.data.eval_input_files
  packing_config = None
  if training and config.data.get("packing", False):
    if config.objective == "ltr":
      raise ValueError("config.data.packing needs an MLM objective (mlm_nsp or mlm): the "
                       "left-to-right targets of a packed row would cross from pair to pair")
    packing_config = packing.PackingConfig(window=config.data.packing_window,
                                           max_pairs_per_row=config.data.max_pairs_per_row)
  masking_config, special = None, None
  if config.data.masking == "dynamic" and config.objective != "ltr":
    masking_config = masking.MaskingConfig.from_mixture(
        config.data.mask_mixture, masked_lm_prob=config.data.masked_lm_prob,
        max_predictions_per_seq=config.max_predictions_per_seq,
        whole_word_mask=config.data.whole_word_mask)
    tokenizer = tokenization.create_tokenizer(
        vocab_file=config.data.vocab_file or None,
        spm_model_file=config.data.spm_model_file or None,
        do_lower_case=config.data.do_lower_case)
    special = masking.SpecialTokens.from_tokenizer(tokenizer)
  return input_pipeline.create_pretraining_dataset(
      files, global_batch_size=config.global_batch_size if training else config.eval_batch_size,
      max_seq_length=config.max_seq_length,
      max_predictions_per_seq=config.max_predictions_per_seq, masking=masking_config,
      special=special, seed=config.seed, is_training=training,
      process_index=process_index, process_count=process_count,
      shuffle_buffer_size=config.data.shuffle_buffer_size, packing=packing_config)


def _pairs_in(batch) -> float:
  """Real sequences (NSP pairs) in this host's batch: one per row unless rows are packed."""
  if packing.NSP_WEIGHTS in batch:
    return float(np.sum(batch[packing.NSP_WEIGHTS]))
  return float(len(batch["input_ids"]))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """Pre-trains as `config` says, resuming from `workdir` if it holds a checkpoint.

  Returns the last logged training metrics (and eval metrics under `eval_*`).
  """
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  if config.data.get("prepare_demo_corpus"):
    from data_pipelines import demo_corpus
    demo_corpus.prepare(config, workdir)
  if not config.data.input_files:
    raise ValueError("config.data.input_files is empty: point it at pre-training TFRecords "
                     "(python -m data_pipelines.create_pretraining_data writes them)")

  bert_config = bert_config_from(config)
  if jax.process_index() == 0:
    bert_config.to_json_file(os.path.join(workdir, tc.BERT_CONFIG), include_runtime=True)
  model = build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  par = parallel.create(config)
  rng = jax.random.PRNGKey(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)

  # Logical axis names of the parameters: with config.model_parallelism > 1 they shard the state.
  param_axes = sharding.logical_axes(
      model.init, init_rng, jnp.zeros((1, min(config.max_seq_length, 8)), jnp.int32))
  state = par.init_state(lambda: create_train_state(config, model, tx, init_rng), param_axes)
  step_fn = functools.partial(train_step, model=model, tx=tx, objective=config.objective,
                              schedule=schedule, grad_accum_steps=config.grad_accum_steps)
  p_train_step = par.compile_step(step_fn)
  p_eval_step = par.compile_eval(functools.partial(eval_step, model=model,
                                                   objective=config.objective))

  from data_pipelines import input_pipeline
  iterator = input_pipeline.PipelineIterator(input_pipeline_for(config, training=True),
                                             source=config.data.input_files)
  checkpointer = tc.TrainingCheckpointer(workdir, keep=config.keep_checkpoints,
                                         async_save=config.async_checkpointing)
  restored_step, restored = checkpointer.restore_latest(par.abstract_state(state), iterator)
  if restored is not None:
    state = par.from_checkpoint(restored)
    print(f"Resumed from the checkpoint at step {restored_step} in {checkpointer.directory}",
          flush=True)
  elif config.init_checkpoint:
    host = jax.device_get(par.checkpointable(state))
    params = load_init_checkpoint(config, host.params)
    state = par.place_state(host.replace(params=params, opt_state=tx.init(params)))
    print(f"Initialised from {config.init_checkpoint}", flush=True)
  start_step = int(np.asarray(par.metrics({"step": state.step})["step"]))
  writer = MetricWriter(workdir, resume_step=start_step)

  last: Dict[str, float] = {}
  window_start, window_steps, window_pairs, window_tokens = time.time(), 0, 0.0, 0.0
  tokens_per_batch = config.global_batch_size * config.max_seq_length
  with _Preemption() as preemption:  # shardings are explicit in the compiled steps: no mesh context
    step = start_step
    while step < config.num_train_steps:
      batch = next(iterator)
      window_pairs += _pairs_in(batch)
      window_tokens += float(np.sum(batch["input_mask"]))   # host numpy: no device sync
      state, metrics = p_train_step(state, par.put_batch(batch), dropout_rng)
      step += 1
      window_steps += 1
      if step % config.log_every_steps == 0 or step == config.num_train_steps:
        last = {k: float(v) for k, v in par.metrics(metrics).items()}
        counters = par.metrics({"total": state.total_skips, "run": state.consecutive_skips})
        last["skipped_steps_total"] = float(counters["total"])
        elapsed = max(time.time() - window_start, 1e-9)
        # Sequences are NSP pairs (several per packed row); the global count assumes the
        # other hosts' rows hold as many pairs as this host's (exact with one host).
        pairs = window_pairs * jax.process_count()
        # tokens_per_sec counts row positions (padding included); real_tokens_per_sec only the
        # non-padding tokens, the throughput that packing raises (same multi-host estimate).
        last.update(steps_per_sec=window_steps / elapsed, sequences_per_sec=pairs / elapsed,
                    tokens_per_sec=window_steps * tokens_per_batch / elapsed,
                    real_tokens_per_sec=window_tokens * jax.process_count() / elapsed)
        if packing.NSP_WEIGHTS in batch:
          last["pairs_per_row"] = pairs / (window_steps * config.global_batch_size)
        writer.write(step, "train", last)
        writer.console(step, config.num_train_steps, "train", last)
        consecutive = int(counters["run"])
        if consecutive:
          logging.warning("Step %d: %d non-finite step(s) in a row were skipped.", step,
                          consecutive)
        if consecutive >= config.max_consecutive_skips:
          checkpointer.close()
          raise NonFiniteLossError(
              f"Aborting at step {step}: {consecutive} consecutive steps had a non-finite loss "
              f"or gradient (limit config.max_consecutive_skips={config.max_consecutive_skips}). "
              "Lower the learning rate or check the input data.")
        window_start, window_steps, window_pairs, window_tokens = time.time(), 0, 0.0, 0.0
      if config.eval_every_steps and config.data.eval_input_files and (
          step % config.eval_every_steps == 0 or step == config.num_train_steps):
        eval_metrics = evaluate(config, state.params, p_eval_step, par)
        writer.write(step, "eval", eval_metrics)
        writer.console(step, config.num_train_steps, "eval", eval_metrics)
        last.update({f"eval_{k}": v for k, v in eval_metrics.items()})
        window_start = time.time()
      preempted = preemption.reached(step)
      if (step % config.checkpoint_every_steps == 0 or step == config.num_train_steps
          or preempted):
        checkpointer.save(step, par.checkpointable(state), iterator, force=True)
      if preempted:
        checkpointer.wait()
        print(f"Preempted: checkpoint at step {step} saved; exiting.", flush=True)
        break
  checkpointer.close()
  writer.close()
  return last
