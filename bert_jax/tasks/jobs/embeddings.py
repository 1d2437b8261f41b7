r"""Sentence embeddings: a bi-encoder fine-tuned with in-batch negatives, on the one training loop.

    python -m bert_jax.main --config=experiments/embeddings.py --workdir=DIR \
      --config.init_checkpoint=PATH --config.data.train_file=pairs.jsonl

One encoder (any family, from `config.init_checkpoint` as fine-tuning reads it) embeds queries
and documents alike (shared weights): its token states pooled as sentence-transformers pools
them (`config.embedding.pooling`: mean, cls or last; `bert_jax/model/pooling.py`). The loss is
sentence-transformers' `MultipleNegativesRankingLoss` (`bert_jax/model/ranking_loss.py`): each
query against every positive and hard negative of the *global* batch, gathered from every
data-parallel device, `config.embedding.scale` * cosine; `config.embedding.symmetric` adds the
positive -> query term. With `config.grad_cache_chunk` = C > 0 the gradient is computed by
gradient caching (`runtime/grad_cache.py`): the same gradient, C rows per device at a time, so
the batch (and with it the negatives) can be far larger than the activations that fit.

The pairs: `config.data.train_file` (JSON lines, `embedding_data.py`), or without one the demo
pairs from Python's documentation. Rows are shuffled per epoch from `config.seed`, the batch of
step s a pure function of s (a resumed run continues exactly). With `config.length_bucket` N > 0
a batch's queries and documents are each cut to the smallest multiple of N holding the batch's
longest (sentence-transformers pads to the longest too): padding changes no vector, and at most
(max_query_length / N) * (max_seq_length / N) shapes are compiled.

Evaluation: every `config.eval_every_steps` (and at the end), when `config.eval.beir_dir` is
set, the BEIR evaluation (`retrieval_evaluator`: `bert_jax/tasks/datasets/beir.py`, exact
search, pytrec_eval's nDCG@10, MRR@10 and Recall@100) scores the model, and the best by
`config.eval.best_metric` (nDCG@10) is kept in WORKDIR/best/
(`framework/best_model.py`). Without evaluation WORKDIR/best/ is the model of the last step.
Either way best/ is an encoder `load_pretrained` reads, its vocabulary, `task_config.json` and
`embedding.json` ({"pooling", "normalize", "max_seq_length"}: how to embed with it).

Shapes: B pairs in the global batch, b on one device (under pmap), K hard negatives per pair,
Sq query tokens, Sd document tokens, H hidden.
"""
import dataclasses
import functools
import json
import time
from typing import Any, Callable, Dict, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import families, parallel
from bert_jax.io import checkpoints, filesystem, sentence_transformers
from bert_jax.model import pooling, ranking_loss
from bert_jax.model.config import BertConfig
from bert_jax.parallel import sharding
from bert_jax.runtime import config_names, grad_cache, optim, outputs
from bert_jax.runtime import job as jobs
from bert_jax.runtime import step as step_core
from bert_jax.runtime.inference import BatchedInference, host_slice
from bert_jax.runtime.job import Batches, Job
from bert_jax.runtime.length_buckets import bucket_length, row_lengths
from bert_jax.runtime.loop import LoopSettings, Throughput
from bert_jax.runtime.state import TrainState
from bert_jax.tasks.datasets import beir
from bert_jax.tasks.framework import best_model, finetuning
from bert_jax.tasks.jobs import embedding_data
from bert_jax.text import pairs as text_pairs

NAME = "embeddings"
EMBEDDING_FILE = sentence_transformers.EMBEDDING_FILE   # what every command reads back
RESULTS_FILE = finetuning.RESULTS_FILE

# evaluate(encode, beir_dir, split) -> {metric: value}; encode(texts, kind) -> [N, H] float32,
# kind "query" (cut to config.data.max_query_length) or "document" (config.max_seq_length).
Encode = Callable[[Sequence[str], str], np.ndarray]
Evaluate = Callable[[Encode, str, str], Dict[str, float]]


# ----------------------------------------------------------------------------------- model


