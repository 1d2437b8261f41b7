"""Preemption notices from the metadata server (bert_jax/runtime/preemption.py): a TPU VM learns
it is about to go from `instance/preempted` and `instance/maintenance-event`, not only from
SIGTERM. A metadata server on loopback (`GCE_METADATA_IP`) stands in for the real one.

* a real training run (`python -m bert_jax.main`) told `instance/preempted=TRUE` saves a complete
  checkpoint at a step boundary and exits 0, timing the save against the grace period;
* with several processes our SIGTERM handler is installed and still reaches jax's preemption
  service (which agrees the step every host saves at): a jax.distributed run of one process;
* the poller's answers to each kind of event, and the grace period's warnings.
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from bert_jax.runtime import preemption
from bert_jax.runtime.metric_writers import read_metrics
from tests import pretraining_fixtures as fx
from tests.metadata_server import MetadataServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240
NOTICE_AFTER = 5   # steps: past compilation, before the end
# Far more steps than a notice needs: the run must still be training when the notice lands.
OVERRIDES = {"num_train_steps": 5000, "checkpoint_every_steps": 20, "eval_every_steps": 0,
             "log_every_steps": 1, "keep_checkpoints": 3, "async_checkpointing": True}


def _env(server, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
             JAX_DISABLE_MOST_OPTIMIZATIONS="1", GCE_METADATA_IP=server.address, **extra)
  env.pop("GCE_METADATA_HOST", None)
  env.pop("TPU_SKIP_MDS_QUERY", None)
  return env


def _wait_for_step(workdir, proc, step, server):
  """Until the run has logged `step` and asked the server once (with the compiles cached, a run
  can pass `step` before the poller's first question)."""
  deadline = time.time() + TIMEOUT
  while not (any(r["step"] >= step for r in read_metrics(workdir))
             and "instance/preempted" in server.asked):
    assert time.time() < deadline, f"no step {step} and a question within {TIMEOUT} s"
    assert proc.poll() is None, "the run ended before the notice"
    time.sleep(0.05)


@pytest.mark.slow   # a real run: 30-75 s on 2 busy cores
def test_a_preempted_notice_saves_a_checkpoint_and_exits_0(tmp_path):
  experiment = fx.write_experiment(str(tmp_path), str(tmp_path / "data"), **OVERRIDES)
  workdir = str(tmp_path / "work")
  with MetadataServer({"instance/preempted": "FALSE",
                       "instance/maintenance-event": "NONE"}) as server:
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
      proc = subprocess.Popen(
          [sys.executable, "-m", "bert_jax.main", f"--config={experiment}",
           f"--workdir={workdir}"], cwd=ROOT, env=_env(server), stdout=out, stderr=err, text=True)
      try:
        _wait_for_step(workdir, proc, NOTICE_AFTER, server)
        server.set("instance/preempted", "TRUE")
        proc.wait(timeout=TIMEOUT)
      finally:
        if proc.poll() is None:
          proc.kill()
      out.seek(0)
      err.seek(0)
      stdout, stderr = out.read(), err.read()
  assert proc.returncode == 0, stderr[-4000:]
  # The run asked the metadata server while it trained (with the header the real one requires).
  assert server.asked.count("instance/preempted") >= 2
  assert "Preemption notice (metadata server: instance/preempted=TRUE)" in stdout
  lines = [l for l in stdout.splitlines() if l.startswith("Preempted: checkpoint at step")]
  assert len(lines) == 1, stdout[-3000:]
  step = int(lines[0].split()[4])
  assert NOTICE_AFTER < step < OVERRIDES["num_train_steps"]
  # The save is timed against the grace period (30 s by default): it fits, so no warning.
  assert "grace period 30 s" in lines[0] and " after the notice " in lines[0]
  assert "past the grace period" not in stderr
  # A complete checkpoint at that very step, the newest, and the metrics end there.
  saves = os.path.join(workdir, "checkpoints")
  assert max(int(s) for s in os.listdir(saves) if s.isdigit()) == step
  assert not [s for s in os.listdir(saves) if not s.isdigit()], "unfinished save"
  assert max(r["step"] for r in read_metrics(workdir)) == step


def test_our_sigterm_handler_reaches_jax_preemption_service(tmp_path):
  """A jax.distributed run (one process: the service runs as on a pod) with our handler in
  front of the service's: SIGTERM, then a metadata notice in a second loop, each make
  `reached` agree on one step; after each loop the service's own handler is back."""
  script = textwrap.dedent("""
      import os, signal, socket, sys, time
      import jax
      from bert_jax.runtime import preemption
      s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
      jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1,
                                 process_id=0)
      service = preemption.c_handler_address(signal.SIGTERM)
      assert service not in (None, 0, 1), "jax's service installed no SIGTERM handler"

      def loop(p, notify):
        for step in range(1, 60):
          if step == 3:
            notify()
          if p.reached(step):
            return step
          time.sleep(0.25)   # the service's thread looks once a second

      with preemption.Preemption(5, multihost=True, notices=False) as p:
        assert callable(signal.getsignal(signal.SIGTERM))   # ours, in front of the service's
        assert preemption.c_handler_address(signal.SIGTERM) != service
        step = loop(p, lambda: os.kill(os.getpid(), signal.SIGTERM))
        print("SIGTERM", step, p.reason, flush=True)
      assert preemption.c_handler_address(signal.SIGTERM) == service
      """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if l.startswith("SIGTERM")]
  assert len(lines) == 1, result.stdout
  _, step, reason = lines[0].split(" ", 2)
  assert int(step) > 3 and reason == "SIGTERM"
  # `reached` with several processes is the service's answer alone: it got the signal.
  assert "Preemption notice (SIGTERM)" in result.stdout


def test_a_metadata_notice_reaches_jax_preemption_service(tmp_path):
  """As above, the notice from the metadata server's poller thread: the service is told at once,
  and `reached` agrees on a step."""
  script = textwrap.dedent("""
      import socket, sys, time
      import jax
      from bert_jax.runtime import preemption
      s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
      jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1,
                                 process_id=0)
      with preemption.Preemption(5, multihost=True, notices=True, poll_seconds=0.1) as p:
        for step in range(1, 80):
          if p.reached(step):
            break
          time.sleep(0.25)
        print("REACHED", step, p.reason, flush=True)
      """)
  with MetadataServer({"instance/preempted": "FALSE",
                       "instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE"}) as server:
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(server),
                            capture_output=True, text=True, timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if l.startswith("REACHED")]
  assert lines and lines[0].split(" ", 2)[2] == (
      "metadata server: instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE"), result.stdout
  assert int(lines[0].split()[1]) < 79   # the service's agreement, not the loop's end


