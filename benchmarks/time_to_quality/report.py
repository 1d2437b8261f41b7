"""`--report`: the tables (time_to_quality.md/.json) and the plot of every side's curves, from
whatever stages have finished (a side not yet run is named as such)."""
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from benchmarks import bench_util
from benchmarks.time_to_quality import common, finetune, prepared

# The issue's goal for the modern sides: bert_jax's at least transformers' on GLUE, at this many
# times its steps per hour or more.
STEPS_PER_HOUR_GOAL = 1.3


def average_scores(per_task: Dict[str, dict]) -> List[float]:
  """Per seed, the mean over tasks of the task scores (seed i of every task together)."""
  seeds = min(len(e["scores"]) for e in per_task.values())
  return [float(np.mean([e["scores"][i] for e in per_task.values()])) for i in range(seeds)]


def last_within(curve: Sequence[dict], budget_seconds: float) -> Optional[dict]:
  """The last held-out evaluation at or before the budget. A side's steps come from a short
  calibration, and its sustained rate can differ (bert_jax's first run: 0.64 steps/s sustained
  against 0.72 calibrated, 67 minutes instead of 60): this column compares all at the budget."""
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
  """Held-out MLM loss and accuracy vs training minutes on both held-out sets (rows), every side
  with a curve (matplotlib PNG)."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib is not installed: no plot (pip install matplotlib)", flush=True)
    return None
  fig, axes = plt.subplots(len(common.EVAL_SETS), 2, figsize=(11, 4.0 * len(common.EVAL_SETS)),
                           squeeze=False)
  titles = {"pairs": "held-out NSP pairs", "text": "held-out contiguous text"}
  for (loss_ax, acc_ax), eval_set in zip(axes, common.EVAL_SETS):
    for side, rows in curves.items():
      rows = [r for r in rows if common.metric(r, eval_set, "mlm_loss") is not None]
      if not rows:
        continue
      minutes = [r["seconds"] / 60 for r in rows]
      style = dict(marker="o", markersize=3, color=common.COLORS[side], label=side,
                   linestyle="--" if common.RECIPE[side] == "modern" else "-")
      loss_ax.plot(minutes, [common.metric(r, eval_set, "mlm_loss") for r in rows], **style)
      acc_ax.plot(minutes, [common.metric(r, eval_set, "mlm_accuracy") for r in rows], **style)
    loss_ax.set(xlabel="training wall clock (minutes)", ylabel="MLM loss (15% masked)",
                title=f"Masked-LM loss, {titles.get(eval_set, eval_set)}")
    acc_ax.set(xlabel="training wall clock (minutes)", ylabel="MLM accuracy (15% masked)",
               title=f"Masked-LM accuracy, {titles.get(eval_set, eval_set)}")
    for ax in (loss_ax, acc_ax):
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:
        ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _pm(s: dict) -> str:
  return f"{s['mean']:.1f} +- {s['std']:.1f}"


def _num(value, digits: int = 3) -> str:
  return "-" if value is None else f"{value:.{digits}f}"


def describe_documents(documents: Dict[str, Dict[str, int]]) -> str:
  """'training: 1,083 book + 2,112 Python-docs documents, 1,434,218 words; held out: ...'."""
  parts = []
  for split, label in (("train", "training"), ("eval", "held out")):
    counts = documents.get(split, {})
    parts.append(f"{label}: {counts.get('text', 0):,} book + {counts.get('python_docs', 0):,} "
                 f"Python-docs documents, {counts.get('words', 0):,} words")
  return "; ".join(parts)


def settings_of(args, sides: Dict[str, dict], recipe: str):
  """The recipe's flags as its first finished side ran them (else this command's)."""
  for side, data in sides.items():
    if common.RECIPE[side] == recipe and data.get("summary", {}).get("settings"):
      merged = dict(vars(args))
      merged.update(data["summary"]["settings"])
      return type(args)(**merged)
  return args


def describe_data(args, info: dict, sides: Dict[str, dict]) -> List[str]:
  bert_args, modern_args = settings_of(args, sides, "bert"), settings_of(args, sides, "modern")
  args = bert_args
  lines = [f"Corpus: {describe_documents(info['documents'])}; vocabulary {info['vocab_size']} "
           "(WordPiece, uncased). BERT's recipe: "
           f"{info['instances']['train']:,} NSP-pair training instances (dupe factor "
           f"{info['settings']['dupe_factor']}, mean length {info['mean_train_length']:.0f}), "
           f"BERT-{args.size}, MLM 15% + NSP, batch {args.batch} x {info['seq']}, AdamW, peak lr "
           f"{args.lr:g}, warm-up {100 * args.warmup_proportion:g}% of each side's steps, linear "
           "decay."]
  part = info.get("contiguous")
  args = modern_args
  if part:
    lines.append(
        f"The modern recipe: {part['instances']['train']:,} contiguous-text rows (dupe factor "
        f"{part['dupe_factor']}), a ModernBERT-family model of BERT-{args.size}'s size, MLM "
        f"alone at {100 * args.modern_masking:g}%, batch ramped {args.batch_warmup_start} -> "
        f"{args.batch} over {100 * args.batch_warmup_fraction:g}% of the tokens, StableAdamW, "
        f"peak lr {args.modern_lr:g}, warm-up {100 * args.warmup_proportion:g}% of the tokens, "
        f"1-sqrt decay over the last {100 * args.decay_fraction:g}% of the steps.")
    lines.append(
        f"Held out (every side scored on the same instances and masks, 15%): pairs "
        f"{info['eval_sequences']} sequences / {info['eval_masked_tokens']} masked tokens; "
        f"text {part['eval_sequences']} rows / {part['eval_masked_tokens']} masked tokens.")
  else:
    lines.append(f"Held-out pairs: {info['eval_sequences']} sequences / "
                 f"{info['eval_masked_tokens']} masked tokens (no contiguous-text part yet: "
                 "--prepare adds it).")
  return lines


def steps_per_sec(summary: dict) -> Optional[float]:
  """Sustained: the side's steps over its training time."""
  seconds = summary.get("train_seconds")
  return summary["steps"] / seconds if seconds else None


def pretraining_table(sides: Dict[str, dict]) -> List[str]:
  lines = ["| side | recipe | calibrated steps/s | sustained steps/s | steps (sequences) | "
           "training minutes | pairs: MLM loss, accuracy | NSP accuracy | text: MLM loss, "
           "accuracy | last evaluation within the budget: minute; pairs loss, accuracy; text "
           "loss, accuracy |", "|---|---|---|---|---|---|---|---|---|---|"]
  for side, data in sides.items():
    summary = data.get("summary")
    if not summary or not summary.get("final"):
      state = "running or stopped" if data["curve"] else "not run"
      lines.append(f"| {side} | {common.RECIPE[side]} | {state} | | | | | | | |")
      continue
    cal = summary["plan"]["calibration"]
    final = summary["final"]
    m = lambda row, s, name: common.metric(row, s, name)
    within = last_within(data["curve"], summary["plan"]["budget_seconds"])
    lines.append(
        f"| {side} | {common.RECIPE[side]} | {cal['steps_per_sec']:.3f} | "
        f"{_num(steps_per_sec(summary))} | {summary['steps']:,} ({summary['sequences']:,}) | "
        f"{summary['train_seconds'] / 60:.1f} | {_num(m(final, 'pairs', 'mlm_loss'))}, "
        f"{_num(m(final, 'pairs', 'mlm_accuracy'))} | "
        f"{_num(m(final, 'pairs', 'nsp_accuracy'))} | {_num(m(final, 'text', 'mlm_loss'))}, "
        f"{_num(m(final, 'text', 'mlm_accuracy'))} | "
        + (f"{within['seconds'] / 60:.1f}; {_num(m(within, 'pairs', 'mlm_loss'))}, "
           f"{_num(m(within, 'pairs', 'mlm_accuracy'))}; {_num(m(within, 'text', 'mlm_loss'))}, "
           f"{_num(m(within, 'text', 'mlm_accuracy'))} |" if within else "none |"))
  return lines


