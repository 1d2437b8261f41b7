r"""Time to quality: BERT's recipe and the modern recipe in bert_jax, each pre-trained from scratch
for the same wall-clock budget on the same corpus, vocabulary and held-out instances, then every
checkpoint fine-tuned on GLUE with one recipe.

  python -m benchmarks.time_to_quality --prepare --out=/tmp/ttq                      # ~10 min
  python -m benchmarks.time_to_quality --side=bert_jax --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --side=bert_jax_modern --budget_minutes=60 --out=/tmp/ttq
  python -m benchmarks.time_to_quality --finetune --out=/tmp/ttq        # ~1 h a side (--ft_sides)
  python -m benchmarks.time_to_quality --report --out=/tmp/ttq --plot=benchmarks/time_to_quality.png

Each stage alone on an otherwise idle machine (a side: 65-70 minutes of wall clock on a 2-core
CPU), resumed when run again after an interruption. `--finetune` and `--report` write
OUT/time_to_quality.md and .json and the plot (OUT/time_to_quality.png unless `--plot` names one).

Data (`--prepare`, OUT/data): the books under `--text_dir` and Python's documentation cut into
documents, every `--holdout_every`-th held out, a WordPiece vocabulary learned on the rest, and
unmasked records of three forms: BERT's NSP pairs, contiguous text, and documents as sequences
(what the modern side trains on unless `--modern_instances=contiguous`, the form of its
2026-11-26 run). Both sides are scored on two fixed sets of the held-out documents, masked once
at 15% by bert_jax's evaluation pipeline (`pairs`, `text`), by the job's own `eval_step`; GLUE
is the comparison of record.

The sides, each trained as `registry.run_job` runs a user's job: `bert_jax`, BERT-mini with
BERT's recipe (MLM 15% + NSP, AdamW, linear warm-up and decay, dropout 0.1); `bert_jax_modern`,
the ModernBERT-family model of BERT-mini's size (`modern_counterpart`) with the modern recipe
(`pretrain_demo.modern_twin`: MLM alone at 30%, a batch ramp, StableAdamW, a 1-sqrt decay).
Each side measures its speed first and sizes its schedule to end at the budget (`make_plan`);
the training clock is the loop's `train_seconds`. `--finetune`: bert_jax's GLUE fine-tuning
(`glue.run`) of every checkpoint on `--tasks`, `--seeds` restarts.

The study's `Trainer` sides (`transformers`, `hf_modern`) are historical: their figures stay in
benchmarks/RESULTS.md, their code at commit 19398faa0305. Results: RESULTS.md, "Time to quality".
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

from benchmarks import process_setup

process_setup.prepare(main=__name__ == "__main__")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from benchmarks.bench_util import read_json, write_json  # noqa: E402
from bert_jax import parallel  # noqa: E402
from bert_jax.families.modernbert.config import modern_counterpart  # noqa: E402
from bert_jax.io import checkpoints, filesystem  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402
from bert_jax.runtime import batch_ramp  # noqa: E402
from bert_jax.runtime import job as jobs  # noqa: E402
from bert_jax.runtime.metric_writers import read_metrics  # noqa: E402
from bert_jax.tasks import registry  # noqa: E402
from bert_jax.tasks.datasets import glue  # noqa: E402
from bert_jax.tasks.jobs import pretraining  # noqa: E402
from bert_jax.text import tokenization  # noqa: E402
from data_pipelines import build_vocab, create_pretraining_data, demo_corpus, packing  # noqa: E402
from data_pipelines.sentences import split_sentences  # noqa: E402
from experiments import glue as glue_experiment  # noqa: E402
from experiments import pretrain_demo, pretraining_defaults  # noqa: E402

SIDES = ("bert_jax", "bert_jax_modern")
RECIPE = {"bert_jax": "bert", "bert_jax_modern": "modern"}
COLORS = {"bert_jax": "tab:blue", "bert_jax_modern": "tab:green"}
EVAL_SETS = ("pairs", "text")   # the held-out documents as NSP pairs and as contiguous text
EVAL_BATCH = 64
DEFAULT_TEXT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                "data", "text")
DEFAULT_GLUE_DIR = os.path.join(os.path.dirname(DEFAULT_TEXT_DIR), "glue")
Batch = Dict[str, np.ndarray]


# --- The corpus: books and Python's documentation cut into documents --------------------------

# A heading line ("Chapter 1", "CHAPTER XII.", "BOOK 3", "ACT II", "Scene 4") ends a document.
HEADING = re.compile(r"^(chapter|book|act|scene|canto|volume|part|section)\b[\w .:-]{0,30}$",
                     re.IGNORECASE)
BRACKETED = re.compile(r"^\[.*\]$")                     # "[ Persuasion by Jane Austen 1818 ]"
SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,40}:$")       # "First Citizen:" (a play's speaker)


def clean(sentence: str) -> str:
  """Tokenized-text quotes (`` and '') as plain quotes, whitespace normalised."""
  return " ".join(sentence.replace("``", '"').replace("''", '"').split())


def chunks(sentences: Iterable[Optional[str]], size: int) -> Iterator[List[str]]:
  """Runs of at most `size` sentences (of 2 or more); None (a heading) ends the current run."""
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


def file_sentences(text: str) -> Iterator[Optional[str]]:
  """One sentence per line (the Gutenberg files: headings become None, bracketed notes go), or,
  with blank lines between paragraphs, raw text (tinyshakespeare: speaker lines dropped)."""
  if re.search(r"\n\s*\n", text) is None:
    for line in map(str.strip, text.splitlines()):
      if line and not BRACKETED.match(line):
        yield None if len(line) <= 40 and HEADING.match(line) else clean(line)
    return
  kept = "\n".join(line for line in text.splitlines() if not SPEAKER.match(line.strip()))
  yield from map(clean, split_sentences(kept))


def text_documents(text_dir: str, sentences_per_document: int) -> Iterator[List[str]]:
  """Documents (lists of sentences) of every *.txt under `text_dir`, in sorted path order."""
  paths = sorted(os.path.join(root, name) for root, _, names in os.walk(text_dir)
                 for name in names if name.endswith(".txt"))
  if not paths:
    raise FileNotFoundError(f"no *.txt under {text_dir}")
  for path in paths:
    with open(path, encoding="utf-8", errors="replace") as f:
      yield from chunks(file_sentences(f.read()), sentences_per_document)


def write_corpus(args, train_path: str, eval_path: str) -> Dict[str, Dict[str, int]]:
  """The text files' documents, then the demo corpus's (-1: none, 0: all), shuffled, in BERT's
  input format; every `--holdout_every`-th to `eval_path`. Counts per split and source."""
  docs = [("text", d) for d in text_documents(args.text_dir, args.sentences_per_document)]
  if args.demo_documents >= 0:
    docs += [("python_docs", d) for d in demo_corpus.documents(args.demo_documents)]
  order = list(range(len(docs)))
  random.Random(args.seed).shuffle(order)
  counts: Dict[str, Dict[str, int]] = {}
  with open(train_path, "w", encoding="utf-8") as train, \
       open(eval_path, "w", encoding="utf-8") as held_out:
    for position, index in enumerate(order):
      source, sentences = docs[index]
      split = "eval" if position % args.holdout_every == 0 else "train"
      (held_out if split == "eval" else train).write("\n".join(sentences) + "\n\n")
      entry = counts.setdefault(split, {})
      entry[source] = entry.get(source, 0) + 1
      entry["words"] = entry.get("words", 0) + sum(len(s.split()) for s in sentences)
  return counts


# --- `--prepare`: vocabulary, records and the held-out sets, once -------------------------------

def data_path(out: str, name: str) -> str:
  return os.path.join(out, "data", name)


def read_data_info(out: str) -> dict:
  path = data_path(out, "DONE.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: run --prepare first")
  return read_json(path)


def eval_batches_from_pipeline(config, max_sequences: int) -> List[Batch]:
  """The first batches of bert_jax's evaluation pipeline (fixed masks) holding `max_sequences`."""
  count = max(1, math.ceil(max_sequences / config.eval_batch_size))
  return bench_util.pipeline_batches(config, count, training=False)


