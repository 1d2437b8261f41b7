r"""Time to quality: BERT-mini pre-trained from scratch for the same wall-clock budget by bert_jax
and by `transformers` (its `Trainer`), then both checkpoints fine-tuned on GLUE with one recipe.

The full run (each stage on an otherwise idle machine, one at a time; every stage resumes when
the same command is run again after an interruption):

  python benchmarks/time_to_quality.py --prepare --out=/tmp/ttq
  python benchmarks/time_to_quality.py --side=bert_jax --budget_minutes=60 --out=/tmp/ttq
  python benchmarks/time_to_quality.py --side=transformers --budget_minutes=60 --out=/tmp/ttq
  python benchmarks/time_to_quality.py --finetune --out=/tmp/ttq
  python benchmarks/time_to_quality.py --report --out=/tmp/ttq --plot=benchmarks/time_to_quality.png

In the background, so that a stage outlives the shell: `nohup python benchmarks/time_to_quality.py
--side=bert_jax --out=/tmp/ttq > /tmp/ttq/bert_jax.log 2>&1 &` (and the same for the others).
`--finetune` and `--report` write OUT/time_to_quality.md (tables to paste into
benchmarks/RESULTS.md), OUT/time_to_quality.json and the plot (`--plot`).

Why: a faster step is only worth something if it buys quality. Both sides get the same data,
model, recipe and minutes; what differs is how many updates each side fits into them.

Needs torch, transformers, accelerate (Trainer) and matplotlib (the plot).

`--prepare` (OUT/data, once; 77 s with --dupe_factor=1 on a busy machine, several minutes at
the default 10): the corpus is every `*.txt` under `--text_dir` (../shared/data/text: 14
Gutenberg books, one sentence per line, and tinyshakespeare, raw text) plus Python's
documentation (data_pipelines/demo_corpus.py), about 1.5M words. The books have no
document boundaries, so documents are runs of at most `--sentences_per_document` consecutive
sentences, cut at chapter headings as well (a file with blank lines is raw text: split into
sentences by data_pipelines/sentences.py, speaker lines such as "ROMEO:" dropped). Documents are
shuffled with a fixed seed (so that the data builder's blocks, and the random "next" sentences
of NSP drawn within a block, mix all sources as the original's single pool did) and every
`--holdout_every`-th one is held out for evaluation. An 8,000-entry uncased WordPiece vocabulary
is learned on the training part only (why 8k: ~1.5M words hold 12.8k word types seen 5 times or
more; at 8k, words seen ~10+ times stay whole and the rest are pieces that each occur often
enough to be learned in a budget that passes over the corpus only a few times; the demo corpus
of similar size uses 8k too). Records are the original algorithm's
(`data_pipelines.create_pretraining_data`, seq 128, dupe factor 10: ~200k instances, more than
the faster side reads in 60 minutes), unmasked (dynamic masking). The held-out records are masked
once by bert_jax's evaluation pipeline (fixed seed) and stored as numpy batches
(OUT/data/eval_batches.npz): both sides are scored on exactly these batches. The training
instances are also stored as numpy (OUT/data/train_instances.npz) for the transformers side.

`--side` (OUT/<side>): BERT-mini (L=4, H=256, A=4, vocab 8k, dropout 0.1, float32) from random
initialisation, MLM + NSP, batch 64 x 128, peak lr 5e-4 (post-LN small models stall at 1e-3+,
experiments/pretrain_demo.py), linear warm-up over the first 5% of the side's steps then linear
decay to 0 at its last step, AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 except biases
and LayerNorm), gradient clipping at global norm 1.0.
  bert_jax: `bert_jax.tasks.pretraining.train_and_evaluate` as a user runs it (tf.data pipeline
    with dynamic masking, 15%, 80/10/10, at most 20 predictions per sequence; AdamW as the
    original, without bias correction; the original schedule, whose decay runs over all steps).
  transformers: `BertForPreTraining` with `transformers.Trainer` and
    `DataCollatorForLanguageModeling` (15%, 80/10/10, a Bernoulli draw per token, so no cap
    of 20), the same unmasked instances with their NSP labels, sequences padded per batch to the
    longest (its usual dynamic padding). Its usual optimizer and schedule: torch AdamW (fused,
    with bias correction), `lr_scheduler_type="linear"` (decay over the steps after warm-up).
    Its model computes MLM logits at every position, as BertForPreTraining does.
  Both schedules need a step count. Each side first measures its own speed in a short
  calibration run (`--calibration_steps` x 3 steps: the first window holds compilation or
  warm-up, the last two give steps/s), then trains for
  `num_train_steps = (budget - measured start-up) x steps/s`, so that each side's schedule ends
  at the budget (`--calibrate --side=...` prints the calibration alone). The training clock runs
  from the start of the training loop (compilation, input pipeline and logging count) and stops
  during evaluations and checkpoint saves, on both sides: bert_jax's own clock (`train_seconds`
  in metrics.jsonl: the loop waits for the steps in flight before it pauses, as JAX dispatches
  asynchronously), and a `TrainerCallback` on the transformers side. Held-out MLM loss and
  accuracy are recorded every
  ~`--eval_every_minutes` of training time to OUT/<side>/curve.jsonl: bert_jax's own
  evaluation every N steps (N = interval x calibrated steps/s), the transformers side by its
  clock. Checkpoints every ~`--checkpoint_every_minutes`: bert_jax resumes from its workdir,
  the Trainer with `resume_from_checkpoint`; the clock reached at each checkpoint is saved with
  it and a resumed run continues from there (paying compilation again, ~0.5 min).
  The transformers side ends with `save_pretrained` + vocab.txt in OUT/transformers/final.

`--finetune` (OUT/finetune/<side>/<task>): both checkpoints with one recipe, bert_jax's GLUE
fine-tuning (`bert_jax.tasks.glue.run`, what `glue.run_all` runs for each task; called per task
because a training subset applies to one task only): SST-2, MRPC, STS-B, RTE, CoLA, whole dev
sets, `--seeds` restarts, batch 32, lr 1e-4 (small models want a higher rate than BERT-base's
2e-5..5e-5), 3 epochs, warm-up 10%, max length 128, batches cut to their longest row
(`length_bucket=16`: same outputs, less padding computed). SST-2's training set is cut to the
first `--ft_train_examples` (default sst2=20000, 30%, the same label balance, 55% positive,
and sentence length as the whole set; the other training sets are whole): about 2 h for the
stage instead of ~3.5 h (estimated from BERT-mini's fine-tuning speed; `--ft_train_examples=""`
for the whole set). A finished task (OUT/finetune/<side>/<task>/ttq.json) is not run again.

Measured results: benchmarks/RESULTS.md ("Time to quality").
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import random
import re
import shutil
import sys
import time
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if __name__ == "__main__":
  # As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads: freed host memory is
  # reused instead of faulted in again. Process-wide, so both sides (each in its own process)
  # run with it; not on import (the test), where other threads run already.
  from bert_jax.runtime import host_memory
  host_memory.keep_freed_memory()

import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402

SIDES = ("bert_jax", "transformers")
COLORS = {"bert_jax": "tab:blue", "transformers": "tab:orange"}
EVAL_BATCH = 64
DATA_DONE = "DONE.json"
DEFAULT_TEXT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                "data", "text")
DEFAULT_GLUE_DIR = os.path.join(os.path.dirname(DEFAULT_TEXT_DIR), "glue")
Batch = Dict[str, np.ndarray]


# ----------------------------------------------------------------------------------- corpus

# A heading line ("Chapter 1", "CHAPTER XII.", "BOOK 3", "ACT II", "Scene 4") ends a document.
_HEADING = re.compile(r"^(chapter|book|act|scene|canto|volume|part|section)\b[\w .:-]{0,30}$",
                      re.IGNORECASE)
_BRACKETED = re.compile(r"^\[.*\]$")                     # "[ Persuasion by Jane Austen 1818 ]"
_SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,40}:$")       # "First Citizen:" (a play's speaker)


def _clean(sentence: str) -> str:
  """Tokenized-text quotes (`` and '') as plain quotes, whitespace normalised."""
  return " ".join(sentence.replace("``", '"').replace("''", '"').split())


def _chunks(sentences: Iterable[Optional[str]], size: int) -> Iterator[List[str]]:
  """Runs of at most `size` sentences; None (a heading) ends the current run."""
  run: List[str] = []
  for sentence in sentences:
    if sentence is None or len(run) >= size:
      if len(run) >= 2:
        yield run
      run = []
    if sentence:
      run.append(sentence)
  if len(run) >= 2:
    yield run


def _line_sentences(text: str) -> Iterator[Optional[str]]:
  """One sentence per line (the Gutenberg files); headings become None, bracketed notes go."""
  for line in text.splitlines():
    line = line.strip()
    if not line or _BRACKETED.match(line):
      continue
    yield None if len(line) <= 40 and _HEADING.match(line) else _clean(line)


def _raw_sentences(text: str) -> Iterator[str]:
  """Raw text with blank lines between paragraphs (tinyshakespeare): speaker lines dropped."""
  from data_pipelines.sentences import split_sentences
  kept = "\n".join(line for line in text.splitlines() if not _SPEAKER.match(line.strip()))
  for sentence in split_sentences(kept):
    yield _clean(sentence)


def text_documents(text_dir: str, sentences_per_document: int) -> Iterator[List[str]]:
  """Documents (lists of sentences) of every *.txt under `text_dir`, in sorted path order.

  A file without blank lines is one sentence per line; one with blank lines is raw text.
  """
  paths = sorted(os.path.join(root, name) for root, _, names in os.walk(text_dir)
                 for name in names if name.endswith(".txt"))
  if not paths:
    raise FileNotFoundError(f"no *.txt under {text_dir}")
  for path in paths:
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
    raw = re.search(r"\n\s*\n", text) is not None
    sentences = _raw_sentences(text) if raw else _line_sentences(text)
    yield from _chunks(sentences, sentences_per_document)


def corpus_documents(text_dir: str, demo_documents: int,
                     sentences_per_document: int) -> List[Tuple[str, List[str]]]:
  """(source, sentences) of the text files, then of the demo corpus (-1: none, 0: all)."""
  docs = [("text", d) for d in text_documents(text_dir, sentences_per_document)]
  if demo_documents >= 0:
    from data_pipelines import demo_corpus
    docs += [("python_docs", d) for d in demo_corpus.documents(demo_documents)]
  return docs


def write_corpus(docs: Sequence[Tuple[str, List[str]]], train_path: str, eval_path: str,
                 holdout_every: int, seed: int) -> Dict[str, Dict[str, int]]:
  """Shuffled documents in BERT's input format; every `holdout_every`-th to `eval_path`."""
  order = list(range(len(docs)))
  random.Random(seed).shuffle(order)
  counts: Dict[str, Dict[str, int]] = {}
  with open(train_path, "w", encoding="utf-8") as train, \
       open(eval_path, "w", encoding="utf-8") as held_out:
    for position, index in enumerate(order):
      source, sentences = docs[index]
      split = "eval" if position % holdout_every == 0 else "train"
      (held_out if split == "eval" else train).write("\n".join(sentences) + "\n\n")
      entry = counts.setdefault(split, {})
      entry[source] = entry.get(source, 0) + 1
      entry["words"] = entry.get("words", 0) + sum(len(s.split()) for s in sentences)
  return counts