def glue_tables(args, finetuned: Dict[str, Dict[str, dict]], result: dict) -> List[str]:
  """Per task and on average, every side with fine-tuning results (the average over the tasks
  every such side has finished, so that the averages compare)."""
  from bert_jax.tasks.datasets import glue
  sides = [s for s in common.SIDES if finetuned.get(s)]
  tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  missing = [s for s in common.SIDES if s not in sides]
  lines = ["", f"GLUE dev (whole dev sets), {args.seeds} seed(s), mean +- std over seeds "
           f"(score = mean of the task's metrics x100); recipe: batch {args.ft_batch}, lr "
           f"{args.ft_lr:g}, {args.ft_epochs} epochs, max length {args.ft_max_seq}; training "
           f"subsets: {args.ft_train_examples or 'none'}."
           + (f" Not fine-tuned yet: {', '.join(missing)}." if missing else ""), "",
           "| task | metric | " + " | ".join(sides) + " | minutes (" + " / ".join(sides) + ") |",
           "|---|---|" + "---|" * len(sides) + "---|"]
  table = {}
  for task in tasks:
    entries = {side: finetuned[side].get(task) for side in sides}
    if not any(entries.values()):
      continue
    spec = glue.spec_for(task)
    s = {side: bench_util.seed_spread(e["scores"]) for side, e in entries.items() if e}
    table[task] = s
    lines.append(f"| {spec.folder} | {'/'.join(spec.metrics)} | "
                 + " | ".join(_pm(s[side]) if side in s else "-" for side in sides) + " | "
                 + " / ".join(f"{entries[side]['seconds'] / 60:.0f}" if entries[side] else "-"
                              for side in sides) + " |")
  complete = [t for t in tasks if t in table and all(side in table[t] for side in sides)]
  if complete:
    averages = {side: bench_util.seed_spread(
        average_scores({t: finetuned[side][t] for t in complete})) for side in sides}
    lines.append(f"| **average** | {len(complete)} tasks | "
                 + " | ".join(f"**{_pm(averages[side])}**" for side in sides) + " | |")
    result["average"] = averages
  result["table"] = table
  return lines


def goals(sides: Dict[str, dict], averages: Dict[str, dict]) -> List[str]:
  """The issue's goals, each met, not met, or not yet measurable."""
  lines = ["", "Goals:"]
  for modern_side, bert_side in (("bert_jax_modern", "bert_jax"), ("hf_modern", "transformers")):
    a, b = averages.get(modern_side), averages.get(bert_side)
    if not (a and b):
      lines.append(f"- {modern_side} ahead of {bert_side} on the GLUE average by more than the "
                   "seed spread: not yet measured (a side has no GLUE average)")
      continue
    diff, spread = a["mean"] - b["mean"], max(a["std"], b["std"])
    lines.append(f"- {modern_side} ahead of {bert_side} on the GLUE average by more than the "
                 f"seed spread (the larger seed std, {spread:.1f}): {diff:+.1f}, "
                 f"**{'met' if diff > spread else 'not met'}**")
  jax_summary = sides["bert_jax_modern"].get("summary")
  hf_summary = sides["hf_modern"].get("summary")
  a, b = averages.get("bert_jax_modern"), averages.get("hf_modern")
  if not (jax_summary and hf_summary and a and b):
    lines.append(f"- bert_jax_modern at least equal to hf_modern on the GLUE average at >= "
                 f"{STEPS_PER_HOUR_GOAL}x its steps per hour: not yet measured")
  else:
    ratio = steps_per_sec(jax_summary) / steps_per_sec(hf_summary)
    diff = a["mean"] - b["mean"]
    within = abs(diff) <= max(a["std"], b["std"])
    met = diff >= 0 and ratio >= STEPS_PER_HOUR_GOAL
    lines.append(f"- bert_jax_modern at least equal to hf_modern on the GLUE average "
                 f"({diff:+.1f}{', within the seed spread' if within else ''}) at >= "
                 f"{STEPS_PER_HOUR_GOAL}x its steps per hour ({ratio:.2f}x sustained): "
                 f"**{'met' if met else 'not met'}**")
  return lines


def report(args) -> dict:
  """OUT/time_to_quality.md and .json, and the plot, from whatever stages have finished."""
  info = prepared.read_data_info(args.out)
  sides = {side: read_side(args, side) for side in common.SIDES}
  finetuned = finetune.collect_finetune(args)
  lines = describe_data(args, info, sides) + [""] + pretraining_table(sides)
  result = dict(data=info, pretraining={s: d.get("summary") for s, d in sides.items()},
                curves={s: d["curve"] for s, d in sides.items()}, finetune=finetuned,
                machine=bench_util.machine_line(), args=vars(args))
  if finetuned:
    lines += glue_tables(args, finetuned, result)
  lines += goals(sides, result.get("average", {}))
  plot = plot_curves({s: d["curve"] for s, d in sides.items()}, args.plot)
  if plot:
    lines += ["", f"Plot: `{plot}` (held-out MLM loss and accuracy vs training minutes, on the "
              "pairs and the text set)."]
  lines += ["", f"Machine: {result['machine']}."]
  markdown = "\n".join(lines)
  with open(os.path.join(args.out, "time_to_quality.md"), "w") as f:
    f.write(markdown + "\n")
  common.write_json(os.path.join(args.out, "time_to_quality.json"), result)
  print(markdown, flush=True)
  return result