class EmbeddingModel(nn.Module):
  """A family's encoder (params `bert/...`, as in the checkpoints; no pooler) and its pooled,
  optionally unit-length, sentence vector: [N, S] token ids and padding mask -> [N, H] float32.
  Queries and documents both go through it (one set of weights)."""
  bert_config: BertConfig
  pooling: str = "mean"
  normalize: bool = False

  @nn.compact
  def __call__(self, input_ids, input_mask, deterministic: bool = True):
    encoder = families.of(self.bert_config).encoder(self.bert_config, add_pooling_layer=False,
                                                    name="bert")
    states = encoder(input_ids, input_mask, jnp.zeros_like(input_ids),
                     deterministic=deterministic)["sequence_output"]              # [N, S, H]
    return pooling.embed(states, input_mask, self.pooling, self.normalize)     # [N, H]


def model_for(config, bert_config: BertConfig) -> EmbeddingModel:
  return EmbeddingModel(bert_config, config.embedding.pooling, config.embedding.normalize)


# ----------------------------------------------------------------------------------- step


def embedding_objective(model: EmbeddingModel, scale: float, symmetric: bool,
                        axis_name: Optional[str] = None) -> step_core.Objective:
  """The ranking loss of a batch of pairs for the step core: the mean of the rows' losses over
  the global batch. Its terms factor through the embeddings (`embed`, `embedded_terms`), which
  is what gradient caching needs."""

  def embed(params, batch, rng):
    query_rng, document_rng = jax.random.split(rng)
    apply = lambda ids, mask, r: model.apply({"params": params}, ids, mask, deterministic=False,
                                             rngs={"dropout": r})
    queries = apply(batch["query_ids"], batch["query_mask"], query_rng)           # [b, H]
    rows, documents, length = batch["document_ids"].shape                       # b, 1 + K, Sd
    flat = lambda x: x.reshape(rows * documents, length)
    embedded = apply(flat(batch["document_ids"]), flat(batch["document_mask"]),
                     document_rng)                                              # [b(1 + K), H]
    return {"query": queries, "documents": embedded.reshape(rows, documents, -1)}

  def embedded_terms(embeddings, batch):
    documents = embeddings["documents"]                                         # [b, 1 + K, H]
    ranked = ranking_loss.ranking(embeddings["query"], documents[:, 0], documents[:, 1:],
                                  batch["negative_mask"], scale=scale, symmetric=symmetric,
                                  axis_name=axis_name)
    return {"loss_sum": jnp.sum(ranked["loss"]), "correct_sum": jnp.sum(ranked["correct"]),
            "pairs": jnp.float32(ranked["loss"].shape[0])}

  return step_core.Objective(
      totals=lambda batch: {"pairs": jnp.float32(batch["query_ids"].shape[0])},
      terms=lambda params, batch, rng: embedded_terms(embed(params, batch, rng), batch),
      loss=lambda terms, totals: terms["loss_sum"] / totals["pairs"],
      metrics=lambda terms: {"in_batch_accuracy": terms["correct_sum"] / terms["pairs"]},
      embed=embed, embedded_terms=embedded_terms)


def train_step(state: TrainState, batch, rng, *, model, tx, schedule, scale: float,
               symmetric: bool, grad_cache_rows: int = 0, axis_name: Optional[str] = None):
  """One optimizer update on a batch of pairs: `runtime.step.train_step` with the ranking
  loss, by gradient caching when `grad_cache_rows` > 0."""
  return step_core.train_step(state, batch, rng,
                              objective=embedding_objective(model, scale, symmetric, axis_name),
                              tx=tx, schedule=schedule, axis_name=axis_name,
                              grad_cache_rows=grad_cache_rows)


def encode_step(params, batch, *, model):
  """{"embedding": [N, H]} of one batch of texts (input_ids, input_mask): what evaluation runs
  and `--compile_for` compiles as the evaluation step."""
  return {"embedding": model.apply({"params": params}, batch["input_ids"], batch["input_mask"])}


# ----------------------------------------------------------------------------------- inputs


def embedding_settings(config) -> Dict[str, Any]:
  """The contents of `embedding.json`: how a text becomes this model's vector."""
  return {"pooling": config.embedding.pooling, "normalize": bool(config.embedding.normalize),
          "max_seq_length": int(config.max_seq_length)}


def check_config(config) -> None:
  """Fails before any work on a field no run can use, naming it."""
  config_names.check(config)

  def value(field):
    return functools.reduce(lambda c, name: c[name], field.split("."), config)

  def fail(field, why):
    raise ValueError(f"config.{field}={value(field)!r}: {why}")
  for field in ("global_batch_size", "eval_batch_size", "max_seq_length",
                "data.max_query_length"):
    if not isinstance(value(field), int) or value(field) < 1:
      fail(field, "must be a positive integer")
  if not isinstance(config.length_bucket, int) or config.length_bucket < 0:
    fail("length_bucket", "must be an integer >= 0 (0: every batch padded to its maximum lengths)")
  if config.embedding.pooling not in pooling.POOLINGS:
    fail("embedding.pooling", f"expected one of {pooling.POOLINGS}")
  if not isinstance(config.embedding.normalize, bool):
    fail("embedding.normalize", "must be True or False")
  if not config.embedding.scale > 0:
    fail("embedding.scale", "must be positive (the inverse temperature; 20 is "
         "sentence-transformers' default)")
  if not isinstance(config.grad_cache_chunk, int) or config.grad_cache_chunk < 0:
    fail("grad_cache_chunk", "must be an integer >= 0 (0: off; C: rows per device at a time)")
  if config.grad_accum_steps != 1:
    fail("grad_accum_steps", "must be 1: micro-batches would each see only their own "
         "negatives (another loss); for a batch larger than memory set config.grad_cache_chunk "
         "(gradient caching: the same loss and gradient)")
  if not isinstance(config.data.num_negatives, int) or config.data.num_negatives < -1:
    fail("data.num_negatives", "must be -1 (as many as the file's rows have) or a count >= 0")
  if not config.learning_rate > 0:
    fail("learning_rate", "must be positive")
  if not config.num_train_epochs >= 0:
    fail("num_train_epochs", "must be >= 0")
  if not 0.0 <= config.warmup_proportion < 1.0:
    fail("warmup_proportion", "must be in [0, 1)")
  if config.eval.beir_dir and config.eval_every_steps < 0:
    fail("eval_every_steps", "must be >= 0 (0: at the end only)")


def check_devices(config, data_parallelism: int) -> None:
  """The global batch split over the data-parallel devices, and each device's rows into whole
  gradient-caching chunks."""
  if config.global_batch_size % data_parallelism:
    raise ValueError(f"config.global_batch_size={config.global_batch_size} must be divisible by "
                     f"the {data_parallelism} data-parallel devices")
  if config.grad_cache_chunk:
    grad_cache.check_rows(config.global_batch_size, data_parallelism, config.grad_cache_chunk,
                          f" (config.global_batch_size={config.global_batch_size})")


@dataclasses.dataclass
class Inputs:
  """What a run reads before it builds anything: the checkpoint's architecture, the vocabulary
  (None for the shapes alone), the training arrays and the hard negatives per row."""
  bert_config: BertConfig
  tokenizer: Any
  arrays: Dict[str, np.ndarray]
  num_negatives: int
  train_file: str = ""

  @property
  def rows(self) -> int:
    return len(self.arrays["query_ids"])


def _architecture(config) -> BertConfig:
  if not config.init_checkpoint:
    raise ValueError("config.init_checkpoint is empty: give the encoder to start from (a "
                     "Hugging Face directory, a Google TF checkpoint, a save_pretrained "
                     "directory or a pre-training workdir, of any family).")
  bert_config = finetuning.bert_config_for(
      config, checkpoints.load_pretrained_config(config.init_checkpoint))
  families.of(bert_config).check_length(
      bert_config, max(config.max_seq_length, config.data.max_query_length),
      config.init_checkpoint)
  return bert_config