def save_batches(path: str, batches: Sequence[Batch]) -> dict:
  """The batches to `path`; their counts (batches, sequences, masked tokens)."""
  np.savez(path, **{k: np.stack([b[k] for b in batches]) for k in batches[0]})
  return dict(eval_batches=len(batches),
              eval_sequences=int(sum(b["example_weight"].sum() for b in batches)),
              eval_masked_tokens=int(sum(b["masked_lm_weights"].sum() for b in batches)))


def load_batches(path: str) -> List[Batch]:
  with np.load(path) as data:
    stacked = {k: data[k] for k in data.files}
  return [{k: v[i] for k, v in stacked.items()} for i in range(len(stacked["input_ids"]))]


def load_eval_sets(out: str) -> Dict[str, List[Batch]]:
  """The fixed held-out sets both sides are scored on: {"pairs": batches, "text": batches}."""
  return {"pairs": load_batches(data_path(out, "eval_batches.npz")),
          "text": load_batches(data_path(out, "eval_text_batches.npz"))}


def write_records(args, tokenizer, suffix: str, **options) -> Dict[str, int]:
  """train/eval{suffix}.tfrecord from train/eval.txt (`--dupe_factor` passes over the training
  documents, one over the held-out ones), unmasked; instances and tokens per split."""
  counts = {}
  for split in ("train", "eval"):
    stats = create_pretraining_data.create_pretraining_data(
        [data_path(args.out, f"{split}.txt")], [data_path(args.out, f"{split}{suffix}.tfrecord")],
        tokenizer, max_seq_length=args.seq, max_predictions_per_seq=args.max_predictions,
        random_seed=args.seed, dupe_factor=args.dupe_factor if split == "train" else 1,
        masking="dynamic", num_workers=args.data_workers, progress=False, **options)
    counts[split], counts[f"{split}_tokens"] = stats.instances, stats.tokens
  return counts