# ----------------------------------------------------------------------------------- data


def data_paths(out: str) -> Dict[str, str]:
  data = os.path.join(out, "data")
  names = ("train.txt", "eval.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord",
           "eval_batches.npz", "train_instances.npz", DATA_DONE)
  return {name: os.path.join(data, name) for name in names}


def read_data_info(out: str) -> dict:
  path = data_paths(out)[DATA_DONE]
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: run --prepare first")
  with open(path) as f:
    return json.load(f)


def jax_config(args, info: dict):
  """bert_jax's pre-training config of this benchmark (steps and cadences set by the caller)."""
  from bert_jax.model.config import BertConfig
  from experiments import pretraining_defaults
  paths = data_paths(args.out)
  c = pretraining_defaults.get_config(args.size)
  shape = BertConfig.named(args.size)
  c.model.update(vocab_size=info["vocab_size"], num_hidden_layers=shape.num_hidden_layers,
                 hidden_size=shape.hidden_size, num_attention_heads=shape.num_attention_heads,
                 intermediate_size=shape.intermediate_size,
                 max_position_embeddings=max(args.seq, 512), dtype="float32",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  c.max_seq_length, c.max_predictions_per_seq = info["seq"], info["max_predictions"]
  c.global_batch_size, c.eval_batch_size = args.batch, EVAL_BATCH
  c.learning_rate, c.seed = args.lr, args.seed
  c.data.input_files, c.data.eval_input_files = paths["train.tfrecord"], paths["eval.tfrecord"]
  c.tokenizer.vocab_file, c.tokenizer.do_lower_case = paths["vocab.txt"], True
  c.data.masking = "dynamic"
  c.data.shuffle_buffer_size = 10_000
  c.eval_steps = info["eval_batches"]
  c.log_every_steps = args.log_every
  c.keep_checkpoints = 2
  return c


def eval_batches_from_pipeline(config, max_sequences: int) -> List[Batch]:
  """The first batches of bert_jax's evaluation pipeline (fixed masks), as numpy."""
  from bert_jax.tasks import pretraining
  dataset = pretraining.input_pipeline_for(config, training=False, process_index=0,
                                           process_count=1)
  count = max(1, math.ceil(max_sequences / config.eval_batch_size))
  return [dict(b) for b in dataset.take(count).as_numpy_iterator()]


def save_batches(path: str, batches: Sequence[Batch]) -> None:
  np.savez(path, **{k: np.stack([b[k] for b in batches]) for k in batches[0]})


def load_batches(path: str) -> List[Batch]:
  with np.load(path) as data:
    stacked = {k: data[k] for k in data.files}
  return [{k: v[i] for k, v in stacked.items()} for i in range(len(stacked["input_ids"]))]


def read_instances(record_path: str, seq: int) -> Dict[str, np.ndarray]:
  """The unmasked training instances as compact numpy arrays (what the Trainer's dataset holds)."""
  import tensorflow as tf
  from data_pipelines import features as F
  spec = F.dynamic_feature_spec(seq)
  parts: Dict[str, List[np.ndarray]] = {"input_ids": [], "segment_ids": [], "lengths": [],
                                        "next_sentence_labels": []}
  for batch in tf.data.TFRecordDataset(record_path).batch(4096).map(
      lambda s: tf.io.parse_example(s, spec)).as_numpy_iterator():
    parts["input_ids"].append(batch[F.INPUT_IDS].astype(np.int32))
    parts["segment_ids"].append(batch[F.SEGMENT_IDS].astype(np.int8))
    parts["lengths"].append(batch[F.INPUT_MASK].sum(axis=1).astype(np.int32))
    parts["next_sentence_labels"].append(batch[F.NEXT_SENTENCE_LABELS][:, 0].astype(np.int8))
  return {k: np.concatenate(v) for k, v in parts.items()}


def prepare(args) -> dict:
  """OUT/data: corpus, vocabulary, records, fixed eval batches, training instances (once)."""
  from bert_jax.text import tokenization
  from data_pipelines import build_vocab, create_pretraining_data
  paths = data_paths(args.out)
  if os.path.exists(paths[DATA_DONE]):
    print(f"{paths[DATA_DONE]} exists: the data is prepared", flush=True)
    return read_data_info(args.out)
  os.makedirs(os.path.dirname(paths[DATA_DONE]), exist_ok=True)
  seconds = {}
  start = time.time()
  docs = corpus_documents(args.text_dir, args.demo_documents, args.sentences_per_document)
  counts = write_corpus(docs, paths["train.txt"], paths["eval.txt"], args.holdout_every,
                        args.seed)
  seconds["corpus"] = time.time() - start
  print(f"corpus: {counts} ({seconds['corpus']:.0f} s)", flush=True)
  start = time.time()
  build_vocab.train_wordpiece([paths["train.txt"]], paths["vocab.txt"],
                              vocab_size=args.vocab_size, do_lower_case=True)
  tokenizer = tokenization.FullTokenizer(paths["vocab.txt"], do_lower_case=True)
  seconds["vocab"] = time.time() - start
  start = time.time()
  instances = {}
  for split in ("train", "eval"):
    stats = create_pretraining_data.create_pretraining_data(
        [paths[f"{split}.txt"]], [paths[f"{split}.tfrecord"]], tokenizer,
        max_seq_length=args.seq, max_predictions_per_seq=args.max_predictions,
        random_seed=args.seed, dupe_factor=args.dupe_factor if split == "train" else 1,
        masking="dynamic", num_workers=args.data_workers, progress=False)
    instances[split] = stats.instances
  seconds["records"] = time.time() - start
  print(f"records: {instances} ({seconds['records']:.0f} s)", flush=True)
  start = time.time()
  info = dict(vocab_size=tokenizer.vocab_size, seq=args.seq, max_predictions=args.max_predictions,
              seed=args.seed, eval_batches=0)
  batches = eval_batches_from_pipeline(jax_config(args, info), args.eval_sequences)
  save_batches(paths["eval_batches.npz"], batches)
  arrays = read_instances(paths["train.tfrecord"], args.seq)
  np.savez(paths["train_instances.npz"], **arrays)
  seconds["numpy"] = time.time() - start
  info.update(eval_batches=len(batches),
              eval_sequences=int(sum(b["example_weight"].sum() for b in batches)),
              eval_masked_tokens=int(sum(b["masked_lm_weights"].sum() for b in batches)),
              documents=counts, instances=instances,
              mean_train_length=float(arrays["lengths"].mean()),
              settings=dict(vocab_size=args.vocab_size, dupe_factor=args.dupe_factor,
                            holdout_every=args.holdout_every,
                            sentences_per_document=args.sentences_per_document,
                            demo_documents=args.demo_documents,
                            text_dir=os.path.abspath(args.text_dir)),
              seconds=seconds)
  with open(paths[DATA_DONE], "w") as f:
    json.dump(info, f, indent=1)
  print(json.dumps(info, indent=1), flush=True)
  return info


# ----------------------------------------------------------------------------------- schedule


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A side's speed from a short run: steps/s after the first window, and the start-up cost."""
  steps_per_sec: float
  startup_seconds: float      # the first window's time beyond what its steps take at that rate
  windows: Tuple[Tuple[int, float], ...]   # (steps, seconds) per window

  @classmethod
  def from_windows(cls, windows: Sequence[Tuple[int, float]]) -> "Calibration":
    if len(windows) < 2:
      raise ValueError("calibration needs at least 2 windows (the first holds start-up)")
    steps = sum(s for s, _ in windows[1:])
    rate = steps / sum(t for _, t in windows[1:])
    first_steps, first_seconds = windows[0]
    return cls(rate, max(0.0, first_seconds - first_steps / rate),
               tuple((int(s), float(t)) for s, t in windows))

  def steps_for(self, budget_seconds: float) -> int:
    """Steps that fill `budget_seconds` of training time, start-up included."""
    return max(1, int((budget_seconds - self.startup_seconds) * self.steps_per_sec))


def every(seconds: float, steps_per_sec: float, multiple: int = 1) -> int:
  """A step interval of about `seconds`, a multiple of `multiple` (at least one multiple)."""
  return multiple * max(1, int(round(seconds * steps_per_sec / multiple)))


@dataclasses.dataclass
class Plan:
  """What a side's run does; written once (OUT/<side>/plan.json) so a resume reuses it."""
  side: str
  budget_seconds: float
  calibration: Calibration
  num_train_steps: int
  warmup_steps: int
  eval_every_steps: int        # bert_jax only (the transformers side evaluates by its clock)
  checkpoint_every_steps: int

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, values: dict) -> "Plan":
    values = dict(values)
    calibration = values.pop("calibration")
    calibration["windows"] = tuple(tuple(w) for w in calibration["windows"])
    return cls(calibration=Calibration(**calibration), **values)