def read_inputs(config, workdir: str) -> Inputs:
  """The run's inputs: the checkpoint's architecture and vocabulary, the pairs file (or the
  demo pairs, written into WORKDIR/data) read, checked and tokenized."""
  bert_config = _architecture(config)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  path = embedding_data.training_file(config, workdir)
  start = time.time()
  rows = embedding_data.read_pairs(path, config.data.max_train_examples)
  k = embedding_data.negatives_per_row(config, rows)
  arrays = embedding_data.encode(tokenizer, rows, config.data.max_query_length,
                                 config.max_seq_length, k)
  print(f"[{NAME}] {len(rows)} training pairs from {path}, {k} hard negative(s) per pair; "
        f"tokenized in {time.time() - start:.1f}s", flush=True)
  return Inputs(bert_config, tokenizer, arrays, k, path)


def shape_inputs(config, rows: int = 4) -> Inputs:
  """Inputs of the right shapes without reading data or the vocabulary (`--compile_for`): the
  checkpoint's architecture, `rows` rows of `config.data.num_negatives` hard negatives each."""
  k = embedding_data.negatives_per_row(config, None)
  return Inputs(_architecture(config), None,
                embedding_data.shape_arrays(rows, config.data.max_query_length,
                                            config.max_seq_length, k), k)


def _flops(config, bert_config: BertConfig, k: int):
  """(model_flops, kernel_flops): rows -> the analytic training FLOPs of a step: the encoder on
  the queries and on 1 + K documents per pair, and the similarity matrices (forward and both
  operands' gradients). Gradient caching's second forward pass is not counted (MFU counts the
  model's work)."""
  c, family = bert_config, families.of(bert_config)
  sq, sd = config.data.max_query_length, config.max_seq_length

  def model_flops(rows: int) -> float:
    encoder = (family.training_flops(c, rows=rows, seq_len=sq, predictions=0, pairs=0)
               + family.training_flops(c, rows=rows * (1 + k), seq_len=sd, predictions=0,
                                       pairs=0))
    candidates = rows * (1 + k) + (rows if config.embedding.symmetric else 0)
    return encoder + 6.0 * rows * candidates * c.hidden_size

  def kernel_flops(rows: int) -> float:
    return (family.kernel_training_flops(c, rows, sq)
            + family.kernel_training_flops(c, rows * (1 + k), sd))
  return model_flops, kernel_flops


# ----------------------------------------------------------------------------------- evaluation


def retrieval_evaluator(config) -> Optional[Evaluate]:
  """The BEIR evaluation (`bert_jax/tasks/datasets/beir.py`: exact search, nDCG@10, MRR@10 and
  Recall@100 by pytrec_eval) of `config.eval.beir_dir`, queries cut at
  `config.data.max_query_length` and documents at `config.max_seq_length`; None (no evaluation)
  when it is empty. pytrec_eval missing: the error that names its install, before training."""
  if not config.eval.beir_dir:
    print(f"[{NAME}] config.eval.beir_dir is empty: no retrieval evaluation; WORKDIR/best/ will "
          "be the model of the last step", flush=True)
    return None
  beir.pytrec_eval()
  for name in ("corpus.jsonl", "queries.jsonl", f"qrels/{config.eval.split}.tsv"):
    if not filesystem.exists(filesystem.join(config.eval.beir_dir, name)):   # before training
      raise ValueError(f"config.eval.beir_dir={config.eval.beir_dir!r} is not a BEIR folder: "
                       f"{filesystem.join(config.eval.beir_dir, name)} is missing "
                       "(corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)")

  def evaluate(encode: Encode, beir_dir: str, split: str) -> Dict[str, float]:
    scores = beir.evaluate_beir(lambda texts: encode(texts, "document"), beir_dir, split,
                                encode_queries=lambda texts: encode(texts, "query"),
                                say=lambda line: print(f"[{NAME}] {line}", flush=True))
    return {name: float(scores[name]) for name in beir.METRICS}
  return evaluate


