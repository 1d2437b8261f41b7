"""One run per workdir (bert_jax/io/workdir_lock.py), on a local disk and on Cloud Storage (the
emulator of tests/test_cloud_storage.py on loopback).

Every holder and contender is a process of its own, as two runs are: a second
`python -m bert_jax.main` on a held workdir is refused naming the holder; of several contenders
started together exactly one wins; a lock left by `kill -9` is taken over at once; a holder's
heartbeat keeps its lock past the lease, and a holder stopped past its lease loses it and exits.
The lock is read back independently of the module (the file, or the emulator's own JSON API).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from bert_jax.io import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A run in miniature: waits for GO (so that contenders start together), takes the lock, says
# HELD (or REFUSED and the error), holds it until END exists, releases it.
_CONTENDER = r"""
import os, sys, time
from bert_jax.io import workdir_lock
workdir, go, end = sys.argv[1:4]
while not os.path.exists(go):
  time.sleep(0.005)
try:
  lock = workdir_lock.acquire(workdir)
except workdir_lock.WorkdirInUseError as error:
  print("REFUSED", error, flush=True)
  sys.exit(3)
print("HELD", flush=True)
while not os.path.exists(end):
  time.sleep(0.05)
lock.release()
print("RELEASED", flush=True)
"""


class _Place:
  """A workdir on one store, and the lock as the store holds it, read without our code."""

  def __init__(self, store, tmp_path, emulator_url=None):
    self.store, self.tmp = store, tmp_path
    self.emulator_url = emulator_url
    if store == "local":
      self.workdir = str(tmp_path / "work")
      os.makedirs(self.workdir)
    else:
      self.workdir = f"gs://{_bucket()}/{tmp_path.name}/work"
    self.env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    if emulator_url:
      self.env["STORAGE_EMULATOR_HOST"] = emulator_url

  def lock(self):
    """The lock's record, or None when there is none."""
    if self.store == "local":
      path = os.path.join(self.workdir, workdir_lock.LOCK_FILE)
      if not os.path.exists(path):
        return None
      with open(path, encoding="utf-8") as f:
        return json.load(f)
    name = self.workdir[len(f"gs://{_bucket()}/"):] + "/" + workdir_lock.LOCK_FILE
    quoted = urllib.parse.quote(name, safe="")
    try:
      with urllib.request.urlopen(f"{self.emulator_url}/download/storage/v1/b/{_bucket()}/o/"
                                  f"{quoted}?alt=media", timeout=10) as r:
        return json.load(r)
    except urllib.error.HTTPError as error:
      if error.code == 404:
        return None
      raise

  def start(self, name, lease=None, go=True):
    """A contender process; `go=False`: it waits for `self.go()`."""
    env = dict(self.env)
    if lease is not None:
      env[workdir_lock.LEASE_ENV] = str(lease)
    if go:
      self.go()
    proc = subprocess.Popen([sys.executable, "-c", _CONTENDER, self.workdir,
                             str(self.tmp / "go"), str(self.tmp / f"end-{name}")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.end = self.tmp / f"end-{name}"
    return proc

  def go(self):
    (self.tmp / "go").touch()


def _bucket():
  from tests import test_cloud_storage
  return test_cloud_storage.BUCKET


@pytest.fixture(scope="module")
def emulator_url():
  cloud = pytest.importorskip("tests.test_cloud_storage")
  proc, url = cloud._start_emulator()   # pylint: disable=protected-access
  try:
    cloud._create_bucket(url)   # pylint: disable=protected-access
    yield url
  finally:
    proc.kill()
    proc.wait()


@pytest.fixture(params=["local", "gs"])
def place(request, tmp_path):
  if request.param == "gs":
    return _Place("gs", tmp_path, request.getfixturevalue("emulator_url"))
  return _Place("local", tmp_path)


def _first_line(proc, timeout=60):
  """The contender's first line of output (HELD / REFUSED ...), or a failure with its stderr."""
  deadline = time.time() + timeout
  line = ""
  while not line and time.time() < deadline:
    line = proc.stdout.readline()
    if not line and proc.poll() is not None:
      break
  assert line, f"no answer from the contender (exit {proc.poll()}): {proc.stderr.read()[-3000:]}"
  return line.strip()


def _end(proc, timeout=60):
  """Lets a holder release its lock and end; its remaining output (stdout, stderr)."""
  proc.end.touch()
  out, err = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, err[-3000:]
  return out, err


def _kill(*procs):
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
    proc.communicate()


def test_a_second_main_on_a_held_workdir_exits_at_once_naming_the_holder(tmp_path):
  place = _Place("local", tmp_path)
  holder = place.start("holder")
  try:
    assert _first_line(holder) == "HELD"
    started = place.lock()["started"]
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.main",
         f"--config={os.path.join(ROOT, 'experiments/pretrain_demo.py')}:quick",
         f"--workdir={place.workdir}"],
        cwd=str(tmp_path), env=dict(place.env, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "WorkdirInUseError" in result.stderr, result.stderr[-3000:]
    message = result.stderr[result.stderr.index("WorkdirInUseError"):]
    assert f"host {socket.gethostname()}, pid {holder.pid}, started {started}" in message
    # Refused before writing anything: no data built, no environment recorded, the lock kept.
    assert "Building pre-training records" not in result.stdout
    assert sorted(os.listdir(place.workdir)) == ["lock.json", "lock.json.guard"]
    assert place.lock()["pid"] == holder.pid
    _end(holder)
    assert place.lock() is None
  finally:
    _kill(holder)


def test_of_contenders_started_together_exactly_one_wins(place):
  contenders = [place.start(f"c{i}", go=False) for i in range(4)]
  try:
    time.sleep(1.0)   # every interpreter up and polling for GO
    place.go()
    answers = [_first_line(proc) for proc in contenders]
    winners = [proc for proc, answer in zip(contenders, answers) if answer == "HELD"]
    assert len(winners) == 1, answers
    winner = winners[0]
    assert place.lock()["pid"] == winner.pid
    for proc, answer in zip(contenders, answers):
      if proc is not winner:
        assert answer.startswith("REFUSED"), answer
        assert f"pid {winner.pid}," in answer and f"host {socket.gethostname()}" in answer
        assert proc.wait(timeout=30) == 3
    _end(winner)
    assert place.lock() is None   # released by its holder
  finally:
    _kill(*contenders)


def test_a_lock_left_by_kill_9_is_taken_over_at_once_on_the_same_machine(place):
  # A lease far longer than the test: only the holder's death can free the lock.
  holder = place.start("holder", lease=3600)
  procs = [holder]
  try:
    assert _first_line(holder) == "HELD"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert place.lock()["pid"] == holder.pid   # left behind
    began = time.time()
    successor = place.start("successor", lease=3600)
    procs.append(successor)
    out = _first_line(successor)
    assert out.startswith("Took over the workdir lock"), out
    assert f"pid {holder.pid}," in out and "no longer runs on this machine" in out
    assert _first_line(successor) == "HELD"
    assert time.time() - began < 60
    assert place.lock()["pid"] == successor.pid
    _end(successor)
  finally:
    _kill(*procs)


def test_renewals_keep_a_lock_past_its_lease_and_a_stopped_holder_loses_it(place):
  lease = 4.0   # renewed every 0.67 s
  holder = place.start("holder", lease=lease)
  procs = [holder]
  try:
    assert _first_line(holder) == "HELD"
    time.sleep(lease + 1)   # past its lease: only renewals keep it
    early = place.start("early", lease=lease)
    procs.append(early)
    answer = _first_line(early)
    if answer.startswith("The workdir lock"):   # a renewal late on a busy machine: waited for
      answer = _first_line(early)
    assert answer.startswith("REFUSED") and f"pid {holder.pid}," in answer, answer
    # Stopped, the holder renews no more: past its lease a contender takes the lock over.
    holder.send_signal(signal.SIGSTOP)
    time.sleep(lease / 2)   # renewals overdue: the contender waits rather than refusing
    late = place.start("late", lease=lease)
    procs.append(late)
    lines = [_first_line(late, timeout=lease * 10) for _ in range(3)]
    assert lines[0].startswith("The workdir lock") and "waiting up to" in lines[0], lines
    assert lines[1].startswith("Took over") and "not renewed for" in lines[1], lines
    assert lines[2] == "HELD", lines
    assert place.lock()["pid"] == late.pid
    # Continued, the old holder finds its lock taken at its next renewal and leaves at once.
    holder.send_signal(signal.SIGCONT)
    _, err = holder.communicate(timeout=30)
    assert holder.returncode == workdir_lock.LOST_EXIT_STATUS
    assert f"was taken over by host {socket.gethostname()}, pid {late.pid}," in err, err
    assert place.lock()["pid"] == late.pid   # the new holder keeps it
    _end(late)
    assert place.lock() is None
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
    _kill(*procs)


def test_an_unreadable_lock_file_is_taken_over(tmp_path):
  with open(tmp_path / workdir_lock.LOCK_FILE, "w") as f:
    f.write('{"host": "cut sho')   # e.g. written by hand, or cut short by a full disk
  said = []
  lock = workdir_lock.acquire(str(tmp_path), say=said.append)
  assert said and "unreadable" in said[0], said
  try:
    with open(tmp_path / workdir_lock.LOCK_FILE) as f:
      assert json.load(f)["pid"] == os.getpid()
  finally:
    lock.release()
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_FILE)


def test_a_lock_copied_with_its_workdir_holds_nothing_in_the_copy(tmp_path):
  """A copy made while the source runs carries the source's lock.json: written for another
  workdir (its real path, device and inode), it is taken over at once, without waiting out the
  source's lease; the source's own lock is untouched."""
  import shutil
  source = tmp_path / "source"
  source.mkdir()
  held = workdir_lock.acquire(str(source), lease=3600, say=lambda text: None)
  try:
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    said = []
    began = time.time()
    lock = workdir_lock.acquire(str(copy), lease=3600, say=said.append)
    assert time.time() - began < 10
    assert said and "written for another workdir" in said[0] and str(source) in said[0], said
    lock.release()
    with open(source / workdir_lock.LOCK_FILE) as f:
      assert json.load(f)["token"] == held.holder["token"]
  finally:
    held.release()


def test_the_copy_rule_compares_local_identities_on_the_holder_s_machine_only():
  elsewhere = {"token": "t", "lease_secs": 3600, "renewed": time.time(), "pid": 1,
               "machine": "another machine", "workdir_id": "/a@1:2"}
  assert workdir_lock._stale(elsewhere, "/b@1:3") is None   # its paths mean nothing here
  here = dict(elsewhere, machine=workdir_lock._machine())
  assert "another workdir" in workdir_lock._stale(here, "/b@1:3")
  on_gs = dict(elsewhere, workdir_id="gs://b/run")   # one namespace everywhere
  assert "another workdir" in workdir_lock._stale(on_gs, "gs://b/copy")


def _skewed_holder(workdir, lease, renew):
  """A lock on gs:// whose holder's clock is 1,000 s behind: its `renewed` always looks long
  past. `renew`: a thread keeps renewing it (a new generation every lease / 6), as a live
  holder does; returns a function that stops it."""
  import threading
  store = workdir_lock._CloudStore(workdir)
  record = dict(workdir_lock._new_record(workdir, lease), renewed=time.time() - 1000,
                machine="another machine", workdir_id=workdir)
  version = store.write(record, None)
  assert version is not None
  stop = threading.Event()

  def renewing():
    current = version
    while not stop.wait(lease / 6):
      current = store.write(dict(record, renewed=time.time() - 1000), current)

  if renew:
    threading.Thread(target=renewing, daemon=True).start()
  return stop.set


def test_on_gs_a_live_lock_is_not_taken_over_whatever_its_holder_s_clock_says(
    tmp_path, emulator_url, monkeypatch):
  """Cloud Storage: staleness is judged by the lock's generation watched with this run's own
  clock, never by the holder's: a live holder whose clock is behind keeps its lock (a new
  generation seen: refused); a dead one is taken over once its generation stayed one lease."""
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator_url)
  lease = 3.0
  live = f"gs://{_bucket()}/{tmp_path.name}/live"
  stop = _skewed_holder(live, lease, renew=True)
  try:
    began = time.time()
    with pytest.raises(workdir_lock.WorkdirInUseError, match="is in use by another run"):
      workdir_lock.acquire(live, lease=lease, say=lambda text: None)
    assert time.time() - began < 3 * lease
  finally:
    stop()
  dead = f"gs://{_bucket()}/{tmp_path.name}/dead"
  _skewed_holder(dead, lease, renew=False)
  said = []
  began = time.time()
  lock = workdir_lock.acquire(dead, lease=lease, say=said.append)
  waited = time.time() - began
  lock.release()
  assert lease <= waited < 6 * lease, waited
  assert any("its version unchanged while this run watched it" in line for line in said), said


