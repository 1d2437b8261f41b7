"""The one `TrainState` of every training job (pre-training, fine-tuning, the feature-based tagger)."""
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  consecutive_skips: jax.Array   # non-finite steps in a row (reset by a good step)
  total_skips: jax.Array

  @classmethod
  def create(cls, params, tx: optax.GradientTransformation) -> "TrainState":
    zero = jnp.zeros((), jnp.int32)
    return cls(step=zero, params=params, opt_state=tx.init(params), consecutive_skips=zero,
               total_skips=zero)