class TextEncoder:
  """The model being trained as `encode(texts, kind) -> [N, H]` float32 for an evaluator:
  queries cut to `config.data.max_query_length` tokens, documents to `config.max_seq_length`,
  run in batches of `config.eval_batch_size` on the run's mesh (`runtime.inference`)."""

  def __init__(self, model: EmbeddingModel, tokenizer, config, par):
    self.tokenizer, self.hidden = tokenizer, model.bert_config.hidden_size
    self.lengths = {"query": config.data.max_query_length, "document": config.max_seq_length}
    self.inference = BatchedInference(
        functools.partial(encode_step, model=model), config.eval_batch_size,
        length_bucket=config.eval.length_bucket, token_inputs=("input_ids", "input_mask"),
        mesh=par.mesh, params_sharding=par.params_sharding())

  def bound(self, params) -> Encode:
    """encode(texts, kind) with these parameters."""
    placed = self.inference.place(params)

    def encode(texts: Sequence[str], kind: str = "document") -> np.ndarray:
      if kind not in self.lengths:
        raise ValueError(f"encode(texts, kind={kind!r}): expected one of {sorted(self.lengths)}")
      texts = list(texts)
      if not texts:
        return np.zeros((0, self.hidden), np.float32)
      arrays = text_pairs.encode_pairs(self.tokenizer, texts, None, self.lengths[kind])
      arrays = {k: arrays[k] for k in ("input_ids", "input_mask")}
      return self.inference(placed, arrays)["embedding"]
    return encode


class _BestKeeper:
  """The evaluation of the loop: the retrieval evaluator on the model being trained; the best
  by `config.eval.best_metric` saved in WORKDIR/best/ with `embedding.json`."""

  def __init__(self, config, inputs: Inputs, model: EmbeddingModel, evaluate: Evaluate,
               trainer):
    self.config, self.inputs, self.evaluate, self.par = config, inputs, evaluate, trainer.par
    self.encoder = TextEncoder(model, inputs.tokenizer, config, self.par)
    self.directory = filesystem.join(trainer.workdir, best_model.BEST_DIR)
    best = best_model.read_best_info(trainer.workdir) if trainer.resumed else None
    self.value = best["value"] if best else None

  def __call__(self, state, step: int) -> Dict[str, float]:
    params = self.par.checkpointable(state).params
    scores = self.evaluate(self.encoder.bound(params), self.config.eval.beir_dir,
                           self.config.eval.split)
    metric = self.config.eval.best_metric
    if metric not in scores:
      raise ValueError(f"config.eval.best_metric={metric!r} is not among the evaluator's "
                       f"metrics {sorted(scores)}")
    record = {k: float(v) for k, v in scores.items()}
    if finetuning.is_better(record[metric], self.value, higher=True):
      self.value = record[metric]
      save_model(self.directory, self.config, self.inputs, params,
                 {"step": step, "metric": metric, "value": record[metric], "metrics": record})
    return record


def save_model(directory: str, config, inputs: Inputs, params, info: Dict) -> None:
  """WORKDIR/best/: the encoder, its vocabulary, the run's config, `embedding.json` and
  best.json (`info`), swapped in whole (`best_model.save_best`)."""
  settings = json.dumps(embedding_settings(config), indent=2, sort_keys=True) + "\n"
  best_model.save_best(directory, inputs.bert_config, params, info, inputs.tokenizer, config,
                       files={EMBEDDING_FILE: settings})


# ----------------------------------------------------------------------------------- the job


def _warm_start(config, bert_config: BertConfig, tx, state, par) -> TrainState:
  """A fresh run's state: the checkpoint's encoder in place of the random one (the checkpoint's
  pooler and pre-training heads are not used, and said so in the log)."""
  _, pretrained = checkpoints.load_pretrained(config.init_checkpoint)
  host = jax.device_get(par.checkpointable(state))
  params, _ = finetuning.merge_pretrained(
      host.params, checkpoints.to_model_layout(pretrained, bert_config), (),
      config.init_checkpoint)
  print(f"[{NAME}] loaded {config.init_checkpoint}", flush=True)
  return par.place_state(host.replace(params=params, opt_state=tx.init(params)))


