"""SIGTERM (preemption) handling: the loop saves a checkpoint at a step boundary and exits 0."""
import signal

import jax


class Preemption:
  """SIGTERM sets a flag; the loop saves at the next step boundary and exits cleanly.

  With several processes the hosts must save at the *same* step (a save is a collective), but
  each host's loop runs ahead of its devices by a different amount. There jax's preemption
  service (started by `jax.distributed.initialize`) catches SIGTERM on any host and
  `reached(step)` becomes True on every host at one agreed step: the service's C++ handler
  replaces the default one at initialisation (so no Python handler may be installed, it would
  take the signal from the service), polls for the signal once a second, and agrees on one
  more than the largest step any host has passed to `reached`, which therefore must be called
  with every step on every host (tests/test_multihost_preemption.py).
  """

  def __init__(self):
    self.requested = False
    self._previous = None
    self._multihost = jax.process_count() > 1

  def reached(self, step: int) -> bool:
    """Call once per step on every host: True when this is the step to save and stop at."""
    if self._multihost:
      from jax.experimental import multihost_utils
      self.requested = multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def __enter__(self):
    if self._multihost:  # the preemption service owns SIGTERM (see the class docstring)
      return self
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. a notebook worker): no handler
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True
    print("SIGTERM received: saving a checkpoint at the next step boundary.", flush=True)

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
