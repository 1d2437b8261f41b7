"""Batch-size warm-up by tokens (bert_jax/runtime/batch_ramp.py): the ramp's values (equal steps
per level, switching where ModernBERT's own scheduler switches), a step of k
micro-batches equals one step on their concatenation (one device, a mesh, pmap), and a quick
ModernBERT run across the ramp resumed in the middle of it ends bit for bit as the
uninterrupted run."""
import collections
import functools
import importlib
import math
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.io import checkpoints
from bert_jax.runtime import optim
from bert_jax.runtime.batch_ramp import BatchRamp
from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks import registry
from tests import demo_runs
from tests.test_train_step import synthetic_batch, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _brute_force(ramp, steps):
  """k of each step from the definition: tokens trained so far, summed step by step, against
  the thresholds in fractions (K - 1 levels below K, level k ending at
  tokens * (1 + ... + k) / (1 + ... + (K - 1)), rounded up)."""
  from fractions import Fraction
  big_k, trained, out = ramp.final // ramp.start, 0, []
  unit = Fraction(int(ramp.tokens), sum(range(1, big_k))) if big_k > 1 else 0
  thresholds = [math.ceil(unit * sum(range(1, k + 1))) for k in range(1, big_k)]
  for _ in range(steps):
    k = 1 + sum(trained >= t for t in thresholds)
    out.append(k)
    trained += k * ramp.start * ramp.seq_len
  return out


class _ModernBertScheduler:
  """ModernBERT's `BatchSizeWarmupScheduler` (AnswerDotAI/ModernBERT src/sequence_packer.py,
  8c57a0f), transcribed: per GPU, batch sizes in micro-batches, the counter that GPU's tokens."""

  def __init__(self, min_batch_size, max_batch_size, warmup_tokens, world_size):
    self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size
    self.warmup_tokens = math.ceil(warmup_tokens / world_size)
    total_batch_sizes = sum(range(self.min_batch_size, self.max_batch_size))
    steps_per_unit = self.warmup_tokens / total_batch_sizes
    self._step_thresholds, cumsum = [], 0
    for batch_size in range(self.min_batch_size, self.max_batch_size):
      cumsum += batch_size
      self._step_thresholds.append(math.ceil(steps_per_unit * cumsum))

  def __call__(self, current_step):
    if current_step >= self.warmup_tokens:
      return self.max_batch_size
    for i, threshold in enumerate(self._step_thresholds):
      if current_step < threshold:
        return self.min_batch_size + i
    return self.max_batch_size


@pytest.mark.parametrize("global_batch,micro,warmup_tokens", [
    (4608, 96, 50e9),    # modernbert-base-pretrain.yaml
    (4928, 56, 10e9)])   # modernbert-large-pretrain.yaml
def test_the_ramp_switches_where_modernberts_scheduler_does(global_batch, micro,
                                                           warmup_tokens):
  """8 GPUs (the paper's), full packed rows of 1,024 tokens, each GPU counting its own tokens:
  every step's batch equals ModernBERT's, through the whole ramp and past it."""
  gpus, seq_len = 8, 1024
  theirs = _ModernBertScheduler(1, global_batch // gpus // micro, warmup_tokens, gpus)
  ours = BatchRamp(gpus * micro, global_batch, warmup_tokens, seq_len)
  counter, step, levels = 0, 0, collections.Counter()
  while True:
    rows_per_gpu = theirs(counter) * micro
    assert ours.rows(step) == rows_per_gpu * gpus, step
    levels[rows_per_gpu * gpus] += 1
    counter += rows_per_gpu * seq_len
    step += 1
    if counter >= theirs.warmup_tokens + 3 * rows_per_gpu * seq_len:
      break
  steps = [levels[rows] for rows in sorted(levels)[:-1]]   # the levels below the final batch
  assert len(steps) == global_batch // (gpus * micro) - 1 and max(steps) - min(steps) <= 1


@pytest.mark.parametrize("start,final,tokens,seq_len", [
    (2, 8, 1024, 128), (768, 4608, 50e9, 1024), (448, 4928, 10e9, 1024), (4, 8, 0, 16),
    (3, 3, 500, 7), (1, 10, 37, 1), (5, 40, 123_457, 3)])
def test_ramp_values(start, final, tokens, seq_len):
  ramp = BatchRamp(start, final, tokens, seq_len)
  steps = min(ramp.steps_for_tokens(tokens) + 5, 40_000)
  expected = _brute_force(ramp, steps)
  assert [ramp.multiple(s) for s in range(steps)] == expected
  assert [ramp.micro_batches_before(s) for s in range(steps)] == list(
      np.cumsum([0] + expected[:-1]))
  for want in (0, 1, tokens / 3, tokens, tokens + 12_345):
    n = ramp.steps_for_tokens(want)
    assert ramp.tokens_before(n) >= want and (n == 0 or ramp.tokens_before(n - 1) < want)


def test_modernbert_ramps():
  base = BatchRamp(768, 4608, 50e9, 1024)
  assert base.multiple(0) == 1 and base.rows(0) == 768
  end = base.steps_for_tokens(50e9)
  assert base.rows(end - 1) < 4608 and base.rows(end) == 4608
  assert sorted({base.rows(s) for s in range(end + 1)}) == [768 * k for k in range(1, 7)]
  large = BatchRamp(448, 4928, 10e9, 1024)
  assert large.rows(large.steps_for_tokens(10e9)) == 4928
  with pytest.raises(ValueError, match="whole number"):
    BatchRamp(448, 4600, 10e9, 1024)


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_k_micro_batches_are_one_step_on_their_concatenation(grad_accum_steps):
  config = tiny_config(grad_accum_steps=grad_accum_steps, warmup_steps=0)   # no dropout; lr > 0
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  state = pretraining.create_train_state(config, model, tx, jax.random.PRNGKey(0))
  batch = synthetic_batch(batch=8)
  step = lambda start: jax.jit(functools.partial(
      pretraining.train_step, model=model, tx=tx, objective=config.objective, schedule=schedule,
      grad_accum_steps=grad_accum_steps, warmup_start_rows=start))
  whole, whole_metrics = step(0)(state, batch, jax.random.PRNGKey(1))
  ramped, metrics = step(2)(state, batch, jax.random.PRNGKey(1))   # k = 4 micro-batches of 2
  assert float(metrics["batch_size"]) == 8.0 and "batch_size" not in whole_metrics
  for key in ("loss", "mlm_accuracy", "grad_norm"):
    np.testing.assert_allclose(metrics[key], whole_metrics[key], rtol=1e-5, err_msg=key)
  moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda a, b: float(np.max(np.abs(a - b))), whole.params, state.params))
  assert max(moved) > 1e-4    # the step changed the parameters: the comparison means something
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         ramped.params, whole.params)
  with pytest.raises(ValueError, match="whole number"):
    step(3)(state, batch, jax.random.PRNGKey(1))


@pytest.mark.slow
def test_on_a_mesh_and_under_pmap():
  """4 simulated devices: k micro-batches (1 row per device each) equal the whole batch's step
  under both strategies (tests/batch_warmup_devices.py)."""
  out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "batch_warmup_devices.py")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  diffs = json.loads(out.stdout.strip().splitlines()[-1])
  assert diffs["jit"] < 1e-5 and diffs["pmap"] < 1e-5, diffs


def _quick_config():
  config = importlib.import_module("experiments.pretrain_modernbert").get_config(
      "phase=pretrain,quick")
  config.log_every_steps, config.checkpoint_every_steps, config.keep_checkpoints = 1, 1, 10
  config.async_checkpointing = False
  return config


def test_ramped_batches_take_k_micro_batches_and_replay_to_a_step():
  class Counting:   # a PipelineIterator's interface: batch i is rows [i, i]
    def __init__(self):
      self.position = 0

    def __next__(self):
      self.position += 1
      return {"input_ids": np.full((2, 3), self.position - 1)}

    def skip(self, batches):
      self.position += batches

  ramp = BatchRamp(2, 8, 1024, 128)   # the quick experiment's: k = 1, 2, 3, 4, 4, ...
  batches = pretraining.RampedBatches(Counting(), ramp)
  seen = [batches.next_batch(step)["input_ids"][:, 0].tolist() for step in range(4)]
  assert seen == [[0, 0], [1, 1, 2, 2], [3, 3, 4, 4, 5, 5], [6, 6, 7, 7, 8, 8, 9, 9]]
  replayed = pretraining.RampedBatches(Counting(), ramp)
  replayed.skip(3)    # a moved workdir's checkpoint at step 3: the micro-batches before it
  assert replayed.next_batch(3)["input_ids"][:, 0].tolist() == seen[3]


@pytest.mark.slow
def test_resume_in_the_middle_of_the_ramp_is_bitwise_identical(tmp_path, capsys):
  config = _quick_config()
  reference = str(tmp_path / "reference")
  registry.run_job(config, reference)
  train = [r for r in demo_runs.untimed_metrics(reference) if "batch_size" in r]
  assert [r["batch_size"] for r in train] == [2, 4, 6, 8]     # across the whole ramp
  # Killed after the step-1 checkpoint: the next steps take 2, 3 and 4 micro-batches.
  resumed = str(tmp_path / "resumed")
  shutil.copytree(reference, resumed)
  for step in ("2", "3", "4"):
    shutil.rmtree(os.path.join(resumed, "checkpoints", step))
  capsys.readouterr()
  registry.run_job(config, resumed)
  assert "Resumed from the checkpoint at step 1 " in capsys.readouterr().out
  assert demo_runs.untimed_metrics(resumed) == demo_runs.untimed_metrics(reference)
  ours = checkpoints.flatten(checkpoints.load_pretrained(resumed)[1])
  theirs = checkpoints.flatten(checkpoints.load_pretrained(reference)[1])
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
