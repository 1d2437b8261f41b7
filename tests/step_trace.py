r"""The files a reader opens to follow one pre-training step, measured on a real run.

  python -m tests.step_trace --experiment=experiments/pretrain_demo.py:quick --json=FILE

Runs `bert_jax.main --config=EXPERIMENT --config.num_train_steps=1` (the demo corpus cut to
--demo_documents documents) in this process, in a fresh workdir under $TMPDIR, with a profile
hook on every Python thread, and records the project files on the call stack at four points of
the run: where the job is made (`make_job`), where the step's forward enters the model (its first
`__call__`), where the step computes the loss and where it applies the update (`tx.update`). What
those pieces are made of is listed apart, not counted: the files that build the model and the
optimizer (`pretraining_model` or `make_model`, `create_optimizer`, with every project function
they call) and those the update calls inside optax (an optimizer of our own). Module bodies run
by an import are not calls of the run. `tests/test_step_trace.py` holds WORKSPACE.md's table to
it.
"""
import argparse
import json
import linecache
import os
import sys
import tempfile
import threading
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = ("bert_jax", "data_pipelines", "experiments")
STEP_FILE = os.path.join("bert_jax", "runtime", "step.py")
# Functions whose whole call tree is part of the trace: what builds the step's pieces.
BUILDERS = ("pretraining_model", "make_model", "create_optimizer")


class StepTrace:
  """The profile hook: by point, the project files on the call stack the first time the point
  is reached (`points`), and the files the builders and the update call (`calls`)."""

  def __init__(self):
    self.prefixes = tuple(os.path.join(ROOT, p) + os.sep for p in PROJECT)
    self.points: Dict[str, List[str]] = {}
    self.calls: Dict[str, List[str]] = {}
    self.open: List[Tuple[str, object]] = []   # (what, frame) whose callees are listed

  def files(self, frame) -> List[str]:
    """The project files on the stack that ends at `frame`, outermost first."""
    found = []
    while frame is not None:
      name = frame.f_code.co_filename
      if name.startswith(self.prefixes):
        found.append(os.path.relpath(name, ROOT))
      frame = frame.f_back
    return list(dict.fromkeys(reversed(found)))

  def record(self, point: str, frame) -> None:
    if point not in self.points:
      self.points[point] = self.files(frame)

  def listen(self, what: str, frame) -> None:
    if what not in self.calls:
      self.calls[what] = []
      self.open.append((what, frame))

  def __call__(self, frame, event, arg):
    if event == "return" and self.open and self.open[-1][1] is frame:
      self.open.pop()
      return
    code = frame.f_code
    if event != "call" or code.co_name == "<module>":
      return
    caller = frame.f_back
    in_step = caller is not None and caller.f_code.co_filename.endswith(STEP_FILE)
    if (in_step and caller.f_code.co_name == "train_step" and
        "tx.update(" in linecache.getline(caller.f_code.co_filename, caller.f_lineno)):
      self.record("update", caller)
      self.listen("update", frame)   # optax's: it may call an optimizer of ours
    if not code.co_filename.startswith(self.prefixes):
      return
    name = os.path.relpath(code.co_filename, ROOT)
    for what, _ in self.open:
      if name not in self.calls[what]:
        self.calls[what].append(name)
    if code.co_name == "make_job":
      self.record("job", frame)
    elif code.co_name in BUILDERS:
      self.listen(code.co_name, frame)
      self.calls[code.co_name].append(name)
    if in_step and caller.f_code.co_name == "train_step" and code.co_name == "loss":
      self.record("loss", frame)
    if code.co_name == "__call__" and "forward" not in self.points and any(
        f.endswith(STEP_FILE) for f in self.files(frame)):
      self.record("forward", frame)

  def summary(self) -> Dict[str, object]:
    files = list(dict.fromkeys(f for stack in self.points.values() for f in stack))
    return {"files": files, "points": self.points, "calls": self.calls}


def trace(experiment: str, demo_documents: int) -> Dict[str, object]:
  """One training step of `experiment` under the hook; its summary."""
  sys.path.insert(0, ROOT)
  argv = ["bert_jax.main", f"--config={experiment}",
          f"--workdir={tempfile.mkdtemp(prefix='step_trace_')}", "--config.num_train_steps=1",
          f"--config.data.demo_max_documents={demo_documents}"]
  sys.argv = argv   # config_flags reads the overrides from sys.argv when the flag is defined
  from absl import flags
  from bert_jax import main as entry   # its import-time set-up, as `python -m bert_jax.main`
  hook = StepTrace()
  threading.setprofile(hook)
  sys.setprofile(hook)
  try:
    flags.FLAGS(argv)
    entry.main(argv[:1])
  finally:
    sys.setprofile(None)
    threading.setprofile(None)
  missing = {"job", "forward", "loss", "update"} - set(hook.points)
  if missing:
    raise RuntimeError(f"the step's trace never reached {sorted(missing)}")
  return hook.summary()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--experiment", default="experiments/pretrain_demo.py:quick")
  parser.add_argument("--demo_documents", type=int, default=200)
  parser.add_argument("--json", required=True, help="the trace is written here")
  args = parser.parse_args()
  result = trace(args.experiment, args.demo_documents)
  with open(args.json, "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