def prepare(args) -> dict:
  """OUT/data: corpus, vocabulary, both kinds of records, the two held-out sets (DONE.json)."""
  done = data_path(args.out, "DONE.json")
  if os.path.exists(done):
    print(f"{done} exists: the data is prepared", flush=True)
    return read_data_info(args.out)
  os.makedirs(os.path.dirname(done), exist_ok=True)
  start = time.time()
  counts = write_corpus(args, data_path(args.out, "train.txt"), data_path(args.out, "eval.txt"))
  print(f"corpus: {counts}", flush=True)
  vocab = data_path(args.out, "vocab.txt")
  build_vocab.train_wordpiece([data_path(args.out, "train.txt")], vocab,
                              vocab_size=args.vocab_size, do_lower_case=True)
  tokenizer = tokenization.FullTokenizer(vocab, do_lower_case=True)
  pairs = write_records(args, tokenizer, "")
  info = dict(vocab_size=tokenizer.vocab_size, seq=args.seq, max_predictions=args.max_predictions,
              seed=args.seed, eval_batches=0)
  info.update(save_batches(data_path(args.out, "eval_batches.npz"), eval_batches_from_pipeline(
      bert_config(args, info), args.eval_sequences)))
  info.update(documents=counts, instances={s: pairs[s] for s in ("train", "eval")},
              mean_train_length=pairs["train_tokens"] / pairs["train"],
              settings=dict(vocab_size=args.vocab_size, dupe_factor=args.dupe_factor,
                            holdout_every=args.holdout_every,
                            sentences_per_document=args.sentences_per_document,
                            demo_documents=args.demo_documents,
                            text_dir=os.path.abspath(args.text_dir)))
  rows = write_records(args, tokenizer, "_contiguous", instances="contiguous")
  # BERT's evaluation config read over the contiguous rows: the same 15%, 80/10/10, cap and seed
  # as the pairs set (objective mlm: these rows have no NSP labels).
  config = bert_config(args, dict(info, eval_batches=0))
  config.objective = "mlm"
  config.data.eval_input_files = data_path(args.out, "eval_contiguous.tfrecord")
  info["contiguous"] = dict(
      save_batches(data_path(args.out, "eval_text_batches.npz"),
                   eval_batches_from_pipeline(config, args.eval_sequences)),
      instances={s: rows[s] for s in ("train", "eval")},
      mean_train_length=rows["train_tokens"] / rows["train"], dupe_factor=args.dupe_factor,
      special=dict(pad=tokenizer.pad_id, cls=tokenizer.cls_id, sep=tokenizer.sep_id,
                   mask=tokenizer.mask_id))
  # The modern recipe's rows as ModernBERT packs them: each document a sequence of its own.
  rows = write_records(args, tokenizer, "_documents", instances="documents")
  info["documents_rows"] = dict(instances={s: rows[s] for s in ("train", "eval")},
                                mean_train_length=rows["train_tokens"] / rows["train"])
  info["seconds"] = time.time() - start
  write_json(done, info)
  print(json.dumps(info, indent=1), flush=True)
  return info


# --- The two recipes as bert_jax pre-training configs -------------------------------------------