def make_plan(args, side: str, calibration: Calibration) -> Plan:
  budget = args.budget_minutes * 60.0
  steps = args.max_steps or calibration.steps_for(budget)
  rate = calibration.steps_per_sec
  multiple = args.log_every if side == "bert_jax" else 1
  return Plan(side=side, budget_seconds=budget, calibration=calibration, num_train_steps=steps,
              warmup_steps=int(round(args.warmup_proportion * steps)),
              eval_every_steps=min(steps, every(args.eval_every_minutes * 60, rate, multiple)),
              checkpoint_every_steps=min(steps, every(args.checkpoint_every_minutes * 60, rate,
                                                      multiple)))


def load_or_make_plan(args, side: str, calibrate) -> Plan:
  """The side's plan.json if a run started already (same schedule on resume), else a new one."""
  path = os.path.join(args.out, side, "plan.json")
  if os.path.exists(path):
    with open(path) as f:
      plan = Plan.from_json(json.load(f))
    print(f"[{side}] plan from {path}: {plan.num_train_steps} steps", flush=True)
    return plan
  if args.max_steps:   # a fixed step count (tests): no calibration needed
    calibration = Calibration(1.0, 0.0, ())
  else:
    calibration = calibrate()
  plan = make_plan(args, side, calibration)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(plan.to_json(), f, indent=1)
  print(f"[{side}] {calibration.steps_per_sec:.3f} steps/s, start-up "
        f"{calibration.startup_seconds:.0f} s -> {plan.num_train_steps} steps "
        f"(warm-up {plan.warmup_steps}) in {plan.budget_seconds / 60:g} min", flush=True)
  return plan


