r"""The demo and its modern twin, one after the other on the same machine: held-out masked-LM
accuracy against wall-clock time, both curves in one plot.

  python -m benchmarks.demo_pair --out=DIR [--plot=benchmarks/demo_pair.png]

Runs README's main job (`experiments/pretrain_demo.py`, BERT's recipe) and then its twin
(`:recipe=modern`), each a fresh `python -m bert_jax.main` in DIR/bert and DIR/modern, and
watches each run's `metrics.jsonl`: the wall-clock seconds since the command started at which
every evaluation line appeared (data preparation, compiling and evaluation included, as a user
waits for them). Both evaluate the same held-out documents at 15% masking, each in its own form
(NSP pairs; contiguous text), so at the end each final model is also scored on the other's
held-out set. Writes DIR/runs.json (each run's start and duration) as it goes, then DIR/pair.json
(the curves, the cross scores) and the plot; `--report_only` redoes the report from
DIR/runs.json. Time the pair on an otherwise idle machine: the comparison is at equal wall-clock
time.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

from benchmarks import bench_util

SIDES = {"bert": "experiments/pretrain_demo.py",
         "modern": "experiments/pretrain_demo.py:recipe=modern"}
QUICK = {"bert": "experiments/pretrain_demo.py:quick",
         "modern": "experiments/pretrain_demo.py:recipe=modern,quick"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_side(name: str, workdir: str, experiment: str) -> Dict:
  """Runs one side's command from a fresh workdir: its start (epoch seconds) and duration."""
  command = [sys.executable, "-m", "bert_jax.main", f"--config={experiment}",
             f"--workdir={workdir}"]
  started = time.time()
  with open(os.path.join(os.path.dirname(workdir), f"{name}.log"), "w") as log:
    code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
  seconds = time.time() - started
  if code != 0:
    raise SystemExit(f"{name}: `{' '.join(command)}` exited {code} (log: {log.name})")
  print(f"{name}: {seconds:.0f} s", flush=True)
  return {"command": " ".join(command[1:]), "started": started, "seconds": round(seconds, 1)}


def curve(workdir: str, started: float) -> List[Dict]:
  """The held-out evaluations of a run by the wall-clock seconds since its command started:
  the wall times TensorBoard's event files hold for each `eval/` scalar."""
  import glob
  import tensorflow as tf
  points: Dict[int, Dict] = {}
  for events in sorted(glob.glob(os.path.join(workdir, "tensorboard", "*"))):
    for event in tf.compat.v1.train.summary_iterator(events):
      for value in event.summary.value:
        if value.tag in ("eval/mlm_accuracy", "eval/mlm_loss"):
          point = points.setdefault(event.step, {"step": event.step})
          point["seconds"] = round(event.wall_time - started, 1)
          number = (tf.make_ndarray(value.tensor) if value.HasField("tensor")
                    else value.simple_value)
          point[value.tag.split("/")[1]] = round(float(number), 4)
  return [points[step] for step in sorted(points)]


def cross_scores(out: str, sides: Dict[str, str]) -> Dict:
  """Every side's final model scored on every side's held-out set (the BERT demo's NSP pairs,
  the twin's contiguous text; each masked once at 15%, the whole set): the comparison on the
  same instances. Both runs learn the vocabulary from the same corpus; if the files differ,
  nothing is scored across."""
  import importlib
  from benchmarks import time_to_quality
  from bert_jax.tasks.jobs import pretraining
  configs = {}
  for name, experiment in sides.items():   # its config with the data its run built filled in
    module, _, arg = experiment.partition(":")
    config = importlib.import_module(module[:-len(".py")].replace("/", ".")).get_config(arg or None)
    configs[name] = pretraining.prepare(config, os.path.join(out, name))
  vocabularies = set()
  for config in configs.values():
    with open(config.tokenizer.vocab_file, "rb") as f:
      vocabularies.add(f.read())
  if len(vocabularies) != 1:
    return {"error": "the runs learned different vocabularies: not scored across"}
  held_out = {name: time_to_quality.eval_batches_from_pipeline(config, max_sequences=10 ** 6)
              for name, config in configs.items()}
  scores = {}
  for name, config in configs.items():
    params = time_to_quality.jax_params_from_workdir(os.path.join(out, name))
    score = time_to_quality.scorer(pretraining.build_model(config), config.objective)
    scores[name] = {f"on_{set_name}_held_out": score(params, batches)
                    for set_name, batches in held_out.items()}
  return scores


def plot(result: Dict, path: str) -> None:
  figure, axis = bench_util.pyplot().subplots(figsize=(6.4, 4.0))
  labels = {"bert": "BERT's recipe (the demo)", "modern": "the modern recipe (its twin)"}
  for name, side in result["sides"].items():
    minutes = [0.0] + [point["seconds"] / 60 for point in side["curve"]]
    accuracy = [0.0] + [point["mlm_accuracy"] for point in side["curve"]]
    axis.plot(minutes, accuracy, marker="o",
              label=f"{labels[name]}: {side['seconds'] / 60:.1f} min")
  axis.set(xlabel="wall-clock minutes since the command started",
           ylabel="held-out masked-LM accuracy (15%)")
  axis.set_title(f"The demo and its modern twin ({result['machine']})", fontsize=9)
  axis.grid(alpha=0.3)
  axis.legend(loc="lower right")
  bench_util.save_figure(figure, path)


def report(out: str, sides: Dict[str, str], plot_path: str) -> Dict:
  """DIR/pair.json and the plot from DIR/runs.json and the workdirs."""
  runs = bench_util.read_json(os.path.join(out, "runs.json"))
  result = {"machine": runs.pop("machine"), "sides": {}}
  for name, run in runs.items():
    result["sides"][name] = dict(run, curve=curve(os.path.join(out, name), run["started"]))
  result["cross_scores"] = cross_scores(out, {name: sides[name] for name in runs})
  bench_util.write_json(os.path.join(out, "pair.json"), result)
  plot(result, plot_path)
  return result


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True, help="a directory for both workdirs and pair.json")
  parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "demo_pair.png"))
  parser.add_argument("--sides", default="bert,modern")
  parser.add_argument("--quick", action="store_true", help="both experiments' :quick (a check)")
  parser.add_argument("--report_only", action="store_true",
                      help="only the report, from an earlier run's DIR/runs.json and workdirs")
  args = parser.parse_args()
  table = QUICK if args.quick else SIDES
  sides = {name: table[name] for name in args.sides.split(",")}
  if not args.report_only:
    os.makedirs(args.out, exist_ok=True)
    runs = {"machine": bench_util.machine_line().split(", load")[0]}
    for name, experiment in sides.items():
      workdir = os.path.join(args.out, name)
      if os.path.exists(workdir):
        raise SystemExit(f"{workdir} exists: the pair is timed from fresh workdirs")
      runs[name] = run_side(name, workdir, experiment)
      bench_util.write_json(os.path.join(args.out, "runs.json"), runs)   # kept if the report fails
  result = report(args.out, sides, args.plot)
  for name, side in result["sides"].items():
    print(json.dumps({"side": name, "seconds": side["seconds"], "final": side["curve"][-1],
                      **result["cross_scores"].get(name, {})}), flush=True)
  if "error" in result["cross_scores"]:
    print(result["cross_scores"]["error"], flush=True)


if __name__ == "__main__":
  main()