# ------------------------------------------------------------------------------ the poller

def _poll(values, seconds=1.0):
  """The notices the poller gives within `seconds` with the server answering `values`, and the
  keys it asked."""
  notices = []
  with MetadataServer(values) as server:
    poller = preemption.NoticePoller(notices.append, poll_seconds=0.05,
                                     environ={"GCE_METADATA_IP": server.address}).start()
    deadline = time.time() + seconds
    while not notices and time.time() < deadline:
      time.sleep(0.02)
    poller.stop()
  return notices, server.asked


def test_the_poller_takes_preemption_and_terminating_maintenance_as_notices(capsys):
  notices, asked = _poll({"instance/preempted": "TRUE", "instance/maintenance-event": "NONE"})
  assert notices == ["metadata server: instance/preempted=TRUE"] and asked
  notices, _ = _poll({"instance/preempted": "FALSE",
                      "instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE"})
  assert notices == ["metadata server: instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE"]
  # A live migration is no reason to stop; said once.
  notices, asked = _poll({"instance/preempted": "FALSE",
                          "instance/maintenance-event": "MIGRATE_ON_HOST_MAINTENANCE"}, 0.5)
  assert notices == [] and asked.count("instance/maintenance-event") > 2
  assert capsys.readouterr().err.count("MIGRATE_ON_HOST_MAINTENANCE") == 1
  notices, asked = _poll({"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"},
                         0.5)
  assert notices == [] and asked.count("instance/preempted") > 2


