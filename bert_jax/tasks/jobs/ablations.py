"""Ablation studies at one budget, in one run: the paper's Table 5 (pre-training tasks) and
appendix C.2 (masking mixtures), and what each part of the modern recipe buys added alone to BERT's.

Every variant is pre-trained from scratch with the same configuration, data, steps and seed,
except for what it changes (`VARIANTS`), in WORKDIR/<variant>/pretraining; then fine-tuned on
the same GLUE tasks with one recipe and the same seeds (WORKDIR/<variant>/glue/<task>), and the
C.2 variants are probed feature-based on NER like the paper's last C.2 column
(WORKDIR/<variant>/ner_feature_based). The demo corpus, when the pre-training config asks for
it, is prepared once per form of instance the study needs and shared: NSP pairs in WORKDIR/data,
the same documents as contiguous text (the no-NSP rows of the modern parts) in
WORKDIR/contiguous/data, one vocabulary. Every MLM variant's final checkpoint is also scored on
the held-out sets `config.common_evals` names (`COMMON_EVALS`: the same instances and masked
positions for every variant).

A piece that finished (its results file is there) is read, not run again; an unfinished one
resumes (pre-training exactly, from its last checkpoint), so the same command continues an
interrupted study. The table, with the paper's numbers beside, goes to WORKDIR/ablations.md and
WORKDIR/results.json after every variant.
"""
import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import ml_collections
import numpy as np

from bert_jax.io import filesystem
from bert_jax.families.modernbert.config import modern_counterpart
from bert_jax.model.config import BertConfig
from bert_jax.runtime import config_names, outputs
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.tasks.datasets import glue
from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.jobs import feature_based



@dataclasses.dataclass(frozen=True)
class Variant:
  title: str                       # the paper's table row, or the recipe part it adds
  overrides: Dict[str, Any]        # of the pre-training config, as dotted field names
  # Not None: the model is the ModernBERT family of the base model's size
  # (`modern_counterpart`: the MLP's weights kept, a window of half the row, both rotary
  # bases 10,000) with the block fields this returns (given the base model) changed.
  modern_block: Optional[Callable[[BertConfig], Dict[str, Any]]] = None


# The modern recipe's parts (ModernBERT, Warner et al. 2024; experiments/pretrain_modernbert.py
# has each value's source), each a change of BERT's demo recipe.
MASK_30 = {"data.masked_lm_prob": 0.30, "max_predictions_per_seq": 40}   # 0.30 * 126 = 38
STABLE_ADAMW = {"optimizer.name": "stable_adamw", "optimizer.b2": 0.98,   # b1 0.9 as BERT's
                "optimizer.weight_decay": 1e-5, "optimizer.fully_decoupled_weight_decay": True,
                "optimizer.clip_grad_norm": 0.0}
WSD = {"schedule.name": "wsd", "schedule.decay_fraction": 0.2, "schedule.decay_shape": "1-sqrt"}
# The ModernBERT family has no NSP head: its rows train the masked LM alone on contiguous text,
# and compare with `no_nsp_text`, BERT's block on the same records.
NO_NSP_TEXT = {"objective": "mlm", "data.instances": "contiguous"}

