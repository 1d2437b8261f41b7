r"""Growth at the demo's scale: the twin started from a trained model of half its width and depth
(ModernBERT-large from base, by centre tiling) against the twin from scratch, with seeds.

  python -m benchmarks.modern_growth --out=/tmp/modern_growth --seeds=0,1

ModernBERT-large did not start from random weights: its initialisation was ModernBERT-base's,
grown by "center tiling" (`config.init_tiling=tile_from_middle`, bert_jax/model/growth.py). Does
that pay for the smaller model's training? Here the question at the scale of the demo's twin
(experiments/pretrain_demo.py:recipe=modern: its corpus, learned vocabulary, held-out documents,
recipe and 2,000 steps), each run `registry.run_job` on a config, exactly what
`python -m bert_jax.main` runs (each workdir a normal one; a rerun of this command reuses
finished runs):

  small        the twin at half its width and depth (2 layers of H=64, one head of 64, GeGLU 96;
               the twin: 4 layers of H=128, two heads of 64, GeGLU 192), from scratch,
               --small_steps of the twin's recipe
  scratch      the twin from scratch, --steps
  <mode>       the twin grown from `small` of the same seed by `config.init_tiling=<mode>` (each of
               --modes: tile_from_middle, ModernBERT's; center, the small model at the centre of
               the fresh initialisation; tile_from_edge), then --steps of the same recipe
               (fresh optimizer, the same schedule and data order as scratch)

every one evaluated on the held-out documents at 15% masking with fixed masks (the same positions
for every run) before training and every --eval_every steps. Three readings: at equal steps of
the twin; at equal training compute, where a grown run is charged its small model's FLOPs first
(tokens trained times `flops.modern_training_flops` per token: independent of the machine and of
whatever else runs on it); and at equal training time, likewise (`train_seconds` of each workdir,
the training clock: evaluations and checkpoints excluded; only meaningful on an idle machine).
Seeds change the initialisation, the data order and the masks.

Output: OUT/modern_growth.json, OUT/modern_growth.md (the tables for benchmarks/RESULTS.md) and,
with --plot=PNG, held-out accuracy against training compute, every run.
"""
import argparse
import os
import shutil
from typing import Dict, List

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if __name__ == "__main__":
  # As bert_jax.main does, before JAX or TensorFlow start threads.
  from bert_jax.runtime import host_memory
  host_memory.keep_freed_memory()

import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax.model import flops  # noqa: E402
from bert_jax.runtime import batch_ramp, metric_writers  # noqa: E402
from bert_jax.tasks.jobs import pretraining  # noqa: E402
from bert_jax.tasks import registry
from experiments import pretrain_demo  # noqa: E402

SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=1, intermediate_size=96)


