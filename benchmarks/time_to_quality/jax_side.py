"""`--side=bert_jax`: pre-training as a user runs it, scored on the fixed held-out batches."""
import functools
import json
import os
import shutil
import time
from typing import Dict, Sequence

from benchmarks import bench_util
from benchmarks.time_to_quality import clocks, common, prepared, schedule


def calibrate_jax(args, info: dict) -> schedule.Calibration:
  """bert_jax's speed: `train_and_evaluate` for 3 logging windows of `calibration_steps`."""
  from bert_jax.tasks.jobs import pretraining
  k = args.calibration_steps
  config = prepared.jax_config(args, info)
  config.num_train_steps, config.warmup_steps, config.log_every_steps = 3 * k, k, k
  config.eval_every_steps, config.checkpoint_every_steps = 0, 0
  directory = os.path.join(args.out, "bert_jax", "calibration")
  shutil.rmtree(directory, ignore_errors=True)
  pretraining.train_and_evaluate(config, os.path.join(directory, "workdir"))
  marks = clocks.jax_clock_marks(os.path.join(directory, "workdir"))
  shutil.rmtree(directory, ignore_errors=True)
  windows = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]
  return schedule.Calibration.from_windows(windows)


def score_jax(config, params, batches: Sequence[common.Batch]) -> Dict[str, float]:
  """bert_jax's evaluation step summed over `batches` (the cross-check of the curve's data)."""
  import jax
  from bert_jax.tasks.jobs import pretraining
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
  from bert_jax.tasks.jobs import pretraining
  info = prepared.read_data_info(args.out)
  side_dir = os.path.join(args.out, "bert_jax")
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[bert_jax] {side_dir}/summary.json exists: done", flush=True)
    with open(os.path.join(side_dir, "summary.json")) as f:
      return json.load(f)
  plan = schedule.load_or_make_plan(args, "bert_jax", lambda: calibrate_jax(args, info))
  config = prepared.jax_config(args, info)
  config.num_train_steps, config.warmup_steps = plan.num_train_steps, plan.warmup_steps
  config.eval_every_steps = plan.eval_every_steps
  config.checkpoint_every_steps = plan.checkpoint_every_steps
  workdir = os.path.join(side_dir, "workdir")
  os.makedirs(workdir, exist_ok=True)
  # Fine-tuning finds the vocabulary beside the checkpoint: the workdir is self-contained.
  shutil.copy(prepared.data_paths(args.out)["vocab.txt"], os.path.join(workdir, "vocab.txt"))
  start = time.time()
  result = pretraining.train_and_evaluate(config, workdir)
  curve = clocks.jax_curve(workdir)
  common.write_jsonl(os.path.join(side_dir, "curve.jsonl"), curve)
  if result.get("preempted"):
    print("[bert_jax] preempted: run the same command again to resume", flush=True)
    return result
  batches = prepared.load_batches(prepared.data_paths(args.out)["eval_batches.npz"])
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
  common.write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary
