"""A job spec: everything that defines what a training job computes, built once by the job's
`make_job(config)` and used unchanged by whoever runs it: the training loop on real devices,
`--compile_for` on a TPU slice's abstract devices (`tasks.compile_report`), and the benchmarks.
So the step that is compiled, profiled and timed is the step that trains.

    job = pretraining.make_job(config)
    state = par.init_state(job.init_state, job.param_axes)      # real devices
    step = par.compile_step(job.train_step)
    abstract = jax.eval_shape(job.init_state)                   # or: shapes only, for a report
"""
import dataclasses
from typing import Any, Callable, Dict, Optional

import numpy as np

Batch = Dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Job:
  name: str                                  # console prefix, e.g. "pretraining"
  model: Any                                 # the Flax module
  tx: Any                                    # the optax transformation
  schedule: Callable[[int], float]           # learning rate by optimizer step
  init_state: Callable[[], Any]              # () -> a fresh TrainState (jit / eval_shape it)
  param_axes: Any                            # logical axis names of the parameters (sharding)
  train_step: Callable                       # (state, batch, rng) -> (state, metrics), pure
  eval_step: Optional[Callable]              # (params, batch) -> summed terms, or None
  example_batch: Callable[[int], Batch]      # rows -> a host batch of the train step's shapes
  example_eval_batch: Optional[Callable[[int], Batch]] = None
  model_flops: Callable[[int], float] = lambda rows: 0.0   # analytic training FLOPs of a step
  kernel_flops: Callable[[int], float] = lambda rows: 0.0  # inside custom calls (splash)
