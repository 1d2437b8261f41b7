"""The command line: which stages run, with which settings (the package's docstring)."""
import argparse
import dataclasses
import json
import os
import sys
from typing import Optional, Sequence

from benchmarks import bench_util, time_to_quality  # the package's docstring
from benchmarks.time_to_quality import (common, finetune, hf_side, jax_side, prepared, report,
                                        schedule)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m benchmarks.time_to_quality",
                              description=time_to_quality.__doc__.split("\n")[0])
  stage = p.add_argument_group("stages (one or more, in this order)")
  stage.add_argument("--prepare", action="store_true", help="build OUT/data once")
  stage.add_argument("--side", choices=common.SIDES, action="append", default=[],
                     help="pre-train this side (repeatable)")
  stage.add_argument("--calibrate", action="store_true",
                     help="with --side: measure the side's steps/s only (no training)")
  stage.add_argument("--finetune", action="store_true",
                     help="GLUE for every pre-trained side's checkpoint (--ft_sides)")
  stage.add_argument("--report", action="store_true", help="write the tables and the plot")
  p.add_argument("--out", default="/tmp/time_to_quality")
  # OUT's by default, so that a stage run on a few sides cannot overwrite the committed plot of
  # all four (benchmarks/time_to_quality.png is written only when named).
  p.add_argument("--plot", default="",
                 help="the plot's path (default OUT/time_to_quality.png)")
  data = p.add_argument_group("data (--prepare)")
  data.add_argument("--text_dir", default=common.DEFAULT_TEXT_DIR)
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
  mod = p.add_argument_group("the modern recipe (--side=bert_jax_modern, --side=hf_modern)")
  mod.add_argument("--modern_lr", type=float, default=1e-3,
                   help="peak learning rate (pre-norm: higher than BERT's 5e-4)")
  mod.add_argument("--modern_masking", type=float, default=0.30, help="training masking rate")
  mod.add_argument("--local_attention", type=int, default=64,
                   help="the local layers' window (tokens, transformers' semantics)")
  mod.add_argument("--batch_warmup_start", type=int, default=16,
                   help="the batch ramp's first batch (rows; 0: no ramp), up to --batch")
  mod.add_argument("--batch_warmup_fraction", type=float, default=0.1,
                   help="the ramp's share of the side's planned tokens")
  mod.add_argument("--decay_fraction", type=float, default=0.2,
                   help="the 1-sqrt decay's share of the steps (at the end)")
  ft = p.add_argument_group("fine-tuning (--finetune)")
  ft.add_argument("--glue_dir", default=common.DEFAULT_GLUE_DIR)
  ft.add_argument("--ft_sides", default="",
                  help="sides to fine-tune (comma list); default: every side whose pre-training "
                       "has finished (OUT/<side>/summary.json)")
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
  args.plot = args.plot or os.path.join(args.out, "time_to_quality.png")
  return args


def calibrate(args, side: str) -> dict:
  """`--calibrate`: the side's speed at this setting, to OUT/<side>/calibration.json."""
  info = prepared.read_data_info(args.out)
  if common.RECIPE[side] == "modern":
    prepared.contiguous_info(args.out)
  if common.FRAMEWORK[side] == "jax":
    calibration = jax_side.calibrate_jax(args, info, side)
  else:
    import torch
    hf_side.quiet_transformers()
    torch.set_num_threads(args.threads)
    calibration = hf_side.calibrate_hf(args, info, side)
  plan = schedule.make_plan(args, side, calibration, info["seq"])
  result = dict(dataclasses.asdict(calibration), side=side, size=args.size, batch=args.batch,
                seq=info["seq"], steps=plan.num_train_steps, sequences=plan.sequences(),
                budget_minutes=args.budget_minutes, machine=bench_util.machine_line())
  common.write_json(os.path.join(args.out, side, "calibration.json"), result)
  print(json.dumps(result, indent=1), flush=True)
  return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  done = {}
  if args.prepare:
    done["prepare"] = prepared.prepare(args)
  if args.side:
    # bert_jax's evaluation pipeline draws the held-out masks with config.seed: the sides must
    # use the seed the fixed batches were drawn with, or bert_jax would be scored on others.
    seed = prepared.read_data_info(args.out)["seed"]
    if args.seed != seed:
      print(f"--seed={args.seed} replaced by {seed}, the seed of --prepare", flush=True)
      args.seed = seed
  for side in args.side:
    if args.calibrate:
      done[side] = calibrate(args, side)
    else:
      run = jax_side.run_jax if common.FRAMEWORK[side] == "jax" else hf_side.run_hf
      done[side] = run(args, side)
  if args.finetune:
    if not os.path.isdir(args.glue_dir):
      sys.exit(f"{args.glue_dir} not found: fine-tuning needs the GLUE folder (../shared/data)")
    done["finetune"] = finetune.finetune(args)
  if args.finetune or args.report:
    done["report"] = report.report(args)
  return done

