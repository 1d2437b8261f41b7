"""The one place that decides which process writes a run's outputs.

Every process computes (a multi-host step, evaluation and prediction are collectives), but only
process 0 writes metrics, predictions, submission files, results, `best/` and exports, so each
output file is written once. Checkpoints are the exception: Orbax writes them from every
process, each its own shards.
"""
import jax


def is_writer() -> bool:
  """True on the process that writes the run's outputs (process 0)."""
  return jax.process_index() == 0
