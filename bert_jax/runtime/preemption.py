"""Preemption: a notice (SIGTERM, or the metadata server on a Google Cloud VM) makes the loop
save a checkpoint at a step boundary and exit 0, timed against the grace period.

Notices:
* SIGTERM, on one process or several;
* on a Google Cloud VM of any kind, TPU, GPU or CPU (its DMI product name, read locally), or
  wherever `GCE_METADATA_IP` / `GCE_METADATA_HOST` names a metadata server: a
  loopback stand-in in the tests), the metadata server's `instance/preempted` turning `TRUE`
  (a Spot or preemptible VM about to go) and `instance/maintenance-event` turning
  `TERMINATE_ON_HOST_MAINTENANCE`, polled every second in a background thread. Both feed the
  same path as SIGTERM.

With several processes the hosts must save at the *same* step (a save is a collective), but each
host's loop runs ahead of its devices by a different amount. There jax's preemption service
(started by `jax.distributed.initialize`) agrees on one step: its C++ SIGTERM handler, installed
at initialisation, records the notice, a thread of the service tells the other hosts, and
`reached(step)` becomes True on every host at one more than the largest step any host has
passed to it (so it must be called with every step on every host;
tests/test_multihost_preemption.py). Our SIGTERM handler is installed in front of the service's
and calls it, so a notice is both seen here (the console line, the grace period's start) and
agreed by the service; a metadata notice calls the service's handler directly.

The grace period (`config.preemption_grace_seconds`, 30 s on GCE) is what the platform leaves
between the notice and the kill: the preemption save logs its duration and the time since the
notice beside it, with a warning when it did not fit; a regular checkpoint that alone takes
longer than the grace period is warned about once, before any preemption.
"""
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable, Mapping, Optional

import jax

from bert_jax.runtime import cluster

POLL_SECONDS = 1.0


# ------------------------------------------------------------------ jax's service's handler

class _SigAction(ctypes.Structure):
  """glibc's `struct sigaction` (Linux, x86-64 and arm64)."""
  _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
              ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_SA_SIGINFO = 4


def _sigaction(signum: int, new: Optional[_SigAction] = None) -> _SigAction:
  """The process's current handler of `signum` at the C level (replaced by `new` if given)."""
  old = _SigAction()
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.sigaction(signum, ctypes.byref(new) if new is not None else None, ctypes.byref(old)):
    raise OSError(ctypes.get_errno(), f"sigaction({signum})")
  return old


def c_handler_address(signum: int) -> int:
  """The address of the process's C-level handler of `signum` (0: default, 1: ignored)."""
  return _sigaction(signum).handler or 0


def _c_handler(action: _SigAction) -> Callable[[], None]:
  """A call of the C signal handler in `action` for SIGTERM (jax's service's handler records the
  notice in an atomic, which its own thread reads: safe outside a signal)."""
  if action.flags & _SA_SIGINFO:
    function = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        action.handler)
    return lambda: function(signal.SIGTERM, None, None)
  function = ctypes.CFUNCTYPE(None, ctypes.c_int)(action.handler)
  return lambda: function(signal.SIGTERM)


# ------------------------------------------------------------------ metadata server notices