# ----------------------------------------------------------------------------------- clocks


class Clock:
  """Training time: wall clock that the caller stops around evaluations and checkpoint saves."""

  def __init__(self, seconds: float = 0.0):
    self.seconds = seconds
    self._mark: Optional[float] = None

  def start(self) -> None:
    self._mark = time.perf_counter()

  def read(self) -> float:
    """The training time up to now (the clock keeps running)."""
    now = time.perf_counter()
    if self._mark is not None:
      self.seconds += now - self._mark
    self._mark = now
    return self.seconds

  def stop(self) -> float:
    seconds = self.read()
    self._mark = None
    return seconds


def jax_curve(workdir: str) -> List[dict]:
  """bert_jax's held-out curve from its own metrics.jsonl: each evaluation with the training
  clock of the training line logged at the same step (`train_seconds`: paused during
  evaluations and checkpoints, saved with every checkpoint and continued by a resumed run; the
  lines a killed run logged after its last checkpoint are cut when it resumes)."""
  from bert_jax.runtime.metric_writers import read_metrics
  seconds = {r["step"]: r["train_seconds"] for r in read_metrics(workdir, "train")}
  curve = []
  for record in read_metrics(workdir, "eval"):
    if record["step"] not in seconds:
      raise ValueError(f"{workdir}: an evaluation at step {record['step']} has no training line "
                       "at that step (evaluate at multiples of --log_every)")
    metrics = {k: v for k, v in record.items() if k not in ("step", "split")}
    curve.append(dict(seconds=seconds[record["step"]], step=record["step"], **metrics))
  return curve


def jax_clock_marks(workdir: str) -> List[Tuple[int, float]]:
  """(step, training seconds) at the start and at every logged step (what calibration reads)."""
  from bert_jax.runtime.metric_writers import read_metrics
  return [(0, 0.0)] + [(r["step"], r["train_seconds"]) for r in read_metrics(workdir, "train")]


# ----------------------------------------------------------------------------------- bert_jax


def calibrate_jax(args, info: dict) -> Calibration:
  """bert_jax's speed: `train_and_evaluate` for 3 logging windows of `calibration_steps`."""
  from bert_jax.tasks import pretraining
  k = args.calibration_steps
  config = jax_config(args, info)
  config.num_train_steps, config.warmup_steps, config.log_every_steps = 3 * k, k, k
  config.eval_every_steps, config.checkpoint_every_steps = 0, 0
  directory = os.path.join(args.out, "bert_jax", "calibration")
  shutil.rmtree(directory, ignore_errors=True)
  pretraining.train_and_evaluate(config, os.path.join(directory, "workdir"))
  marks = jax_clock_marks(os.path.join(directory, "workdir"))
  shutil.rmtree(directory, ignore_errors=True)
  return Calibration.from_windows([(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])])


def score_jax(config, params, batches: Sequence[Batch]) -> Dict[str, float]:
  """bert_jax's evaluation step summed over `batches` (the cross-check of the curve's data)."""
  import jax
  from bert_jax.tasks import pretraining
  model = pretraining.build_model(config)
  step = jax.jit(functools.partial(pretraining.eval_step, model=model,
                                   objective=config.objective))
  totals = None
  for batch in batches:
    terms = step(params, batch)
    totals = terms if totals is None else jax.tree_util.tree_map(lambda a, b: a + b, totals,
                                                                  terms)
  _, metrics = pretraining.loss_from_terms(totals)
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def jax_params_from_workdir(workdir: str):
  from bert_jax.io import checkpoints
  bert_config, params = checkpoints.load_params_from_workdir(workdir)
  return checkpoints.to_model_layout(params, bert_config)


def run_jax(args) -> dict:
  """Pre-trains with bert_jax's `train_and_evaluate` (resuming from OUT/bert_jax/workdir)."""
  from bert_jax.tasks import pretraining
  info = read_data_info(args.out)
  side_dir = os.path.join(args.out, "bert_jax")
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[bert_jax] {side_dir}/summary.json exists: done", flush=True)
    with open(os.path.join(side_dir, "summary.json")) as f:
      return json.load(f)
  plan = load_or_make_plan(args, "bert_jax", lambda: calibrate_jax(args, info))
  config = jax_config(args, info)
  config.num_train_steps, config.warmup_steps = plan.num_train_steps, plan.warmup_steps
  config.eval_every_steps = plan.eval_every_steps
  config.checkpoint_every_steps = plan.checkpoint_every_steps
  workdir = os.path.join(side_dir, "workdir")
  os.makedirs(workdir, exist_ok=True)
  # Fine-tuning finds the vocabulary beside the checkpoint: the workdir is self-contained.
  shutil.copy(data_paths(args.out)["vocab.txt"], os.path.join(workdir, "vocab.txt"))
  start = time.time()
  result = pretraining.train_and_evaluate(config, workdir)
  curve = jax_curve(workdir)
  write_jsonl(os.path.join(side_dir, "curve.jsonl"), curve)
  if result.get("preempted"):
    print("[bert_jax] preempted: run the same command again to resume", flush=True)
    return result
  batches = load_batches(data_paths(args.out)["eval_batches.npz"])
  check = score_jax(config, jax_params_from_workdir(workdir), batches)
  if curve and abs(check["mlm_loss"] - curve[-1]["mlm_loss"]) > 1e-4 * abs(check["mlm_loss"]):
    print(f"WARNING: bert_jax's evaluation ({curve[-1]['mlm_loss']:.5f}) and the fixed batches "
          f"({check['mlm_loss']:.5f}) disagree: the curves are not on the same data", flush=True)
  summary = dict(side="bert_jax", plan=plan.to_json(), steps=plan.num_train_steps,
                 sequences=plan.num_train_steps * args.batch,
                 train_seconds=curve[-1]["seconds"] if curve else None,
                 final=curve[-1] if curve else None, npz_check=check,
                 checkpoint=workdir, wall_seconds_this_call=time.time() - start,
                 machine=bench_util.machine_line())
  write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary


# ----------------------------------------------------------------------------------- transformers


def hf_tokenizer(vocab_file: str):
  import transformers
  return transformers.BertTokenizerFast(vocab_file=vocab_file, do_lower_case=True)


