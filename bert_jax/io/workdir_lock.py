"""One run per workdir: `WORKDIR/lock.json`, held by the run that writes the workdir.

Two runs on one workdir (a job retried while the first still runs, a second terminal) would write
into each other's checkpoints and metrics. The first run writes `lock.json` (its host, pid, start
time and command) with a create-if-absent write; a second run finds it and stops at once with an
error naming the holder.

A run killed with `kill -9` cannot remove its lock, so a lock is a lease: the holder's heartbeat
thread rewrites it every `lease / 6` seconds (30 s by default), and a lock not renewed for
`lease` seconds (`BERT_JAX_WORKDIR_LOCK_LEASE_SECS`, default 180) is stale and taken over. On
Cloud Storage "not renewed" is seen, not read off the holder's clock: the lock's generation
unchanged for a lease while the contender watches it with its own monotonic clock (a holder whose
clock is skewed keeps a live lock). On the holder's own machine a holder process that no longer
runs is stale at once, so the same command run again after a kill starts straight away. A lock
renewed lately (or seen renewed) is refused at once; one whose renewal is overdue is waited for
until it is renewed (refused) or its lease runs out (taken over).

A lock knows its workdir (`workdir_identity`: the gs:// path; locally the real path, device and
inode of the directory, which a copy gets afresh): a lock.json copied with a workdir from a
running source holds nothing in the copy, which takes it over at once.

Every change of the lock is a compare-and-swap, so two contenders never both win:
* Cloud Storage (`gs://`): object generations, through the google-cloud-storage client (which
  honours `STORAGE_EMULATOR_HOST`): created with `if_generation_match=0`, renewed and taken over
  with the generation that was read.
* Local paths: the file is created with `O_EXCL`; a renewal or a take-over compares the file with
  what was read and replaces it, under an `flock` on `lock.json.guard` that is held for those few
  instructions only (the kernel drops it with a killed process, so it never sticks).

A holder whose lock was taken over while it could not renew it (a stopped process, a suspended
machine) finds out at its next renewal and exits (status 1) at once: two runs must never write
one workdir.
"""
import contextlib
import datetime
import errno
import json
import os
import socket
import stat
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

from bert_jax.io import remote_storage

LOCK_FILE = "lock.json"
LEASE_ENV = "BERT_JAX_WORKDIR_LOCK_LEASE_SECS"
DEFAULT_LEASE_SECS = 180.0
RENEWALS_PER_LEASE = 6      # a holder renews 6 times per lease: 30 s with the default lease
LOST_EXIT_STATUS = 1

Record = Dict[str, Any]
# The tokens of the locks this process holds now: a lock.json of this very process that is not
# among them was left by an earlier run in this interpreter (tests) and is stale.
_HELD_HERE: set = set()



# A lock file is one short JSON line: a planted link to an endless file cannot keep a read going.
_MAX_LOCK_BYTES = 1 << 16


def _no_follow(path: str, flags: int) -> int:
  """`os.open` that never follows a symbolic link at `path` (a link planted in the workdir would
  otherwise have the lock read, create or write a file outside it): a clear error instead."""
  try:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)
  except OSError as error:
    if error.errno == errno.ELOOP:
      raise OSError(errno.ELOOP, f"{path} is a symbolic link (to {os.readlink(path)}): the "
                    "workdir's lock never goes through a link; remove it", path) from None
    raise

class WorkdirInUseError(RuntimeError):
  """Another run holds the workdir's lock; the message names it (host, pid, start, command)."""


def lease_secs() -> float:
  return remote_storage.number_from_env(LEASE_ENV, DEFAULT_LEASE_SECS)


def lock_path(workdir: str) -> str:
  workdir = os.fspath(workdir)
  if "://" in workdir:
    return workdir.rstrip("/") + "/" + LOCK_FILE
  return os.path.join(workdir, LOCK_FILE)


# ------------------------------------------------------------------------------ who holds it


def _machine() -> str:
  """Where a pid means this process table: host name, kernel boot and pid namespace (two
  containers of one host can share a name but not a pid namespace)."""
  parts = [socket.gethostname()]
  with contextlib.suppress(OSError):
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      parts.append(f.read().strip())
  with contextlib.suppress(OSError):
    parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
  return "/".join(parts)


def _process_start(pid: int) -> Optional[Tuple[str, str]]:
  """(state, start time in clock ticks since boot) of a process, from /proc; None without it."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      fields = f.read().rpartition(")")[2].split()
  except OSError:
    return None
  return fields[0], fields[19]


def _running(record: Record) -> bool:
  """Whether the holder's process (on this machine) still runs: not gone, not a zombie, and not
  another process that was given its pid since."""
  pid = int(record.get("pid", -1))
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass   # someone else's process: it exists
  if pid == os.getpid():
    return record.get("token") in _HELD_HERE
  process = _process_start(pid)
  if process is None:
    return True
  state, started = process
  return state != "Z" and record.get("pid_start") in (None, started)


def workdir_identity(workdir: str) -> str:
  """What tells this workdir from a copy of it: on Cloud Storage its path (one namespace for
  every machine); locally its real path and its directory's device and inode, which a copy
  gets afresh (and which mean something on this machine only: `_stale` compares them there)."""
  if "://" in workdir and not workdir.startswith("file://"):
    return workdir.rstrip("/")
  local = workdir[len("file://"):] if workdir.startswith("file://") else workdir
  info = os.stat(local)
  return f"{os.path.realpath(local)}@{info.st_dev}:{info.st_ino}"


def _new_record(workdir: str, lease: float) -> Record:
  process = _process_start(os.getpid())
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "renewed": time.time(), "lease_secs": lease, "token": uuid.uuid4().hex,
          "machine": _machine(), "pid_start": process[1] if process else None,
          "workdir": workdir, "workdir_id": workdir_identity(workdir),
          "command": " ".join(sys.argv)}


def describe(record: Record) -> str:
  """host, pid, start time (and command) of a lock's holder, for messages."""
  text = (f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, "
          f"started {record.get('started', '?')}")
  if record.get("command"):
    text += f" (command: {record['command']})"
  return text


def _age(record: Record) -> float:
  return time.time() - float(record.get("renewed", 0))


def _stale(record: Optional[Record], identity: str,
           unchanged_for: Optional[float] = None) -> Optional[str]:
  """Why a lock may be taken over, or None while its holder may still be running.

  `identity`: this workdir's (`workdir_identity`); a lock written for another (copied with the
  workdir) holds nothing here. `unchanged_for`: on a store with versions (Cloud Storage's
  generations), how long this process has seen the lock's version unchanged, by its own
  monotonic clock: then the lease is judged by that alone, never by the holder's clock (a
  skewed clock must not let a live lock be taken)."""
  if record is None:
    return "the lock file does not hold a lock (unreadable)"
  recorded = record.get("workdir_id")
  global_id = "@" not in identity   # a gs:// path: the same for every machine
  if recorded and recorded != identity and (global_id or record.get("machine") == _machine()):
    return (f"it was written for another workdir ({recorded}): copied here with the workdir, "
            "it holds nothing")
  lease = float(record.get("lease_secs", DEFAULT_LEASE_SECS))
  if unchanged_for is not None:
    if unchanged_for > lease:
      return (f"not renewed for {unchanged_for:.0f} s (its version unchanged while this run "
              f"watched it), longer than its lease of {lease:.0f} s")
  elif _age(record) > lease:
    return f"not renewed for {_age(record):.0f} s, longer than its lease of {lease:.0f} s"
  if record.get("machine") == _machine() and not _running(record):
    return "its process no longer runs on this machine"
  return None


# ------------------------------------------------------------------------------ the two stores


