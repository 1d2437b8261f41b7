"""Multi-host on localhost: 2 processes (`jax.distributed`, gloo CPU collectives) of
`python -m bert_jax.main --coordinator_address=... --num_processes=2 --process_id=I`.

Each process reads its own shard of the files (one train file and one eval file each; the eval
shards have different lengths). The run must equal one process that sees the same global batches:
rows of host 0 then rows of host 1, which is how `jax.make_array_from_process_local_data` lays
them out. A checkpoint written by the 2 processes must restore into 2 processes and continue
exactly, and load in 1 process (export, fine-tuning).
"""
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.io import checkpoints
from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks import registry
from bert_jax.runtime.metric_writers import read_metrics
from tests import pretraining_fixtures as fx

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCESSES = 2
# 4 steps, checkpoints at 2 and 4, evaluation at 4 (over unequal per-host eval shards).
OVERRIDES = {"num_train_steps": 4, "checkpoint_every_steps": 2, "eval_every_steps": 4,
             "async_checkpointing": False}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# Loaded by every Python process whose PYTHONPATH starts with its folder: records each file it
# opens for writing (Python's `open` audit event) in WRITE_LOG_DIR/<pid>.
_WRITE_LOGGER = """
import os, sys
_log = os.path.join(os.environ["WRITE_LOG_DIR"], str(os.getpid()))
def _hook(event, args):
  if event != "open" or not isinstance(args[0], str):
    return
  mode, flags = args[1], args[2]
  writes = (any(c in mode for c in "wax+") if isinstance(mode, str)
            else bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
  if writes and not args[0].startswith(os.environ["WRITE_LOG_DIR"]):
    with open(_log, "a") as f:
      f.write(args[0] + "\\n")
sys.addaudithook(_hook)
"""


def _start(experiment: str, workdir: str, *flags: str, devices_per_process: int = 1,
           write_log_dir: str = ""):
  """Starts the 2 processes (`flags`: extra command-line flags); returns their `Popen`s.

  Their stdout and stderr go to files beside the workdir (`<workdir>.process<i>.out|err`), not
  pipes: an unread full pipe would block a process and, through a collective, its partner; and
  files can be read while the processes run, so a hung launch reports where each one was.
  """
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
             JAX_DISABLE_MOST_OPTIMIZATIONS="1",  # as tests/conftest.py: compile-bound tiny model
             # The second launch (the resume) reuses the first one's compiled programs.
             JAX_COMPILATION_CACHE_DIR=os.path.join(os.path.dirname(workdir), "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("XLA_FLAGS", None)  # one CPU device per process, unless asked for more
  if write_log_dir:
    os.makedirs(write_log_dir, exist_ok=True)
    with open(os.path.join(write_log_dir, "sitecustomize.py"), "w") as f:
      f.write(_WRITE_LOGGER)
    env.update(WRITE_LOG_DIR=write_log_dir, PYTHONPATH=f"{write_log_dir}{os.pathsep}{ROOT}")
  if devices_per_process > 1:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_process}"
  procs = []
  for i in range(PROCESSES):
    out, err = (f"{workdir}.process{i}.{kind}" for kind in ("out", "err"))
    with open(out, "w") as stdout, open(err, "w") as stderr:  # the child keeps its own copies
      proc = subprocess.Popen(
          [sys.executable, "-m", "bert_jax.main", f"--config={experiment}",
           f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
           f"--num_processes={PROCESSES}", f"--process_id={i}", *flags],
          cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True)
    proc.logs = (out, err)
    procs.append(proc)
  return procs


def _outputs(procs):
  """[(stdout, stderr)] of each process so far."""
  outputs = []
  for proc in procs:
    with open(proc.logs[0]) as out, open(proc.logs[1]) as err:
      outputs.append((out.read(), err.read()))
  return outputs


def _wait(procs, timeout: float):
  """Waits for every process to end; kills them and fails with each one's state and last output
  otherwise (or when interrupted)."""
  deadline = time.time() + timeout
  try:
    while any(p.poll() is None for p in procs) and time.time() < deadline:
      time.sleep(0.1)
    running = [i for i, p in enumerate(procs) if p.poll() is None]
    if running:
      state = lambda p: "running" if p.poll() is None else f"exit {p.returncode}"
      report = "\n".join(
          f"--- process {i} ({state(procs[i])})\nstdout: ...{out[-1500:]}\nstderr: ...{err[-3000:]}"
          for i, (out, err) in enumerate(_outputs(procs)))
      raise AssertionError(f"process(es) {running} still run after {timeout} s\n{report}")
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()


def _launch(experiment: str, workdir: str, *flags: str, devices_per_process: int = 1,
            write_log_dir: str = ""):
  """Runs the 2 processes to completion; returns process 0's stdout (and, with
  `write_log_dir`, sets `_launch.pids` to their process ids)."""
  procs = _start(experiment, workdir, *flags, devices_per_process=devices_per_process,
                 write_log_dir=write_log_dir)
  _launch.pids = [proc.pid for proc in procs]
  _wait(procs, 300)
  outputs = _outputs(procs)
  for i, (proc, (_, err)) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0, f"process {i} failed:\n{err[-4000:]}"
  return outputs[0][0]


