"""WORKDIR/environment.jsonl: what a run's numbers depend on beyond its config, one line a start;
and the claim it rests on: the same environment gives the same run, bit for bit."""
import json
import os

import pytest

from bert_jax.runtime import environment
from tests import demo_runs


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
  result = demo_runs.run(workdir)
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
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
  untimed = demo_runs.untimed_metrics
  assert untimed(first) and untimed(first) == untimed(second)
  assert len(environment.read(first)) == 1