class _LocalStore:
  """lock.json on a local (or mounted) filesystem; a version is the file's exact text."""

  versioned = False   # one machine's clock: the holder's `renewed` is compared with it

  def __init__(self, workdir: str):
    self.path = lock_path(workdir)
    self.guard = self.path + ".guard"

  @contextlib.contextmanager
  def _guarded(self):
    import fcntl
    fd = _no_follow(self.guard, os.O_RDWR | os.O_CREAT)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
      yield
    finally:
      os.close(fd)   # releases the flock

  def _text(self) -> Optional[str]:
    try:
      fd = _no_follow(self.path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO: no wait for a writer
      if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{self.path} is not a regular file (a FIFO, a device or a "
                      "directory where the workdir's lock belongs): remove it", self.path)
      with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return f.read(_MAX_LOCK_BYTES)
    except FileNotFoundError:
      return None

  def read(self) -> Optional[Tuple[Optional[Record], str]]:
    with self._guarded():   # never between a create and its write
      text = self._text()
    return None if text is None else (_parse(text), text)

  def write(self, record: Record, expected: Optional[str]) -> Optional[str]:
    """Writes `record` if the lock is still `expected` (None: no lock); its new version, or None
    when another process changed it first."""
    text = json.dumps(record, sort_keys=True)
    with self._guarded():
      if expected is None:
        try:
          fd = _no_follow(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
          return None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
          f.write(text)
          f.flush()
          os.fsync(f.fileno())
        return text
      if self._text() != expected:
        return None
      temporary = f"{self.path}.{os.getpid()}.tmp"
      with contextlib.suppress(FileNotFoundError):   # created afresh, never through a link
        os.unlink(temporary)
      fd = _no_follow(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
      os.replace(temporary, self.path)
      return text

  def delete(self, expected: str) -> None:
    with self._guarded():
      if self._text() == expected:
        os.remove(self.path)


class _CloudStore:
  """lock.json as a Cloud Storage object; a version is the object's generation."""

  versioned = True   # generations: a renewal is seen, not read off another clock

  def __init__(self, workdir: str):
    from google.cloud import storage
    bucket, _, prefix = workdir[len("gs://"):].partition("/")
    self.path = lock_path(workdir)
    self.name = (prefix.strip("/") + "/" if prefix.strip("/") else "") + LOCK_FILE
    self.bucket = storage.Client().bucket(bucket)   # STORAGE_EMULATOR_HOST: the emulator
    # Each request bounded as every other gs:// call is (bert_jax/io/remote_storage.py).
    from google.cloud.storage.retry import DEFAULT_RETRY
    self.timeout = remote_storage.timeout_secs()
    self.retry = DEFAULT_RETRY.with_timeout(
        self.timeout * (remote_storage.retries() + 1))

  def read(self) -> Optional[Tuple[Optional[Record], int]]:
    from google.api_core import exceptions
    for _ in range(5):   # replaced between the two requests: read the new one
      blob = self.bucket.get_blob(self.name, timeout=self.timeout, retry=self.retry)
      if blob is None:
        return None
      try:
        data = self.bucket.blob(self.name, generation=blob.generation).download_as_bytes(
            timeout=self.timeout, retry=self.retry)
      except exceptions.NotFound:
        continue
      return _parse(data.decode("utf-8", errors="replace")), blob.generation
    raise OSError(f"{self.path} changed at every read")

  def write(self, record: Record, expected: Optional[int]) -> Optional[int]:
    from google.api_core import exceptions
    blob = self.bucket.blob(self.name)
    try:
      # A generation precondition makes the upload safe to retry; 0: only if there is none.
      blob.upload_from_string(json.dumps(record, sort_keys=True),
                              content_type="application/json",
                              if_generation_match=0 if expected is None else expected,
                              timeout=self.timeout, retry=self.retry)
    except exceptions.PreconditionFailed:
      return None
    return blob.generation

  def delete(self, expected: int) -> None:
    from google.api_core import exceptions
    with contextlib.suppress(exceptions.NotFound, exceptions.PreconditionFailed):
      # One short try: a run on its way out does not wait for a store that does not answer.
      self.bucket.blob(self.name).delete(if_generation_match=expected,
                                         timeout=min(self.timeout, 10.0), retry=None)


def _store(workdir: str):
  if workdir.startswith("gs://"):
    return _CloudStore(workdir)
  if "://" in workdir:
    if not workdir.startswith("file://"):
      raise ValueError(f"--workdir={workdir}: a workdir lock needs a local path or gs://")
    workdir = workdir[len("file://"):]
  return _LocalStore(workdir)


def _parse(text: str) -> Optional[Record]:
  try:
    record = json.loads(text)
  except ValueError:
    return None
  return record if isinstance(record, dict) and "token" in record else None


# ------------------------------------------------------------------------------ holding it


class Lock:
  """A held workdir lock: renewed by a daemon thread until `release()`."""

  def __init__(self, store, record: Record, version, say: Callable[[str], None]):
    self._store, self._record, self._version, self._say = store, record, version, say
    self.path = store.path
    self.interval = record["lease_secs"] / RENEWALS_PER_LEASE
    self._stop = threading.Event()
    _HELD_HERE.add(record["token"])
    self._thread = threading.Thread(target=self._renew_until_released,
                                    name="workdir-lock-heartbeat", daemon=True)
    self._thread.start()

  @property
  def holder(self) -> Record:
    return dict(self._record)

  def _renew_until_released(self) -> None:
    while not self._stop.wait(self.interval):
      record = dict(self._record, renewed=time.time())
      try:
        version = self._store.write(record, self._version)
        if version is None:
          version = _ours_after_all(self._store, record["token"])
      except Exception as error:  # pylint: disable=broad-except
        # A store that does not answer: try again at the next beat (the lease lasts 6 of them).
        self._say(f"Could not renew the workdir lock {self.path}: {error}")
        continue
      if version is None:
        self._lost()
      self._record, self._version = record, version

  def _lost(self) -> None:
    current = None
    with contextlib.suppress(Exception):
      current = (self._store.read() or (None, None))[0]
    holder = describe(current) if current else "no one (the lock file was removed)"
    print(f"The workdir lock {self.path} was taken over by {holder}: this run could not renew "
          f"it for its lease of {self._record['lease_secs']:.0f} s (a stopped process or a "
          "suspended machine?). It leaves now, so that two runs never write one workdir.",
          file=sys.stderr, flush=True)
    os._exit(LOST_EXIT_STATUS)  # pylint: disable=protected-access

  def release(self) -> None:
    """Stops the renewals and removes the lock (if it is still this run's). A store that does not
    answer leaves the lock behind, stale once its lease runs out."""
    if self._stop.is_set():
      return
    self._stop.set()
    self._thread.join(timeout=min(self.interval, 5.0))
    _HELD_HERE.discard(self._record["token"])
    if self._thread.is_alive():   # a renewal still waits for the store
      return
    try:
      self._store.delete(self._version)
    except Exception as error:  # pylint: disable=broad-except
      self._say(f"Could not remove the workdir lock {self.path} ({error}): it is stale once its "
                f"lease of {self._record['lease_secs']:.0f} s runs out")

  def __enter__(self) -> "Lock":
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def _ours_after_all(store, token: str):
  """The version of the lock if it holds `token`: a write whose answer was lost (and whose retry
  then failed its precondition) may have landed."""
  current = store.read()
  if current is not None and current[0] is not None and current[0].get("token") == token:
    return current[1]
  return None


def acquire(workdir: str, lease: Optional[float] = None,
            say: Callable[[str], None] = lambda text: print(text, flush=True)) -> Lock:
  """Takes the lock of `workdir` (which must exist) or raises WorkdirInUseError naming the run
  that holds it. A stale lock is taken over (`say` tells which, and why)."""
  workdir = os.fspath(workdir)
  store = _store(workdir)
  record = _new_record(workdir, lease_secs() if lease is None else float(lease))
  identity = record["workdir_id"]
  said_wait = False
  watched, watched_since = None, 0.0   # the holder's version this run saw first, and when
  while True:
    record["renewed"] = time.time()
    version = store.write(record, None)
    if version is not None:
      return Lock(store, record, version, say)
    current = store.read()
    if current is None:
      continue   # released in between: try again
    holder, version = current
    if holder is not None and holder.get("token") == record["token"]:
      return Lock(store, record, version, say)   # our create landed; its answer did not
    renewed_while_watched = watched is not None and version != watched
    if watched is None or renewed_while_watched:
      watched, watched_since = version, time.monotonic()
    reason = _stale(holder, identity,
                    time.monotonic() - watched_since if store.versioned else None)
    if reason:
      record["renewed"] = time.time()
      taken = store.write(record, version)
      if taken is not None:
        say(f"Took over the workdir lock {store.path}"
            + (f" of {describe(holder)}" if holder is not None else "") + f": {reason}.")
        return Lock(store, record, taken, say)
      continue   # another contender was first (or our answer was lost): look again
    lease_of_holder = float(holder.get("lease_secs", DEFAULT_LEASE_SECS))
    age = _age(holder)
    if renewed_while_watched and store.versioned:
      age = 0.0   # renewed while this run watched it: in use, whatever the clocks say
    if age < 2 * lease_of_holder / RENEWALS_PER_LEASE:
      raise WorkdirInUseError(
          f"{workdir} is in use by another run: {describe(holder)}; its lock ({store.path}) was "
          f"renewed {max(age, 0):.0f} s ago. Two runs on one workdir would write into each "
          "other's checkpoints and metrics: let it finish, stop it, or use another --workdir. A "
          "run that was killed leaves a stale lock, taken over by the next run at once on the "
          f"same machine, after its lease of {lease_of_holder:.0f} s from any other "
          f"({LEASE_ENV}).")
    # Its renewals are overdue: the holder may be gone (another machine) or slow. Wait until it
    # renews (in use: refused above) or its lease runs out (stale: taken over).
    if store.versioned:   # the lease counted from when this run first saw the version
      age = time.monotonic() - watched_since
    if not said_wait:
      say(f"The workdir lock {store.path} of {describe(holder)} was last renewed {age:.0f} s "
          f"ago: waiting up to {max(lease_of_holder - age, 0):.0f} s for its lease to run out.")
      said_wait = True
    time.sleep(min(lease_of_holder / RENEWALS_PER_LEASE, max(lease_of_holder - age, 0) + 0.5))
