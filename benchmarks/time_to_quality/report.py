"""`--report`: the tables (time_to_quality.md/.json) and the plot of both curves."""
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from benchmarks import bench_util
from benchmarks.time_to_quality import common, finetune, prepared


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
  out = dict(curve=common.read_jsonl(os.path.join(side_dir, "curve.jsonl")))
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
                 color=common.COLORS[side], label=side)
    acc_ax.plot(minutes, [r["mlm_accuracy"] for r in rows], marker="o", markersize=3,
                color=common.COLORS[side], label=side)
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
  from bert_jax.tasks.datasets import glue
  info = prepared.read_data_info(args.out)
  sides = {side: read_side(args, side) for side in common.SIDES}
  finetuned = finetune.collect_finetune(args)
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
      entries = {side: finetuned.get(side, {}).get(task) for side in common.SIDES}
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
          average_scores({t: finetuned[side][t] for t in complete})) for side in common.SIDES}
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
  common.write_json(os.path.join(args.out, "time_to_quality.json"), result)
  print(markdown, flush=True)
  return result
