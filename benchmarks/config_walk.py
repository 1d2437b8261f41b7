r"""How far one run's config travels, which files a step's trace opens, how big each package is,
and which modules import each other in a circle.

  python -m benchmarks.config_walk [--experiment=experiments/pretrain_demo.py:quick]
      [--demo_documents=200] [--skip_walk] [--json=FILE]

The walk: `bert_jax.main --config=EXPERIMENT --config.num_train_steps=1` (the demo corpus cut to
--demo_documents documents) in this process, in a fresh workdir, with a profile hook on every
Python thread. From the flags' parse (where `get_config` builds the config)
until the first training step has run (the loop's first `after_step`), every call of a project
function (bert_jax, data_pipelines, experiments) whose arguments hold the run's config is
recorded: the ConfigDict the experiment built or any copy derived from it
(`config_names.replaced`), known from its sub-configs (`config.data`, ...) by holding both `model`
and `data`. Printed: the distinct modules it passes through, each with its functions; how many
times the walk entered bert_jax/tasks/jobs/pretraining.py from another module; and the same for
any ConfigDict (sub-configs included).

The step's trace (`StepTrace`): the project files a reader opens to follow the run from
`bert_jax.main` to the loss and the optimizer update of its step: the files of the project
functions on the call stack at four points of the same run: where the job is made (`make_job`),
where the step's forward enters the model (its first `__call__`), where the step computes the loss
and where it applies the update (`tx.update`). What those pieces are made of is listed apart, not
counted: the files that build the model and the optimizer (`pretraining_model` or `make_model`,
`create_optimizer`, with every project function they call) and those the update calls inside
optax (an optimizer of our own). Module bodies run by an import are not calls of the run.
"""
import argparse
import ast
import collections
import json
import linecache
import os
import sys
import tempfile
import threading
from typing import Dict, List, Set, Tuple

ROOT = os.getcwd()
PROJECT = ("bert_jax", "data_pipelines", "experiments")


# ------------------------------------------------------------------------------ lines


def _python_files(package: str):
  for directory, _, files in os.walk(os.path.join(ROOT, package)):
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.join(directory, name)


def _lines(path: str) -> int:
  with open(path, "rb") as f:
    return f.read().count(b"\n")


def lines_per_package() -> Dict[str, Dict[str, object]]:
  """{package: {"lines", "files", "largest"}}: bert_jax's files by their folder
  (bert_jax/tasks/jobs, ...), data_pipelines whole."""
  table: Dict[str, Dict[str, object]] = {}
  for package in ("bert_jax", "data_pipelines"):
    for path in _python_files(package):
      key = os.path.relpath(os.path.dirname(path), ROOT) if package == "bert_jax" else package
      row = table.setdefault(key, {"lines": 0, "files": 0, "largest": ("", 0)})
      n = _lines(path)
      row["lines"] += n
      row["files"] += 1
      if n > row["largest"][1]:
        row["largest"] = (os.path.relpath(path, ROOT), n)
  return dict(sorted(table.items()))


# ------------------------------------------------------------------------------ circles


def _module_name(path: str) -> str:
  name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
  return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _is_main_guard(node) -> bool:
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def import_graph() -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
  """({module: project modules it imports}, {module: those its `__main__` block imports})."""
  files = {_module_name(p): p for package in ("bert_jax", "data_pipelines")
           for p in _python_files(package)}
  graph, script = {}, {}
  for module, path in files.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    guarded = {id(n) for top in tree.body if _is_main_guard(top) for n in ast.walk(top)}
    found, found_in_script = set(), set()
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
      targets = {n for n in names if n in files}
      # `from package import module` names the module, not the package's __init__.
      if isinstance(node, ast.ImportFrom) and targets - {node.module}:
        targets.discard(node.module)
      (found_in_script if id(node) in guarded else found).update(targets - {module})
    graph[module], script[module] = found, found_in_script
  return graph, script


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  sys.setrecursionlimit(10000)
  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


# ------------------------------------------------------------------------------ the walk


