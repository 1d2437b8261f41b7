r"""The modern recipe's three phases at the demo's scale: pretrain -> extend -> decay, each started
from the one before, with the held-out loss of every phase's model at every length.

  python -m benchmarks.modern_phases --out=/tmp/modern_phases

ModernBERT trains in three runs (experiments/pretrain_modernbert.py): `pretrain` at 1,024 tokens
with both rotary bases 10,000 and the rate held after its warm-up; `extend` at 8,192 tokens from
the pretrain model, the global rotary base raised to 160,000 and a lower constant rate; `decay`
from the extend model, the rate decayed to 0 along 1-sqrt. Here the same three runs at the
scale of the demo's twin (experiments/pretrain_demo.py:recipe=modern: its corpus, learned
vocabulary, held-out documents, model and optimizer), the lengths divided by 8:

  pretrain  --pretrain_length (128) tokens, the twin's batch warm-up and rate, constant after its
            warm-up (no decay: that is the third phase's), --pretrain_steps
  extend    --extend_length (512) tokens, the same tokens per step (rows / 4), the global rotary
            base 160,000, the rate scaled as ModernBERT's (3e-4 / 8e-4 of the pretrain rate),
            constant, --extend_steps, initialised from pretrain with its Adam moments
            (`init_optimizer_state`, as ModernBERT's phases carried them)
  decay     as extend, the rate decayed from there to 0 along 1-sqrt over --decay_steps,
            initialised from extend

Each run is `registry.run_job` on a config, exactly what `python -m bert_jax.main`
runs, and each phase's workdir is a normal workdir (resumable; a rerun of this command reuses
finished phases). Every phase's final model is then scored on the held-out documents cut at each
of `--lengths`, masked at 15% with the evaluation's fixed masks (the same instances and masks for
every phase at one length): a run with num_train_steps=0 from the phase's workdir that
evaluates before training (`eval_before_training`), its held-out records built once per length.
What it shows: whether the extension makes the long rows as good as (or better than) the short
ones without losing the short ones, and what the decay adds at both lengths.

Long context, shown (`long_context_probe`): rows of --extend_length tokens of held-out text in
which a span of SPAN tokens comes twice, the second copy's tokens masked (every token of it at
fixed 15% of its positions, all [MASK]). `far`: the first copy at the row's start, so the only
evidence of a masked token beyond its own neighbourhood sits more than --pretrain_length tokens
away (past the length the pretrain phase ever saw, as 1,024 is in the recipe); `near`: the first
copy just before the second (within --pretrain_length); `control`: the first copy replaced by
other text (no evidence). Accuracy on the masked tokens, per condition: `far - control` is what
the model reads from past the pretrain length. `--instances=contiguous` trains every phase on
documents crossing (RoBERTa's FULL-SENTENCES) instead of documents as sequences, for the same
probe on a model that learned to attend across unrelated text.

Output: OUT/modern_phases.json and OUT/modern_phases.md (the table for benchmarks/RESULTS.md).
"""
import argparse
import math
import os
import shutil
import time
from typing import Dict, List

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if __name__ == "__main__":
  # As bert_jax.main does, before JAX or TensorFlow start threads.
  from bert_jax.runtime import host_memory
  host_memory.keep_freed_memory()

from benchmarks import bench_util  # noqa: E402
from bert_jax.runtime import metric_writers  # noqa: E402
from experiments import pretrain_demo, pretrain_modernbert  # noqa: E402

PHASES = ("pretrain", "extend", "decay")
EXTEND_RATE_RATIO = pretrain_modernbert.EXTEND_LEARNING_RATE / pretrain_modernbert.SIZES["base"][0]
EXTENDED_GLOBAL_THETA = pretrain_modernbert.PHASES["extend"][1]
SPAN = 48                    # tokens of the copied span
PROBE_ROWS = 64
CONDITIONS = ("near", "far", "control")


def predictions_for(length: int) -> int:
  """Masked-LM slots for 30% of a row, in slots of 8 (the training rate; evaluation uses 15%)."""
  return 8 * math.ceil(0.30 * length / 8)


def phase_config(phase: str, args, init_checkpoint: str = ""):
  """The twin's config for one phase (module docstring)."""
  c = pretrain_demo.get_config("recipe=modern")
  c.data.instances = args.instances
  c.eval_every_steps, c.eval_steps = 0, 0      # phases are scored afterwards, at every length
  c.checkpoint_every_steps, c.keep_checkpoints = 500, 1
  if phase == "pretrain":
    c.max_seq_length, c.max_predictions_per_seq = args.pretrain_length, predictions_for(
        args.pretrain_length)
    c.num_train_steps = args.pretrain_steps
    c.warmup_steps = min(c.warmup_steps, args.pretrain_steps // 4)
    c.schedule.update(decay_fraction=0.0)      # held after the warm-up
    return c
  rows = c.global_batch_size * args.pretrain_length // args.extend_length
  c.max_seq_length = args.extend_length
  c.max_predictions_per_seq = predictions_for(args.extend_length)
  c.global_batch_size, c.eval_batch_size = rows, max(rows, 8)
  c.model.global_rope_theta = EXTENDED_GLOBAL_THETA
  c.learning_rate *= EXTEND_RATE_RATIO
  c.warmup_steps = 0
  c.batch_warmup.start_batch_size = 0
  c.init_checkpoint = init_checkpoint
  c.init_optimizer_state = bool(init_checkpoint)   # the moments carried, as the recipe's phases
  if phase == "extend":
    c.num_train_steps = args.extend_steps
    c.schedule.update(decay_fraction=0.0)
  else:
    c.num_train_steps = args.decay_steps
    c.schedule.update(decay_fraction=1.0, decay_shape="1-sqrt", final_fraction=0.0)
  return c


def train_phase(phase: str, args, previous: str) -> Dict[str, object]:
  from bert_jax.tasks import registry
  workdir = os.path.join(args.out, phase)
  config = phase_config(phase, args, init_checkpoint=previous)
  start = time.perf_counter()
  last = registry.run_job(config, workdir)
  train = metric_writers.read_metrics(workdir, "train")
  return dict(workdir=workdir, steps=config.num_train_steps, length=config.max_seq_length,
              rows=config.global_batch_size, learning_rate=config.learning_rate,
              global_rope_theta=config.model.global_rope_theta,
              final_train_loss=float(last.get("loss", train[-1]["loss"])),
              train_seconds=float(train[-1]["train_seconds"]),
              wall_seconds=time.perf_counter() - start)


def score(phase: str, args, length: int) -> Dict[str, float]:
  """Held-out MLM at 15% of `phase`'s final model on rows of `length` tokens."""
  from bert_jax.tasks import registry
  workdir = os.path.join(args.out, "scores", f"{phase}_{length}")
  shared = os.path.join(args.out, "scores", f"data_{length}")
  if os.path.exists(os.path.join(shared, "DONE")) and not os.path.exists(
      os.path.join(workdir, "data")):
    os.makedirs(workdir, exist_ok=True)                     # one build of the records per length
    shutil.copytree(shared, os.path.join(workdir, "data"))
  config = phase_config(phase, args)
  config.init_checkpoint = os.path.join(args.out, phase)
  config.max_seq_length, config.max_predictions_per_seq = length, predictions_for(length)
  config.eval_batch_size = max(8, 64 * args.pretrain_length // length)
  config.num_train_steps, config.eval_before_training = 0, True
  config.eval_every_steps, config.eval_steps = 1, 0        # the whole held-out set, at step 0
  config.batch_warmup.start_batch_size = 0
  config.data.dupe_factor = 1                   # the training records of this workdir go unused
  if not metric_writers.read_metrics(workdir, "eval"):
    registry.run_job(config, workdir)
  if not os.path.exists(os.path.join(shared, "DONE")):
    shutil.copytree(os.path.join(workdir, "data"), shared)
  evals = metric_writers.read_metrics(workdir, "eval")
  if not evals:
    raise RuntimeError(f"{workdir}/metrics.jsonl holds no evaluation")
  return dict(loss=float(evals[-1]["loss"]), mlm_accuracy=float(evals[-1]["mlm_accuracy"]))


def probe_rows(stream: np.ndarray, length: int, gap: int, special, seed: int = 0):
  """The probe's rows of `length` tokens cut from the held-out token `stream` (module
  docstring): {condition: (input_ids [R, L], masked_lm_positions [R, P], masked_lm_ids [R, P])}.
  The masked positions and ids are the same in every condition; only what precedes differs."""
  rng = np.random.default_rng(seed)
  body = length - 2                                 # [CLS] ... [SEP]
  filler = body - 2 * SPAN
  rows = {c: [] for c in CONDITIONS}
  masked = max(1, round(0.15 * SPAN))
  positions = []
  for _ in range(PROBE_ROWS):
    start = rng.integers(0, len(stream) - body - SPAN)
    span, other = stream[start:start + SPAN], stream[start + SPAN:start + 2 * SPAN]
    text = stream[start + 2 * SPAN:start + 2 * SPAN + filler]
    chosen = np.sort(rng.choice(SPAN, masked, replace=False))
    copy = span.copy()
    copy[chosen] = special.mask_id
    near = np.concatenate([text[:filler - gap], span, text[filler - gap:], copy])
    far = np.concatenate([span, text, copy])
    control = np.concatenate([other, text, copy])
    for condition, tokens in zip(CONDITIONS, (near, far, control)):
      rows[condition].append(np.concatenate([[special.cls_id], tokens, [special.sep_id]]))
    positions.append(1 + body - SPAN + chosen)
  return {c: np.stack(r) for c, r in rows.items()}, np.stack(positions)       # [R, L], [R, P]


def long_context_probe(phase: str, args) -> Dict[str, float]:
  """Masked-token accuracy of `phase`'s final model on the probe's rows, per condition."""
  import jax
  from bert_jax import families
  from bert_jax.io import checkpoints
  from bert_jax.text import tokenization
  from data_pipelines import masking
  data = os.path.join(args.out, "pretrain", "data")
  tokenizer = tokenization.FullTokenizer(os.path.join(data, "vocab.txt"), do_lower_case=True)
  special = masking.SpecialTokens.from_tokenizer(tokenizer)
  with open(os.path.join(data, "eval.txt"), encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  stream = np.concatenate([np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(lines)
                           if ids])
  gap = args.pretrain_length // 4
  rows, positions = probe_rows(stream, args.extend_length, gap, special)
  # The masked tokens' truth: the span's tokens before masking, at the same positions of the
  # `far` rows' first copy (which holds the span unmasked).
  truth = np.take_along_axis(rows["far"], positions - (args.extend_length - 2 - SPAN), axis=1)
  config, params = checkpoints.load_pretrained(os.path.join(args.out, phase))
  model = families.of(config).pretraining_model(config, use_nsp=False)
  apply = jax.jit(lambda ids, where: model.apply(
      {"params": params}, ids, (ids > 0).astype(np.int32), masked_lm_positions=where)[
          "mlm_logits"])
  scores = {}
  for condition in CONDITIONS:
    correct = 0
    for start in range(0, PROBE_ROWS, 16):
      part = slice(start, start + 16)
      logits = np.asarray(apply(rows[condition][part], positions[part]))     # [16, P, V]
      correct += int(np.sum(np.argmax(logits, axis=-1) == truth[part]))
    scores[condition] = correct / truth.size
  scores["far_minus_control"] = scores["far"] - scores["control"]
  return scores


def markdown(result) -> str:
  lengths = result["args"]["lengths"]
  lines = ["| phase | trained at | steps | rows x tokens | rate | global rotary base | "
           + " | ".join(f"held-out loss / acc at {n}" for n in lengths) + " |",
           "|---" * (6 + len(lengths)) + "|"]
  for phase in ("pretrain",) + PHASES[1:]:
    p = result["phases"][phase]
    cells = [f"{result['scores'][phase][str(n)]['loss']:.3f} / "
             f"{result['scores'][phase][str(n)]['mlm_accuracy']:.3f}" for n in lengths]
    lines.append(f"| {phase} | {p['length']} | {p['steps']} | {p['rows']} x {p['length']} | "
                 f"{p['learning_rate']:.2e} | {p['global_rope_theta']:g} | "
                 + " | ".join(cells) + " |")
  lines += ["", f"Long context ({result['args']['instances']}): masked-token accuracy of the "
            f"probe's copies at {result['args']['extend_length']} tokens, the first copy near "
            f"(within {result['args']['pretrain_length']}), far (beyond it) or absent (control)",
            "", "| phase | near | far | control | far - control |", "|---|---|---|---|---|"]
  for phase in PHASES:
    p = result["probe"][phase]
    lines.append(f"| {phase} | {p['near']:.3f} | {p['far']:.3f} | {p['control']:.3f} | "
                 f"{p['far_minus_control']:+.3f} |")
  lines.append("")
  lines.append(f"{result['machine']}. Training time per phase: " + ", ".join(
      f"{phase} {result['phases'][phase]['train_seconds']:.0f} s" for phase in PHASES) + ".")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="/tmp/modern_phases")
  parser.add_argument("--pretrain_steps", type=int, default=1500)
  parser.add_argument("--extend_steps", type=int, default=300)
  parser.add_argument("--decay_steps", type=int, default=300)
  parser.add_argument("--pretrain_length", type=int, default=128)
  parser.add_argument("--extend_length", type=int, default=512)
  parser.add_argument("--lengths", default="128,512",
                      help="comma list: the row lengths every phase's model is scored at")
  parser.add_argument("--instances", default="documents", choices=("documents", "contiguous"),
                      help="documents kept apart (the recipe's) or crossing (FULL-SENTENCES)")
  args = parser.parse_args()
  lengths: List[int] = [int(n) for n in args.lengths.split(",")]
  os.makedirs(args.out, exist_ok=True)
  result = dict(args=dict(vars(args), lengths=lengths), machine=bench_util.machine_line(),
                phases={}, scores={}, probe={})
  previous = ""
  for phase in PHASES:
    result["phases"][phase] = train_phase(phase, args, previous)
    previous = result["phases"][phase]["workdir"]
    print(f"{phase}: {result['phases'][phase]}", flush=True)
  for phase in PHASES:
    result["scores"][phase] = {str(n): score(phase, args, n) for n in lengths}
    print(f"{phase} held-out: {result['scores'][phase]}", flush=True)
    result["probe"][phase] = long_context_probe(phase, args)
    print(f"{phase} long-context probe: {result['probe'][phase]}", flush=True)
  bench_util.write_report(args.out, "modern_phases", result, markdown(result))


if __name__ == "__main__":
  main()