def run_config(kind: str, seed: int, args):
  """The twin's config for one run (module docstring)."""
  c = pretrain_demo.get_config("recipe=modern")
  c.seed = seed
  c.eval_every_steps, c.eval_steps = args.eval_every, 0     # the whole held-out set
  c.eval_before_training = True           # step 0: where growth starts, against a fresh model
  c.log_every_steps = args.eval_every // 5
  c.checkpoint_every_steps, c.keep_checkpoints = 500, 1
  c.num_train_steps = args.steps
  if kind == "small":
    c.model.update(SMALL)
    c.num_train_steps = args.small_steps
  elif kind != "scratch":
    c.init_checkpoint = os.path.join(args.out, f"small_s{seed}")
    c.init_tiling = kind
  c.warmup_steps = min(c.warmup_steps, c.num_train_steps // 4)   # 300 of the twin's 2,000
  return c


def training_flops(config, step: int) -> float:
  """The FLOPs a run of `config` has trained up to `step`: its tokens so far (through the batch
  ramp) times the model's FLOPs per token (`flops.modern_training_flops`, every masked slot)."""
  ramp = batch_ramp.from_config(config)
  tokens = (ramp.tokens_before(step) if ramp is not None
            else step * config.global_batch_size * config.max_seq_length)
  per_row = flops.modern_training_flops(pretraining.bert_config_from(config), rows=1,
                                        seq_len=config.max_seq_length,
                                        predictions=config.max_predictions_per_seq)
  return per_row * tokens / config.max_seq_length


def curve(workdir: str, config) -> List[Dict[str, float]]:
  """Held-out (step, training FLOPs and seconds, loss, accuracy) at every evaluation of a
  workdir."""
  seconds = {int(r["step"]): float(r["train_seconds"])
             for r in metric_writers.read_metrics(workdir, "train") if "train_seconds" in r}
  points = []
  for record in metric_writers.read_metrics(workdir, "eval"):
    step = int(record["step"])
    points.append(dict(step=step, flops=training_flops(config, step),
                       train_seconds=seconds.get(step, 0.0), loss=float(record["loss"]),
                       mlm_accuracy=float(record["mlm_accuracy"])))
  return points


def train(kind: str, seed: int, args) -> Dict[str, object]:
  workdir = os.path.join(args.out, f"{kind}_s{seed}")
  shared = os.path.join(args.out, "data")
  if os.path.exists(shared) and not os.path.exists(os.path.join(workdir, "data")):
    os.makedirs(workdir, exist_ok=True)          # one build of the corpus, vocabulary and records
    shutil.copytree(shared, os.path.join(workdir, "data"))
  config = run_config(kind, seed, args)
  registry.run_job(config, workdir)
  if not os.path.exists(shared):
    shutil.copytree(os.path.join(workdir, "data"), shared)
  points = curve(workdir, config)
  if not points:
    raise RuntimeError(f"{workdir}/metrics.jsonl holds no evaluation")
  return dict(kind=kind, seed=seed, workdir=workdir, curve=points)


def at_cost(points: List[Dict[str, float]], key: str, value: float, offset: float) -> float:
  """Held-out accuracy where a run's cost `key` (flops or train_seconds), counted from `offset`,
  reaches `value` (linear between evaluations; nan before the first or past the last)."""
  costs = [offset + p[key] for p in points]
  if value < costs[0] or value > costs[-1] + 1e-9 * abs(costs[-1]):
    return float("nan")
  return float(np.interp(value, costs, [p["mlm_accuracy"] for p in points]))


def charged(run, runs, key: str) -> float:
  """Where a run's own cost `key` starts: a grown run after its small model's whole training."""
  if run["kind"] in ("small", "scratch"):
    return 0.0
  return runs[f"small_s{run['seed']}"]["curve"][-1][key]


def spread(values) -> str:
  """"mean +- sample std" over the seeds that reached the point, "-" if none did."""
  values = [v for v in values if not np.isnan(v)]
  if not values:
    return "-"
  summary = bench_util.seed_spread(values)
  return f"{summary['mean']:.3f} +- {summary['std']:.3f}"


def markdown(result) -> str:
  runs, seeds = result["runs"], result["args"]["seeds"]
  kinds = ["small", "scratch"] + result["args"]["modes"]
  steps = [p["step"] for p in runs[f"scratch_s{seeds[0]}"]["curve"]]
  lines = ["Held-out masked-LM accuracy (15%, fixed masks; mean +- std over seeds "
           f"{', '.join(map(str, seeds))}) at the twin's steps:", "",
           "| run | " + " | ".join(f"step {s}" for s in steps) + " | training s (own) |",
           "|---" * (len(steps) + 2) + "|"]
  for kind in kinds:
    cells = []
    for step in steps:
      cells.append(spread([next((p["mlm_accuracy"] for p in runs[f"{kind}_s{s}"]["curve"]
                                 if p["step"] == step), float("nan")) for s in seeds]))
    own = [runs[f"{kind}_s{s}"]["curve"][-1]["train_seconds"] for s in seeds]
    lines.append(f"| {kind} | " + " | ".join(cells) + f" | {np.mean(own):.0f} |")
  for key, title, shown in (
      ("flops", "At equal training compute (FLOPs; a grown run is charged its small model's "
                "first)", lambda m: f"{m / 1e12:.2f} TFLOP"),
      ("train_seconds", "At equal training time (a grown run's clock starts at its small "
                        "model's training time)", lambda m: f"{m:.0f} s")):
    total = np.mean([runs[f"scratch_s{s}"]["curve"][-1][key] for s in seeds])
    marks = [total * f for f in (0.25, 0.5, 0.75, 1.0)]
    lines += ["", title + ":", "", "| run | " + " | ".join(map(shown, marks)) + " |",
              "|---" * (len(marks) + 1) + "|"]
    for kind in kinds[1:]:
      cells = []
      for mark in marks:
        cells.append(spread([at_cost(runs[f"{kind}_s{s}"]["curve"], key, mark,
                                     charged(runs[f"{kind}_s{s}"], runs, key)) for s in seeds]))
      lines.append(f"| {kind} | " + " | ".join(cells) + " |")
  lines += ["", f"{result['machine']}."]
  return "\n".join(lines)


def plot(result, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  colors = {"small": "tab:gray", "scratch": "tab:blue", "tile_from_middle": "tab:green",
            "center": "tab:orange", "tile_from_edge": "tab:purple"}
  fig, (by_flops, by_step) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
  for run in result["runs"].values():
    offset = charged(run, result["runs"], "flops")
    accuracy = [p["mlm_accuracy"] for p in run["curve"]]
    style = dict(marker=".", color=colors.get(run["kind"], "black"),
                 linestyle="-" if run["seed"] == result["args"]["seeds"][0] else "--",
                 label=run["kind"] if run["seed"] == result["args"]["seeds"][0] else None)
    by_flops.plot([(offset + p["flops"]) / 1e12 for p in run["curve"]], accuracy, **style)
    if run["kind"] != "small":
      by_step.plot([p["step"] for p in run["curve"]], accuracy, **style)
  by_flops.set_xlabel("training TFLOP (a grown run: its small model's first)")
  by_step.set_xlabel("the twin's steps")
  by_flops.set_ylabel("held-out masked-LM accuracy (15%)")
  for ax in (by_flops, by_step):
    ax.grid(alpha=0.3)
  by_flops.legend()
  fig.suptitle("The demo's modern twin grown from a half-size model, against from scratch "
               "(seeds: solid, dashed)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="/tmp/modern_growth")
  parser.add_argument("--seeds", default="0,1", help="comma list")
  parser.add_argument("--modes", default="tile_from_middle,center",
                      help="comma list of config.init_tiling modes to grow by")
  parser.add_argument("--steps", type=int, default=2000, help="the twin's steps, each run")
  parser.add_argument("--small_steps", type=int, default=2000, help="the small model's steps")
  parser.add_argument("--eval_every", type=int, default=250)
  parser.add_argument("--plot", default="", help="PNG path for the curves")
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  modes = [m for m in args.modes.split(",") if m]
  os.makedirs(args.out, exist_ok=True)
  result = dict(args=dict(vars(args), seeds=seeds, modes=modes),
                machine=bench_util.machine_line(), runs={})
  for seed in seeds:
    for kind in ["small", "scratch"] + modes:
      run = train(kind, seed, args)
      result["runs"][f"{kind}_s{seed}"] = run
      print(f"{kind} seed {seed}: {run['curve'][-1]}", flush=True)
  bench_util.write_report(args.out, "modern_growth", result, markdown(result))
  if args.plot:
    plot(result, args.plot)


if __name__ == "__main__":
  main()
