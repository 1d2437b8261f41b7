"""BertConfig.remat_policy: which forward values a rematerialised layer keeps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import layers, post_ln
from tests.test_splash_attention import B, S, _config, _masks


@pytest.mark.parametrize("policy", [
    pytest.param("dots_with_no_batch_dims_saveable", marks=pytest.mark.slow),   # 18 s on 2 cores
    "everything_saveable"])
def test_remat_policies_change_what_is_kept_not_what_is_computed(policy):
  """BertConfig.remat_policy: the same loss and gradients as no remat (each policy only decides
  which forward values the backward pass recomputes)."""
  padding, masks = _masks()
  ids = np.random.RandomState(1).randint(5, 60, size=(B, S)) * padding
  results = []
  for overrides in ({}, {"remat": True, "remat_policy": policy}):
    model = post_ln.BertModel(_config("xla", **overrides))
    params = layers.init_params(model, jax.random.PRNGKey(0), seq_len=S)
    loss = lambda p: jnp.sum(model.apply({"params": p}, ids, masks["padding"])["pooled_output"])
    results.append(jax.value_and_grad(loss)(params))
  np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(results[1][1]),
                  jax.tree_util.tree_leaves(results[0][1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match="remat_policy"):
    _config("xla", remat_policy="save_everything")