def assert_ends_as_an_uninterrupted_run(experiment: str, workdir: str, reference: str,
                                        steps: int) -> None:
  """The 2 processes run uninterrupted into `reference`; the run in `workdir` (resumed after a
  fault) logged every step 1..`steps` with the same losses and accuracies and ended with the
  same parameters."""
  from tests import demo_runs
  _launch(experiment, reference)
  ours, theirs = (demo_runs.untimed_metrics(w) for w in (workdir, reference))
  assert [r["step"] for r in ours] == list(range(1, steps + 1))
  for a, b in zip(ours, theirs):
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
      np.testing.assert_allclose(a[key], b[key], rtol=1e-6, err_msg=f"step {a['step']} {key}")
  ours, theirs = (checkpoints.flatten(checkpoints.load_pretrained(w)[1])
                  for w in (workdir, reference))
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _data(data_dir):
  """The fixture data, plus two eval files of different lengths (24 and 8 records)."""
  fx.make_data(data_dir)
  fx.write_records(os.path.join(data_dir, "eval-0.tfrecord"), 24, seed=4)
  fx.write_records(os.path.join(data_dir, "eval-1.tfrecord"), 8, seed=5)
  return {"data.eval_input_files": os.path.join(data_dir, "eval-*.tfrecord")}


def _as_one_host(original):
  """`input_pipeline_for` that yields the global batch of both hosts from one process."""
  def pipeline(config, training, process_index=None, process_count=None):
    del process_index, process_count
    shards = [original(config, training, process_index=i, process_count=PROCESSES)
              for i in range(PROCESSES)]
    if not training:  # pad the shorter shard with all-zero batches, as sharding.lockstep does
      longest = max(sum(1 for _ in shard) for shard in shards)
      zeros = lambda batch: {k: tf.zeros_like(v) for k, v in batch.items()}
      shards = [shard.concatenate(shard.take(1).map(zeros).repeat()).take(longest)
                for shard in shards]
    return tf.data.Dataset.zip(tuple(shards)).map(
        lambda *parts: {k: tf.concat([p[k] for p in parts], axis=0) for k in parts[0]})
  return pipeline


# pmap across processes: each process maps over its local devices and `psum` spans all hosts.
# pmap draws dropout per device (fold_in of the device index), jit over the global batch, so
# the pmap run is compared without dropout.
NO_DROPOUT = {"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0}


@pytest.mark.parametrize("parallelism", ["jit", "pmap"])
def test_two_processes_equal_one_process_and_resume_from_their_checkpoint(tmp_path, monkeypatch,
                                                                          parallelism):
  flag = f"--config.parallelism={parallelism}"
  overrides = dict(OVERRIDES, **_data(str(tmp_path / "data")),
                   **(NO_DROPOUT if parallelism == "pmap" else {}))
  experiment = fx.write_experiment(str(tmp_path), str(tmp_path / "data"), **overrides)
  workdir = str(tmp_path / "work")
  out = _launch(experiment, workdir, flag)
  assert "[pretraining] eval step 4/4" in out
  # Each host saved its own input position; metrics are written once (process 0).
  data_dir = os.path.join(workdir, "checkpoints", "4", "data")
  assert {"process_0", "process_1"} <= set(os.listdir(data_dir))
  multi = read_metrics(workdir)
  assert [(r["step"], r["split"]) for r in multi] == [
      (1, "train"), (2, "train"), (3, "train"), (4, "train"), (4, "eval")]

  monkeypatch.setattr(pretraining, "input_pipeline_for",
                      _as_one_host(pretraining.input_pipeline_for))
  config = fx.tiny_config(str(tmp_path / "data"), **overrides)
  registry.run_job(config, str(tmp_path / "single"))
  single = read_metrics(str(tmp_path / "single"))
  _assert_same_losses(multi, single, rtol=2e-5)
  # The checkpoint of 2 processes loads in 1 (export, fine-tuning) and holds the same model.
  ours, reference = (checkpoints.flatten(checkpoints.load_pretrained(w)[1])
                     for w in (workdir, str(tmp_path / "single")))
  for name, value in reference.items():
    np.testing.assert_allclose(ours[name], value, atol=2e-5, err_msg=name)

  # Resume: without the step-4 checkpoint, 2 new processes continue from step 2 and recompute
  # steps 3-4 and the evaluation exactly as the first run did.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))
  out = _launch(experiment, workdir, flag)
  assert "Resumed from the checkpoint at step 2" in out
  _assert_same_losses(read_metrics(workdir), multi, rtol=1e-6)


def test_fine_tuning_across_two_processes_with_model_parallelism(tmp_path):
  """GLUE MRPC on 2 processes x 2 devices, model_parallelism=2 (each host one model group):
  the encoder is split within each host, the best checkpoint is gathered from the shards, and
  the run equals the same fine-tuning in one process on one device."""
  from bert_jax import tasks
  from experiments import glue as glue_experiment
  from tests import finetuning_fixtures as ftx
  glue_dir = ftx.write_glue_dir(str(tmp_path / "glue"), dict(train=16, dev=10, test=5))
  ckpt = ftx.write_checkpoint(str(tmp_path / "ckpt"))
  settings = {"init_checkpoint": ckpt, "data.glue_dir": glue_dir, "max_seq_length": 16,
              "eval_batch_size": 4, "global_batch_size": 8}
  workdir = str(tmp_path / "multi")
  write_logs = str(tmp_path / "writes")
  out = _launch("experiments/glue.py:task=mrpc,quick", workdir, "--config.model_parallelism=2",
                *(f"--config.{k}={v}" for k, v in settings.items()), devices_per_process=2,
                write_log_dir=write_logs)
  assert "[mrpc] best f1=" in out
  # Each output file is written once, by process 0 (checkpoints are every process's).
  written = []
  for pid in _launch.pids:
    path = os.path.join(write_logs, str(pid))
    names = open(path).read().split() if os.path.exists(path) else []
    written.append({os.path.relpath(n, workdir) for n in names if n.startswith(workdir + os.sep)
                    and not os.path.relpath(n, workdir).startswith("checkpoints")})
  # best/ is written whole into best.partial/ and swapped in by renames.
  for name in ("results.json", "dev_predictions.tsv", "MRPC.tsv", "metrics.jsonl",
               os.path.join("best.partial", "head.safetensors"),
               os.path.join("best.partial", "best.json")):
    assert any(w.startswith(name) for w in written[0]), (name, written[0])
  assert not written[1], f"process 1 wrote outputs: {sorted(written[1])}"
  assert sorted(n for n in os.listdir(workdir) if n.startswith("best")) == ["best"]

  config = glue_experiment.get_config("task=mrpc,quick")
  config.init_checkpoint, config.data.glue_dir = ckpt, glue_dir
  config.max_seq_length, config.eval_batch_size, config.global_batch_size = 16, 4, 8
  tasks.run(config, str(tmp_path / "single"))
  multi, single = read_metrics(workdir), read_metrics(str(tmp_path / "single"))
  assert [(r["step"], r["split"]) for r in multi] == [(r["step"], r["split"]) for r in single]
  for a, b in zip(multi, single):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=2e-5, err_msg=f"step {a['step']}")
  for name in ("dev_predictions.tsv", "MRPC.tsv"):
    with open(os.path.join(workdir, name)) as f, open(tmp_path / "single" / name) as g:
      assert f.read() == g.read(), name
  ours, reference = (checkpoints.flatten(checkpoints.load_pretrained(os.path.join(w, "best"))[1])
                     for w in (workdir, str(tmp_path / "single")))
  assert ours.keys() == reference.keys()
  for name, value in reference.items():
    np.testing.assert_allclose(ours[name], value, atol=2e-5, err_msg=name)


def _assert_same_losses(ours, reference, rtol):
  assert [(r["step"], r["split"]) for r in ours] == [(r["step"], r["split"]) for r in reference]
  for a, b in zip(ours, reference):
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
      np.testing.assert_allclose(a[key], b[key], rtol=rtol,
                                 err_msg=f"step {a['step']} {a['split']} {key}")


def test_a_failing_process_ends_the_run_on_every_process_at_once(tmp_path):
  """Process 1's training file is truncated: it fails mid-run with an error naming its input,
  and both processes exit with status 1 right away. (A process that raised used to wait at the
  shutdown barrier while its partner waited in the next collective: a hang.)"""
  data = tmp_path / "data"
  fx.make_data(str(data))
  broken = tmp_path / "broken"
  broken.mkdir()
  shutil.copy(data / "train-0.tfrecord", broken / "train-0.tfrecord")  # process 0's file
  whole = (data / "train-1.tfrecord").read_bytes()                    # process 1's file
  (broken / "train-1.tfrecord").write_bytes(whole[:-10])  # its last record cut short
  pattern = str(broken / "train-*.tfrecord")
  experiment = fx.write_experiment(
      str(tmp_path), str(data), num_train_steps=1000, checkpoint_every_steps=20,
      eval_every_steps=0, log_every_steps=5, **{"data.input_files": pattern})
  workdir = str(tmp_path / "work")
  procs = _start(experiment, workdir)
  _wait(procs, 150)
  (out0, err0), (_, err1) = _outputs(procs)
  assert [proc.returncode for proc in procs] == [1, 1], (err0[-3000:], err1[-3000:])
  assert f"DataLossError: Unreadable record in {pattern}" in err1, err1[-3000:]
  assert "Traceback" in err0 and "DataLossError" not in err0, err0[-3000:]
  # It failed mid-run, after checkpoints.
  assert 20 <= max(r["step"] for r in read_metrics(workdir)) < 1000
  assert any(s.isdigit() for s in os.listdir(os.path.join(workdir, "checkpoints"))), out0[-2000:]