def make_job(config, inputs: Inputs, evaluate: Optional[Evaluate] = None) -> Job:
  """The embedding job on `inputs` (runtime.job): what trains and what `--compile_for`
  compiles. `evaluate`: the retrieval evaluator (None: no evaluation)."""
  model = model_for(config, inputs.bert_config)
  num_train_steps = finetuning.num_train_steps_for(config, inputs.rows)
  tx, schedule = optim.build_optimizer(config.optimizer, config.learning_rate,
                                       int(num_train_steps * config.warmup_proportion),
                                       max(num_train_steps, 1), config.schedule)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  sample = embedding_data.shape_arrays(1, 8, 8, 0)
  init_args = ({"params": init_rng}, sample["query_ids"], sample["query_mask"])
  batch_size = config.global_batch_size
  order = finetuning.TrainOrder(inputs.rows, batch_size, config.seed)
  # Per text kind, its token arrays and its rows' real lengths: query [N], document [N] (the
  # longest of a pair's 1 + K documents).
  kinds = [((f"{kind}_ids", f"{kind}_mask"), row_lengths(inputs.arrays[f"{kind}_mask"]))
           for kind in ("query", "document")]

  def next_batch(step: int) -> Dict[str, np.ndarray]:
    index = order.batch_index(step)
    batch = {k: v[index] for k, v in inputs.arrays.items()}
    # The cut is decided on the global batch, so every host cuts its rows alike.
    for names, lengths in kinds:
      length = bucket_length(lengths[index], config.length_bucket, batch[names[0]].shape[-1])
      batch = finetuning.cut_tokens(batch, length, names)
    return host_slice(batch, batch_size)

  def example_batch(rows: int) -> Dict[str, np.ndarray]:
    return embedding_data.shape_arrays(rows, config.data.max_query_length,
                                       config.max_seq_length, inputs.num_negatives)

  def example_eval_batch(rows: int) -> Dict[str, np.ndarray]:
    shape = (rows, config.max_seq_length)   # documents, the longer texts an evaluator embeds
    return {"input_ids": np.zeros(shape, np.int32), "input_mask": np.ones(shape, np.int32)}

  model_flops, kernel_flops = _flops(config, inputs.bert_config, inputs.num_negatives)
  evaluates = evaluate is not None
  return Job(
      name=NAME, model=model,
      init_state=lambda: TrainState.create(nn.unbox(model.init(*init_args)["params"]), tx),
      # The encoder sharded as in pre-training with config.model_parallelism > 1 or fsdp.
      param_axes=sharding.logical_axes(model.init, *init_args),
      train_step=functools.partial(
          train_step, model=model, tx=tx, schedule=schedule, scale=config.embedding.scale,
          symmetric=config.embedding.symmetric, grad_cache_rows=config.grad_cache_chunk),
      eval_step=functools.partial(encode_step, model=model),
      example_batch=example_batch, example_eval_batch=example_eval_batch,
      model_flops=model_flops, kernel_flops=kernel_flops,
      # Checkpoints for resume: at every evaluation, and every N steps in between if asked.
      settings=LoopSettings.from_config(config, num_train_steps, async_checkpointing=False,
                                        checkpoint_at_evaluations=True),
      batches=lambda: Batches(next_batch), dropout_rng=dropout_rng,
      evaluator=(functools.partial(_BestKeeper, config, inputs, model, evaluate) if evaluates
                 else None),
      eval_at=lambda step: (evaluates and config.eval_every_steps > 0
                            and step % config.eval_every_steps == 0),
      # The checkpoint as it is: a baseline, and the best model if training does not beat it.
      eval_first=evaluates and (config.eval.before_training or num_train_steps == 0),
      warm_start=functools.partial(_warm_start, config, inputs.bert_config, tx),
      throughput=Throughput(rates=lambda sums, steps, seconds: {
          "examples_per_sec": steps * batch_size / seconds}),
      # Training lines' metrics, and an evaluation's scores on its line.
      console_keys=("loss", "in_batch_accuracy", "learning_rate") + tuple(
          dict.fromkeys((config.eval.best_metric,) + beir.METRICS)))


def _prepared(config, workdir: str) -> Inputs:
  """The workdir made and the run's inputs read, after every check that needs no data."""
  check_config(config)
  check_devices(config, sharding.mesh_shape(config)[0])
  filesystem.makedirs(workdir)
  return read_inputs(config, workdir)


