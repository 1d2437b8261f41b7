"""Orbax checkpoints of a training run: model and optimizer state plus the input position.

Layout: `WORKDIR/checkpoints/<step>/state` (the TrainState pytree) and
`WORKDIR/checkpoints/<step>/data/process_<i>` (each host's tf.data iterator), written together so a
restart continues from exactly the batch after the checkpoint. Orbax finalises a step directory
atomically, so a run killed mid-save leaves no half checkpoint behind. Each checkpoint also holds
`fingerprints`: two sums of the bits of every array of the state, compared with the restored
arrays (a byte changed on disk can decode to other numbers without any error from the storage
layers). A step directory that is complete but unreadable or whose arrays do not match their
fingerprints (truncated or corrupted on disk) is moved to `WORKDIR/checkpoints_corrupt/` with a
loud message and the previous one is used; a run never silently restarts from scratch.
"""
import contextlib
import dataclasses
import os
import re
import time
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import tensorflow as tf
from absl import logging
from etils import epath
from orbax.checkpoint._src.serialization import tensorstore_utils as orbax_tensorstore

from bert_jax.io import filesystem, remote_storage

BERT_CONFIG = "bert_config.json"


def _bound_tensorstore_retries() -> None:
  """Orbax opens every array with a TensorStore context made from these base specs; with the
  run's retry budget in them (`remote_storage`), not TensorStore's own (32 attempts, waits of up
  to 32 s), a save to an unreachable store fails in minutes instead of most of an hour."""
  for spec in (orbax_tensorstore._BASE_TS_CONTEXT,  # pylint: disable=protected-access
               orbax_tensorstore._DEFAULT_OCDBT_TS_CONTEXT):  # pylint: disable=protected-access
    spec.update(remote_storage.tensorstore_context())


_bound_tensorstore_retries()
# Orbax makes its directories through etils.epath, which calls tf.io.gfile (the guard's why:
# remote_storage).
remote_storage.guard_makedirs(tf.io.gfile)


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (a full disk, a store that refused it): the run stops,
  and the newest complete checkpoint before it is where the same command resumes."""


class CheckpointDamagedError(ValueError):
  """A checkpoint that Orbax reads without error but whose arrays are not the ones saved."""


@jax.jit
def _bit_sums(tree):
  """Per array: the sum of its values' bits (as unsigned integers) and the sum weighted by
  position, both mod 2**32. Integer sums are exact and associative: the same numbers whatever
  the mesh or topology that computes them, and any changed, lost or moved value changes them."""

  def sums(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
      bits = x.astype(jnp.uint32)
    else:
      bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
    bits = bits.reshape(-1).astype(jnp.uint32)                            # [N]
    position = jnp.arange(1, bits.size + 1, dtype=jnp.uint32)             # [N]
    return jnp.stack([bits.sum(dtype=jnp.uint32), (bits * position).sum(dtype=jnp.uint32)])

  return jax.tree_util.tree_map(sums, tree)


def fingerprints(state) -> dict:
  """{array path: [bit sum, position-weighted bit sum, dtype]} of a state (see `_bit_sums`)."""
  sums = jax.device_get(_bit_sums(state))
  flat, _ = jax.tree_util.tree_flatten_with_path(sums)
  dtypes = jax.tree_util.tree_leaves(state)
  return {_path_name(path): [int(v[0]), int(v[1]), str(x.dtype)]
          for (path, v), x in zip(flat, dtypes)}


def _path_name(path) -> str:
  """An array's path such as `params/bert/pooler/dense/kernel`: the same for a TrainState and
  for the dict Orbax reads it back as."""
  return "/".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def check_fingerprints(saved: dict, state, where: str) -> None:
  """Raises CheckpointDamagedError naming the arrays of `state` that differ from `saved`
  (arrays restored in another dtype than they were saved in are not compared)."""
  restored = fingerprints(state)
  differ = [path for path, (total, weighted, dtype) in saved.items()
            if path in restored and restored[path][2] == dtype
            and restored[path][:2] != [total, weighted]]
  if differ:
    raise CheckpointDamagedError(
        f"{len(differ)} of {len(saved)} arrays read from {where} differ from what was saved "
        f"(first: {differ[0]}): the files were changed on disk after they were written")


class InputMovedError(FileNotFoundError):
  """A checkpoint's saved input position names input files that are gone (the workdir, or the
  data, was moved or copied): the checkpoint itself is good."""


class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves a `PipelineIterator` (tf.data iterator state) of each process in the step directory."""

  def save(self, directory: epath.Path, args: "DataIteratorSave"):
    target = directory / f"process_{jax.process_index()}"
    target.mkdir(parents=True, exist_ok=True)
    args.iterator.save(os.fspath(target))

  def restore(self, directory: epath.Path, args: "DataIteratorRestore"):
    source = directory / f"process_{jax.process_index()}"
    if not source.exists():
      raise FileNotFoundError(f"No input-pipeline state for process {jax.process_index()} in "
                              f"{directory}; was the run started with another process count?")
    args.iterator.restore(os.fspath(source))
    return args.iterator

  def metadata(self, directory):
    return None

  def finalize(self, directory):
    pass

  def close(self):
    pass


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


