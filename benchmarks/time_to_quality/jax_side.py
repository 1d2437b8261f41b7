"""`--side=bert_jax` and `--side=bert_jax_modern`: pre-training as a user runs it (bert_jax's
pre-training job and loop), scored on the fixed held-out sets.

The job is `bert_jax.tasks.jobs.pretraining.make_job(config)`, run by `bert_jax.runtime.job.run`
as `registry.run_job` runs it (the same step, input pipeline, checkpoints, clock and resume),
with one field replaced: the evaluation scores the fixed numpy sets of OUT/data (the pairs and
the text set, `prepared.load_eval_sets`) with the job's own `eval_step`, instead of reading the
side's own held-out records, so that all four sides are scored on the very same instances and
masks.
"""
import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Dict, Sequence

import numpy as np

from benchmarks import bench_util
from benchmarks.time_to_quality import clocks, common, modern, prepared, schedule


def side_config(args, info: dict, side: str):
  """The side's pre-training config before the plan: BERT's recipe or the modern one."""
  if common.RECIPE[side] == "modern":
    return modern.jax_config(args, info)
  return prepared.jax_config(args, info)


def apply_plan(config, plan: schedule.Plan) -> None:
  config.num_train_steps, config.warmup_steps = plan.num_train_steps, plan.warmup_steps
  config.eval_every_steps = plan.eval_every_steps
  config.checkpoint_every_steps = plan.checkpoint_every_steps
  if common.RECIPE[plan.side] == "modern":
    config.batch_warmup.start_batch_size = plan.batch_warmup_start
    config.batch_warmup.tokens = plan.batch_warmup_tokens
    config.schedule.decay_steps = plan.decay_steps


def calibrate_jax(args, info: dict, side: str = "bert_jax") -> schedule.Calibration:
  """bert_jax's speed: `registry.run_job` for 3 logging windows of `calibration_steps`, at the
  full batch (no ramp), no evaluation or checkpoint."""
  from bert_jax.tasks import registry
  k = args.calibration_steps
  config = side_config(args, info, side)
  config.num_train_steps, config.warmup_steps, config.log_every_steps = 3 * k, k, k
  config.eval_every_steps, config.checkpoint_every_steps = 0, 0
  directory = os.path.join(args.out, side, "calibration")
  shutil.rmtree(directory, ignore_errors=True)
  registry.run_job(config, os.path.join(directory, "workdir"))
  marks = clocks.jax_clock_marks(os.path.join(directory, "workdir"))
  shutil.rmtree(directory, ignore_errors=True)
  windows = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]
  return schedule.Calibration.from_windows(windows)


def scorer(model, objective: str):
  """(params, batches) -> bert_jax's evaluation metrics summed over `batches` (the job's
  `eval_step`, jitted once). Batches without NSP labels (the text set) scored by a model with
  the NSP head give the masked-LM metrics alone (their NSP terms are left out)."""
  import jax
  from bert_jax.tasks.jobs import pretraining
  step = jax.jit(functools.partial(pretraining.eval_step, model=model, objective=objective))

  def score(params, batches: Sequence[common.Batch]) -> Dict[str, float]:
    nsp = "next_sentence_labels" in batches[0]
    totals = None
    for batch in batches:
      if objective == "mlm_nsp" and not nsp:
        batch = dict(batch, next_sentence_labels=np.zeros((len(batch["input_ids"]), 1),
                                                          np.int32))
      terms = step(params, batch)
      totals = terms if totals is None else jax.tree_util.tree_map(lambda a, b: a + b, totals,
                                                                    terms)
    if not nsp:
      totals = {k: v for k, v in totals.items() if not k.startswith("nsp_")}
    _, metrics = pretraining.loss_from_terms(totals)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  return score


def score_sets(score, params, eval_sets: Dict[str, Sequence[common.Batch]]) -> Dict[str, float]:
  metrics = {}
  for name, batches in eval_sets.items():
    metrics.update(common.prefixed(name, score(params, batches)))
  return metrics


