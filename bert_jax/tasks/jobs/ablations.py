"""The paper's ablations at one budget, in one run: Table 5 (pre-training tasks) and appendix
C.2 (masking mixtures).

Every variant is pre-trained from scratch with the same configuration, data, steps and seed,
except for what it ablates (`VARIANTS`), in WORKDIR/<variant>/pretraining; then fine-tuned on
the same GLUE tasks with one recipe and the same seeds (WORKDIR/<variant>/glue/<task>), and the
C.2 variants are probed feature-based on NER like the paper's last C.2 column
(WORKDIR/<variant>/ner_feature_based). The demo corpus, when the pre-training config asks for
it, is prepared once in WORKDIR/data and shared.

A piece that finished (its results file is there) is read, not run again; an unfinished one
resumes (pre-training exactly, from its last checkpoint), so the same command continues an
interrupted study. The table, with the paper's numbers beside, goes to WORKDIR/ablations.md and
WORKDIR/results.json after every variant.
"""
import json
from typing import Any, Dict, List, Optional

import ml_collections
import numpy as np

from bert_jax.io import filesystem
from bert_jax.runtime import config_names, outputs
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.tasks.datasets import glue
from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.jobs import feature_based, pretraining

# name -> (paper table, overrides of the pre-training config as dotted field names)
VARIANTS = {
    "mlm_nsp": ("Table 5 and C.2: BERT (MLM + NSP, 80/10/10)", {}),
    "no_nsp": ("Table 5: No NSP", {"objective": "mlm"}),
    "ltr_no_nsp": ("Table 5: LTR & No NSP", {"objective": "ltr"}),
    "mask_100_0_0": ("C.2: 100/0/0", {"data.mask_mixture": "100/0/0"}),
    "mask_80_0_20": ("C.2: 80/0/20", {"data.mask_mixture": "80/0/20"}),
    "mask_80_20_0": ("C.2: 80/20/0", {"data.mask_mixture": "80/20/0"}),
    "mask_0_20_80": ("C.2: 0/20/80", {"data.mask_mixture": "0/20/80"}),
    "mask_0_0_100": ("C.2: 0/0/100", {"data.mask_mixture": "0/0/100"}),
}
C2_VARIANTS = ("mlm_nsp",) + tuple(v for v in VARIANTS if v.startswith("mask_"))

# The paper's dev numbers (BERT-base): Table 5 (GLUE accuracy/F1, SQuAD v1.1 F1) and Table 8 of
# appendix C.2 (MNLI accuracy, NER F1 fine-tuned and feature-based from the last four layers).
PAPER_TABLE5 = {
    "mlm_nsp": {"MNLI-m": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7, "SQuAD": 88.5},
    "no_nsp": {"MNLI-m": 83.9, "QNLI": 84.9, "MRPC": 86.5, "SST-2": 92.6, "SQuAD": 87.9},
    "ltr_no_nsp": {"MNLI-m": 82.1, "QNLI": 84.3, "MRPC": 77.5, "SST-2": 92.1, "SQuAD": 77.8},
}
PAPER_C2 = {
    "mlm_nsp": {"MNLI": 84.2, "NER fine-tune": 95.4, "NER feature-based": 94.9},
    "mask_100_0_0": {"MNLI": 84.3, "NER fine-tune": 94.9, "NER feature-based": 94.0},
    "mask_80_0_20": {"MNLI": 84.1, "NER fine-tune": 95.2, "NER feature-based": 94.6},
    "mask_80_20_0": {"MNLI": 84.4, "NER fine-tune": 95.2, "NER feature-based": 94.7},
    "mask_0_20_80": {"MNLI": 83.7, "NER fine-tune": 94.8, "NER feature-based": 94.6},
    "mask_0_0_100": {"MNLI": 83.6, "NER fine-tune": 94.9, "NER feature-based": 94.6},
}
TABLE_FILE = "ablations.md"
# Every MLM variant is also scored on one masking of the held-out set: every target [MASK], at
# the positions the shared seed picks. Each variant's own masking is what it trained for, but
# a mixture's kept tokens are easy targets, so only this column compares the C.2 rows.
COMMON_MASKING = "100/0/0"


def variant_names(config) -> List[str]:
  names = [v.strip() for v in config.variants.split(",") if v.strip()]
  unknown = [v for v in names if v not in VARIANTS]
  if unknown:
    raise ValueError(f"config.variants: unknown {unknown}; expected names from {list(VARIANTS)}")
  return names


def pretraining_config(config, name: str) -> ml_collections.ConfigDict:
  """`config.pretraining` with the variant's overrides."""
  return config_names.replaced(config.pretraining, VARIANTS[name][1])


def _finetuning_config(template, checkpoint: str, vocab_file: str, causal: bool):
  # LTR is fine-tuned left to right, as in the paper.
  return config_names.replaced(template, {"init_checkpoint": checkpoint,
                                          "tokenizer.vocab_file": vocab_file,
                                          "model.causal_attention": causal})


def _finished(workdir: str) -> Optional[Dict]:
  path = filesystem.join(workdir, finetuning.RESULTS_FILE)
  return json.loads(filesystem.read_text(path)) if filesystem.exists(path) else None


def _last_eval(workdir: str) -> Dict[str, float]:
  evals = [r for r in read_metrics(workdir) if r.get("split") == "eval"]
  return evals[-1] if evals else {}


def _common_masking_eval(pre_config, pre_dir: str, workdir: str) -> Dict[str, float]:
  """The pre-trained model's held-out metrics under COMMON_MASKING (no training: an evaluation
  of the final checkpoint, logged as step 0 in WORKDIR/metrics.jsonl and read back after)."""
  done = _last_eval(workdir)  # {} until it ran (read_metrics: no file, no records)
  if done:
    return done
  c = config_names.replaced(pre_config, {
      "init_checkpoint": pre_dir, "data.mask_mixture": COMMON_MASKING, "num_train_steps": 0,
      "eval_before_training": True})
  pretraining.train_and_evaluate(c, workdir)
  return _last_eval(workdir)


def _glue_scores(results: Dict[str, Dict]) -> Dict[str, Dict[str, Any]]:
  """{task: {"scores": per-seed GLUE scores (x100), "mean", "std"}} from run_all's results."""
  out = {}
  for name, result in results.items():
    spec = glue.spec_for(name)
    runs = result.get("seeds") or {str(result.get("seed", 0)): result}
    scores = [glue.task_score(run["dev"], spec) for run in runs.values()]
    spread = finetuning.seed_spread(scores)
    out[name] = {"scores": scores, "mean": spread["mean"], "std": spread["std"]}
  return out


def run_variant(config, name: str, workdir: str, vocab_file: str) -> Dict[str, Any]:
  """Pre-trains, fine-tunes and probes one variant (each piece skipped once finished)."""
  pre_config = pretraining_config(config, name)
  pre_dir = filesystem.join(workdir, "pretraining")
  last = pretraining.train_and_evaluate(pre_config, pre_dir)
  if last.get("preempted"):
    return {"preempted": True}
  result: Dict[str, Any] = {"paper_table": VARIANTS[name][0],
                            "pretraining_eval": _last_eval(pre_dir)}
  causal = pre_config.objective == "ltr"
  if not causal:
    result["common_masking_eval"] = _common_masking_eval(
        pre_config, pre_dir, filesystem.join(workdir, "common_masking_eval"))
  glue_dir = filesystem.join(workdir, "glue")
  glue_results = _finished(glue_dir)
  if glue_results is None:
    glue_config = _finetuning_config(config.glue, pre_dir, vocab_file, causal)
    glue_results = glue.run_all(glue_config, glue_dir)
    if any(r.get("preempted") for r in glue_results.values()):
      return {"preempted": True}
  else:
    glue_results = glue_results["tasks"]
  result["glue"] = _glue_scores(glue_results)
  result["glue_average"] = float(np.mean([t["mean"] for t in result["glue"].values()]))
  if config.ner_probe.enabled and name in C2_VARIANTS:
    probe_dir = filesystem.join(workdir, "ner_feature_based")
    probe = _finished(probe_dir)
    if probe is None:
      probe_config = _finetuning_config(config.ner_probe.config, pre_dir, vocab_file, causal)
      probe = feature_based.run(probe_config, probe_dir)
      if probe.get("preempted"):
        return {"preempted": True}
    result["ner_feature_based_f1"] = {k: 100 * v["f1"] for k, v in probe["dev"].items()}
  return result


def results_table(results: Dict[str, Dict], seeds: int) -> str:
  """Ours (mean +- std over the fine-tuning seeds) beside the paper's dev numbers."""
  tasks = sorted({t for r in results.values() for t in r.get("glue", {})})
  probe = any("ner_feature_based_f1" in r for r in results.values())
  head = (["variant", "held-out MLM acc", "held-out MLM acc, all [MASK]"]
          + [glue.spec_for(t).folder for t in tasks] + ["GLUE avg"]
          + (["NER feature-based F1"] if probe else []) + ["paper (dev)"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, r in results.items():
    mlm = r["pretraining_eval"].get("mlm_accuracy")
    cells = [f"{name}", "" if mlm is None else f"{mlm:.3f}" + (" (next token)" if
                                                                 name == "ltr_no_nsp" else "")]
    common = r.get("common_masking_eval", {}).get("mlm_accuracy")
    cells.append("" if common is None else f"{common:.3f}")
    cells += [f"{r['glue'][t]['mean']:.1f} +- {r['glue'][t]['std']:.1f}" for t in tasks]
    cells.append(f"{r['glue_average']:.1f}")
    if probe:
      cells.append(", ".join(f"{v:.1f}" for v in r.get("ner_feature_based_f1", {}).values()))
    paper = {**PAPER_TABLE5.get(name, {}), **PAPER_C2.get(name, {})}
    cells.append("; ".join(f"{k} {v}" for k, v in paper.items()))
    lines.append("| " + " | ".join(cells) + " |")
  lines.append(f"\nGLUE dev scores x100 (the leaderboard's per-task score), mean +- sample std "
               f"over {seeds} fine-tuning seed(s); one pre-training run per variant. Held-out MLM "
               f"accuracy: on the variant's own masking (next token for LTR), then on one "
               f"masking for all ({COMMON_MASKING}: every target [MASK], the same positions).")
  return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """The `ablations` runner: every variant of `config.variants`, then the table."""
  names = variant_names(config)
  workdir = filesystem.absolute(workdir)
  filesystem.makedirs(workdir)
  if config.pretraining.data.prepare_demo_corpus:
    from bert_jax.tasks.jobs import pretraining_data
    data = pretraining_data.data_changes(config.pretraining, workdir)  # WORKDIR/data, once
    config = config_names.replaced(config, dict(
        {f"pretraining.{k}": v for k, v in data.items()},
        **{"pretraining.data.prepare_demo_corpus": False}))
  vocab_file = config.pretraining.tokenizer.vocab_file
  results: Dict[str, Any] = {}
  for name in names:
    print(f"[ablations] {name}: {VARIANTS[name][0]}", flush=True)
    result = run_variant(config, name, filesystem.join(workdir, name), vocab_file)
    if result.get("preempted"):
      return {"preempted": True}
    results[name] = result
    table = results_table(results, int(config.glue.seeds))
    if outputs.is_writer():
      filesystem.write_text(filesystem.join(workdir, TABLE_FILE), table + "\n")
      filesystem.write_text(filesystem.join(workdir, finetuning.RESULTS_FILE),
                            json.dumps({"variants": results, "table": table}, indent=2,
                                       sort_keys=True))
  print(table, flush=True)
  return results