class _CheckpointManager(ocp.CheckpointManager):
  """Orbax's manager, kept out of the jax preemption service.

  The training loop alone asks the service whether to save (`pretraining._Preemption`, once per
  step on every host: the service agrees on a step from the last one each host passed it).
  Orbax also asks it on its own, for logging and metrics, once from the background thread that
  finalises an async save, with the *saved* step: a host's last-passed step could then read
  older than it is and the agreed step be one that host has already gone past.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class TrainingCheckpointer:
  """Async saves every N steps, keeps the last `keep`, restores the newest readable one."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = filesystem.join(filesystem.absolute(workdir), "checkpoints")
    self.corrupt_directory = filesystem.join(filesystem.absolute(workdir), "checkpoints_corrupt")
    self._keep = keep
    self._async = async_save
    self.restored_clock = 0.0   # the training clock saved with the restored checkpoint
    self._manager = self._new_manager()

  def _new_manager(self) -> ocp.CheckpointManager:
    # A step's directories are made before `save` returns, not in the background: made there, a
    # failure (a storage outage) never sent the signal the iterator's blocking save waits for,
    # and the run sat idle for Orbax's whole async timeout (20 minutes) before the error.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self._keep, create=True, enable_async_checkpointing=self._async,
        cleanup_tmp_directories=True,
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
    return _CheckpointManager(epath.Path(self.directory), options=options,
                              item_names=("state", "data", "clock", "fingerprints"))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state, iterator=None, force: bool = False,
           train_seconds: Optional[float] = None) -> bool:
    """`train_seconds`: the run's training clock at `step`, restored with it (`restored_clock`)."""
    items = {"state": ocp.args.StandardSave(state),
             "fingerprints": ocp.args.JsonSave(fingerprints(state))}
    if iterator is not None:
      items["data"] = DataIteratorSave(iterator)
    if train_seconds is not None:
      items["clock"] = ocp.args.JsonSave({"train_seconds": float(train_seconds)})
    with self._write_errors(step):
      return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

  def wait(self) -> None:
    with self._write_errors(self._manager.latest_step()):
      self._manager.wait_until_finished()

  @contextlib.contextmanager
  def _write_errors(self, step):
    """A failed write as one clear error: the step, the directory, the cause's first line and
    where the run resumes (Orbax's own error is a thread's traceback; the half-written step
    stays a `*.orbax-checkpoint-tmp` directory, which the next start removes)."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      message = str(e)
      full = filesystem.no_space(e)
      # Orbax finishes a save in a thread: its error can surface at the next save. The path in
      # the message names the step that failed.
      failed = re.search(r"/(\d+)\.orbax-checkpoint-tmp", message)
      step = int(failed.group(1)) if failed else step
      previous = [s for s in self._manager.all_steps() if step is None or s < step]
      resume = (f"the checkpoint at step {max(previous)} is the newest complete one"
                if previous else "there is no complete checkpoint yet")
      if _cause(e, remote_storage.MissingBucketError):   # the store lost what it held
        raise CheckpointWriteError(
            f"Could not write the checkpoint at step {step} in {self.directory}: {message}. "
            "Every checkpoint this run wrote there is gone with its bucket; with the bucket "
            "back, the same command starts from the newest checkpoint it then holds (none: "
            "from step 0, and it says so).") from None
      cause = "the disk is full" if full else type(e).__name__
      raise CheckpointWriteError(
          f"Could not write the checkpoint at step {step} in {self.directory}: {cause} "
          f"({message.splitlines()[0][:300] if message else ''}). Nothing complete was lost: "
          f"{resume}; {'free space and ' if full else ''}run the same command again to resume "
          "from it.") from None

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def restore_latest(self, abstract_state, iterator=None) -> Tuple[Optional[int], Any]:
    """(step, state) of the newest readable checkpoint, or (None, None) if there is none.

    `abstract_state` gives the tree structure, shapes, dtypes and shardings to restore into.
    `iterator` (one batch per step) is put at the checkpoint's input position: from the saved
    position, or, where that names input files that moved (`InputMovedError`: a copied
    workdir), by replaying the pipeline to the step.
    """
    while True:
      step = self._manager.latest_step()
      if step is None:
        return None, None
      items = {"state": ocp.args.StandardRestore(abstract_state)}
      # Checkpoints written before the clock or the fingerprints were saved have none: the clock
      # then starts at 0, and the arrays are taken as read.
      for name in ("clock", "fingerprints"):
        if filesystem.exists(filesystem.join(self.directory, str(step), name)):
          items[name] = ocp.args.JsonRestore()
      if iterator is not None:
        items["data"] = DataIteratorRestore(iterator)
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        self._checked(step, restored)
        return step, restored["state"]
      except Exception as e:  # pylint: disable=broad-except
        moved = _cause(e, InputMovedError)
        if moved is None:
          self._set_aside(step, e)
          continue
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            **{k: v for k, v in items.items() if k != "data"}))
        self._checked(step, restored)
      except Exception as e:  # pylint: disable=broad-except
        self._set_aside(step, e)
        continue
      print(f"{moved}. The checkpoint at step {step} is good: its state is restored and the "
            f"input position replayed from the files as configured now ({step} batches).",
            flush=True)
      iterator.skip(step)
      return step, restored["state"]

  def _checked(self, step: int, restored) -> None:
    """The restored state checked against its fingerprints; the training clock taken."""
    if "fingerprints" in restored:
      check_fingerprints(restored["fingerprints"], restored["state"],
                         filesystem.join(self.directory, str(step), "state"))
    self.restored_clock = (float(restored["clock"]["train_seconds"]) if "clock" in restored
                           else 0.0)

  def restore_params(self, step: int):
    """The parameters saved at `step`, as host-side arrays on this process's first device,
    whatever mesh wrote them (a pod run exported or fine-tuned from one process)."""
    step_dir = filesystem.join(self.directory, str(step))
    try:
      target = _on_this_process(filesystem.join(step_dir, "state"))
      items = {"state": ocp.args.StandardRestore(target)}
      if filesystem.exists(filesystem.join(step_dir, "fingerprints")):
        items["fingerprints"] = ocp.args.JsonRestore()
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
      if "fingerprints" in restored:
        check_fingerprints(restored["fingerprints"], restored["state"],
                           filesystem.join(step_dir, "state"))
    except Exception as error:  # pylint: disable=broad-except  (any read failure: named below)
      earlier = [s for s in self._manager.all_steps() if s < step]
      advice = (f"; the checkpoint before it (step {max(earlier)}) is used once {step_dir} is "
                "moved away" if earlier else "")
      raise CheckpointDamagedError(
          f"The checkpoint {step_dir} cannot be read: {type(error).__name__}: "
          f"{str(error)[:500]}{advice}") from error
    return restored["state"]["params"]

  def _set_aside(self, step: int, error: Exception) -> None:
    source = filesystem.join(self.directory, str(step))
    target = filesystem.join(self.corrupt_directory, f"{step}-{int(time.time())}")
    earlier = [s for s in self._manager.all_steps() if s < step]
    fallback = (f"falling back to the previous checkpoint (step {max(earlier)})" if earlier
                else "there is no earlier checkpoint: the run starts from the beginning")
    message = (f"CHECKPOINT AT STEP {step} IS UNREADABLE ({type(error).__name__}: {error}). "
               f"Moved it to {target}; {fallback}.")
    logging.error(message)
    print(f"\n!!! {message}\n", flush=True)
    if jax.process_index() == 0:  # one process moves the shared directory
      filesystem.makedirs(self.corrupt_directory)
      filesystem.rename(source, target)
    self._manager.close()
    self._manager = self._new_manager()


def _cause(error: BaseException, kind: type) -> Optional[BaseException]:
  """`error` or the first exception of type `kind` it was raised from (Orbax wraps the errors of
  an item's handler)."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, kind):
      return error
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None


def _on_this_process(state_directory: str):
  """The saved tree as abstract arrays on this process's first device.

  A checkpoint records the device mesh that wrote it (e.g. 2 hosts); restoring it in another
  topology (one process exporting a pod run, or fine-tuning from it) needs an explicit target.
  """
  # The item's own handler reads the item folder; a whole checkpointer would also look there
  # for the step's metadata file (which the manager writes one folder up) and warn it is missing.
  reader = ocp.StandardCheckpointHandler()
  try:
    saved = reader.metadata(epath.Path(state_directory)).tree
  finally:
    reader.close()
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree_util.tree_map(
      lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