def test_a_bad_lease_setting_is_named(monkeypatch, tmp_path):
  monkeypatch.setenv(workdir_lock.LEASE_ENV, "3 min")
  with pytest.raises(ValueError, match=f"{workdir_lock.LEASE_ENV}='3 min' is not a number"):
    workdir_lock.acquire(str(tmp_path))


@pytest.mark.slow
def test_a_multi_process_run_on_a_held_workdir_is_refused_by_process_0_and_all_leave(tmp_path):
  """Two processes of one run (`--num_processes=2`) on a workdir another run holds: process 0,
  the one that takes the lock for the run, names the holder; both leave with an error, nothing
  is built (process 1 waited for process 0's lock before starting its part)."""
  from tests import test_multihost
  place = _Place("local", tmp_path)
  holder = place.start("holder")
  try:
    assert _first_line(holder) == "HELD"
    start = test_multihost._start   # pylint: disable=protected-access
    procs = start("experiments/pretrain_demo.py:quick", place.workdir)
    test_multihost._wait(procs, 300)   # pylint: disable=protected-access
    (_, err0), (out1, _) = test_multihost._outputs(procs)   # pylint: disable=protected-access
    # Process 0 leaves with the error; process 1, waiting at the barrier behind the lock, is
    # ended by jax's distributed service when process 0 is gone (status 1 or an abort).
    assert procs[0].returncode == 1 and procs[1].returncode != 0, err0[-3000:]
    assert f"WorkdirInUseError: {place.workdir} is in use by another run: host " \
           f"{socket.gethostname()}, pid {holder.pid}," in err0, err0[-3000:]
    assert "waiting for process 0" not in out1
    assert sorted(os.listdir(place.workdir)) == ["lock.json", "lock.json.guard"]
    assert place.lock()["pid"] == holder.pid
    _end(holder)
  finally:
    _kill(holder)
