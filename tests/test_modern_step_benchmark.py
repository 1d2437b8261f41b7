"""benchmarks/modern_step_throughput.py's `--part=decoder` and `--part=attention` time the same
functions on both sides: bert_jax's decoder and loss (the model's building blocks) and PyTorch's
linear and cross-entropy, and bert_jax's local attention (band or blocks) and PyTorch's
`scaled_dot_product_attention` with the band as its mask, give the same gradients."""
import argparse

import numpy as np
import pytest

from benchmarks import modern_step_throughput as bench

torch = pytest.importorskip("torch", reason="the benchmark's peer side needs PyTorch")


def test_decoder_part_computes_the_same_gradients_on_both_sides():
  args = argparse.Namespace(batch=2, hidden=16, threads=1, precision="float32")
  ours = bench.jax_decoder(args, predictions=3)()
  theirs = bench.torch_decoder(args, predictions=3)()
  for name, a, b in zip(("hidden", "table", "bias"), ours, theirs):
    assert a.shape == tuple(b.shape), name
    np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-4, atol=1e-7, err_msg=name)
  assert np.abs(np.asarray(ours[1])).max() > 0   # the table's gradient is not trivially zero


@pytest.mark.parametrize("seq", [256, 1024])   # the band; the blocks
def test_attention_part_computes_the_same_gradients_on_both_sides(seq):
  args = argparse.Namespace(batch=1, seq=seq, layers=1, hidden=64, local_attention=128,
                            threads=1, precision="float32")
  ours = bench.jax_attention(args, predictions=0)()
  theirs = bench.torch_attention(args, predictions=0)()
  for name, a, b in zip("qkv", ours, theirs):
    np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-4, atol=2e-5, err_msg=name)