def hf_model(args, info: dict, seed: int):
  """A fresh `BertForPreTraining` of the benchmark's shape (transformers' own initialisation)."""
  import transformers
  from bert_jax.model.config import BertConfig
  shape = BertConfig.named(args.size)
  transformers.set_seed(seed)
  config = transformers.BertConfig(
      vocab_size=info["vocab_size"], hidden_size=shape.hidden_size,
      num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
      intermediate_size=shape.intermediate_size, max_position_embeddings=max(args.seq, 512),
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2)
  return transformers.BertForPreTraining(config)


class InstanceDataset:
  """The unmasked training instances, one dict per example as the collator expects them."""

  def __init__(self, path: str, cls_id: int, sep_id: int):
    with np.load(path) as data:
      self.arrays = {k: data[k] for k in data.files}
    self.cls_id, self.sep_id = cls_id, sep_id

  def __len__(self) -> int:
    return len(self.arrays["lengths"])

  def __getitem__(self, i: int) -> dict:
    n = int(self.arrays["lengths"][i])
    ids = self.arrays["input_ids"][i, :n]
    special = (ids == self.cls_id) | (ids == self.sep_id)
    return {"input_ids": ids.tolist(), "token_type_ids": self.arrays["segment_ids"][i, :n].tolist(),
            "attention_mask": [1] * n, "special_tokens_mask": special.astype(np.int64).tolist(),
            "next_sentence_label": int(self.arrays["next_sentence_labels"][i])}


def score_torch(model, batches: Sequence[Batch]) -> Dict[str, float]:
  """bert_jax's evaluation metrics for a `BertForPreTraining` on the fixed eval batches.

  MLM: sum(w * nll) / sum(w) over masked_lm_positions, accuracy = argmax hits; NSP: mean over
  real rows (example_weight), as `bert_jax.tasks.pretraining.loss_from_terms`.
  """
  import torch
  import torch.nn.functional as F
  was_training = model.training
  model.eval()
  sums = dict(mlm_nll=0.0, mlm_correct=0.0, mlm_weight=0.0, nsp_nll=0.0, nsp_correct=0.0,
              nsp_weight=0.0)
  tensor = lambda b, name: torch.from_numpy(np.asarray(b[name]).astype(np.int64))
  with torch.no_grad():
    for b in batches:
      out = model.bert(input_ids=tensor(b, "input_ids"), attention_mask=tensor(b, "input_mask"),
                       token_type_ids=tensor(b, "segment_ids"), return_dict=True)
      sequence = out.last_hidden_state
      positions = tensor(b, "masked_lm_positions")
      gathered = torch.gather(sequence, 1,
                              positions[..., None].expand(-1, -1, sequence.shape[-1]))
      mlm_logits, nsp_logits = model.cls(gathered, out.pooler_output)
      labels = tensor(b, "masked_lm_ids")
      weights = torch.from_numpy(np.asarray(b["masked_lm_weights"], np.float32))
      nll = F.cross_entropy(mlm_logits.flatten(0, 1), labels.flatten(), reduction="none")
      hits = (mlm_logits.argmax(-1) == labels).float().flatten()
      sums["mlm_nll"] += float((nll * weights.flatten()).sum())
      sums["mlm_correct"] += float((hits * weights.flatten()).sum())
      sums["mlm_weight"] += float(weights.sum())
      rows = torch.from_numpy(np.asarray(b["example_weight"], np.float32))
      nsp_labels = tensor(b, "next_sentence_labels").reshape(-1)
      nsp_nll = F.cross_entropy(nsp_logits, nsp_labels, reduction="none")
      sums["nsp_nll"] += float((nsp_nll * rows).sum())
      sums["nsp_correct"] += float(((nsp_logits.argmax(-1) == nsp_labels).float() * rows).sum())
      sums["nsp_weight"] += float(rows.sum())
  model.train(was_training)
  mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
  nsp_loss = sums["nsp_nll"] / max(sums["nsp_weight"], 1e-5)
  return dict(mlm_loss=mlm_loss, mlm_accuracy=sums["mlm_correct"] / (sums["mlm_weight"] + 1e-5),
              nsp_loss=nsp_loss, nsp_accuracy=sums["nsp_correct"] / max(sums["nsp_weight"], 1e-5),
              loss=mlm_loss + nsp_loss)


def _callback_base():
  import transformers
  return transformers.TrainerCallback


def make_step_times():
  """A TrainerCallback (calibration) noting the time at the start and at every step's end."""
  base = _callback_base()

  class StepTimes(base):
    def __init__(self):
      self.start, self.ends = None, []

    def on_train_begin(self, args, state, control, **kwargs):
      self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
      self.ends.append(time.perf_counter())

  return StepTimes()


def make_wall_clock(curve_path: str, batches: Sequence[Batch], eval_every_seconds: float,
                    prior_seconds: float = 0.0, next_eval: Optional[float] = None,
                    last_eval_step: int = -1):
  """A TrainerCallback keeping training time (without its evaluations and Trainer's saves),
  scoring the model on `batches` every `eval_every_seconds` of it and at the end, and saving its
  state with every checkpoint (`clock.json` in the checkpoint folder) for a resumed run.
  """
  base = _callback_base()

  class WallClock(base):
    def __init__(self):
      self.clock = Clock(prior_seconds)
      self.at_step_end = prior_seconds
      self.next_eval = eval_every_seconds if next_eval is None else next_eval
      self.last_eval_step = last_eval_step

    @property
    def seconds(self) -> float:
      return self.clock.seconds

    def _evaluate(self, state, model, seconds):
      metrics = score_torch(model, batches)
      append_jsonl(curve_path, dict(seconds=seconds, step=state.global_step, **metrics))
      print(f"[transformers] eval step {state.global_step} ({seconds / 60:.1f} min): "
            f"mlm_loss={metrics['mlm_loss']:.4f} mlm_accuracy={metrics['mlm_accuracy']:.4f}",
            flush=True)
      self.last_eval_step = state.global_step

    def on_train_begin(self, args, state, control, **kwargs):
      self.clock.start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
      self.at_step_end = seconds = self.clock.read()
      if seconds >= self.next_eval:
        self.clock.stop()
        self._evaluate(state, model, seconds)
        while self.next_eval <= seconds:
          self.next_eval += eval_every_seconds
        self.clock.start()

    def on_save(self, args, state, control, **kwargs):
      # Trainer logs and saves after on_step_end, then calls this: that time is not counted.
      self.clock = Clock(self.at_step_end)
      folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
      write_json(os.path.join(folder, "clock.json"),
                 dict(seconds=self.seconds, next_eval=self.next_eval, step=state.global_step))
      self.clock.start()

    def on_train_end(self, args, state, control, model=None, **kwargs):
      self.clock = Clock(self.at_step_end)
      if self.last_eval_step != state.global_step:
        self._evaluate(state, model, self.seconds)

  return WallClock()


def hf_training_args(args, output_dir: str, plan: Optional[Plan], max_steps: int,
                     warmup_steps: int):
  import transformers
  save = dict(save_strategy="no") if plan is None else dict(
      save_strategy="steps", save_steps=plan.checkpoint_every_steps, save_total_limit=2)
  return transformers.TrainingArguments(
      output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=args.batch,
      learning_rate=args.lr, warmup_steps=warmup_steps, lr_scheduler_type="linear",
      weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6, max_grad_norm=1.0,
      logging_steps=args.log_every, report_to=[], use_cpu=True, dataloader_num_workers=0,
      seed=args.seed, disable_tqdm=True, remove_unused_columns=False, **save)