class Walk:
  """The profile hook: calls of project functions that receive the run's config."""

  def __init__(self):
    import ml_collections
    self.config_type = ml_collections.ConfigDict
    self.prefixes = tuple(os.path.join(ROOT, p) + os.sep for p in PROJECT)
    self.done = False
    self.calls = []        # (module, function, caller module, run config?)
    self.configs = set()   # ids of the run configs seen

  def module(self, filename: str) -> str:
    return _module_name(filename) if filename.startswith(self.prefixes) else "<other>"

  def __call__(self, frame, event, arg):
    if event != "call" or self.done:
      return
    code = frame.f_code
    if not code.co_filename.startswith(self.prefixes):
      return
    if code.co_name == "after_step" and "/bert_jax/runtime/" in code.co_filename:
      self.done = True   # the first training step has run
      return
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)   # *args, **kwargs
    values = []
    local = frame.f_locals
    for name in code.co_varnames[:count]:
      value = local.get(name)
      if isinstance(value, tuple):
        values.extend(value)
      elif isinstance(value, dict) and not isinstance(value, self.config_type):
        values.extend(value.values())
      else:
        values.append(value)
    configs = [v for v in values if isinstance(v, self.config_type)]
    if not configs:
      return
    run = [v for v in configs if "model" in v and "data" in v]
    self.configs.update(id(v) for v in run)
    caller = self.module(frame.f_back.f_code.co_filename) if frame.f_back else "<none>"
    self.calls.append((self.module(code.co_filename), code.co_qualname, caller, bool(run)))

  def summary(self, run_only: bool) -> Dict[str, object]:
    calls = [c for c in self.calls if c[3] or not run_only]
    modules: Dict[str, List[str]] = collections.OrderedDict()
    for module, function, _, _ in calls:
      modules.setdefault(module, [])
      if function not in modules[module]:
        modules[module].append(function)
    hub = "bert_jax.tasks.jobs.pretraining"
    return {"modules": len(modules), "calls": len(calls),
            "entries_into_pretraining": sum(m == hub and c != hub for m, _, c, _ in calls),
            "by_module": modules}


STEP_FILE = os.path.join("bert_jax", "runtime", "step.py")
# Functions whose whole call tree is part of the trace: what builds the step's pieces.
BUILDERS = ("pretraining_model", "make_model", "create_optimizer")


class StepTrace:
  """The profile hook of the step's trace (the module docstring): by point, the project files on
  the call stack the first time the point is reached (`points`), and the files the builders and
  the update call (`calls`)."""

  def __init__(self, prefixes: Tuple[str, ...]):
    self.prefixes = prefixes
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


def walk(demo_documents: int,
         experiment: str = "experiments/pretrain_demo.py:quick") -> Dict[str, object]:
  sys.path.insert(0, ROOT)
  workdir = tempfile.mkdtemp(prefix="config_walk_")
  argv = ["bert_jax.main", f"--config={experiment}",
          f"--workdir={workdir}", "--config.num_train_steps=1",
          f"--config.data.demo_max_documents={demo_documents}"]
  sys.argv = argv   # config_flags reads the overrides from sys.argv when the flag is defined
  from absl import flags
  from bert_jax import main as entry   # its import-time set-up, as `python -m bert_jax.main`
  hook = Walk()
  trace = StepTrace(hook.prefixes)

  def both(frame, event, arg):
    hook(frame, event, arg)
    trace(frame, event, arg)

  threading.setprofile(both)
  sys.setprofile(both)
  try:
    flags.FLAGS(argv)
    entry.main(argv[:1])
  finally:
    sys.setprofile(None)
    threading.setprofile(None)
  if not hook.done:
    raise RuntimeError("the run ended before its first training step")
  missing = {"job", "forward", "loss", "update"} - set(trace.points)
  if missing:
    raise RuntimeError(f"the step's trace never reached {sorted(missing)}")
  return {"workdir": workdir, "run_configs": len(hook.configs), "experiment": experiment,
          "run_config": hook.summary(run_only=True), "any_config_dict": hook.summary(False),
          "step_trace": trace.summary()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--demo_documents", type=int, default=200,
                      help="documents of the demo corpus the walk builds its records from")
  parser.add_argument("--experiment", default="experiments/pretrain_demo.py:quick",
                      help="the run to walk (--config of bert_jax.main); its data needs no "
                           "download")
  parser.add_argument("--skip_walk", action="store_true", help="lines and circles only")
  parser.add_argument("--json", default="", help="also write the results here")
  args = parser.parse_args()
  graph, script = import_graph()
  result = {"root": ROOT, "lines": lines_per_package(), "circles": circles(graph),
            "circles_with_scripts": circles({m: graph[m] | script[m] for m in graph})}
  print(f"{'package':32s} {'lines':>7s} {'files':>5s}  largest module")
  for package, row in result["lines"].items():
    print(f"{package:32s} {row['lines']:7d} {row['files']:5d}  {row['largest'][0]} "
          f"({row['largest'][1]})")
  print(f"import circles: {result['circles'] or 'none'}")
  print(f"  counting `if __name__ == '__main__'` blocks: {result['circles_with_scripts'] or 'none'}")
  if not args.skip_walk:
    result["walk"] = walk(args.demo_documents, args.experiment)
    for kind in ("run_config", "any_config_dict"):
      s = result["walk"][kind]
      print(f"\n{kind}: {s['modules']} modules, {s['calls']} calls, "
            f"{s['entries_into_pretraining']} entries into tasks/jobs/pretraining.py from another "
            f"module ({result['walk']['run_configs']} run-config objects)")
      for module, functions in s["by_module"].items():
        print(f"  {module:44s} {', '.join(functions)}")
    trace = result["walk"]["step_trace"]
    print(f"\nthe step's trace opens {len(trace['files'])} files: " + ", ".join(trace["files"]))
    for point, files in trace["points"].items():
      print(f"  {point:18s} {' > '.join(files)}")
    for what, files in trace["calls"].items():
      print(f"  {what} calls: {', '.join(files) or 'no project file'}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
