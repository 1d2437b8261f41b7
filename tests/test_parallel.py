"""jit over a mesh and pmap on 8 simulated CPU devices give the single-device result: the same
training losses and parameters, and the same evaluation sums (`par.compile_eval`)."""
import json
import os
import subprocess
import sys

import numpy as np

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_jit_mesh_and_pmap_match_a_single_device():
  # A fresh process: the simulated device count is fixed when jax is first imported.
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, os.path.join(HERE, "parallel_equivalence.py")],
                       capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  np.testing.assert_allclose(report["jit"], report["single"], rtol=1e-5)
  np.testing.assert_allclose(report["pmap"], report["single"], rtol=1e-5)
  assert report["max_param_diff"]["jit"] < 1e-5
  assert report["max_param_diff"]["pmap"] < 1e-5


def test_zero1_pins_the_gradients_only_while_its_step_is_traced(monkeypatch):
  import jax
  import jax.numpy as jnp
  from bert_jax.parallel import sharding
  pinned = []   # (one device here: jax would drop a real constraint, so it is recorded instead)
  monkeypatch.setattr(jax.lax, "with_sharding_constraint",
                      lambda x, target: pinned.append(target) or x)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), (sharding.DATA_AXIS,))
  target = {"w": sharding.replicated(mesh)}
  grads = {"w": jnp.ones((4, 4))}
  assert sharding.placed_gradients(grads) is grads and not pinned
  with sharding.gradients_placed_like(target):
    sharding.placed_gradients(grads)
  assert pinned == [target]
  sharding.placed_gradients(grads)
  assert pinned == [target]    # the context is left as it was found
