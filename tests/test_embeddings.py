"""The word-embedding lookup under mixed precision: bfloat16 values, float32 gradient sums."""
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import kernels, ops


def test_word_lookup_values_are_the_cast_rows_and_gradients_sum_in_float32():
  rng = np.random.RandomState(0)
  table = jnp.asarray(rng.randn(10, 8), jnp.float32)                     # [V, H]
  # Token 3 at 512 positions, as [CLS] is in every row of a 512-sequence batch.
  ids = jnp.asarray(np.where(rng.rand(4, 128) < 0.2, rng.randint(10, size=(4, 128)), 3))
  out, pullback = jax.vjp(lambda t: ops.word_lookup(t, ids, jnp.bfloat16), table)
  assert out.dtype == jnp.bfloat16 and out.shape == (4, 128, 8)
  np.testing.assert_array_equal(out, table.astype(jnp.bfloat16)[ids])
  cotangent = jnp.asarray(rng.randn(4, 128, 8), jnp.bfloat16)
  (grad,) = pullback(cotangent)
  expected = np.zeros((10, 8))
  np.add.at(expected, np.asarray(ids), np.asarray(cotangent, np.float64))
  assert grad.dtype == jnp.float32
  # A bfloat16 scatter-add (casting the table before the gather) misses this by ~1e-2 relative.
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-4)
  # The textbook form (kernels "cast_then_gather") gives the same values, its gradient rounded.
  textbook, textbook_pullback = jax.vjp(
      lambda t: kernels.cast_then_gather(t, ids, jnp.bfloat16), table)
  np.testing.assert_array_equal(textbook, out)
  (textbook_grad,) = textbook_pullback(cotangent)
  np.testing.assert_allclose(textbook_grad, expected, rtol=5e-2, atol=5e-1)
