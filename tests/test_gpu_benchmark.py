"""The GPU benchmark's machine has jax, flax, optax, orbax and PyTorch but no TensorFlow: the
pre-training step (both families) and `benchmarks/gpu_pretrain_mfu.py` must import and run
without it. Shown here with TensorFlow made unimportable in a fresh process; the benchmark's
ModernBERT-family path (bert_jax and transformers' model, the variants) run on the CPU."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_TENSORFLOW = "import sys\nsys.modules['tensorflow'] = None   # import tensorflow fails\n"


def _python(code: str, timeout: int = 600):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_a_modern_pretraining_step_runs_without_tensorflow():
  run = _python(NO_TENSORFLOW + textwrap.dedent("""
      import jax, numpy as np
      import benchmarks.gpu_pretrain_mfu                                # the whole benchmark
      from benchmarks import bench_util
      from bert_jax.io import training_checkpoints
      from bert_jax.model.config import BertConfig
      from bert_jax.tasks.jobs import pretraining
      config = BertConfig.named("modernbert-base", num_hidden_layers=3, hidden_size=64,
                                num_attention_heads=2, intermediate_size=96, vocab_size=128,
                                local_attention=16, pad_token_id=0)
      c = bench_util.modern_pretraining_config(config, dtype="float32", seq=64, batch=2,
                                               predictions=19)
      job = pretraining.make_job(c)
      state = jax.jit(job.init_state)()
      batch = bench_util.mlm_batch(2, 64, 19, vocab=128)
      state, metrics = jax.jit(job.train_step)(state, batch, jax.random.PRNGKey(0))
      print("loss", float(metrics["loss"]))
      # Restore errors are still classified (TensorFlow's error classes only once imported).
      print(training_checkpoints.restore_error_kind(FileNotFoundError("x")))
      assert "tensorflow" not in sys.modules or sys.modules["tensorflow"] is None
      """))
  assert run.returncode == 0, run.stderr[-3000:]
  lines = run.stdout.split("\n")
  loss = float(next(line for line in lines if line.startswith("loss")).split()[1])
  assert 3.0 < loss < 8.0, loss   # about ln(128) = 4.85 from a random start
  assert "missing" in lines


@pytest.mark.slow
def test_the_benchmark_times_the_modern_step_against_transformers_on_a_cpu():
  pytest.importorskip("transformers", reason="the peer is transformers' ModernBertForMaskedLM")
  run = _python(NO_TENSORFLOW + textwrap.dedent("""
      import runpy
      sys.argv = ["gpu_pretrain_mfu", "--family=modernbert", "--size=mini", "--seq=128",
                  "--vocab_size=8000", "--local_attention=64", "--dtype=float32",
                  "--batch=1", "--steps=1", "--rounds=1", "--matmul_n=128", "--peer=torch",
                  "--variants=current,xla_attention"]
      runpy.run_module("benchmarks.gpu_pretrain_mfu", run_name="__main__")
      """))
  assert run.returncode == 0, run.stderr[-3000:]
  results = [json.loads(line) for line in run.stdout.split("\n") if line.startswith("{")]
  assert [r["side"] for r in results] == ["current", "xla_attention", "torch"]
  for r in results:
    assert r["family"] == "modernbert" and r["masked_per_row"] == 38 and r["steps_per_sec"] > 0
    assert r["size"] == "mini" and r["dtype"] == "float32"
  assert results[0]["attention"] == "xla" and results[2]["attention"] == "sdpa"
  assert results[0]["ratio_vs_torch"] > 0


def test_the_torch_compile_peer_asks_for_triton_before_compiling_anything(monkeypatch):
  # bert_jax keeps Triton out of its processes; torch.compile needs it (found on an H200).
  import argparse
  from benchmarks import gpu_pretrain_mfu
  monkeypatch.setitem(sys.modules, "triton", None)   # as `import bert_jax` leaves it
  args = argparse.Namespace(peer="torch,torch_compile")
  with pytest.raises(SystemExit, match="BERT_JAX_ALLOW_TRITON=1"):
    gpu_pretrain_mfu.run_modern(args, "cpu", peak=1.0, matmul=1.0)


def test_the_modern_family_takes_a_bert_sizes_counterpart_and_another_vocabulary():
  # --size=mini: the model benchmarks/time_to_quality trains (its vocabulary's [PAD] is 0).
  import argparse
  from benchmarks import gpu_pretrain_mfu
  from bert_jax.model.config import BertConfig
  mini = gpu_pretrain_mfu.modern_bert_config(
      argparse.Namespace(size="mini", vocab_size=8000, local_attention=64))
  assert (mini.num_hidden_layers, mini.hidden_size, mini.num_attention_heads,
          mini.intermediate_size) == (4, 256, 4, 704)
  assert (mini.vocab_size, mini.pad_token_id, mini.local_attention) == (8000, 0, 64)
  assert mini.architecture == "modernbert"
  base = gpu_pretrain_mfu.modern_bert_config(
      argparse.Namespace(size="base", vocab_size=0, local_attention=0))
  assert base == BertConfig.named("modernbert-base", vocab_size=50368)
