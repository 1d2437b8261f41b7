"""Exact search (`bert_jax/runtime/search.py`): the corpus sharded over 8 simulated devices (a
subprocess: the device count is fixed when jax starts) gives numpy's single-device ranking and
scores, with a corpus that does not divide by the devices, k past a shard's rows, k past the
corpus, and query blocks with a short last one.

Run as a script (`python tests/test_search.py OUT.npz`) it is that subprocess."""
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS, QUERIES, DIM = 1003, 300, 16   # 1003 rows: 126 per device of 8, the last padded


def _data():
  rng = np.random.default_rng(0)
  return (rng.standard_normal((CORPUS, DIM)).astype(np.float32),
          rng.standard_normal((QUERIES, DIM)).astype(np.float32))


def _searches():
  """{name: (scores, ids)} of ExactSearch on this process's devices."""
  from bert_jax.runtime.search import ExactSearch
  corpus, queries = _data()
  search = ExactSearch(corpus, query_block=128)
  return {f"k{k}": search.top_k(queries[:7] if k > 200 else queries, k) for k in (10, 200, 5000)}


def _numpy(k, queries):
  corpus, _ = _data()
  scores = queries.astype(np.float64) @ corpus.T.astype(np.float64)            # [Q, N]
  ids = np.argsort(-scores, axis=1, kind="stable")[:, :min(k, CORPUS)]         # [Q, k]
  return np.take_along_axis(scores, ids, axis=1), ids


def _check(found):
  _, queries = _data()
  for k in (10, 200, 5000):
    scores, ids = found[f"k{k}"]
    rows = queries[:7] if k > 200 else queries
    expected_scores, expected_ids = _numpy(k, rows)
    assert scores.shape == ids.shape == (len(rows), min(k, CORPUS))
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5, rtol=0)


def test_one_device_equals_numpy():
  _check(_searches())


def test_eight_devices_equal_one(tmp_path):
  out = str(tmp_path / "found.npz")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", PYTHONPATH=ROOT,
             JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, os.path.abspath(__file__), out], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "devices: 8" in result.stdout
  with np.load(out) as saved:
    found = {name: (saved[f"{name}_scores"], saved[f"{name}_ids"]) for name in ("k10", "k200",
                                                                                "k5000")}
  _check(found)


def test_bad_shapes_are_named():
  import pytest
  from bert_jax.runtime.search import ExactSearch
  with pytest.raises(ValueError, match=r"shape \(0, 4\): expected \[N > 0, D\]"):
    ExactSearch(np.zeros((0, 4)))
  with pytest.raises(ValueError, match=r"queries of shape \(2, 3\): expected \[Q, 4\]"):
    ExactSearch(np.zeros((5, 4))).top_k(np.zeros((2, 3)), 1)


if __name__ == "__main__":
  import jax
  print(f"devices: {jax.device_count()}")
  np.savez(sys.argv[1], **{f"{name}_{part}": value for name, (scores, ids) in _searches().items()
                           for part, value in (("scores", scores), ("ids", ids))})
