"""benchmarks/modern_growth.py's readings: the FLOPs a run has trained (through the batch ramp),
and a grown run charged its small model's compute before its own."""
import argparse
import math

from benchmarks import modern_growth


def _args(**overrides):
  values = dict(steps=2000, small_steps=2000, eval_every=250, out="/tmp/unused")
  values.update(overrides)
  return argparse.Namespace(**values)


def test_training_flops_follow_the_batch_ramp_and_the_model():
  twin = modern_growth.run_config("scratch", 0, _args())
  small = modern_growth.run_config("small", 0, _args())
  assert small.model.hidden_size * 2 == twin.model.hidden_size
  assert small.model.num_hidden_layers * 2 == twin.model.num_hidden_layers
  per_step = [modern_growth.training_flops(twin, k + 1) - modern_growth.training_flops(twin, k)
              for k in (0, 1999)]
  # The ramp: 8 rows a step at first, the recipe's 32 at the end.
  assert math.isclose(per_step[1] / per_step[0], 4.0, rel_tol=1e-6)
  ratio = modern_growth.training_flops(small, 2000) / modern_growth.training_flops(twin, 2000)
  assert 0.1 < ratio < 0.5, ratio       # half the width and depth: well under half the compute


def test_a_grown_run_is_charged_its_small_models_compute_first():
  def run(kind, accuracy_by_step, flops_per_step):
    return dict(kind=kind, seed=0, curve=[
        dict(step=s, flops=s * flops_per_step, train_seconds=s * 0.1, loss=1.0,
             mlm_accuracy=a) for s, a in accuracy_by_step])
  result = dict(args=dict(seeds=[0], modes=["tile_from_middle"]), machine="test", runs={
      "small_s0": run("small", [(0, 0.0), (100, 0.2)], 1.0e9),       # 0.1 TFLOP in all
      "scratch_s0": run("scratch", [(0, 0.0), (100, 0.3), (200, 0.4)], 2.0e9),
      "tile_from_middle_s0": run("tile_from_middle", [(0, 0.2), (100, 0.5), (200, 0.6)],
                                 2.0e9)})
  table = modern_growth.markdown(result)
  compute = table.split("At equal training compute")[1].split("At equal training time")[0]
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
          for line in compute.splitlines() if line.startswith("| ") and "TFLOP" not in line}
  # Marks at 0.1, 0.2, 0.3, 0.4 TFLOP (quarters of scratch's 0.4): the grown run's own curve
  # starts at 0.1 (its small model's compute), so it reads 0.2 there and 0.5 at 0.3.
  assert rows["scratch"] == ["0.150 +- 0.000", "0.300 +- 0.000", "0.350 +- 0.000",
                             "0.400 +- 0.000"]
  assert rows["tile_from_middle"] == ["0.200 +- 0.000", "0.350 +- 0.000", "0.500 +- 0.000",
                                      "0.550 +- 0.000"]