def score_jax(config, params, batches: Sequence[common.Batch]) -> Dict[str, float]:
  """bert_jax's evaluation step summed over `batches`."""
  from bert_jax.tasks.jobs import pretraining
  return scorer(pretraining.build_model(config), config.objective)(params, batches)


def jax_params_from_workdir(workdir: str):
  from bert_jax.io import checkpoints
  bert_config, params = checkpoints.load_params_from_workdir(workdir)
  return checkpoints.to_model_layout(params, bert_config)


def train(config, workdir: str, eval_sets: Dict[str, Sequence[common.Batch]]) -> dict:
  """`registry.run_job` with the evaluation on `eval_sets` (module docstring)."""
  from bert_jax import parallel
  from bert_jax.io import filesystem
  from bert_jax.runtime import job as jobs
  from bert_jax.tasks import registry
  job = registry.job(config, workdir)   # the records are given: nothing is built
  score = scorer(job.model, config.objective)
  every = config.eval_every_steps
  job = dataclasses.replace(
      job, evaluator=lambda trainer: lambda state, step: score_sets(score, state.params,
                                                                   eval_sets),
      eval_at=lambda step: bool(every) and step % every == 0)
  return jobs.run(job, filesystem.absolute(workdir), parallel.create(config)).results()


def run_jax(args, side: str = "bert_jax") -> dict:
  """Pre-trains the side with bert_jax's job (resuming from OUT/<side>/workdir)."""
  from bert_jax.tasks.jobs import pretraining
  info = prepared.read_data_info(args.out)
  side_dir = os.path.join(args.out, side)
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[{side}] {side_dir}/summary.json exists: done", flush=True)
    with open(os.path.join(side_dir, "summary.json")) as f:
      return json.load(f)
  eval_sets = prepared.load_eval_sets(args.out)
  plan = schedule.load_or_make_plan(args, side, lambda: calibrate_jax(args, info, side),
                                    info["seq"])
  config = side_config(args, info, side)
  apply_plan(config, plan)
  workdir = os.path.join(side_dir, "workdir")
  os.makedirs(workdir, exist_ok=True)
  # Fine-tuning finds the vocabulary beside the checkpoint: the workdir is self-contained.
  shutil.copy(prepared.data_paths(args.out)["vocab.txt"], os.path.join(workdir, "vocab.txt"))
  start = time.time()
  result = train(config, workdir, eval_sets)
  curve = clocks.jax_curve(workdir)
  common.write_jsonl(os.path.join(side_dir, "curve.jsonl"), curve)
  if result.get("preempted"):
    print(f"[{side}] preempted: run the same command again to resume", flush=True)
    return result
  # The saved checkpoint (what fine-tuning reads) scores as the state the loop evaluated.
  check = score_sets(scorer(pretraining.build_model(config), config.objective),
                     jax_params_from_workdir(workdir), eval_sets)
  final = curve[-1] if curve else None
  if final and abs(check["text_mlm_loss"] - final["text_mlm_loss"]) > 1e-4 * abs(
      check["text_mlm_loss"]):
    print(f"WARNING: [{side}] the saved checkpoint ({check['text_mlm_loss']:.5f}) does not "
          f"score as the last evaluation ({final['text_mlm_loss']:.5f})", flush=True)
  summary = dict(side=side, recipe=common.RECIPE[side],
                 settings=common.recipe_settings(args, side), plan=plan.to_json(),
                 steps=plan.num_train_steps,
                 sequences=plan.sequences() if plan.batch else plan.num_train_steps * args.batch,
                 train_seconds=final["seconds"] if final else None, final=final,
                 checkpoint_check=check, checkpoint=workdir,
                 wall_seconds_this_call=time.time() - start, machine=bench_util.machine_line())
  common.write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary
