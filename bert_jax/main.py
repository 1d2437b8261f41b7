r"""Entry point: `python -m bert_jax.main --config=experiments/NAME.py[:ARGS] --workdir=DIR`.

Fields are overridden from the command line, e.g. `--config.learning_rate=5e-5`. The command is
idempotent: run it again after an interruption and it resumes from the newest checkpoint.
"""
import os
import sys
import traceback

from bert_jax.runtime import cluster, host_memory

# A parent process that loaded libtpu leaves its placeholder text in the TPU variables: gone
# before anything (this module, jax, libtpu) reads them (bert_jax/runtime/cluster.py).
cluster.scrub_placeholders()

# Before any library starts a thread: each step's host temporaries are then reused, not faulted
# in again (see bert_jax/runtime/host_memory.py; BERT_JAX_KEEP_HOST_MEMORY=0 turns it off).
host_memory.keep_freed_memory()
# TensorFlow (the input pipeline) must never take the accelerators from JAX.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bert_jax.io import remote_storage  # noqa: E402

# Timeouts and retries of every gs:// call (and, with STORAGE_EMULATOR_HOST set, every gs:// path
# to that emulator); TensorFlow reads some of the settings when it is imported, so before that.
remote_storage.configure(leave_at_once_after_error=True)

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

# Locked: `--config.x` of a field the experiment does not declare is an error, not a new field.
_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment file (get_config).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 (multi-host outside TPU VMs).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", 30,
    "Multi-host: a process that sends no heartbeat for this long (killed, its host lost) is "
    "taken for dead, and every other process stops with an error. A process waiting on a "
    "collective with it stops at once; one waiting at a checkpoint's barrier only then (jax's "
    "default is 100 s).")
_COMPILE_FOR = flags.DEFINE_string(
    "compile_for", None, "Compile the experiment's steps for this TPU slice (v4-8, v5litepod-16, "
    "v5p-8, v6e-8, ...) with the real TPU compiler, without running; writes "
    "WORKDIR/compile_report.json (bert_jax/tasks/tools/compile_report.py).")
_FIND_MAX_BATCH = flags.DEFINE_bool(
    "find_max_batch", False, "With --compile_for: search the largest global batch that fits.")
_ALLOW_PICKLE = flags.DEFINE_bool(
    "allow_pickle", False, "Load a PyTorch pickle checkpoint (pytorch_model.bin) as "
    "config.init_checkpoint: a pickle can run code when loaded, so only for a source you trust "
    "(safetensors need no flag).")
flags.mark_flags_as_required(["config", "workdir"])


def _string_fields(tree, prefix=""):
  """(dotted name, value) of every string field of a config dict, nested ones included."""
  for name, value in tree.items():
    if isinstance(value, dict):
      yield from _string_fields(value, f"{prefix}{name}.")
    elif isinstance(value, str):
      yield prefix + name, value


def _check_storage_paths(config, workdir: str) -> None:
  """Every gs:// path of the command, against Cloud Storage's bucket naming rules, before
  anything starts: TensorStore refuses a bad name only at the first checkpoint."""
  paths = {f"--config.{name}": value for name, value in _string_fields(config.to_dict())}
  paths["--workdir"] = workdir
  remote_storage.check_paths(paths, written=["--workdir"])


def main(argv):
  """The command once absl has parsed its flags: storage paths checked, the process joined to
  its cluster, then `--compile_for`'s report or the config's job in the workdir (`registry.run`);
  of several processes, one that fails ends them all at once."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  _check_storage_paths(_CONFIG.value, _WORKDIR.value)
  if _ALLOW_PICKLE.value:
    from bert_jax.io import checkpoints
    checkpoints.trust_pickle_files()
  if not flags.FLAGS["verbosity"].present:
    # Orbax and JAX log every checkpoint step at INFO; our progress lines are printed.
    logging.set_verbosity(logging.WARNING)
  import tensorflow as tf
  tf.config.set_visible_devices([], "GPU")
  import jax
  mode = cluster.multihost_mode(flags_given=bool(_COORDINATOR.value or _NUM_PROCESSES.value))
  if mode == "flags":
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                               heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value)
  elif mode == "tpu_pod":  # TPU VM pod slices configure themselves
    jax.distributed.initialize(heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value)
  prng_impl = _CONFIG.value.prng_impl
  if prng_impl:  # before any key exists: it decides initialisation and dropout streams
    jax.config.update("jax_default_prng_impl", prng_impl)
  if _COMPILE_FOR.value:
    from bert_jax.tasks.tools import compile_report
    compile_report.run(_CONFIG.value, _WORKDIR.value, _COMPILE_FOR.value, _FIND_MAX_BATCH.value)
    return
  from bert_jax.tasks import registry
  try:
    registry.run(_CONFIG.value, _WORKDIR.value)
  except Exception:  # pylint: disable=broad-except
    if jax.process_count() == 1:
      raise
    _leave_at_once(jax.process_index(), jax.process_count())


def _leave_at_once(process_index: int, process_count: int):
  """Ends a failed process of a multi-process run now, with the traceback and exit status 1.

  A normal exit waits at `jax.distributed`'s shutdown barrier, which the other processes never
  reach: they are blocked in the next collective with this one, and the job would hang for the
  shutdown timeout and beyond. Leaving closes this process's collective connections, so the
  others' step fails within milliseconds ("Connection reset by peer") and they leave here too.
  Nothing complete is lost: a checkpoint is written only when every process finishes it.
  """
  traceback.print_exc()
  print(f"Process {process_index} of {process_count} failed and leaves now, so that "
        "the others stop too. An error in a collective (e.g. 'Connection reset by peer') or a "
        "heartbeat timeout means another process failed first: its log has the cause (a log "
        "that just ends: it was killed). Nothing complete is lost: once the cause is gone, the "
        "same command on every host resumes from the newest complete checkpoint.", file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  logging.flush()
  os._exit(1)  # pylint: disable=protected-access


if __name__ == "__main__":
  app.run(main)