def hf_trainer(args, info: dict, training_args, callbacks):
  import transformers
  paths = data_paths(args.out)
  tokenizer = hf_tokenizer(paths["vocab.txt"])
  dataset = InstanceDataset(paths["train_instances.npz"], tokenizer.cls_token_id,
                            tokenizer.sep_token_id)
  collator = transformers.DataCollatorForLanguageModeling(
      tokenizer, mlm=True, mlm_probability=0.15, mask_replace_prob=0.8, random_replace_prob=0.1)
  model = hf_model(args, info, args.seed)
  trainer = transformers.Trainer(model=model, args=training_args, train_dataset=dataset,
                                 data_collator=collator, callbacks=callbacks)
  return trainer, tokenizer


def _quiet_transformers():
  import transformers
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()


def calibrate_hf(args, info: dict) -> Calibration:
  """The Trainer's speed: 3 windows of `calibration_steps` steps of the same setup."""
  k = args.calibration_steps
  directory = os.path.join(args.out, "transformers", "calibration")
  shutil.rmtree(directory, ignore_errors=True)
  times = make_step_times()
  trainer, _ = hf_trainer(args, info, hf_training_args(args, directory, None, 3 * k, k), [times])
  trainer.train()
  marks = [times.start] + [times.ends[i * k - 1] for i in (1, 2, 3)]
  shutil.rmtree(directory, ignore_errors=True)
  return Calibration.from_windows([(k, b - a) for a, b in zip(marks, marks[1:])])


def run_hf(args) -> dict:
  """Pre-trains `BertForPreTraining` with `transformers.Trainer` (resuming its checkpoints)."""
  import torch
  from transformers.trainer_utils import get_last_checkpoint
  _quiet_transformers()
  torch.set_num_threads(args.threads)
  info = read_data_info(args.out)
  side_dir = os.path.join(args.out, "transformers")
  final_dir = os.path.join(side_dir, "final")
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[transformers] {side_dir}/summary.json exists: done", flush=True)
    with open(os.path.join(side_dir, "summary.json")) as f:
      return json.load(f)
  plan = load_or_make_plan(args, "transformers", lambda: calibrate_hf(args, info))
  output_dir = os.path.join(side_dir, "trainer")
  os.makedirs(output_dir, exist_ok=True)
  curve_path = os.path.join(side_dir, "curve.jsonl")
  resume = get_last_checkpoint(output_dir)
  prior = dict(seconds=0.0, next_eval=None, step=0)
  if resume:
    with open(os.path.join(resume, "clock.json")) as f:
      prior = json.load(f)
    print(f"[transformers] resuming from {resume} ({prior['seconds'] / 60:.1f} min trained)",
          flush=True)
  # The curve keeps the rows of the steps the resumed state has (as bert_jax's metrics.jsonl).
  kept = [r for r in read_jsonl(curve_path) if r["step"] <= prior["step"]]
  write_jsonl(curve_path, kept)
  batches = load_batches(data_paths(args.out)["eval_batches.npz"])
  clock = make_wall_clock(curve_path, batches, args.eval_every_minutes * 60, prior["seconds"],
                          prior["next_eval"], kept[-1]["step"] if kept else -1)
  training_args = hf_training_args(args, output_dir, plan, plan.num_train_steps,
                                   plan.warmup_steps)
  trainer, tokenizer = hf_trainer(args, info, training_args, [clock])
  start = time.time()
  trainer.train(resume_from_checkpoint=resume)
  trainer.save_model(final_dir)
  tokenizer.save_pretrained(final_dir)
  # transformers 5 writes tokenizer.json only; bert_jax's fine-tuning reads vocab.txt.
  shutil.copy(data_paths(args.out)["vocab.txt"], os.path.join(final_dir, "vocab.txt"))
  curve = read_jsonl(curve_path)
  summary = dict(side="transformers", plan=plan.to_json(), steps=plan.num_train_steps,
                 sequences=plan.num_train_steps * args.batch, train_seconds=clock.seconds,
                 final=curve[-1] if curve else None, checkpoint=final_dir,
                 wall_seconds_this_call=time.time() - start, torch_threads=torch.get_num_threads(),
                 machine=bench_util.machine_line())
  write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary


# ----------------------------------------------------------------------------------- fine-tuning


def parse_subsets(spec: str) -> Dict[str, int]:
  """'sst2=20000,cola=0' -> {'sst2': 20000, 'cola': 0} (0 or absent: the whole training set)."""
  out = {}
  for item in filter(None, (spec or "").split(",")):
    name, _, value = item.partition("=")
    out[name.strip()] = int(value)
  return out


def checkpoint_of(args, side: str) -> str:
  if side == "bert_jax":
    return os.path.join(args.out, "bert_jax", "workdir")
  return os.path.join(args.out, "transformers", "final")


def glue_config(args, side: str, task: str, train_examples: int):
  """One recipe for both checkpoints: bert_jax's GLUE fine-tuning."""
  from experiments import glue as glue_experiment
  c = glue_experiment.get_config(f"task={task},seeds={args.seeds}")
  c.init_checkpoint = checkpoint_of(args, side)
  c.tokenizer.vocab_file, c.tokenizer.do_lower_case = data_paths(args.out)["vocab.txt"], True
  c.data.glue_dir = args.glue_dir
  c.max_seq_length, c.length_bucket = args.ft_max_seq, args.ft_length_bucket
  c.global_batch_size, c.eval_batch_size = args.ft_batch, 64
  c.learning_rate, c.num_train_epochs = args.ft_lr, float(args.ft_epochs)
  c.data.max_train_examples, c.data.max_eval_examples = train_examples, 0
  c.do_predict = False
  c.log_every_steps = 100
  c.seed = args.seed
  return c


def seed_devs(result: dict) -> List[Dict[str, float]]:
  """The dev metrics of each seed of a `glue.run` result (one run when seeds=1)."""
  if "seeds" not in result:
    return [result["dev"]]
  return [r["dev"] for _, r in sorted(result["seeds"].items(), key=lambda kv: int(kv[0]))]