def test_an_unreachable_metadata_server_is_said_once_and_is_no_notice(capsys):
  notices, asked = _poll({}, 0.5)   # 404 for every key: a VM without them
  assert notices == [] and asked
  closed = socket.socket()
  closed.bind(("127.0.0.1", 0))   # bound, never listening: refused
  noticed = []
  poller = preemption.NoticePoller(
      noticed.append, poll_seconds=0.05,
      environ={"GCE_METADATA_IP": f"127.0.0.1:{closed.getsockname()[1]}"}).start()
  time.sleep(0.6)
  poller.stop()
  closed.close()
  assert noticed == []
  assert capsys.readouterr().err.count("they come from SIGTERM only") == 1


# ------------------------------------------------------------------------ the grace period

def test_a_save_is_timed_against_the_grace_period(capsys):
  # Compared at the C level: after an earlier test of this process started jax's preemption
  # service, its C handler is the one in place, and Python's `getsignal` still reports the last
  # Python-level handler set, whichever object that was.
  before = preemption.c_handler_address(signal.SIGTERM)
  with preemption.Preemption(0.2, multihost=False, notices=False) as p:
    p.saved(4, 0.5)       # a regular checkpoint longer than the grace period: said once
    p.saved(8, 0.6)
    assert not p.reached(9)
    os.kill(os.getpid(), signal.SIGTERM)
    assert p.reached(10) and p.reason == "SIGTERM"
    time.sleep(0.3)       # the save ends past the grace period
    p.saved(10, 0.3)
  captured = capsys.readouterr()
  assert captured.err.count("took 0.5 s, more than the preemption grace period of 0.2 s") == 1
  assert "step 8" not in captured.err
  assert "Preempted: checkpoint at step 10 saved in 0.3 s" in captured.out
  assert "landed" in captured.err and "past the grace period of 0.2 s" in captured.err
  # The handler before is back.
  assert preemption.c_handler_address(signal.SIGTERM) == before


def test_a_save_that_fits_has_no_warning(capsys):
  with preemption.Preemption(30, multihost=False, notices=False) as p:
    os.kill(os.getpid(), signal.SIGTERM)
    assert p.reached(3)
    p.saved(3, 0.1)
  captured = capsys.readouterr()
  assert "Preempted: checkpoint at step 3 saved in 0.1 s" in captured.out
  assert "grace period 30 s" in captured.out and "WARNING" not in captured.err


def test_notices_are_polled_on_every_google_cloud_vm_and_nowhere_else(tmp_path, monkeypatch):
  """A GCE VM of any kind (TPU, GPU, CPU) is told by its DMI product name, read locally; a
  machine that is none (and names no server) polls nothing."""
  from bert_jax.runtime import cluster
  gce, other = tmp_path / "gce", tmp_path / "other"
  gce.write_text("Google Compute Engine\n")
  other.write_text("Standard PC (Q35 + ICH9, 2009)\n")
  assert cluster.on_google_cloud(str(gce))
  assert not cluster.on_google_cloud(str(other))
  assert not cluster.on_google_cloud(str(tmp_path / "absent"))
  for name in ("GCE_METADATA_IP", "GCE_METADATA_HOST", "TPU_SKIP_MDS_QUERY"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(cluster, "has_tpu_chips", lambda: False)   # a GPU or CPU VM
  monkeypatch.setattr(cluster, "DMI_PRODUCT_NAME", str(other))
  assert not preemption.notices_expected()
  monkeypatch.setattr(cluster, "DMI_PRODUCT_NAME", str(gce))
  assert preemption.notices_expected()
  monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
  assert not preemption.notices_expected()
