r"""The workdir fuzzer: every file a finished run left in its workdir, damaged in each way in
turn, then the same command again with more steps. Each case must end, within a bound, in exact
recovery (the run's final parameters bitwise those of an uninterrupted run) or in a clear error
that names the damaged file (or a folder holding it); never a hang, never an error that names
nothing, and no file outside the workdir read or written.

  python -m benchmarks.workdir_fuzz [--job=pretraining|glue] [--sample=N] [--every_chunk=1]
      [--per_file=0] [--timeout=120] [--json=OUT.json]

runs it on the quick pre-training demo (`--job=pretraining`, `experiments/pretrain_demo.py:quick`,
50 documents) or on GLUE MRPC fine-tuning (`--job=glue`, `experiments/glue.py:task=mrpc,quick` on
16 generated examples from a random one-layer checkpoint, both from tests/finetuning_fixtures.py):
the reference run trains 4 steps (checkpoints at 2 and 4), each case copies its workdir, damages
one file (every file of the workdir but the older checkpoint's: that is what a damaged newest
one falls back to), and runs to step 6 in this process (`registry.run`, as `bert_jax.main` runs
it). `tests/test_workdir_fuzz.py` runs a sample of the pre-training cases in the fast tier; in the
slow tier every file of both jobs (the checkpoint's data chunks by the first and the last of each
folder: `chunks`) with 3 damages each, taken in turn (`--every_chunk=0 --per_file=3`). The whole
cross product is this command's, run for the record (benchmarks/RESULTS.md): about 2.7 times
the slow tier's cases, at 1 to 2.5 s a case, it did not fit CI's 90 minutes beside the rest.

A case is a whole run of the job, so it is compile-bound (its initialisation, step and
evaluation traced and compiled again by each run): every run of a fuzzer shares a persistent JAX
compilation cache (`compilation_cache`, in its root), which leaves the tracing and the steps. A
fine-tuning case took about 5 CPU-seconds without it (2 layers), 1.3 with it and one layer; a
pre-training case 2.4, then 1.3 (2026-11-29, this 2-core CPU).

The damages (`DAMAGES`): cut to half; emptied; the same number of random bytes; for a JSON file,
valid JSON of the wrong types, and every string in it replaced by a name climbing out (`..`) or
by an absolute path; a symbolic link to a file outside the workdir; a link to `/dev/zero`; an
empty directory in the file's place. The outside file sits on a tmpfs mounted with
`strictatime` (as root; elsewhere only writes are checked), so a read of it shows in its access
time.
"""
import argparse
import collections
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache as cache

from benchmarks import bench_util
from bert_jax.io import checkpoints
from bert_jax.tasks import registry
from bert_jax.tasks.tools import fine_tuned
from experiments import glue, pretrain_demo

OUTSIDE = "outside.txt"
OUTSIDE_TEXT = "a file outside the workdir\n"


# ------------------------------------------------------------------------------- damages


def _random_bytes(path, outside):
  size = max(os.path.getsize(path), 16)
  with open(path, "wb") as f:
    f.write(np.random.default_rng(0).bytes(size))


def _json(path) -> Optional[object]:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (ValueError, UnicodeDecodeError):
    return None


def _wrong_types(value, depth=0):
  """Each value as another type: strings as numbers, numbers as strings, lists as objects,
  objects as lists (inside containers one level down)."""
  if isinstance(value, dict):
    return ([_wrong_types(v, depth + 1) for v in value.values()] if depth else
            {k: _wrong_types(v, depth + 1) for k, v in value.items()})
  if isinstance(value, list):
    return {str(i): v for i, v in enumerate(value)}
  if isinstance(value, str):
    return 7
  if isinstance(value, bool) or value is None:
    return "x"
  return str(value)


def _strings(value, name: str):
  """`value` with every string (keys of objects too) replaced by `name`."""
  if isinstance(value, dict):
    return {name if isinstance(k, str) else k: _strings(v, name) for k, v in value.items()}
  if isinstance(value, list):
    return [_strings(v, name) for v in value]
  return name if isinstance(value, str) else value


def _json_damage(transform):
  """A damage of JSON files only: the file's value as `transform(value, outside)` gives it."""
  def damage(path, outside):
    value = _json(path)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(transform(value, outside), f)
  damage.json_only = True
  return damage


def _replaced(make):
  """A damage that removes the file and puts `make(path, outside)` in its place."""
  def damage(path, outside):
    os.remove(path)
    make(path, outside)
  return damage


DAMAGES: Dict[str, Callable] = {
    "truncated": lambda path, outside: os.truncate(path, os.path.getsize(path) // 2),
    "emptied": lambda path, outside: os.truncate(path, 0),
    "random bytes": _random_bytes,
    "JSON of wrong types": _json_damage(lambda value, outside: _wrong_types(value)),
    "names with ..": _json_damage(lambda value, outside: _strings(value, "../../../" + OUTSIDE)),
    "absolute names": _json_damage(lambda value, outside: _strings(value, outside)),
    "link outside": _replaced(lambda path, outside: os.symlink(outside, path)),
    "link to /dev/zero": _replaced(lambda path, outside: os.symlink("/dev/zero", path)),
    "directory": _replaced(lambda path, outside: os.mkdir(path)),
}


# ------------------------------------------------------------------------------- a case


@dataclasses.dataclass
class Case:
  file: str            # relative to the workdir
  damage: str
  outcome: str = ""    # OUTCOMES
  seconds: float = 0.0
  detail: str = ""


OK_OUTCOMES = ("recovered exactly", "clear error")
OUTCOMES = OK_OUTCOMES + ("recovered, not exactly", "error naming nothing", "hang",
                          "outside touched")


class _Timeout(BaseException):
  """The case ran past its bound (a BaseException: no `except Exception` of a run swallows it)."""


@contextlib.contextmanager
def _bounded(seconds: float):
  def expire(signum, frame):
    raise _Timeout(f"no end after {seconds:.0f} s")
  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(int(seconds))
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _messages(error: BaseException) -> str:
  """The words of an error and of every error it was raised from."""
  seen, words = set(), []
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    words.append(f"{type(error).__name__}: {error}")
    error = error.__cause__ or error.__context__
  return "\n".join(words)


def names_the_file(message: str, workdir: str, relative: str) -> bool:
  """Whether an error's words name the damaged file or a folder below the workdir holding it
  (`checkpoints/4` for `checkpoints/4/state/manifest.ocdbt`)."""
  parts = relative.split("/")
  candidates = ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]
  candidates = [c for c in candidates if c not in ("checkpoints", "data")]   # too broad
  return any(os.path.join(workdir, c) in message or f"/{c}" in message for c in candidates)


@contextlib.contextmanager
def compilation_cache(directory: str):
  """JAX's persistent compilation cache in `directory` for every compile inside, however short
  or small (a run of a tiny model compiles in about a second: the default thresholds would keep
  it all out); on exit the settings as they were and the cache re-opened from them."""
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes")
  before = {name: getattr(jax.config, name) for name in names}
  for name, value in zip(names, (directory, 0.0, -1)):
    jax.config.update(name, value)
  cache.reset_cache()   # a cache already opened elsewhere would be used otherwise
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    cache.reset_cache()


class Fuzzer:
  """The cases of one job: `run(config, workdir)` trains it (raising on failure), `result(workdir)`
  is what must equal the uninterrupted run's (its final parameters), `config(steps)` its config
  for a number of steps. Every run compiles through one persistent cache in ROOT/compile_cache
  (the same programs each time: a case traces them, then reads them back)."""

  def __init__(self, root: str, config: Callable[[int], object], run: Callable,
               result: Callable[[str], Dict[str, np.ndarray]], steps: int = 4, more: int = 2,
               timeout: float = 120.0):
    self.root, self.config, self.run, self.result = root, config, run, result
    self.steps, self.more, self.timeout = steps, more, timeout
    self.compile_cache = os.path.join(root, "compile_cache")
    self.outside_dir = os.path.join(root, "outside")
    os.makedirs(self.outside_dir, exist_ok=True)
    self.strict_atime = _mount_strictatime(self.outside_dir)
    self.outside = os.path.join(self.outside_dir, OUTSIDE)
    self.reference = os.path.join(root, "reference")
    full = os.path.join(root, "uninterrupted")
    with compilation_cache(self.compile_cache):
      run(config(steps), self.reference)
      run(config(steps + more), full)
    self.expected = result(full)

  def close(self) -> None:
    if self.strict_atime:
      subprocess.run(["umount", self.outside_dir], capture_output=True)

  def files(self) -> List[str]:
    """Every file of the reference workdir a case damages: all but the older checkpoints'."""
    steps = sorted(int(n) for n in os.listdir(os.path.join(self.reference, "checkpoints"))
                   if n.isdigit())
    older = tuple(f"checkpoints/{s}/" for s in steps[:-1])
    found = (os.path.relpath(os.path.join(directory, name), self.reference)
             for directory, _, names in os.walk(self.reference) for name in names)
    return sorted(f for f in found if not f.startswith(older))

  def cases(self, every_chunk: bool = True, per_file: int = 0) -> List[Case]:
    """Every file with every damage (a JSON damage: the JSON files only); `every_chunk=False`:
    of the checkpoint's data chunks, the first and the last of each folder (`chunks`);
    `per_file=N`: N damages of each file, taken in turn from the list of damages, so that
    neighbouring files (one folder, one kind) get different ones and every damage is used."""
    files = self.files() if every_chunk else chunks(self.files())
    cases = []
    for i, relative in enumerate(files):
      names = [name for name, damage in DAMAGES.items() if not getattr(damage, "json_only", False)
               or _json(os.path.join(self.reference, relative)) is not None]
      if per_file:
        names = [names[(i * per_file + k) % len(names)] for k in range(min(per_file, len(names)))]
      cases += [Case(relative, name) for name in names]
    return cases

  def run_case(self, case: Case, index: int) -> Case:
    workdir = os.path.join(self.root, f"case_{index}")
    shutil.copytree(self.reference, workdir, symlinks=True)
    with open(self.outside, "w") as f:
      f.write(OUTSIDE_TEXT)
    before = os.stat(self.outside)
    DAMAGES[case.damage](os.path.join(workdir, case.file), self.outside)
    started = time.perf_counter()
    error = None
    try:
      with _bounded(self.timeout), compilation_cache(self.compile_cache):
        self.run(self.config(self.steps + self.more), workdir)
    except _Timeout as e:
      case.outcome, case.detail = "hang", str(e)
    except Exception as e:  # pylint: disable=broad-except  (classified below)
      error = e
    case.seconds = time.perf_counter() - started
    after = os.stat(self.outside)
    with open(self.outside) as f:
      written = f.read() != OUTSIDE_TEXT
    read = self.strict_atime and after.st_atime_ns != before.st_atime_ns
    if written or read:
      case.outcome = "outside touched"
      case.detail = ("written" if written else "read") + f": {self.outside}"
    elif case.outcome:   # a hang
      pass
    elif error is not None:
      words = _messages(error)
      case.detail = words.splitlines()[0][:400]
      case.outcome = ("clear error" if names_the_file(words, workdir, case.file)
                      else "error naming nothing")
      if case.outcome != "clear error":
        case.detail += "\n" + "".join(traceback.format_exception(error))[-1500:]
    else:
      got = self.result(workdir)
      same = got.keys() == self.expected.keys() and all(
          np.array_equal(got[k], self.expected[k]) for k in got)
      case.outcome = "recovered exactly" if same else "recovered, not exactly"
    shutil.rmtree(workdir, ignore_errors=True)
    return case


def _mount_strictatime(directory: str) -> bool:
  """A small tmpfs with `strictatime` at `directory` (root only), so reads show in access times."""
  if os.geteuid() != 0:
    return False
  result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,strictatime", "tmpfs",
                           directory], capture_output=True)
  return result.returncode == 0


def chunks(files: Sequence[str]) -> List[str]:
  """`files` with the data chunks of a checkpoint's array store (files in a folder `d`, named by
  a hash: 6 to 8 of them in a quick run) cut to the first and the last of each folder. The chunks
  of a folder are one kind of file, read by one code path (tensorstore's OCDBT reader), and hold
  only other arrays; each damage of every chunk is the benchmark's (`--every_chunk`)."""
  by_folder = collections.defaultdict(list)
  for name in files:
    folder = os.path.dirname(name)
    if os.path.basename(folder) == "d":
      by_folder[folder].append(name)
  dropped = {name for group in by_folder.values() for name in sorted(group)[1:-1]}
  return [name for name in files if name not in dropped]


def spread(cases: Sequence[Case], count: int) -> List[Case]:
  """About `count` of `cases`: every damage, each over files spread through the workdir."""
  by_damage = collections.defaultdict(list)
  for case in cases:
    by_damage[case.damage].append(case)
  per = max(1, count // len(by_damage))
  chosen = []
  for group in by_damage.values():
    chosen += group[::max(1, len(group) // per)][:per]
  return chosen


def summary(cases: Sequence[Case]) -> Dict[str, int]:
  counts = collections.Counter(case.outcome for case in cases)
  return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}


def table(cases: Sequence[Case]) -> str:
  """Markdown: outcome counts by damage."""
  by_damage = collections.defaultdict(list)
  for case in cases:
    by_damage[case.damage].append(case)
  return "\n".join(bench_util.markdown_table(
      ("damage", "cases") + OUTCOMES,
      ([damage, len(by_damage[damage])] + list(summary(by_damage[damage]).values())
       for damage in DAMAGES if damage in by_damage)))


# ------------------------------------------------------------------------------- pre-training


def pretraining_fuzzer(root: str, documents: int = 50, timeout: float = 120.0) -> Fuzzer:
  """The quick demo: 4 steps (checkpoints at 2 and 4), cases continued to 6."""

  def config(steps):
    c = pretrain_demo.get_config("quick")
    c.data.demo_max_documents, c.num_train_steps = documents, steps
    c.checkpoint_every_steps, c.eval_every_steps, c.log_every_steps = 2, 0, 1
    c.keep_checkpoints = 3
    # A rate that does not depend on the run's length (warm-up, then constant): a run of 4 steps
    # continued to 6 trains what a run of 6 does, so recovery is compared bit for bit.
    c.schedule.name, c.schedule.decay_steps, c.schedule.decay_fraction = "wsd", 0, 0.0
    return c

  def result(workdir):
    return checkpoints.flatten(checkpoints.load_pretrained(workdir)[1])

  return Fuzzer(root, config, registry.run, result, timeout=timeout)


def glue_fuzzer(root: str, timeout: float = 120.0) -> Fuzzer:
  """GLUE MRPC (quick) on 16 generated training and 10 dev examples from a random one-layer
  checkpoint (tests/finetuning_fixtures.py: the layers add tracing, not files): 4 steps of 4
  examples, checkpoints and evaluations every 2 steps (best/, results.json and the test
  predictions written at the end), cases continued to 6. The result is the best model's
  parameters (best/, checked against the digests best.json records) and the dev metrics of
  results.json."""
  from tests import finetuning_fixtures
  glue_dir = finetuning_fixtures.write_glue_dir(os.path.join(root, "glue"),
                                                dict(train=16, dev=10))
  checkpoint = finetuning_fixtures.write_checkpoint(os.path.join(root, "checkpoint"),
                                                    num_hidden_layers=1)

  def config(steps):
    c = glue.get_config("task=mrpc,quick")
    c.data.glue_dir, c.init_checkpoint = glue_dir, checkpoint
    c.num_train_epochs = steps / 4   # 16 examples, 4 a step
    c.checkpoint_every_steps, c.eval_every_steps, c.log_every_steps = 2, 2, 1
    c.schedule.name, c.schedule.decay_steps, c.schedule.decay_fraction = "wsd", 0, 0.0
    c.warmup_proportion = 0.0   # a warm-up by fraction would depend on the run's length
    return c

  def result(workdir):
    flat = checkpoints.flatten(fine_tuned.load(workdir).params)
    dev = bench_util.read_json(os.path.join(workdir, "results.json"))["dev"]
    return dict(flat, **{f"dev/{k}": np.asarray(v) for k, v in dev.items()})

  return Fuzzer(os.path.join(root, "cases"), config, registry.run, result, timeout=timeout)


JOBS = {"pretraining": pretraining_fuzzer, "glue": glue_fuzzer}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--job", choices=sorted(JOBS), default="pretraining",
                      help="the job whose workdir is damaged: the quick pre-training demo, or "
                           "GLUE MRPC fine-tuning")
  parser.add_argument("--sample", type=int, default=0,
                      help="run this many cases, spread over files and damages (0: all)")
  parser.add_argument("--every_chunk", type=int, default=1,
                      help="1: every data chunk of the checkpoint's array store damaged in turn; "
                           "0: the first and the last of each folder (`chunks`)")
  parser.add_argument("--per_file", type=int, default=0,
                      help="damages of each file, taken in turn (0: every damage; the slow "
                           "tier's: 3)")
  parser.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take")
  parser.add_argument("--json", default="", help="also write every case here")
  args = parser.parse_args()
  root = tempfile.mkdtemp(prefix="workdir_fuzz_")
  fuzzer = JOBS[args.job](root, timeout=args.timeout)
  try:
    cases = fuzzer.cases(every_chunk=bool(args.every_chunk), per_file=args.per_file)
    if args.sample:
      cases = spread(cases, args.sample)
    started = time.perf_counter()
    for i, case in enumerate(cases):
      fuzzer.run_case(case, i)
      print(f"[{i + 1}/{len(cases)}] {case.file}: {case.damage}: {case.outcome} "
            f"({case.seconds:.1f} s) {case.detail.splitlines()[0] if case.detail else ''}",
            flush=True)
  finally:
    fuzzer.close()
  print(table(cases))
  print(json.dumps(summary(cases)))
  print(f"{len(cases)} cases in {time.perf_counter() - started:.0f} s")
  if args.json:
    bench_util.write_json(args.json, [dataclasses.asdict(c) for c in cases])


if __name__ == "__main__":
  main()