def finetune(args) -> dict:
  """Every task for both checkpoints; a finished task (its ttq.json) is not run again."""
  from bert_jax.tasks import glue
  subsets = parse_subsets(args.ft_train_examples)
  results = {}
  for side in SIDES:
    if not os.path.exists(checkpoint_of(args, side)):
      raise FileNotFoundError(f"{checkpoint_of(args, side)} not found: run --side={side} first")
  # Task by task, both sides each: a stage cut short still leaves whole rows of the table.
  for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
    for side in SIDES:
      workdir = os.path.join(args.out, "finetune", side, task)
      done = os.path.join(workdir, "ttq.json")
      if os.path.exists(done):
        with open(done) as f:
          results.setdefault(side, {})[task] = json.load(f)
        continue
      start = time.time()
      result = glue.run(glue_config(args, side, task, subsets.get(task, 0)), workdir)
      if result.get("preempted"):
        sys.exit(f"[{side} {task}] preempted: run the same command again to resume")
      spec = glue.spec_for(task)
      devs = seed_devs(result)
      entry = dict(scores=[glue.task_score(dev, spec) for dev in devs],
                   metrics=list(spec.metrics),
                   dev={m: [dev[m] for dev in devs] for m in spec.metrics},
                   train_examples=subsets.get(task, 0), seconds=time.time() - start)
      write_json(done, entry)
      results.setdefault(side, {})[task] = entry
      print(f"[{side} {task}] scores {entry['scores']} ({entry['seconds']:.0f} s)", flush=True)
  return results


def collect_finetune(args) -> Dict[str, Dict[str, dict]]:
  results: Dict[str, Dict[str, dict]] = {}
  for side in SIDES:
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
      path = os.path.join(args.out, "finetune", side, task, "ttq.json")
      if os.path.exists(path):
        with open(path) as f:
          results.setdefault(side, {})[task] = json.load(f)
  return results


# ----------------------------------------------------------------------------------- report


def average_scores(per_task: Dict[str, dict]) -> List[float]:
  """Per seed, the mean over tasks of the task scores (seed i of every task together)."""
  seeds = min(len(e["scores"]) for e in per_task.values())
  return [float(np.mean([e["scores"][i] for e in per_task.values()])) for i in range(seeds)]


def last_within(curve: Sequence[dict], budget_seconds: float) -> Optional[dict]:
  """The last held-out evaluation at or before the budget. A side's steps come from a short
  calibration, and its sustained rate can differ (bert_jax's first run: 0.64 steps/s sustained
  against 0.72 calibrated, 67 minutes instead of 60): this column compares both at the budget."""
  inside = [row for row in curve if row["seconds"] <= budget_seconds]
  return inside[-1] if inside else None


def read_side(args, side: str) -> dict:
  side_dir = os.path.join(args.out, side)
  out = dict(curve=read_jsonl(os.path.join(side_dir, "curve.jsonl")))
  path = os.path.join(side_dir, "summary.json")
  if os.path.exists(path):
    with open(path) as f:
      out["summary"] = json.load(f)
  return out