def bert_config(args, info: dict):
  """BERT's recipe: BERT-`--size` on the NSP pairs (steps and cadences set from the plan)."""
  c = pretraining_defaults.get_config(args.size)   # the model: BertConfig.named(--size)
  c.model.update(vocab_size=info["vocab_size"], max_position_embeddings=max(args.seq, 512),
                 dtype="float32", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  c.max_seq_length, c.max_predictions_per_seq = info["seq"], info["max_predictions"]
  c.learning_rate = args.lr
  c.data.input_files = data_path(args.out, "train.tfrecord")
  c.data.eval_input_files = data_path(args.out, "eval.tfrecord")
  c.eval_steps = info["eval_batches"]
  return common_settings(c, args)


def modern_max_predictions(masked_lm_prob: float, seq: int) -> int:
  """Masked-LM slots a row: `masked_lm_prob` of its seq - 2 text positions, in slots of 8
  (0.30 at 128: 37.8 -> 40, as the demo's twin)."""
  return 8 * math.ceil(masked_lm_prob * (seq - 2) / 8)


def modern_config(args, info: dict):
  """The modern recipe: `pretrain_demo.modern_twin` (objective mlm, masking while reading,
  StableAdamW, warmup-stable-decay with a 1-sqrt decay to 0) with the ModernBERT-family model of
  BERT-`--size`'s size (`modern_counterpart`: the MLP's weights kept, every third layer global)
  on the contiguous rows (the ramp and the schedule's lengths set from the plan)."""
  c = pretrain_demo.modern_twin(quick=False)
  c.model.update(modern_counterpart(
      BertConfig.named(args.size), vocab_size=info["vocab_size"],
      local_attention=args.local_attention, global_rope_theta=10_000.0,
      local_rope_theta=10_000.0, pad_token_id=info["contiguous"]["special"]["pad"],
      dtype="float32").to_dict())
  c.max_seq_length = info["seq"]
  c.data.masked_lm_prob = args.modern_masking
  c.max_predictions_per_seq = modern_max_predictions(args.modern_masking, info["seq"])
  c.learning_rate = args.modern_lr
  c.batch_warmup.start_batch_size, c.batch_warmup.tokens = 0, 0.0   # the plan's
  c.schedule.update(name="wsd", decay_steps=0, decay_fraction=0.0, decay_shape="1-sqrt",
                    final_fraction=0.0)
  c.data.prepare_demo_corpus = False
  # The held-out sets are fixed batches (`load_eval_sets`); the evaluation files only shape.
  c.data.instances = args.modern_instances
  c.data.input_files = data_path(args.out, f"train_{args.modern_instances}.tfrecord")
  c.data.eval_input_files = data_path(args.out, f"eval_{args.modern_instances}.tfrecord")
  if not os.path.exists(c.data.input_files):
    raise FileNotFoundError(f"{c.data.input_files}: not in OUT/data (prepared before documents "
                            "as sequences existed): --prepare into a fresh --out, or "
                            "--modern_instances=contiguous")
  c.eval_steps = 0
  return common_settings(c, args)


def common_settings(c, args):
  c.global_batch_size, c.eval_batch_size, c.seed = args.batch, EVAL_BATCH, args.seed
  c.tokenizer.vocab_file = data_path(args.out, "vocab.txt")
  c.tokenizer.do_lower_case = True
  c.data.masking, c.data.shuffle_buffer_size = "dynamic", 10_000
  c.log_every_steps, c.keep_checkpoints = args.log_every, 2
  return c


# --- Each side's steps from its own measured speed, so its schedule ends at the budget ----------

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
    rate = sum(s for s, _ in windows[1:]) / sum(t for _, t in windows[1:])
    first_steps, first_seconds = windows[0]
    return cls(rate, max(0.0, first_seconds - first_steps / rate),
               tuple((int(s), float(t)) for s, t in windows))

  def steps_for(self, budget_seconds: float) -> int:
    """Steps that fill `budget_seconds` of training time, start-up included."""
    return max(1, int((budget_seconds - self.startup_seconds) * self.steps_per_sec))


@dataclasses.dataclass
class Plan:
  """What a side's run does; written once (OUT/<side>/plan.json) so a resume reuses it."""
  side: str
  budget_seconds: float
  calibration: Calibration
  num_train_steps: int
  warmup_steps: int
  eval_every_steps: int
  checkpoint_every_steps: int
  # The modern recipe (0: BERT's, no ramp, linear decay over all steps).
  batch_warmup_start: int = 0      # the ramp's first batch (rows); 0: no ramp
  batch_warmup_tokens: float = 0.0
  decay_steps: int = 0             # the 1-sqrt decay's steps, at the end
  batch: int = 0                   # the full batch (rows)
  seq: int = 0

  def ramp(self):
    return make_ramp(self.batch_warmup_start, self.batch, self.batch_warmup_tokens, self.seq)

  def sequences(self, steps: Optional[int] = None) -> int:
    """Rows trained by the first `steps` steps (all of them by default)."""
    steps = self.num_train_steps if steps is None else steps
    ramp = self.ramp()
    return ramp.micro_batches_before(steps) * ramp.start if ramp else steps * self.batch

  @classmethod
  def from_json(cls, values: dict) -> "Plan":   # plan.json, a summary's "plan"
    return cls(**dict(values, calibration=Calibration(**values["calibration"])))


def make_ramp(start: int, batch: int, tokens: float, seq: int):
  """The batch ramp (`bert_jax.runtime.batch_ramp.BatchRamp`), or None when `start` is 0."""
  if not start:
    return None
  return batch_ramp.BatchRamp(start=start, final=batch, tokens=tokens, seq_len=seq)


def make_plan(args, side: str, calibration: Calibration, seq: int) -> Plan:
  """BERT's recipe: `(budget - start-up) x steps/s` steps, the warm-up a fraction of them. The
  modern one: the budget as tokens at the full batch's rate, the steps that train them through
  the ramp (`BatchRamp.steps_for_tokens`), the ramp and the warm-up over their shares of the
  tokens, the decay over the last `--decay_fraction` of the steps; each batch size after the
  first charged the start-up again (bert_jax compiles its step once per batch size).
  `--max_steps` (tests) fixes the steps; a modern ramp then covers its share of the tokens those
  steps would train at the full batch."""
  budget = args.budget_minutes * 60.0
  if RECIPE[side] == "bert":
    steps = args.max_steps or calibration.steps_for(budget)
    warmup, decay, start, ramp_tokens = int(round(args.warmup_proportion * steps)), 0, 0, 0.0
    seconds = budget - calibration.startup_seconds
  else:
    start = args.batch_warmup_start
    if start and (args.batch % start or start >= args.batch):
      raise ValueError(f"--batch_warmup_start={start}: the batch ramp rises to --batch="
                       f"{args.batch} in steps of its start, a smaller divisor of it (0: off)")
    compiles = (args.batch // start - 1) if start else 0
    seconds = budget - calibration.startup_seconds * (1 + compiles)
    full_steps = args.max_steps or max(1, int(seconds * calibration.steps_per_sec))
    tokens = full_steps * args.batch * seq
    ramp_tokens = float(args.batch_warmup_fraction * tokens) if start else 0.0
    ramp = make_ramp(start, args.batch, ramp_tokens, seq)
    steps = args.max_steps or (ramp.steps_for_tokens(tokens) if ramp else full_steps)
    warmup = (ramp.steps_for_tokens(args.warmup_proportion * tokens) if ramp
              else int(round(args.warmup_proportion * steps)))
    decay = int(round(args.decay_fraction * steps))
    warmup = min(warmup, steps - decay)
  rate = steps / max(seconds, 1e-9) if not args.max_steps else calibration.steps_per_sec
  # About `minutes` of training, a multiple of --log_every (a training line at each evaluation).
  interval = lambda minutes: min(steps, args.log_every * max(1, int(round(
      minutes * 60 * rate / args.log_every))))
  return Plan(side=side, budget_seconds=budget, calibration=calibration, num_train_steps=steps,
              warmup_steps=warmup, eval_every_steps=interval(args.eval_every_minutes),
              checkpoint_every_steps=interval(args.checkpoint_every_minutes),
              batch_warmup_start=start, batch_warmup_tokens=ramp_tokens, decay_steps=decay,
              batch=args.batch, seq=seq)


def calibrate(args, info: dict, side: str) -> Calibration:
  """The side's speed: `registry.run_job` for 3 logging windows of `--calibration_steps`, at the
  full batch (no ramp), no evaluation or checkpoint."""
  k = args.calibration_steps
  config = (modern_config if RECIPE[side] == "modern" else bert_config)(args, info)
  config.num_train_steps, config.warmup_steps, config.log_every_steps = 3 * k, k, k
  config.eval_every_steps, config.checkpoint_every_steps = 0, 0
  workdir = os.path.join(args.out, side, "calibration", "workdir")
  shutil.rmtree(os.path.dirname(workdir), ignore_errors=True)
  registry.run_job(config, workdir)
  marks = [(0, 0.0)] + [(r["step"], r["train_seconds"]) for r in read_metrics(workdir, "train")]
  shutil.rmtree(os.path.dirname(workdir), ignore_errors=True)
  return Calibration.from_windows([(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])])


def load_or_make_plan(args, info: dict, side: str) -> Plan:
  """The side's plan.json if a run started already (the same schedule on resume), else a new
  one from a calibration (none with `--max_steps`: 1 step/s assumed)."""
  path = os.path.join(args.out, side, "plan.json")
  if os.path.exists(path):
    return Plan.from_json(read_json(path))
  calibration = Calibration(1.0, 0.0, ()) if args.max_steps else calibrate(args, info, side)
  plan = make_plan(args, side, calibration, info["seq"])
  write_json(path, dataclasses.asdict(plan))
  print(f"[{side}] plan: {json.dumps(dataclasses.asdict(plan))}", flush=True)
  return plan


# --- `--side`: pre-training as a user runs it, scored on the fixed held-out sets ----------------

def scorer(model, objective: str):
  """(params, batches) -> bert_jax's evaluation metrics summed over `batches` (the job's
  `eval_step`, jitted once). Batches without NSP labels (the text set, documents as sequences)
  scored by a model with the NSP head give the masked-LM metrics alone (NSP labels of zeros,
  their terms left out)."""
  step = jax.jit(functools.partial(pretraining.eval_step, model=model, objective=objective))

  def score(params, batches: Sequence[Batch]) -> Dict[str, float]:
    nsp = "next_sentence_labels" in batches[0]
    totals = None
    for batch in batches:
      if objective == "mlm_nsp" and not nsp:
        rows = len(batch["input_ids"])
        if packing.SEQUENCE_IDS in batch:   # documents as sequences: one NSP slot a row
          batch = dict(batch, next_sentence_labels=np.zeros(rows, np.int32),
                       nsp_weights=np.zeros(rows, np.float32))
        else:
          batch = dict(batch, next_sentence_labels=np.zeros((rows, 1), np.int32))
      terms = step(params, batch)
      totals = terms if totals is None else jax.tree_util.tree_map(lambda a, b: a + b, totals,
                                                                    terms)
    if not nsp:
      totals = {k: v for k, v in totals.items() if not k.startswith("nsp_")}
    _, metrics = pretraining.loss_from_terms(totals)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  return score


def jax_params_from_workdir(workdir: str):
  model_config, params = checkpoints.load_params_from_workdir(workdir)
  return checkpoints.to_model_layout(params, model_config)


def curve_of(workdir: str) -> List[dict]:
  """The held-out curve from the run's metrics.jsonl: each evaluation with the training clock of
  the training line logged at its step (`train_seconds`, continued by a resumed run)."""
  seconds = {r["step"]: r["train_seconds"] for r in read_metrics(workdir, "train")}
  curve = []
  for record in read_metrics(workdir, "eval"):
    if record["step"] not in seconds:
      raise ValueError(f"{workdir}: an evaluation at step {record['step']} has no training line "
                       "at that step (evaluate at multiples of --log_every)")
    metrics = {k: v for k, v in record.items() if k not in ("step", "split")}
    curve.append(dict(seconds=seconds[record["step"]], step=record["step"], **metrics))
  return curve


def train(config, workdir: str, evaluate) -> dict:
  """`registry.run_job`, evaluating by `evaluate(params)` (the fixed held-out sets) every
  `config.eval_every_steps` instead of on the job's own held-out records."""
  job = registry.job(config, workdir)   # the records are given: nothing is built
  every_steps = config.eval_every_steps
  job = dataclasses.replace(job, evaluator=lambda trainer: lambda state, step: evaluate(
      state.params), eval_at=lambda step: bool(every_steps) and step % every_steps == 0)
  return jobs.run(job, filesystem.absolute(workdir), parallel.create(config)).results()


def run_side(args, side: str) -> dict:
  """Pre-trains the side (resuming from OUT/<side>/workdir); OUT/<side>/curve.jsonl and
  summary.json."""
  side_dir = os.path.join(args.out, side)
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[{side}] {side_dir}/summary.json exists: done", flush=True)
    return read_json(os.path.join(side_dir, "summary.json"))
  info = read_data_info(args.out)
  plan = load_or_make_plan(args, info, side)
  config = (modern_config if RECIPE[side] == "modern" else bert_config)(args, info)
  config.num_train_steps, config.warmup_steps = plan.num_train_steps, plan.warmup_steps
  config.eval_every_steps = plan.eval_every_steps
  config.checkpoint_every_steps = plan.checkpoint_every_steps
  if RECIPE[side] == "modern":
    config.batch_warmup.start_batch_size = plan.batch_warmup_start
    config.batch_warmup.tokens = plan.batch_warmup_tokens
    config.schedule.decay_steps = plan.decay_steps
  workdir = os.path.join(side_dir, "workdir")
  os.makedirs(workdir, exist_ok=True)
  # Fine-tuning finds the vocabulary beside the checkpoint: the workdir is self-contained.
  shutil.copy(data_path(args.out, "vocab.txt"), os.path.join(workdir, "vocab.txt"))
  score = scorer(pretraining.build_model(config), config.objective)
  eval_sets = load_eval_sets(args.out)
  # Every set's metrics, prefixed with its name (`pairs_mlm_loss`, `text_mlm_accuracy`, ...).
  evaluate = lambda params: {f"{name}_{k}": v for name, batches in eval_sets.items()
                             for k, v in score(params, batches).items()}
  start = time.time()
  result = train(config, workdir, evaluate)
  curve = curve_of(workdir)
  with open(os.path.join(side_dir, "curve.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in curve)
  if result.get("preempted"):
    print(f"[{side}] preempted: run the same command again to resume", flush=True)
    return result
  # The saved checkpoint (what fine-tuning reads) should score as the last evaluation did.
  check = evaluate(jax_params_from_workdir(workdir))
  final = curve[-1] if curve else None
  names = ["size", "batch", "seq", "warmup_proportion"] + (
      ["lr"] if RECIPE[side] == "bert" else
      ["modern_lr", "modern_masking", "local_attention", "batch_warmup_start",
       "batch_warmup_fraction", "decay_fraction"])
  summary = dict(side=side, recipe=RECIPE[side],
                 settings={name: getattr(args, name) for name in names},
                 plan=dataclasses.asdict(plan), steps=plan.num_train_steps,
                 sequences=plan.sequences(), train_seconds=final["seconds"] if final else None,
                 final=final, checkpoint_check=check, checkpoint=workdir,
                 wall_seconds_this_call=time.time() - start, machine=bench_util.machine_line())
  write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary


# --- `--finetune`: every pre-trained side's checkpoint on GLUE, one recipe ----------------------

def pretrained_sides(args) -> List[str]:
  """The sides to fine-tune: `--ft_sides`, or every side whose pre-training has finished
  (OUT/<side>/summary.json)."""
  finished = [s for s in SIDES if os.path.exists(os.path.join(args.out, s, "summary.json"))]
  wanted = [s.strip() for s in args.ft_sides.split(",") if s.strip()] or finished
  for side in wanted:
    if side not in finished:
      raise ValueError(f"--ft_sides: {side} has not finished pre-training"
                       + (f": run --side={side} first" if side in SIDES else
                          f" (the sides: {', '.join(SIDES)})"))
  if set(wanted) != set(SIDES):
    print(f"not fine-tuned: {', '.join(s for s in SIDES if s not in wanted)}", flush=True)
  return wanted


def glue_config(args, side: str, task: str, train_examples: int):
  """One recipe for every checkpoint: bert_jax's GLUE fine-tuning of the side's workdir (the
  architecture is the checkpoint's)."""
  c = glue_experiment.get_config(f"task={task},seeds={args.seeds}")
  c.init_checkpoint = os.path.join(args.out, side, "workdir")
  c.tokenizer.vocab_file = data_path(args.out, "vocab.txt")
  c.tokenizer.do_lower_case = True
  c.data.glue_dir = args.glue_dir
  c.max_seq_length, c.length_bucket = args.ft_max_seq, args.ft_length_bucket
  c.global_batch_size, c.eval_batch_size = args.ft_batch, 64
  c.learning_rate, c.num_train_epochs = args.ft_lr, float(args.ft_epochs)
  c.data.max_train_examples, c.data.max_eval_examples = train_examples, 0
  c.do_predict = False
  c.log_every_steps = 100
  c.seed = args.seed
  return c


def tasks_of(args) -> List[str]:
  return [t.strip() for t in args.tasks.split(",") if t.strip()]


def finetune(args) -> dict:
  """Every task for every side of `pretrained_sides`, task by task (a stage cut short still
  leaves whole rows of the table); a finished task (its ttq.json) is not run again."""
  subsets = {name.strip(): int(value) for name, _, value in
             (item.partition("=") for item in args.ft_train_examples.split(",") if item)}
  sides = pretrained_sides(args)
  if not sides:
    print("no side has finished pre-training: nothing to fine-tune", flush=True)
  for task in tasks_of(args):
    for side in sides:
      workdir = os.path.join(args.out, "finetune", side, task)
      if os.path.exists(os.path.join(workdir, "ttq.json")):
        continue
      start = time.time()
      result = glue.run(glue_config(args, side, task, subsets.get(task, 0)), workdir)
      if result.get("preempted"):
        sys.exit(f"[{side} {task}] preempted: run the same command again to resume")
      spec = glue.spec_for(task)
      devs = ([result["dev"]] if "seeds" not in result else
              [r["dev"] for _, r in sorted(result["seeds"].items(), key=lambda kv: int(kv[0]))])
      entry = dict(scores=[glue.task_score(dev, spec) for dev in devs],
                   metrics=list(spec.metrics),
                   dev={m: [dev[m] for dev in devs] for m in spec.metrics},
                   train_examples=subsets.get(task, 0), seconds=time.time() - start)
      write_json(os.path.join(workdir, "ttq.json"), entry)
      print(f"[{side} {task}] scores {entry['scores']} ({entry['seconds']:.0f} s)", flush=True)
  return finetuned(args)


def finetuned(args) -> Dict[str, Dict[str, dict]]:
  """{side: {task: OUT/finetune/<side>/<task>/ttq.json}} of the tasks finished."""
  results = {side: {task: read_json(os.path.join(args.out, "finetune", side, task, "ttq.json"),
                                    None) for task in tasks_of(args)} for side in SIDES}
  return {side: {task: r for task, r in tasks.items() if r is not None}
          for side, tasks in results.items() if any(r is not None for r in tasks.values())}


# --- `--report`: the tables and the plot, from whatever stages have finished -------------------

def last_within(curve: Sequence[dict], budget_seconds: float) -> Optional[dict]:
  """The last held-out evaluation at or before the budget. A side's steps come from a short
  calibration and its sustained rate can differ (bert_jax's first run: 0.64 steps/s sustained
  against 0.72 calibrated, 67 minutes instead of 60): this column compares both at the budget."""
  inside = [row for row in curve if row["seconds"] <= budget_seconds]
  return inside[-1] if inside else None


def plot_curves(curves: Dict[str, List[dict]], path: str) -> None:
  """Held-out MLM loss and accuracy vs training minutes on both held-out sets (rows), every side
  with a curve; BERT's recipe solid, the modern dashed (matplotlib PNG)."""
  fig, axes = bench_util.pyplot().subplots(len(EVAL_SETS), 2, figsize=(11, 4.0 * len(EVAL_SETS)),
                                           squeeze=False)
  titles = {"pairs": "held-out NSP pairs", "text": "held-out contiguous text"}
  for (loss_ax, acc_ax), eval_set in zip(axes, EVAL_SETS):
    for side, rows in curves.items():
      rows = [r for r in rows if r.get(f"{eval_set}_mlm_loss") is not None]
      if not rows:
        continue
      style = dict(marker="o", markersize=3, color=COLORS[side], label=side,
                   linestyle="--" if RECIPE[side] == "modern" else "-")
      for ax, name in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        ax.plot([r["seconds"] / 60 for r in rows], [r.get(f"{eval_set}_mlm_{name}") for r in rows],
                **style)
    for ax, name in ((loss_ax, "loss"), (acc_ax, "accuracy")):
      ax.set(xlabel="training wall clock (minutes)", ylabel=f"MLM {name} (15% masked)",
             title=f"Masked-LM {name}, {titles[eval_set]}")
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:
        ax.legend()
  bench_util.save_figure(fig, path, dpi=110)


def describe_data(info: dict, sides: Dict[str, dict]) -> List[str]:
  """The corpus, the records, the held-out sets and each side's settings as it ran."""
  docs = "; ".join(
      f"{label}: {c.get('text', 0):,} book + {c.get('python_docs', 0):,} Python-docs "
      f"documents, {c.get('words', 0):,} words" for label, c in
      (("training", info["documents"].get("train", {})),
       ("held out", info["documents"].get("eval", {}))))
  part = info["contiguous"]
  return [f"Corpus: {docs}; vocabulary {info['vocab_size']} (WordPiece, uncased); "
          f"{info['instances']['train']:,} NSP-pair training instances (mean length "
          f"{info['mean_train_length']:.0f}) and {part['instances']['train']:,} contiguous-text "
          f"rows (dupe factor {info['settings']['dupe_factor']}). Held out (every side scored on "
          f"the same instances and masks, 15%): pairs {info['eval_sequences']} sequences / "
          f"{info['eval_masked_tokens']} masked tokens; text {part['eval_sequences']} rows / "
          f"{part['eval_masked_tokens']} masked tokens."] + [
              f"{side} ({RECIPE[side]}'s recipe): {json.dumps(d['summary']['settings'])}."
              for side, d in sides.items() if d.get("summary")]


def pretraining_table(sides: Dict[str, dict]) -> List[str]:
  rows = []
  for side, data in sides.items():
    summary = data.get("summary")
    if not summary or not summary.get("final"):
      state = "running or stopped" if data["curve"] else "not run"
      rows.append([side, RECIPE[side], state] + [""] * 7)
      continue
    cell = lambda row, name: "-" if row.get(name) is None else f"{row[name]:.3f}"
    mlm = lambda row, s: f"{cell(row, s + '_mlm_loss')}, {cell(row, s + '_mlm_accuracy')}"
    final, within = summary["final"], last_within(data["curve"], summary["plan"]["budget_seconds"])
    rows.append([
        side, RECIPE[side], f"{summary['plan']['calibration']['steps_per_sec']:.3f}",
        f"{summary['steps'] / summary['train_seconds']:.3f}",
        f"{summary['steps']:,} ({summary['sequences']:,})",
        f"{summary['train_seconds'] / 60:.1f}", mlm(final, "pairs"),
        cell(final, "pairs_nsp_accuracy"), mlm(final, "text"),
        f"{within['seconds'] / 60:.1f}; {mlm(within, 'pairs')}; {mlm(within, 'text')}"
        if within else "none"])
  return bench_util.markdown_table(
      ["side", "recipe", "calibrated steps/s", "sustained steps/s", "steps (sequences)",
       "training minutes", "pairs: MLM loss, accuracy", "NSP accuracy", "text: MLM loss, accuracy",
       "last evaluation within the budget: minute; pairs loss, accuracy; text loss, accuracy"], rows)


def glue_tables(args, results: Dict[str, Dict[str, dict]], report: dict) -> List[str]:
  """Per task and on average, every side with fine-tuning results (the average over the tasks
  every such side has finished, so that the averages compare)."""
  pm = lambda spread: f"{spread['mean']:.1f} +- {spread['std']:.1f}"
  sides = [s for s in SIDES if results.get(s)]
  missing = [s for s in SIDES if s not in sides]
  tasks = [t for t in tasks_of(args) if any(t in results[s] for s in sides)]
  table = {t: {s: bench_util.seed_spread(results[s][t]["scores"]) for s in sides
               if t in results[s]} for t in tasks}
  rows = [[glue.spec_for(t).folder, "/".join(glue.spec_for(t).metrics)]
          + [pm(table[t][s]) if s in table[t] else "-" for s in sides]
          + [" / ".join(f"{results[s][t]['seconds'] / 60:.0f}" if t in results[s] else "-"
                        for s in sides)] for t in tasks]
  complete = [t for t in tasks if len(table[t]) == len(sides)]
  if complete:   # per seed, the mean over tasks of the task scores
    report["average"] = averages = {s: bench_util.seed_spread(
        [float(np.mean(seed)) for seed in zip(*(results[s][t]["scores"] for t in complete))])
        for s in sides}
    rows.append(["**average**", f"{len(complete)} tasks"]
                + [f"**{pm(averages[s])}**" for s in sides] + [""])
  report["table"] = table
  return ["", f"GLUE dev (whole dev sets), {args.seeds} seed(s), mean +- std over seeds "
          f"(score = mean of the task's metrics x100); recipe: batch {args.ft_batch}, lr "
          f"{args.ft_lr:g}, {args.ft_epochs} epochs, max length {args.ft_max_seq}; training "
          f"subsets: {args.ft_train_examples or 'none'}."
          + (f" Not fine-tuned yet: {', '.join(missing)}." if missing else ""), ""
          ] + bench_util.markdown_table(
              ["task", "metric"] + sides + [f"minutes ({' / '.join(sides)})"], rows)


def goal(averages: Dict[str, dict]) -> List[str]:
  """The goal: the modern recipe ahead of BERT's on the GLUE average by more than the spread."""
  a, b = averages.get("bert_jax_modern"), averages.get("bert_jax")
  line = "- bert_jax_modern ahead of bert_jax on the GLUE average by more than the seed spread"
  if not (a and b):
    return ["", "Goal:", line + ": not yet measured (a side has no GLUE average)"]
  diff, spread = a["mean"] - b["mean"], max(a["std"], b["std"])
  return ["", "Goal:", f"{line} (the larger seed std, {spread:.1f}): {diff:+.1f}, "
          f"**{'met' if diff > spread else 'not met'}**"]


def report(args) -> dict:
  """OUT/time_to_quality.md and .json, and the plot."""
  info = read_data_info(args.out)
  sides = {side: dict(curve=read_json(os.path.join(args.out, side, "curve.jsonl"), []),
                      summary=read_json(os.path.join(args.out, side, "summary.json"), None))
           for side in SIDES}
  results = finetuned(args)
  lines = describe_data(info, sides) + [""] + pretraining_table(sides)
  out = dict(data=info, pretraining={s: d.get("summary") for s, d in sides.items()},
             curves={s: d["curve"] for s, d in sides.items()}, finetune=results,
             machine=bench_util.machine_line(), args=vars(args))
  if results:
    lines += glue_tables(args, results, out)
  lines += goal(out.get("average", {}))
  plot_curves({s: d["curve"] for s, d in sides.items()}, args.plot)
  lines += ["", f"Plot: `{args.plot}` (held-out MLM loss and accuracy vs training minutes, on "
            "the pairs and the text set).", "", f"Machine: {out['machine']}."]
  bench_util.write_report(args.out, "time_to_quality", out, "\n".join(lines))
  return out


# --- The command line ---------------------------------------------------------------------------

# The settings of each stage, `--NAME` with its default (its type); what each means: the
# docstring, and HELP for those it does not name.
FLAGS = dict(
    # --prepare
    text_dir=DEFAULT_TEXT_DIR, demo_documents=0, sentences_per_document=50, holdout_every=25,
    vocab_size=8000, dupe_factor=10, max_predictions=20, eval_sequences=1024, data_workers=2,
    # --side: both recipes, BERT's (lr), the modern one (the rest)
    size="mini", seq=128, batch=64, warmup_proportion=0.05, seed=0, budget_minutes=60.0,
    max_steps=0, calibration_steps=10, eval_every_minutes=3.0, checkpoint_every_minutes=5.0,
    log_every=20, lr=5e-4, modern_lr=1e-3, modern_masking=0.30, modern_instances="documents",
    local_attention=64,
    batch_warmup_start=16, batch_warmup_fraction=0.1, decay_fraction=0.2,
    # --finetune
    glue_dir=DEFAULT_GLUE_DIR, ft_sides="", tasks="sst2,mrpc,stsb,rte,cola", seeds=3, ft_lr=1e-4,
    ft_batch=32, ft_epochs=3, ft_max_seq=128, ft_length_bucket=16, ft_train_examples="sst2=20000")
HELP = dict(
    demo_documents="Python-documentation documents: 0 all, N the first N, -1 none",
    max_predictions="BERT's recipe, and the held-out sets",
    eval_sequences="held-out sequences scored (at most; rounded up to batches of 64)",
    size="BertConfig.named size (the modern model: its counterpart)",
    warmup_proportion="of the steps (BERT's recipe) or of the tokens (modern)",
    seed="data, masks, initialisation (--prepare's is kept); fine-tuning's first",
    max_steps=">0: this many steps, no calibration (tests)",
    calibration_steps="steps per window (x3)",
    local_attention="the local layers' window (tokens, transformers' semantics)",
    modern_instances="the modern side's training rows: documents (each a sequence of its own, "
                     "as ModernBERT packs them) or contiguous (documents crossing; the "
                     "2026-11-26 run)",
    batch_warmup_start="the batch ramp's first batch (rows; 0: no ramp), up to --batch",
    batch_warmup_fraction="the ramp's share of the side's planned tokens",
    decay_fraction="the 1-sqrt decay's share of the steps (at the end)",
    ft_sides="sides to fine-tune (comma list); default: every side whose pre-training has "
             "finished (OUT/<side>/summary.json)",
    ft_train_examples="per-task training subsets 'task=N,...' (the first N examples)")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m benchmarks.time_to_quality",
                              description=__doc__.split("\n")[0])
  p.add_argument("--prepare", action="store_true", help="build OUT/data once")
  p.add_argument("--side", choices=SIDES, action="append", default=[],
                 help="pre-train this side (repeatable)")
  p.add_argument("--finetune", action="store_true",
                 help="GLUE for every pre-trained side's checkpoint (--ft_sides)")
  p.add_argument("--report", action="store_true", help="write the tables and the plot")
  p.add_argument("--out", default="/tmp/time_to_quality")
  p.add_argument("--plot", default="", help="the plot's path (default OUT/time_to_quality.png)")
  for name, default in FLAGS.items():
    p.add_argument(f"--{name}", type=type(default), default=default, help=HELP.get(name))
  args = p.parse_args(argv)
  if args.modern_instances not in ("documents", "contiguous"):
    p.error(f"--modern_instances={args.modern_instances}: expected documents or contiguous")
  if not (args.prepare or args.side or args.finetune or args.report):
    p.error("give at least one of --prepare, --side, --finetune, --report")
  args.plot = args.plot or os.path.join(args.out, "time_to_quality.png")
  return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  done = {}
  if args.prepare:
    done["prepare"] = prepare(args)
  if args.side:
    # bert_jax's evaluation pipeline draws the held-out masks with config.seed: the sides must
    # use the seed the fixed batches were drawn with, or they would be scored on others.
    info = read_data_info(args.out)
    if args.seed != info["seed"]:
      print(f"--seed={args.seed} replaced by {info['seed']}, the seed of --prepare", flush=True)
      args.seed = info["seed"]
  for side in args.side:
    done[side] = run_side(args, side)
  if args.finetune:
    if not os.path.isdir(args.glue_dir):
      sys.exit(f"{args.glue_dir} not found: fine-tuning needs the GLUE folder (../shared/data)")
    finetune(args)
  if args.finetune or args.report:
    done["report"] = report(args)
  return done


if __name__ == "__main__":
  main()