class NoticePoller:
  """Polls the metadata server for a preemption or a terminating maintenance event and calls
  `on_notice(reason)` once, from its own thread."""

  def __init__(self, on_notice: Callable[[str], None], poll_seconds: float = POLL_SECONDS,
               environ: Optional[Mapping[str, str]] = None):
    self.on_notice, self.poll_seconds = on_notice, poll_seconds
    self.environ = dict(os.environ if environ is None else environ)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._poll, name="preemption-notices", daemon=True)
    self._said = set()   # one console line per kind of event that is not a notice

  def start(self) -> "NoticePoller":
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5.0)

  def _poll(self) -> None:
    interval = self.poll_seconds
    while not self._stop.wait(interval):
      try:
        reason = self._notice()
      except cluster.MetadataUnreachable as error:
        self._say("unreachable", f"Preemption notices: {error}; they come from SIGTERM only "
                  "until it answers.")
        interval = min(interval * 2, 30.0)   # a server that is down: ask less often
        continue
      interval = self.poll_seconds
      if reason:
        self.on_notice(reason)
        return

  def _notice(self) -> Optional[str]:
    preempted = cluster.metadata_get("instance/preempted", self.environ, tries=1, timeout=2.0)
    if (preempted or "").upper() == "TRUE":
      return "metadata server: instance/preempted=TRUE"
    event = (cluster.metadata_get("instance/maintenance-event", self.environ, tries=1,
                                  timeout=2.0) or "NONE").upper()
    if event.startswith("TERMINATE"):
      return f"metadata server: instance/maintenance-event={event}"
    if event != "NONE":   # MIGRATE_ON_HOST_MAINTENANCE: the VM moves, the run goes on
      self._say(event, f"Maintenance event {event}: the VM is migrated live; training goes on.")
    return None

  def _say(self, kind: str, line: str) -> None:
    if kind not in self._said:
      self._said.add(kind)
      print(line, file=sys.stderr, flush=True)


def notices_expected() -> bool:
  """The metadata server is worth asking: a Google Cloud VM of any kind (TPU, GPU or CPU: its
  DMI product name; unless told not to ask it, TPU_SKIP_MDS_QUERY), or a server named in the
  environment. Elsewhere nothing is polled and nothing costs."""
  on_gce = ((cluster.on_google_cloud() or cluster.has_tpu_chips())
            and os.environ.get("TPU_SKIP_MDS_QUERY") is None)
  return on_gce or cluster.metadata_explicit()


# ------------------------------------------------------------------------------ the notice