def plot_curves(curves: Dict[str, List[dict]], path: str) -> Optional[str]:
  """Held-out MLM loss (and accuracy) vs training minutes, both sides (matplotlib PNG)."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib is not installed: no plot (pip install matplotlib)", flush=True)
    return None
  fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
  for side, rows in curves.items():
    if not rows:
      continue
    minutes = [r["seconds"] / 60 for r in rows]
    loss_ax.plot(minutes, [r["mlm_loss"] for r in rows], marker="o", markersize=3,
                 color=COLORS[side], label=side)
    acc_ax.plot(minutes, [r["mlm_accuracy"] for r in rows], marker="o", markersize=3,
                color=COLORS[side], label=side)
  loss_ax.set(xlabel="training wall clock (minutes)", ylabel="held-out MLM loss",
              title="Held-out masked-LM loss")
  acc_ax.set(xlabel="training wall clock (minutes)", ylabel="held-out MLM accuracy",
             title="Held-out masked-LM accuracy")
  for ax in (loss_ax, acc_ax):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _pm(s: dict) -> str:
  return f"{s['mean']:.1f} +- {s['std']:.1f}"


def describe_documents(documents: Dict[str, Dict[str, int]]) -> str:
  """'training: 1,083 book + 2,112 Python-docs documents, 1,434,218 words; held out: ...'."""
  parts = []
  for split, label in (("train", "training"), ("eval", "held out")):
    counts = documents.get(split, {})
    parts.append(f"{label}: {counts.get('text', 0):,} book + {counts.get('python_docs', 0):,} "
                 f"Python-docs documents, {counts.get('words', 0):,} words")
  return "; ".join(parts)


def report(args) -> dict:
  """OUT/time_to_quality.md and .json, and the plot, from whatever stages have finished."""
  from bert_jax.tasks import glue
  info = read_data_info(args.out)
  sides = {side: read_side(args, side) for side in SIDES}
  finetuned = collect_finetune(args)
  lines = [f"Corpus: {describe_documents(info['documents'])}; vocabulary {info['vocab_size']} "
           "(WordPiece, uncased); "
           f"{info['instances']['train']:,} training instances (dupe factor "
           f"{info['settings']['dupe_factor']}, mean length {info['mean_train_length']:.0f}), "
           f"held-out set {info['eval_sequences']} sequences / {info['eval_masked_tokens']} "
           f"masked tokens. BERT-{args.size}, batch {args.batch} x {info['seq']}, peak lr "
           f"{args.lr:g}, warm-up {100 * args.warmup_proportion:g}% of each side's steps.", "",
           "| side | calibrated steps/s | steps (sequences) | training minutes | held-out MLM "
           "loss | MLM accuracy | NSP accuracy | last evaluation within the budget: minute, MLM "
           "loss, accuracy |", "|---|---|---|---|---|---|---|---|"]
  for side, data in sides.items():
    summary = data.get("summary")
    if not summary or not summary.get("final"):
      lines.append(f"| {side} | not run | | | | | | |")
      continue
    cal = summary["plan"]["calibration"]
    final = summary["final"]
    nsp = final.get("nsp_accuracy")
    within = last_within(data["curve"], summary["plan"]["budget_seconds"])
    lines.append(f"| {side} | {cal['steps_per_sec']:.3f} | {summary['steps']:,} "
                 f"({summary['sequences']:,}) | {summary['train_seconds'] / 60:.1f} | "
                 f"{final['mlm_loss']:.3f} | {final['mlm_accuracy']:.3f} | "
                 f"{'' if nsp is None else f'{nsp:.3f}'} | "
                 + (f"{within['seconds'] / 60:.1f}, {within['mlm_loss']:.3f}, "
                    f"{within['mlm_accuracy']:.3f} |" if within else "none |"))
  result = dict(data=info, pretraining={s: d.get("summary") for s, d in sides.items()},
                curves={s: d["curve"] for s, d in sides.items()}, finetune=finetuned,
                machine=bench_util.machine_line(), args=vars(args))
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  if finetuned:
    lines += ["", f"GLUE dev (whole dev sets), {args.seeds} seed(s), mean +- std over seeds "
              f"(score = mean of the task's metrics x100); recipe: batch {args.ft_batch}, lr "
              f"{args.ft_lr:g}, {args.ft_epochs} epochs, max length {args.ft_max_seq}; training "
              f"subsets: {args.ft_train_examples or 'none'}.", "",
              "| task | metric | bert_jax | transformers | diff | minutes (jax / hf) |",
              "|---|---|---|---|---|---|"]
    table = {}
    for task in tasks:
      entries = {side: finetuned.get(side, {}).get(task) for side in SIDES}
      if not all(entries.values()):
        continue
      spec = glue.spec_for(task)
      s = {side: bench_util.seed_spread(e["scores"]) for side, e in entries.items()}
      table[task] = s
      lines.append(f"| {spec.folder} | {'/'.join(spec.metrics)} | {_pm(s['bert_jax'])} | "
                   f"{_pm(s['transformers'])} | "
                   f"{s['bert_jax']['mean'] - s['transformers']['mean']:+.1f} | "
                   f"{entries['bert_jax']['seconds'] / 60:.0f} / "
                   f"{entries['transformers']['seconds'] / 60:.0f} |")
    complete = [t for t in tasks if t in table]
    if complete:
      averages = {side: bench_util.seed_spread(
          average_scores({t: finetuned[side][t] for t in complete})) for side in SIDES}
      lines.append(f"| **average** | {len(complete)} tasks | **{_pm(averages['bert_jax'])}** | "
                   f"**{_pm(averages['transformers'])}** | "
                   f"**{averages['bert_jax']['mean'] - averages['transformers']['mean']:+.1f}**"
                   " | |")
      result["table"], result["average"] = table, averages
  plot = plot_curves({s: d["curve"] for s, d in sides.items()}, args.plot)
  if plot:
    lines += ["", f"Plot: `{plot}` (held-out MLM loss and accuracy vs training minutes)."]
  lines += ["", f"Machine: {result['machine']}."]
  markdown = "\n".join(lines)
  with open(os.path.join(args.out, "time_to_quality.md"), "w") as f:
    f.write(markdown + "\n")
  write_json(os.path.join(args.out, "time_to_quality.json"), result)
  print(markdown, flush=True)
  return result


# ----------------------------------------------------------------------------------- files


def write_json(path: str, value) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(temporary, path)


def read_jsonl(path: str) -> List[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue   # a torn last line of a killed run
  return rows


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  os.replace(temporary, path)


def append_jsonl(path: str, row: dict) -> None:
  with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")


# ----------------------------------------------------------------------------------- main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  stage = p.add_argument_group("stages (one or more, in this order)")
  stage.add_argument("--prepare", action="store_true", help="build OUT/data once")
  stage.add_argument("--side", choices=SIDES, action="append", default=[],
                     help="pre-train this side (repeatable)")
  stage.add_argument("--calibrate", action="store_true",
                     help="with --side: measure the side's steps/s only (no training)")
  stage.add_argument("--finetune", action="store_true", help="GLUE for both checkpoints")
  stage.add_argument("--report", action="store_true", help="write the tables and the plot")
  p.add_argument("--out", default="/tmp/time_to_quality")
  p.add_argument("--plot", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "time_to_quality.png"))
  data = p.add_argument_group("data (--prepare)")
  data.add_argument("--text_dir", default=DEFAULT_TEXT_DIR)
  data.add_argument("--demo_documents", type=int, default=0,
                    help="Python-documentation documents: 0 all, N the first N, -1 none")
  data.add_argument("--sentences_per_document", type=int, default=50)
  data.add_argument("--holdout_every", type=int, default=25, help="every N-th document held out")
  data.add_argument("--vocab_size", type=int, default=8000)
  data.add_argument("--dupe_factor", type=int, default=10)
  data.add_argument("--max_predictions", type=int, default=20)
  data.add_argument("--eval_sequences", type=int, default=1024,
                    help="held-out sequences scored (at most; rounded up to batches of 64)")
  data.add_argument("--data_workers", type=int, default=2)
  pre = p.add_argument_group("pre-training (--side)")
  pre.add_argument("--size", default="mini", help="BertConfig.named size")
  pre.add_argument("--seq", type=int, default=128)
  pre.add_argument("--batch", type=int, default=64)
  pre.add_argument("--lr", type=float, default=5e-4)
  pre.add_argument("--warmup_proportion", type=float, default=0.05)
  pre.add_argument("--seed", type=int, default=0,
                   help="data, masks, initialisation (--prepare's is kept); fine-tuning's first")
  pre.add_argument("--budget_minutes", type=float, default=60.0)
  pre.add_argument("--max_steps", type=int, default=0,
                   help=">0: this many steps, no calibration (tests)")
  pre.add_argument("--calibration_steps", type=int, default=10, help="steps per window (x3)")
  pre.add_argument("--eval_every_minutes", type=float, default=3.0)
  pre.add_argument("--checkpoint_every_minutes", type=float, default=5.0)
  pre.add_argument("--log_every", type=int, default=20)
  pre.add_argument("--threads", type=int, default=2, help="PyTorch threads")
  ft = p.add_argument_group("fine-tuning (--finetune)")
  ft.add_argument("--glue_dir", default=DEFAULT_GLUE_DIR)
  ft.add_argument("--tasks", default="sst2,mrpc,stsb,rte,cola")
  ft.add_argument("--seeds", type=int, default=3)
  ft.add_argument("--ft_lr", type=float, default=1e-4)
  ft.add_argument("--ft_batch", type=int, default=32)
  ft.add_argument("--ft_epochs", type=int, default=3)
  ft.add_argument("--ft_max_seq", type=int, default=128)
  ft.add_argument("--ft_length_bucket", type=int, default=16)
  ft.add_argument("--ft_train_examples", default="sst2=20000",
                  help="per-task training subsets 'task=N,...' (the first N examples)")
  args = p.parse_args(argv)
  if not (args.prepare or args.side or args.finetune or args.report):
    p.error("give at least one of --prepare, --side, --finetune, --report")
  return args


def calibrate(args, side: str) -> dict:
  """`--calibrate`: the side's speed at this setting, to OUT/<side>/calibration.json."""
  info = read_data_info(args.out)
  if side == "bert_jax":
    calibration = calibrate_jax(args, info)
  else:
    import torch
    _quiet_transformers()
    torch.set_num_threads(args.threads)
    calibration = calibrate_hf(args, info)
  result = dict(dataclasses.asdict(calibration), side=side, size=args.size, batch=args.batch,
                seq=info["seq"], steps=calibration.steps_for(args.budget_minutes * 60),
                budget_minutes=args.budget_minutes, machine=bench_util.machine_line())
  write_json(os.path.join(args.out, side, "calibration.json"), result)
  print(json.dumps(result, indent=1), flush=True)
  return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  done = {}
  if args.prepare:
    done["prepare"] = prepare(args)
  if args.side:
    # bert_jax's evaluation pipeline draws the held-out masks with config.seed: the sides must
    # use the seed the fixed batches were drawn with, or bert_jax would be scored on others.
    seed = read_data_info(args.out)["seed"]
    if args.seed != seed:
      print(f"--seed={args.seed} replaced by {seed}, the seed of --prepare", flush=True)
      args.seed = seed
  for side in args.side:
    if args.calibrate:
      done[side] = calibrate(args, side)
    else:
      done[side] = run_jax(args) if side == "bert_jax" else run_hf(args)
  if args.finetune:
    if not os.path.isdir(args.glue_dir):
      sys.exit(f"{args.glue_dir} not found: fine-tuning needs the GLUE folder (../shared/data)")
    done["finetune"] = finetune(args)
  if args.finetune or args.report:
    done["report"] = report(args)
  return done


if __name__ == "__main__":
  main()
