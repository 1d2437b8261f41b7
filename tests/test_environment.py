"""WORKDIR/environment.jsonl: what a run's numbers depend on beyond its config, one line a start;
and the claim it rests on: the same environment gives the same run, bit for bit."""
import json
import os
import subprocess
import sys

from bert_jax.runtime import environment
from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_describe_names_versions_cpu_and_devices():
  entry = environment.describe()
  assert entry["packages"]["jax"] and entry["packages"]["numpy"]
  assert entry["cpu"]["cores"] >= 1 and entry["cpu"]["model"]
  known = set(environment._CPU_FLAGS)  # pylint: disable=protected-access
  assert set(entry["cpu"]["features"]) <= known
  assert entry["backend"] == "cpu" and entry["devices"]["count"] >= 1
  json.dumps(entry)  # serialisable as it is


def test_record_appends_one_line_per_start(tmp_path):
  workdir = str(tmp_path / "work")
  environment.record(workdir)
  environment.record(workdir)
  entries = environment.read(workdir)
  assert len(entries) == 2
  assert entries[0]["packages"] == entries[1]["packages"]
  assert environment.read(str(tmp_path / "absent")) == []


def _demo(workdir):
  """The README's main job, quick variant, in its own process."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  subprocess.run([sys.executable, "-m", "bert_jax.main",
                  "--config=experiments/pretrain_demo.py:quick", f"--workdir={workdir}"],
                 cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)


def test_the_demo_is_bitwise_reproducible_in_one_environment(tmp_path):
  """Two fresh workdirs, two processes: the same corpus, vocabulary, records and metrics (the
  README's promise for a given environment; across CPUs the numbers spread, see README)."""
  first, second = str(tmp_path / "a"), str(tmp_path / "b")
  _demo(first)
  _demo(second)
  for name in ("train.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord"):
    with open(os.path.join(first, "data", name), "rb") as a, \
        open(os.path.join(second, "data", name), "rb") as b:
      assert a.read() == b.read(), name
  untimed = lambda w: [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
                       for r in read_metrics(w)]
  assert untimed(first) and untimed(first) == untimed(second)
  assert len(environment.read(first)) == 1