class Preemption:
  """`with Preemption(grace) as p:` notices (SIGTERM, the metadata server) are taken while the
  loop runs; `p.reached(step)` says, at every step, whether this is the step to save and stop
  at; `p.saved(step, seconds)` reports each save against the grace period."""

  def __init__(self, grace_seconds: float = 30.0, *, multihost: Optional[bool] = None,
               notices: Optional[bool] = None, poll_seconds: float = POLL_SECONDS):
    self.grace_seconds = float(grace_seconds)
    self.noticed_at: Optional[float] = None   # time.monotonic() of the notice on this host
    self.reason = ""
    self.stopping = False                     # reached() said True: this save is the last
    self._multihost = jax.process_count() > 1 if multihost is None else multihost
    self._notices = notices
    self._poll_seconds = poll_seconds
    self._poller: Optional[NoticePoller] = None
    self._previous = None        # the Python-level SIGTERM handler we replaced
    self._c_previous: Optional[_SigAction] = None   # a C-level one Python did not know of
    self._installed = False
    self._service: Optional[Callable[[], None]] = None
    self._slow_save_said = False
    self._no_service = False

  @property
  def requested(self) -> bool:
    """A notice reached this host (on several hosts the save waits for the agreed step)."""
    return self.noticed_at is not None

  # ---------------------------------------------------------------------- taking notices

  def __enter__(self):
    self._install()
    notices = notices_expected() if self._notices is None else self._notices
    if notices:
      self._poller = NoticePoller(self._metadata_notice, self._poll_seconds).start()
    return self

  def _install(self) -> None:
    before = _sigaction(signal.SIGTERM)
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. a notebook worker): no handler
      return
    self._installed = True
    python_handler = _sigaction(signal.SIGTERM).handler   # the C function of every Python one
    if before.handler not in (None, 0, 1, python_handler):
      # A C-level handler Python does not know of (jax's preemption service's, with several
      # processes): put back as it was at the end, and called by ours on several processes.
      self._c_previous = before
    if not self._multihost:
      return
    if self._c_previous is None:
      # No jax service (jax_enable_preemption_service off): a notice could not be agreed, and
      # a run that ignored SIGTERM would only be killed later. Leave the default (exit).
      self._restore()
      print("Several processes but no jax preemption service (jax_enable_preemption_service "
            "is off?): the hosts cannot agree on a step to save at, so a SIGTERM or a "
            "preemption notice ends this run without a save; it resumes from its last "
            "regular checkpoint.", file=sys.stderr, flush=True)
      return
    # Ours runs when the main thread is next in Python (within the step or the logging wait it
    # is in; the hosts are in it together, so the agreed step is the same as with the service's
    # handler alone); a metadata notice reaches the service at once.
    self._service = _c_handler(self._c_previous)

  def _restore(self) -> None:
    if not self._installed:
      return
    self._installed = False
    if self._c_previous is not None:
      _sigaction(signal.SIGTERM, self._c_previous)   # the Python-level call cannot restore it
    else:
      signal.signal(signal.SIGTERM, self._previous if self._previous is not None
                    else signal.SIG_DFL)

  def _handle(self, signum, frame):
    del signum, frame
    self._notice("SIGTERM")

  def _metadata_notice(self, reason: str) -> None:
    if self._multihost and self._service is None:
      print(f"Preemption notice ({reason}), but the hosts cannot agree on a step to save at "
            "(no jax preemption service).", file=sys.stderr, flush=True)
      return
    self._notice(reason)

  def _notice(self, reason: str) -> None:
    if self.noticed_at is None:
      self.noticed_at, self.reason = time.monotonic(), reason
      print(f"Preemption notice ({reason}): saving a checkpoint at the next step boundary "
            f"(grace period {self.grace_seconds:g} s).", flush=True)
    if self._service is not None:
      self._service()   # the service tells the other hosts and agrees on the step

  def __exit__(self, *exc):
    if self._poller is not None:
      self._poller.stop()
    self._restore()

  # ---------------------------------------------------------------------- the step

  def reached(self, step: int) -> bool:
    """Call once per step on every host: True when this is the step to save and stop at."""
    if self._multihost:
      if not self._agreed(step):
        return False
      if self.noticed_at is None:   # another host's notice, learnt now
        self.noticed_at, self.reason = time.monotonic(), "another host's notice"
      self.stopping = True
      return True
    self.stopping = self.requested
    return self.stopping

  def _agreed(self, step: int) -> bool:
    """The service's answer (whether or not our handler is in front of its own: SIGTERM reaches
    it either way)."""
    if self._no_service:
      return False
    from jax.experimental import multihost_utils
    try:
      return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError as error:
      if "not been initialized" not in str(error):
        raise   # the coordination service failed: not ours to hide
      self._no_service = True   # jax_enable_preemption_service off: said at the start
      return False

  def saved(self, step: int, seconds: float) -> None:
    """A checkpoint at `step` took `seconds` (the preemption save: until it landed)."""
    if not self.stopping:
      self._regular_save(step, seconds)
      return
    since = time.monotonic() - self.noticed_at
    print(f"Preempted: checkpoint at step {step} saved in {seconds:.1f} s, {since:.1f} s after "
          f"the notice ({self.reason}; grace period {self.grace_seconds:g} s, "
          "config.preemption_grace_seconds); exiting.", flush=True)
    if since > self.grace_seconds:
      print(f"WARNING: the preemption checkpoint landed {since:.1f} s after the notice, past "
            f"the grace period of {self.grace_seconds:g} s: a real preemption would have "
            "killed it first, and the next run would resume from the checkpoint before. "
            "Checkpoint more often, save less, or set config.preemption_grace_seconds to "
            "what the platform really grants.", file=sys.stderr, flush=True)

  def _regular_save(self, step: int, seconds: float) -> None:
    # With asynchronous checkpoints this is only the part the loop waits for: a lower bound.
    if seconds > self.grace_seconds and not self._slow_save_said:
      self._slow_save_said = True
      print(f"WARNING: the checkpoint at step {step} took {seconds:.1f} s, more than the "
            f"preemption grace period of {self.grace_seconds:g} s "
            "(config.preemption_grace_seconds): a preemption would kill the run before its "
            "save lands, and it would resume from the checkpoint before.",
            file=sys.stderr, flush=True)