def _unrolled(inputs: Inputs, layers: Optional[int]) -> Inputs:
  if layers is None:
    return inputs
  return dataclasses.replace(inputs, bert_config=inputs.bert_config.replace(
      num_hidden_layers=layers, scan_layers=False))


def job(config, workdir: Optional[str] = None, *, layers: Optional[int] = None,
        evaluate: Optional[Evaluate] = None) -> Job:
  """The embedding job (`tasks.registry.job`). With `workdir` (made if needed): the job a run
  trains, the pairs read, evaluated by `evaluate` (default: `retrieval_evaluator(config)`);
  without: the same step from the checkpoint's architecture on arrays of the configured shapes,
  nothing read but the checkpoint's config (what `--compile_for` compiles). `layers`: the
  encoder unrolled at that many layers (the cost of a scanned step)."""
  if workdir is None:
    check_config(config)
    return make_job(config, _unrolled(shape_inputs(config), layers))
  inputs = _prepared(config, filesystem.absolute(workdir))
  return make_job(config, _unrolled(inputs, layers), evaluate or retrieval_evaluator(config))


def _barrier(name: str) -> None:
  """Every process here before any goes on (what process 0 wrote is there for all)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def run(config, workdir: str, evaluate: Optional[Evaluate] = None) -> Dict[str, Any]:
  """The runner of `config.task=embeddings`: trains (resuming from the newest checkpoint), then
  makes sure WORKDIR/best/ holds the model (the best evaluated one, else the last step's) and
  writes WORKDIR/results.json. `evaluate`: the retrieval evaluator to use instead of
  `retrieval_evaluator(config)`. A run stopped by SIGTERM saves a checkpoint and returns
  {"preempted": True, "step": N}."""
  workdir = filesystem.absolute(workdir)
  inputs = _prepared(config, workdir)
  built = make_job(config, inputs, evaluate or retrieval_evaluator(config))
  par = parallel.create(config)
  start = time.time()
  outcome = jobs.run(built, workdir, par)
  step = int(np.asarray(par.metrics({"s": outcome.state.step})["s"]))
  if outcome.preempted:
    return {"task": NAME, "preempted": True, "step": step}
  best = _settled_best(config, workdir, inputs, outcome, par, step)
  results = {
      "task": NAME, "init_checkpoint": config.init_checkpoint, "train_file": inputs.train_file,
      "num_train_pairs": inputs.rows, "hard_negatives_per_pair": inputs.num_negatives,
      "num_train_steps": built.settings.num_steps, "global_batch_size": config.global_batch_size,
      "grad_cache_chunk": config.grad_cache_chunk, "embedding": embedding_settings(config),
      "best_metric": best["metric"], "best_value": best["value"], "best_step": best["step"],
      "best_metrics": best.get("metrics", {}), "last": outcome.last,
      "train_seconds": round(time.time() - start, 1)}
  finetuning.write_results(workdir, results)
  value = "" if best["value"] is None else f" {best['metric']}={best['value']:.4f}"
  print(f"[{NAME}] WORKDIR/best/: the model of step {best['step']}{value}; results in "
        f"{filesystem.join(workdir, RESULTS_FILE)}", flush=True)
  return results


def _settled_best(config, workdir: str, inputs: Inputs, outcome, par, step: int) -> Dict:
  """best.json of WORKDIR/best/ once it holds the model to use: the best evaluated one, or
  (no evaluation, or none finite) the last step's, saved now."""
  directory = filesystem.join(workdir, best_model.BEST_DIR)
  if outputs.is_writer():   # a save stopped between its renames: its complete best/ in place
    best_model.settle_best(directory)
  _barrier("best/ settled")
  best = best_model.read_best_info(workdir)
  last_step_wanted = outcome.evaluate is None and (best is None or best["step"] != step)
  if best is None or last_step_wanted:
    save_model(directory, config, inputs, par.checkpointable(outcome.state).params,
               {"step": step, "metric": None, "value": None, "metrics": {}})
    _barrier("best/ saved")
    best = best_model.read_best_info(workdir)
  return best
