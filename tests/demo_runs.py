"""The README's main job, quick variant, run as a user runs it (its own process), for the tests
that interrupt, move or break it and compare with an uninterrupted run."""
import os
import subprocess
import sys

from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(workdir, *overrides):
  return [sys.executable, "-m", "bert_jax.main", "--config=experiments/pretrain_demo.py:quick",
          f"--workdir={workdir}", *overrides]


def env():
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def run(workdir, *overrides):
  """The quick demo to its end (or its error): the CompletedProcess, output captured as text."""
  return subprocess.run(command(workdir, *overrides), cwd=ROOT, env=env(), capture_output=True,
                        text=True, timeout=600)


def untimed_metrics(workdir):
  """metrics.jsonl without the wall-clock fields: what must be bitwise reproducible."""
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]
