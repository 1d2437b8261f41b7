"""`python -m benchmarks.time_to_quality`: the stages named on the command line (see __init__)."""
# As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads: freed host memory is
# reused instead of faulted in again. Process-wide, so both sides (each in its own process) run
# with it; not on import (the test), where other threads run already.
from bert_jax.runtime import host_memory

host_memory.keep_freed_memory()

from benchmarks.time_to_quality import cli  # noqa: E402

cli.main()