VARIANTS = {
    "mlm_nsp": Variant("Table 5 and C.2: BERT (MLM + NSP, 80/10/10)", {}),
    "no_nsp": Variant("Table 5: No NSP", {"objective": "mlm"}),
    "ltr_no_nsp": Variant("Table 5: LTR & No NSP", {"objective": "ltr"}),
    "mask_100_0_0": Variant("C.2: 100/0/0", {"data.mask_mixture": "100/0/0"}),
    "mask_80_0_20": Variant("C.2: 80/0/20", {"data.mask_mixture": "80/0/20"}),
    "mask_80_20_0": Variant("C.2: 80/20/0", {"data.mask_mixture": "80/20/0"}),
    "mask_0_20_80": Variant("C.2: 0/20/80", {"data.mask_mixture": "0/20/80"}),
    "mask_0_0_100": Variant("C.2: 0/0/100", {"data.mask_mixture": "0/0/100"}),
    "mask_30": Variant("modern: 30% masking (80/10/10), with NSP", MASK_30),
    "stable_adamw": Variant("modern: StableAdamW (betas 0.9/0.98, decoupled weight decay 1e-5, "
                            "no clipping)", STABLE_ADAMW),
    "wsd": Variant("modern: warmup-stable-decay, 1-sqrt decay over the last 20%", WSD),
    "no_nsp_text": Variant("modern: no NSP, contiguous text", NO_NSP_TEXT),
    "modern_block": Variant("modern: the ModernBERT block (pre-norm, GeGLU, rotary positions, "
                            "local/global attention, no biases); vs no_nsp_text", NO_NSP_TEXT,
                            modern_block=lambda base: {}),
    "modern_block_no_glu": Variant(
        "modern: the ModernBERT block with BERT's GELU MLP; vs modern_block", NO_NSP_TEXT,
        modern_block=lambda base: {"glu": False, "intermediate_size": base.intermediate_size}),
    "modern_block_global": Variant(
        "modern: the ModernBERT block, every layer global; vs modern_block", NO_NSP_TEXT,
        modern_block=lambda base: {"local_attention": 0}),
    "modern_recipe": Variant("modern: all of the above (the block, no NSP, 30%, StableAdamW, "
                             "warmup-stable-decay)",
                             {**NO_NSP_TEXT, **MASK_30, **STABLE_ADAMW, **WSD},
                             modern_block=lambda base: {}),
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
# The paper's study scores every MLM variant on one masking of the held-out set: every target
# [MASK], at the positions the shared seed picks. Each variant's own masking is what it trained
# for, but a mixture's kept tokens are easy targets, so only this column compares the C.2 rows.
COMMON_MASKING = "100/0/0"
# BERT's held-out masking (15%, 80/10/10, at most 20 predictions a row, the shared seed), masked
# LM alone: the modern parts' rows trained at 30% or on another form of instance are all scored
# on the same positions of the same held-out documents, in both forms (neither is neutral: NSP
# pairs are BERT's training form, contiguous text the modern recipe's).
BERT_HELD_OUT = {"objective": "mlm", "data.mask_mixture": "80/10/10",
                 "data.random_token_ids": "vocabulary", "data.eval_masked_lm_prob": 0.15,
                 "max_predictions_per_seq": 20}


@dataclasses.dataclass(frozen=True)
class CommonEval:
  key: str                    # its results key and WORKDIR/<variant>/<key>
  column: str                 # its column in the table
  overrides: Dict[str, Any]   # of the variant's pre-training config
  instances: str = ""         # the held-out records of this form ("": the variant's own)
  scored: str = ""            # what it scores, for the table's note


# `config.common_evals` names these.
COMMON_EVALS = {
    "all_mask": CommonEval("common_masking_eval", "held-out MLM acc, all [MASK]",
                           {"data.mask_mixture": COMMON_MASKING},
                           scored=f"one masking for all ({COMMON_MASKING}: every target [MASK], "
                                  "the same positions)"),
    "pairs": CommonEval("eval_pairs", "held-out MLM acc at 15%, pairs", BERT_HELD_OUT, "pairs",
                        "BERT's 15% (80/10/10) on the held-out documents as NSP pairs"),
    "text": CommonEval("eval_text", "held-out MLM acc at 15%, text", BERT_HELD_OUT, "contiguous",
                       "BERT's 15% (80/10/10) on the same documents as contiguous text"),
}


def variant_names(config) -> List[str]:
  names = [v.strip() for v in config.variants.split(",") if v.strip()]
  unknown = [v for v in names if v not in VARIANTS]
  if unknown:
    raise ValueError(f"config.variants: unknown {unknown}; expected names from {list(VARIANTS)}")
  return names


def common_evals(config) -> List[CommonEval]:
  names = [v.strip() for v in config.common_evals.split(",") if v.strip()]
  unknown = [v for v in names if v not in COMMON_EVALS]
  if unknown:
    raise ValueError(f"config.common_evals: unknown {unknown}; expected names from "
                     f"{list(COMMON_EVALS)}")
  return [COMMON_EVALS[v] for v in names]


def pretraining_config(config, name: str) -> ml_collections.ConfigDict:
  """`config.pretraining` with the variant's overrides (and its ModernBERT-family model)."""
  variant = VARIANTS[name]
  c = config_names.replaced(config.pretraining, variant.overrides)
  if variant.modern_block is not None:
    base = BertConfig.from_dict(c.model.to_dict())
    fields = dict(local_attention=c.max_seq_length // 2, global_rope_theta=10_000.0,
                  local_rope_theta=10_000.0, pad_token_id=_pad_id(c))
    fields.update(variant.modern_block(base))
    model = modern_counterpart(base, **fields)
    c.model = ml_collections.ConfigDict(model.to_dict())
  return c


def _pad_id(config) -> int:
  """The [PAD] id of the run's vocabulary (0 before the study has learned one)."""
  if not (config.tokenizer.vocab_file or config.tokenizer.spm_model_file
          or config.tokenizer.tokenizer_file):
    return 0
  from bert_jax.text import tokenization
  return tokenization.create_tokenizer(
      vocab_file=config.tokenizer.vocab_file or None,
      spm_model_file=config.tokenizer.spm_model_file or None,
      tokenizer_file=config.tokenizer.tokenizer_file or None,
      do_lower_case=config.tokenizer.do_lower_case).pad_id


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


def _pretrain(config, workdir: str) -> Dict[str, Any]:
  """A pre-training run, as every job runs (`registry.run_job`)."""
  from bert_jax.tasks import registry
  return registry.run_job(config, workdir)


def _common_eval(pre_config, pre_dir: str, workdir: str, overrides: Dict[str, Any]
                 ) -> Dict[str, float]:
  """The pre-trained model's held-out metrics with `overrides` (no training: an evaluation of
  the final checkpoint, logged as step 0 in WORKDIR/metrics.jsonl and read back after)."""
  done = _last_eval(workdir)  # {} until it ran (read_metrics: no file, no records)
  if done:
    return done
  c = config_names.replaced(pre_config, {
      **overrides, "init_checkpoint": pre_dir, "num_train_steps": 0,
      "eval_before_training": True})
  _pretrain(c, workdir)
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


def run_variant(config, name: str, workdir: str, vocab_file: str,
                records: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
  """Pre-trains, fine-tunes and probes one variant (each piece skipped once finished).
  `records`: {form of instance: the config changes that read its records} (`_records`)."""
  pre_config = pretraining_config(config, name)
  pre_config = config_names.replaced(pre_config, _form_records(records, pre_config.data.instances,
                                                               f"variant {name}"))
  pre_dir = filesystem.join(workdir, "pretraining")
  last = _pretrain(pre_config, pre_dir)
  if last.get("preempted"):
    return {"preempted": True}
  result: Dict[str, Any] = {"paper_table": VARIANTS[name].title,
                            "pretraining_eval": _last_eval(pre_dir)}
  causal = pre_config.objective == "ltr"
  if not causal:
    for ev in common_evals(config):
      overrides = dict(ev.overrides)
      if ev.instances:
        overrides.update(_form_records(records, ev.instances, f"config.common_evals {ev.key}"),
                         **{"data.instances": ev.instances})
      result[ev.key] = _common_eval(pre_config, pre_dir, filesystem.join(workdir, ev.key),
                                    overrides)
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


def results_table(results: Dict[str, Dict], seeds: int, evals: List[CommonEval]) -> str:
  """Ours (mean +- std over the fine-tuning seeds) beside the paper's dev numbers; a recipe
  part's row says what it changes."""
  tasks = sorted({t for r in results.values() for t in r.get("glue", {})})
  probe = any("ner_feature_based_f1" in r for r in results.values())
  papers = {name: {**PAPER_TABLE5.get(name, {}), **PAPER_C2.get(name, {})} for name in results}
  parts = any(VARIANTS[name].title.startswith("modern:") for name in results)
  head = (["variant"] + (["what it changes"] if parts else [])
          + ["held-out MLM acc"] + [ev.column for ev in evals]
          + [glue.spec_for(t).folder for t in tasks] + ["GLUE avg"]
          + (["NER feature-based F1"] if probe else [])
          + (["paper (dev)"] if any(papers.values()) else []))
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, r in results.items():
    mlm = r["pretraining_eval"].get("mlm_accuracy")
    cells = [f"{name}"] + ([VARIANTS[name].title.replace("modern: ", "")] if parts else [])
    cells.append("" if mlm is None else f"{mlm:.3f}" + (" (next token)" if
                                                         name == "ltr_no_nsp" else ""))
    for ev in evals:
      common = r.get(ev.key, {}).get("mlm_accuracy")
      cells.append("" if common is None else f"{common:.3f}")
    cells += [f"{r['glue'][t]['mean']:.1f} +- {r['glue'][t]['std']:.1f}" for t in tasks]
    cells.append(f"{r['glue_average']:.1f}")
    if probe:
      cells.append(", ".join(f"{v:.1f}" for v in r.get("ner_feature_based_f1", {}).values()))
    if any(papers.values()):
      cells.append("; ".join(f"{k} {v}" for k, v in papers[name].items()))
    lines.append("| " + " | ".join(cells) + " |")
  lines.append(f"\nGLUE dev scores x100 (the leaderboard's per-task score), mean +- sample std "
               f"over {seeds} fine-tuning seed(s); one pre-training run per variant. Held-out MLM "
               f"accuracy: on the variant's own masking (next token for LTR), then "
               + "; ".join(ev.scored for ev in evals)
               + (" (the same instances and positions for every variant)." if evals else "."))
  return "\n".join(lines)


def _form_records(records: Dict[str, Dict[str, Any]], form: str, who: str) -> Dict[str, Any]:
  """The config changes that read the study's records of `form` ({} when the study prepared
  none: the config's own records then serve)."""
  if not records:
    return {}
  if form not in records:
    raise ValueError(f"{who} needs {form!r} records; the study prepared {sorted(records)}")
  return records[form]


def _records(config, workdir: str, names: List[str]) -> Tuple[ml_collections.ConfigDict,
                                                              Dict[str, Dict[str, Any]]]:
  """The demo corpus built once per form of instance the study needs (its variants', its common
  evaluations'): the config's own form in WORKDIR/data (its vocabulary learned there), any other
  in WORKDIR/<form>/data from the same documents and vocabulary. Returns the config reading the
  first, and {form: the config changes that read its records}; ({} when the config names its
  own records: every variant must then take their form)."""
  if not config.pretraining.data.prepare_demo_corpus:
    return config, {}
  from bert_jax.tasks.jobs import pretraining_data
  base = config.pretraining.data.instances
  data = pretraining_data.data_changes(config.pretraining, workdir)  # WORKDIR/data, once
  config = config_names.replaced(config, {f"pretraining.{k}": v for k, v in data.items()})
  reading = ("data.input_files", "data.eval_input_files")
  records = {base: {k: data[k] for k in reading}}
  forms = {config_names.replaced(config.pretraining, VARIANTS[n].overrides).data.instances
           for n in names} | {ev.instances for ev in common_evals(config) if ev.instances}
  for form in sorted(forms - {base}):
    # (Its own held-out records: the base form's are named in the config by now.)
    other = config_names.replaced(config.pretraining, {
        "data.instances": form, "objective": "mlm", "data.eval_input_files": ""})
    changes = pretraining_data.data_changes(other, filesystem.join(workdir, form))
    records[form] = {k: changes[k] for k in reading}
  config = config_names.replaced(config, {"pretraining.data.prepare_demo_corpus": False})
  return config, records


def run(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """The `ablations` runner: every variant of `config.variants`, then the table."""
  names = variant_names(config)
  evals = common_evals(config)
  workdir = filesystem.absolute(workdir)
  filesystem.makedirs(workdir)
  config, records = _records(config, workdir, names)
  vocab_file = config.pretraining.tokenizer.vocab_file
  results: Dict[str, Any] = {}
  for name in names:
    print(f"[ablations] {name}: {VARIANTS[name].title}", flush=True)
    result = run_variant(config, name, filesystem.join(workdir, name), vocab_file, records)
    if result.get("preempted"):
      return {"preempted": True}
    results[name] = result
    table = results_table(results, int(config.glue.seeds), evals)
    if outputs.is_writer():
      filesystem.write_text(filesystem.join(workdir, TABLE_FILE), table + "\n")
      filesystem.write_text(filesystem.join(workdir, finetuning.RESULTS_FILE),
                            json.dumps({"variants": results, "table": table}, indent=2,
                                       sort_keys=True))
  print(table, flush=True)
  return results
