"""Orbax checkpoints of a training run: model and optimizer state plus the input position.

Layout: `WORKDIR/checkpoints/<step>/state` (the TrainState pytree) and
`WORKDIR/checkpoints/<step>/data/process_<i>` (each host's tf.data iterator), written together so a
restart continues from exactly the batch after the checkpoint. Orbax finalises a step directory
atomically, so a run killed mid-save leaves no half checkpoint behind. Each checkpoint also holds
`fingerprints`: two sums of the bits of every array of the state, compared with the restored
arrays (a byte changed on disk can decode to other numbers without any error from the storage
layers), and `record`: the checkpoint format's version, the shape and dtype of every array and the
model's architecture (its `BertConfig` fields, where the job's model has one). A state that holds
NaN or infinity is never written (`NonFiniteStateError`).

A checkpoint that cannot be restored is one of three cases, told apart before anything is moved:
* damaged, proven by its own files (arrays that differ from their fingerprints, a file missing
  from a complete step directory, unparseable metadata, data TensorStore reports as lost): moved
  to `WORKDIR/checkpoints_corrupt/` with a loud message, and the previous one is used; a run
  never silently restarts from scratch;
* mismatched (`CheckpointMismatchError`): readable, but not of the job now restoring it (the
  model config or the code changed, another process count, a newer format): an error naming the
  fields and arrays that differ; nothing is moved;
* anything else (`CheckpointReadError`: a store past its retry budget, memory that ran out, a
  file the system could not read): not evidence against the checkpoint; the run stops with the
  error and nothing is moved, so the same command resumes from it once the cause is gone.
"""
import contextlib
import dataclasses
import errno
import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from orbax.checkpoint._src.metadata import step_metadata_serialization as _step_metadata
from orbax.checkpoint._src.serialization import tensorstore_utils as orbax_tensorstore

from bert_jax.io import file_digests, filesystem, remote_storage
from bert_jax.model.config import BertConfig

BERT_CONFIG = "bert_config.json"
# The layout of a checkpoint this code writes (its `record` item). A reader refuses a higher one
# (`CheckpointFormatError`); a checkpoint without a record (written before there was one) is
# format 0 and restores as before.
FORMAT_VERSION = 1
# BertConfig fields that change how parameters are trained or first drawn, not what they compute:
# a resumed run may change them (with the compute-only RUNTIME_FIELDS).
TRAINING_ONLY_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob",
                        "initializer_range", "initializer_cutoff_factor")


def _bound_tensorstore_retries() -> None:
  """Orbax opens every array with a TensorStore context made from these base specs; with the
  run's retry budget in them (`remote_storage`), not TensorStore's own (32 attempts, waits of up
  to 32 s), a save to an unreachable store fails in minutes instead of most of an hour."""
  for spec in (orbax_tensorstore._BASE_TS_CONTEXT,  # pylint: disable=protected-access
               orbax_tensorstore._DEFAULT_OCDBT_TS_CONTEXT):  # pylint: disable=protected-access
    spec.update(remote_storage.tensorstore_context())


_bound_tensorstore_retries()


def _guard_makedirs(directory: str) -> None:
  """Orbax makes its directories through etils.epath, which calls tf.io.gfile for URLs (the
  guard's why: remote_storage). TensorFlow is imported only then: a local run's step, model and
  checkpoints import without it (the GPU benchmark machine has none)."""
  if filesystem.is_url(directory):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    remote_storage.guard_makedirs(tf.io.gfile)


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (a full disk, a store that refused it): the run stops,
  and the newest complete checkpoint before it is where the same command resumes."""


class CheckpointDamagedError(ValueError):
  """A checkpoint whose own files prove it damaged: arrays that are not the ones saved, or a
  complete step directory that lacks an item."""


class CheckpointMismatchError(ValueError):
  """A readable checkpoint that is not of the job restoring it (another model config, other code,
  another process count): nothing is moved, the error names what differs."""


class CheckpointFormatError(CheckpointMismatchError):
  """A checkpoint written by a newer bert_jax, in a format this one does not know."""


class CheckpointReadError(OSError):
  """A checkpoint that could not be read for a reason that does not prove it damaged (a store
  past its retry budget, memory that ran out, a file the system could not read): the run stops
  and nothing is moved."""


class NonFiniteStateError(FloatingPointError):
  """A state holding NaN or infinity, refused before it could replace a good checkpoint."""


@jax.jit
def _array_summaries(tree):
  """Per array, one pass over it: the sum of its values' bits (as unsigned integers), the sum
  weighted by position, both mod 2**32, and 1 if every value is finite (else 0). Integer sums
  are exact and associative: the same numbers whatever the mesh or topology that computes them,
  and any changed, lost or moved value changes them."""

  def summary(x):
    finite = jnp.isfinite(x).all() if jnp.issubdtype(x.dtype, jnp.inexact) else True
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
      bits = x.astype(jnp.uint32)
    else:
      bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
    bits = bits.reshape(-1).astype(jnp.uint32)                            # [N]
    position = jnp.arange(1, bits.size + 1, dtype=jnp.uint32)             # [N]
    return jnp.stack([bits.sum(dtype=jnp.uint32), (bits * position).sum(dtype=jnp.uint32),
                      jnp.asarray(finite, jnp.uint32)])

  return jax.tree_util.tree_map(summary, tree)


def _summaries(state) -> Tuple[dict, List[str]]:
  """(fingerprints of `state`, the paths of its arrays that hold NaN or infinity): one jitted
  pass over the state and one small transfer, what a save costs besides writing."""
  sums = jax.device_get(_array_summaries(state))
  flat, _ = jax.tree_util.tree_flatten_with_path(sums)
  leaves = jax.tree_util.tree_leaves(state)
  prints = {_path_name(path): [int(v[0]), int(v[1]), str(x.dtype)]
            for (path, v), x in zip(flat, leaves)}
  return prints, [_path_name(path) for path, v in flat if not v[2]]


def fingerprints(state) -> dict:
  """{array path: [bit sum, position-weighted bit sum, dtype]} of a state (see
  `_array_summaries`)."""
  return _summaries(state)[0]


def _path_name(path) -> str:
  """An array's path such as `params/bert/pooler/dense/kernel`: the same for a TrainState and
  for the dict Orbax reads it back as."""
  return "/".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def check_fingerprints(saved: dict, state, where: str, found: Optional[dict] = None) -> None:
  """Raises CheckpointDamagedError naming the arrays of `state` that differ from `saved`
  (arrays restored in another dtype than they were saved in are not compared). `found`: the
  fingerprints of `state`, when the caller has them already."""
  restored = fingerprints(state) if found is None else found
  differ = [path for path, (total, weighted, dtype) in saved.items()
            if path in restored and restored[path][2] == dtype
            and restored[path][:2] != [total, weighted]]
  if differ:
    raise CheckpointDamagedError(
        f"{len(differ)} of {len(saved)} arrays read from {where} differ from what was saved "
        f"(first: {differ[0]}): the files were changed on disk after they were written")


# ----------------------------------------------------------------------------------- record


def _version() -> str:
  try:
    return importlib.metadata.version("bert_jax")
  except importlib.metadata.PackageNotFoundError:   # run from a source tree, not installed
    return "unknown"


@functools.lru_cache(maxsize=None)
def source_revision() -> Optional[str]:
  """The git commit of the source tree this package runs from, `+changes` when tracked files
  differ from it; None outside a git checkout (an installed wheel) or without git. The package
  version alone never tells two states of the code apart."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if not os.path.exists(os.path.join(root, ".git")):
    return None
  try:
    run = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True,
                                       text=True, timeout=10, check=True).stdout.strip()
    commit = run("rev-parse", "HEAD")
    changed = run("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None
  return commit + ("+changes" if changed else "")


def written_by() -> str:
  """`bert_jax VERSION` and, from a git checkout, `(git COMMIT[+changes])`: a checkpoint's
  `written_by`."""
  revision = source_revision()
  return f"bert_jax {_version()}" + (f" (git {revision})" if revision else "")


def array_shapes(state) -> Dict[str, list]:
  """{array path: [shape, dtype]} of a state or of its abstract form."""
  flat, _ = jax.tree_util.tree_flatten_with_path(state)
  return {_path_name(path): [list(x.shape), str(x.dtype)] for path, x in flat}


def architecture(config: Optional[BertConfig]) -> Optional[Dict[str, Any]]:
  """The fields of `config` that decide what its parameters compute: those a checkpoint holds
  (`to_dict(include_runtime=False)`, the block named always) less TRAINING_ONLY_FIELDS."""
  if config is None:
    return None
  fields = dict(config.to_dict(include_runtime=False), architecture=config.architecture)
  return {k: v for k, v in fields.items() if k not in TRAINING_ONLY_FIELDS}


def model_config_of(model) -> Optional[BertConfig]:
  """The BertConfig a job's Flax module is built from (a field of it: pre-training's `config`,
  fine-tuning's `bert_config`); None for a model without one (the feature-based tagger)."""
  if model is None or not dataclasses.is_dataclass(model):
    return None
  values = (getattr(model, f.name, None) for f in dataclasses.fields(model))
  return next((v for v in values if isinstance(v, BertConfig)), None)


def _record(state, model: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """What a checkpoint says of itself (its `record` item): format, writer, arrays, model."""
  record = {"format_version": FORMAT_VERSION, "written_by": written_by(),
            "arrays": array_shapes(state)}
  if model is not None:
    record["model"] = model
  return record


def _differences(saved: Dict[str, Any], now: Dict[str, Any]) -> List[str]:
  """`field: saved -> now` for every field whose value differs (absent: `-`)."""
  return [f"{k}: {saved.get(k, '-')!r} -> {now.get(k, '-')!r}"
          for k in sorted(set(saved) | set(now)) if saved.get(k, "-") != now.get(k, "-")]


def _array_differences(saved: Dict[str, list], now: Dict[str, list], shown: int = 5) -> List[str]:
  """Lines naming the arrays that only one side has or whose shapes differ (a few of each).
  Dtypes are not compared: Orbax casts a restored array to the dtype asked for."""
  def some(paths):
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown
                                       else "")
  lines = []
  reshaped = [p for p in now if p in saved and list(saved[p][0]) != list(now[p][0])]
  if reshaped:
    lines.append(f"{len(reshaped)} arrays of another shape (saved -> this run): " + "; ".join(
        f"{p} {tuple(saved[p][0])} -> {tuple(now[p][0])}" for p in reshaped[:shown]) +
        (f"; and {len(reshaped) - shown} more" if len(reshaped) > shown else ""))
  only_saved = [p for p in saved if p not in now]
  if only_saved:
    lines.append(f"{len(only_saved)} arrays only in the checkpoint: {some(only_saved)}")
  only_now = [p for p in now if p not in saved]
  if only_now:
    lines.append(f"{len(only_now)} arrays only in this run's state: {some(only_now)}")
  return lines


def keep_model_config(config: BertConfig, workdir: str) -> None:
  """WORKDIR/bert_config.json for a run of `config`: written, after `check_model_config`."""
  check_model_config(config, workdir, say=False)   # said when the run's config was checked
  filesystem.write_text(filesystem.join(workdir, BERT_CONFIG),
                        config.to_json_string(include_runtime=True))


def check_model_config(config: BertConfig, workdir: str, say: bool = True) -> None:
  """That the WORKDIR/bert_config.json an earlier run of this workdir left, if any, describes
  the architecture of `config`. Compute-only and training-only fields may differ (said; the
  file records this run's once written); any other difference is a `CheckpointMismatchError`
  naming the fields (its checkpoints are of that architecture). Nothing is written."""
  path = filesystem.confined(workdir, BERT_CONFIG, held_by=workdir)   # no link out, no FIFO
  if filesystem.exists(path):
    saved = BertConfig.from_json_string(filesystem.read_text(path), source=path)
    differ = _differences(architecture(saved), architecture(config))
    if differ:
      raise CheckpointMismatchError(
          f"{path} was written by an earlier run of this workdir with another model "
          f"architecture; this run's config.model differs in {'; '.join(differ)} (saved -> "
          "this run). Its checkpoints are of the saved one: run with the same config.model "
          "fields to resume it, or give this run another --workdir. Nothing was changed.")
    changed = _differences(saved.to_dict(), config.to_dict())
    if changed and say:
      print(f"{path}: this run's compute-only or training-only model fields differ from the "
            f"earlier run's ({'; '.join(changed)}); the file now records this run's.",
            flush=True)


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
    # A folder of the checkpoint, not a link out of the workdir.
    filesystem.confined(os.fspath(directory), source.name, held_by=os.fspath(directory),
                        folder=True)
    if not source.exists():
      # Another process count (the checkpoint holds one state per process that wrote it), not
      # damage: the checkpoint stays where it is.
      written = sorted(p.name for p in directory.iterdir() if p.name.startswith("process_"))
      raise CheckpointMismatchError(
          f"No input-pipeline state for process {jax.process_index()} in {directory} (it holds "
          f"{', '.join(written) or 'none'}): the checkpoint was written by a run with another "
          "process count; resume it with that count.")
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

  The training loop alone asks the service whether to save (`runtime.preemption.Preemption`,
  once per step on every host: the service agrees on a step from the last one each host passed
  it).
  Orbax also asks it on its own, for logging and metrics, once from the background thread that
  finalises an async save, with the *saved* step: a host's last-passed step could then read
  older than it is and the agreed step be one that host has already gone past.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class TrainingCheckpointer:
  """Async saves every N steps, keeps the last `keep`, restores the newest restorable one."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.directory = filesystem.join(filesystem.absolute(workdir), "checkpoints")
    self.corrupt_directory = filesystem.join(filesystem.absolute(workdir), "checkpoints_corrupt")
    self._keep = keep
    self._async = async_save
    self.restored_clock = 0.0   # the training clock saved with the restored checkpoint
    # The architecture of the model trained (`restore_latest`'s `model`), recorded with each save.
    self._model: Optional[Dict[str, Any]] = None
    # Orbax reads every step's metadata as it starts: all of it regular files of the folder
    # first (no link out, no FIFO), refused by name otherwise.
    filesystem.check_tree(self.directory, held_by=self.directory)
    self._set_aside_unreadable_step_metadata()
    self._manager = self._new_manager()
    # Steps read back and found whole (`_verify`); what an earlier run left counts as verified
    # (it verified them, or they predate verification). Only these count toward `keep`.
    self._verified: List[int] = sorted(self._manager.all_steps())
    self._unverified: List[Tuple[int, Dict[str, Any]]] = []   # (step, its fingerprints)

  def _set_aside_unreadable_step_metadata(self) -> None:
    """A step whose `_CHECKPOINT_METADATA` Orbax cannot read (JSON of other types: Orbax would
    fail on every start, naming no file) is damage of that checkpoint: set aside as any damaged
    one, before the manager reads it."""
    if filesystem.is_url(self.directory) or not filesystem.isdir(self.directory):
      return
    for name in sorted(filesystem.listdir(self.directory)):
      path = filesystem.join(self.directory, name, "_CHECKPOINT_METADATA")
      if not name.isdigit() or not filesystem.exists(path):
        continue
      try:
        value = json.loads(filesystem.read_text(path))
      except (ValueError, UnicodeDecodeError):
        continue   # Orbax reads a step with metadata that does not parse as having none
      try:
        _step_metadata.deserialize(value)
      except Exception as error:  # pylint: disable=broad-except  (any shape Orbax refuses)
        self._move_aside(int(name), CheckpointDamagedError(f"{path}: {error}"))

  def _new_manager(self) -> ocp.CheckpointManager:
    _guard_makedirs(self.directory)
    # A step's directories are made before `save` returns, not in the background: made there, a
    # failure (a storage outage) never sent the signal the iterator's blocking save waits for,
    # and the run sat idle for Orbax's whole async timeout (20 minutes) before the error.
    # Nothing is deleted by Orbax: an older checkpoint goes only once a newer one was read back
    # whole (`_verify`, `_delete_old`).
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None, create=True, enable_async_checkpointing=self._async,
        cleanup_tmp_directories=True,
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
    return _CheckpointManager(epath.Path(self.directory), options=options,
                              item_names=("state", "data", "clock", "fingerprints", "record"))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state, iterator=None, force: bool = False,
           train_seconds: Optional[float] = None) -> bool:
    """`train_seconds`: the run's training clock at `step`, restored with it (`restored_clock`).
    A state holding NaN or infinity is refused (`NonFiniteStateError`) before anything is
    written."""
    prints, non_finite = _summaries(state)
    if non_finite:
      self._refuse_non_finite(step, non_finite, len(prints))
    items = {"state": ocp.args.StandardSave(state),
             "fingerprints": ocp.args.JsonSave(prints),
             "record": ocp.args.JsonSave(_record(state, self._model))}
    if iterator is not None:
      items["data"] = DataIteratorSave(iterator)
    if train_seconds is not None:
      items["clock"] = ocp.args.JsonSave({"train_seconds": float(train_seconds)})
    if self._unverified:   # the save before this one (async) is read back before a new one
      self.wait()
    with self._write_errors(step):
      saved = self._manager.save(step, args=ocp.args.Composite(**items), force=force)
    if saved:
      self._unverified.append((step, prints))
      if not self._async:
        self._verify_pending()
    return saved

  def _verify_pending(self) -> None:
    """Every finished save not yet read back: verified (`_verify`), then the old ones beyond
    `keep` deleted (`_delete_old`)."""
    while self._unverified:
      step, prints = self._unverified.pop(0)
      self._verify(step, prints)
      self._verified.append(step)
    self._delete_old()

  def _verify(self, step: int, prints: Dict[str, Any]) -> None:
    """The checkpoint of `step` read back from the store, as every later restore would read it:
    its arrays (to host memory) against the fingerprints of the state that was saved, its input
    position's files against their recorded digests. A store that accepted an object and lost
    it, or kept other bytes, fails here, before any older checkpoint is deleted: a
    `CheckpointWriteError` naming the step and the newest verified checkpoint, which is kept."""
    step_dir = filesystem.join(self.directory, str(step))
    try:
      state_dir = filesystem.join(step_dir, "state")
      reader = ocp.PyTreeCheckpointHandler()
      try:
        saved = reader.metadata(epath.Path(state_dir))
        saved = getattr(saved, "tree", saved)
        host = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
        restored = reader.restore(epath.Path(state_dir),
                                  args=ocp.args.PyTreeRestore(restore_args=host))
      finally:
        reader.close()
      found = fingerprints(restored)   # one pass over the state read back
      missing = sorted(set(prints) - set(found))
      if missing:
        raise CheckpointDamagedError(f"{len(missing)} arrays saved are not in {state_dir} "
                                     f"(first: {missing[0]})")
      check_fingerprints(prints, restored, state_dir, found=found)
      position = filesystem.join(step_dir, "data", f"process_{jax.process_index()}",
                                 "position.json")
      if filesystem.exists(position):
        record = json.loads(filesystem.read_text(position))
        file_digests.check(filesystem.dirname(position), record.get("state", {}), position)
    except Exception as error:  # pylint: disable=broad-except  (whatever did not read back)
      newest = max(self._verified) if self._verified else None
      kept = (f"the newest verified checkpoint, step {newest}, is kept and the same command "
              "resumes from it" if newest is not None else
              "there is no verified checkpoint before it: the same command starts from step 0")
      raise CheckpointWriteError(
          f"The checkpoint at step {step} in {self.directory} did not read back whole after it "
          f"was written ({_causes(error)}): the store lost or changed what it accepted. No "
          f"older checkpoint was deleted: {kept}.") from error

  def _delete_old(self) -> None:
    """All but the newest `keep` verified checkpoints (never the newest verified one)."""
    if not self._keep:
      return
    keep = max(self._keep, 1)
    present = set(self._manager.all_steps())
    for step in self._verified[:-keep]:
      if step in present:   # every process calls it: Orbax deletes on one and syncs them all
        self._manager.delete(step)
    self._verified = self._verified[-keep:]

  def _refuse_non_finite(self, step: int, paths: List[str], total: int) -> None:
    # Refused, and the run stops with the error (a non-zero exit) rather than skipping this save
    # and training on: written, the state would become the newest checkpoint, push a good one
    # out of the last `keep`, and every rerun would resume from NaN. Training on cannot mend it
    # (a step from non-finite parameters is non-finite, and skipped). Stopped here, the newest
    # checkpoint is the last good state, and the same command resumes from it.
    newest = self._manager.latest_step()
    kept = (f"the newest checkpoint, step {newest}, is kept as it was: the same command "
            "resumes from it" if newest is not None else
            "there is no checkpoint before it: the same command starts again from step 0")
    raise NonFiniteStateError(
        f"Refusing to write the checkpoint at step {step} in {self.directory}: {len(paths)} of "
        f"{total} arrays of the training state hold NaN or infinity (first: "
        f"{', '.join(paths[:3])}). Nothing was written and {kept} (with a lower learning rate "
        "if the run diverges at the same place).")

  def wait(self) -> None:
    """Until the last save is written, read back and verified (and older ones deleted)."""
    with self._write_errors(self._manager.latest_step()):
      self._manager.wait_until_finished()
    self._verify_pending()

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

  def close(self, verify: bool = True) -> None:
    """Finishes the last save; reads it back (and deletes the old ones) unless `verify` is False
    (a run ending on an error: every process may not get here, and deleting waits for all)."""
    try:
      if verify:
        self.wait()
      else:
        self._manager.wait_until_finished()
    finally:
      self._manager.close()

  # ------------------------------------------------------------------------------- restore

  def restore_latest(self, abstract_state, iterator=None,
                     model=None) -> Tuple[Optional[int], Any]:
    """(step, state) of the newest restorable checkpoint, or (None, None) if there is none.

    `abstract_state` gives the tree structure, shapes, dtypes and shardings to restore into.
    `iterator` (one batch per step) is put at the checkpoint's input position: from the saved
    position, or, where that names input files that moved (`InputMovedError`: a copied
    workdir), by replaying the pipeline to the step. `model`: the job's Flax module; its
    architecture (`model_config_of`) is compared with the checkpoint's and recorded with every
    later save.

    A damaged checkpoint is set aside and the one before it tried; a mismatched one raises
    `CheckpointMismatchError`, any other failure `CheckpointReadError`, with nothing moved (the
    module docstring).
    """
    self._model = architecture(model_config_of(model))
    while True:
      step = self._manager.latest_step()
      if step is None:
        return None, None
      try:
        return step, self._restore(step, abstract_state, iterator)
      except Exception as error:  # pylint: disable=broad-except  (each kind told apart below)
        # A mismatch, or a name in the checkpoint's files that leads out of the workdir (an
        # edited or crafted file, not damage): refused as it is, nothing moved.
        refused = _cause(error, CheckpointMismatchError) or _cause(error,
                                                                   filesystem.UnsafeNameError)
        if refused is not None:
          raise refused from None
        if not self._proven_damage(step, error):
          raise self._read_error(step, error) from error
        self._set_aside(step, error)

  def _restore(self, step: int, abstract_state, iterator):
    """The state of `step`: checked to be of this job before it is read (`_check_compatible`),
    and against its fingerprints after; the iterator put at its position."""
    step_dir = filesystem.join(self.directory, str(step))
    # Read only through regular files of the step (TensorStore follows links, blocks on FIFOs).
    filesystem.check_tree(step_dir, held_by=step_dir)
    # One listing (which fails, rather than answering "absent", when the store does not answer).
    names = set(filesystem.listdir(step_dir))
    if "state" not in names:
      raise CheckpointDamagedError(f"{step_dir} is a complete checkpoint but holds no state")
    record = self._read_json(step, "record") if "record" in names else None
    self._check_format(step, record)
    self._check_compatible(step, abstract_state, record)
    # Checkpoints written before the clock or the fingerprints were saved have none: the clock
    # then starts at 0, and the arrays are taken as read.
    items = {"state": ocp.args.StandardRestore(abstract_state),
             **{name: ocp.args.JsonRestore() for name in ("clock", "fingerprints")
                if name in names}}
    if iterator is None:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    else:
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            **items, data=DataIteratorRestore(iterator)))
      except Exception as error:  # pylint: disable=broad-except
        moved = _cause(error, InputMovedError)
        if moved is None:
          raise
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        self._checked(step, restored)
        print(f"{moved}. The checkpoint at step {step} is good: its state is restored and the "
              f"input position replayed from the files as configured now ({step} batches).",
              flush=True)
        iterator.skip(step)
        return restored["state"]
    self._checked(step, restored)
    return restored["state"]

  def _read_json(self, step: int, name: str):
    return self._manager.restore(step, args=ocp.args.Composite(
        **{name: ocp.args.JsonRestore()}))[name]

  def _check_format(self, step: int, record) -> None:
    """A record this code can read (none: a checkpoint from before records, format 0)."""
    if record is None:
      return
    where = filesystem.join(self.directory, str(step), "record")
    version = record.get("format_version") if isinstance(record, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
      raise CheckpointDamagedError(f"{where} holds no format_version: {str(record)[:200]}")
    if version > FORMAT_VERSION:
      raise CheckpointFormatError(
          f"The checkpoint at step {step} in {self.directory} was written by "
          f"{record.get('written_by', 'a newer bert_jax')} in checkpoint format {version}; this "
          f"bert_jax ({_version()}) reads formats up to {FORMAT_VERSION}. Resume it with the "
          "newer bert_jax (or give this run another --workdir). Nothing was moved.")

  def _incompatibilities(self, step: int, abstract_state, record) -> List[str]:
    """Lines naming the model config fields (when this run's model is known) and the arrays in
    which the checkpoint at `step` differs from `abstract_state`. Its arrays are read from its
    record, or, in a checkpoint from before records, from Orbax's metadata of the state."""
    if record is not None:
      saved_arrays, saved_model = record.get("arrays", {}), record.get("model")
    else:
      saved_arrays, saved_model = array_shapes(self._saved_tree(step)), None
    lines = []
    if saved_model is not None and self._model is not None:
      fields = _differences(saved_model, self._model)
      if fields:
        lines.append(f"model config fields (saved -> this run): {'; '.join(fields)}")
    return lines + _array_differences(saved_arrays, array_shapes(abstract_state))

  def _check_compatible(self, step: int, abstract_state, record) -> None:
    """Raises CheckpointMismatchError naming the model config fields and arrays in which the
    checkpoint differs from the state this run built (`_incompatibilities`)."""
    lines = self._incompatibilities(step, abstract_state, record)
    if lines:
      writer = record.get("written_by") if isinstance(record, dict) else None
      # Another version's state layout (an optimizer's, say) reads as other arrays: say which
      # code wrote it, so that the version can resume it.
      advice = (f"It was written by {writer}; this is {written_by()}. Resume it with the code "
                "and the config it was written with" if writer and writer != written_by() else
                "Run with the config the checkpoint was written with to resume it")
      raise CheckpointMismatchError(
          f"The checkpoint at step {step} in {self.directory} is not of the model this run "
          "builds (the config or the code changed since it was written):\n  " +
          "\n  ".join(lines) + f"\nNothing was moved. {advice}, or give this run another "
          "--workdir.")

  def _saved_tree(self, step: int):
    """The state's tree of array metadata (shape, dtype) as Orbax saved it."""
    reader = ocp.StandardCheckpointHandler()
    try:
      return reader.metadata(epath.Path(
          filesystem.join(self.directory, str(step), "state"))).tree
    finally:
      reader.close()

  def _checked(self, step: int, restored) -> None:
    """The restored state checked against its fingerprints; the training clock taken. Our own
    items of another shape than we write them (edited, or bytes that still parse) are damage
    of the checkpoint, named."""
    step_dir = filesystem.join(self.directory, str(step))
    try:
      if "fingerprints" in restored:
        check_fingerprints(restored["fingerprints"], restored["state"],
                           filesystem.join(step_dir, "state"))
      self.restored_clock = (float(restored["clock"]["train_seconds"]) if "clock" in restored
                             else 0.0)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
      if isinstance(error, CheckpointDamagedError):
        raise
      raise CheckpointDamagedError(
          f"{step_dir}: its fingerprints or clock item is not what a run writes "
          f"({type(error).__name__}: {error})") from None

  def _proven_damage(self, step: int, error: BaseException) -> bool:
    """Whether `error`, raised restoring `step`, proves the checkpoint's own files damaged
    (`restore_error_kind`); a missing file counts only while its step directory is there."""
    kind = restore_error_kind(error)
    if kind != "missing":
      return kind == "damaged"
    try:   # a file gone from a step directory the store still lists: damage
      return filesystem.isdir(filesystem.join(self.directory, str(step)))
    except Exception:  # pylint: disable=broad-except  (the store does not answer: not proven)
      return False

  def _read_error(self, step: int, error: BaseException) -> CheckpointReadError:
    step_dir = filesystem.join(self.directory, str(step))
    earlier = [s for s in self._manager.all_steps() if s < step]
    then = (f"the run then resumes from the one before it (step {max(earlier)})" if earlier
            else "there is none before it: the run then starts from step 0")
    return CheckpointReadError(
        f"Could not read the checkpoint at step {step} in {self.directory}: "
        f"{_causes(error)}. Nothing was moved: this error does not show that the checkpoint is "
        "damaged (a store that did not answer within its retry budget, memory that ran out, a "
        "file the system could not read). Run the same command again once the cause is gone to "
        f"resume from it. Only if the checkpoint itself is bad, move {step_dir} away: {then}.")

  def restore_params(self, step: int):
    """The parameters saved at `step`, as host-side arrays on this process's first device,
    whatever mesh wrote them (a pod run exported or fine-tuned from one process)."""
    step_dir = filesystem.join(self.directory, str(step))
    filesystem.check_tree(step_dir, held_by=step_dir)   # no link out of the step, no FIFO
    try:
      names = set(filesystem.listdir(step_dir))
      self._check_format(step, self._read_json(step, "record") if "record" in names else None)
      state = self._read_checked(step, names,
                                 _on_this_process(filesystem.join(step_dir, "state")))
    except (CheckpointMismatchError, filesystem.UnsafeNameError):
      raise
    except Exception as error:  # pylint: disable=broad-except  (any read failure: named below)
      if not self._proven_damage(step, error):
        raise self._read_error(step, error) from error
      earlier = [s for s in self._manager.all_steps() if s < step]
      advice = (f"; the checkpoint before it (step {max(earlier)}) is used once {step_dir} is "
                "moved away" if earlier else "")
      raise CheckpointDamagedError(
          f"The checkpoint {step_dir} cannot be read: {type(error).__name__}: "
          f"{str(error)[:500]}{advice}") from error
    return state["params"]

  def _read_checked(self, step: int, names, target):
    """The state saved at `step` read into `target` (shapes, dtypes, shardings), against its
    fingerprints where the checkpoint has them (`names`: the step folder's entries)."""
    items = {"state": ocp.args.StandardRestore(target)}
    if "fingerprints" in names:
      items["fingerprints"] = ocp.args.JsonRestore()
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    if "fingerprints" in restored:
      check_fingerprints(restored["fingerprints"], restored["state"],
                         filesystem.join(self.directory, str(step), "state"))
    return restored["state"]

  def restore_state(self, step: int, abstract_state):
    """The whole state saved at `step`, into the shapes, dtypes and shardings of
    `abstract_state` (another run's: a later phase starting from this workdir with its optimizer
    state, `config.init_optimizer_state`). Its arrays are compared with the checkpoint's record
    first (a `CheckpointMismatchError` whose lines name those that differ) and with its
    fingerprints once read. Nothing is moved, and no input position is read: this workdir is
    only read from."""
    step_dir = filesystem.join(self.directory, str(step))
    filesystem.check_tree(step_dir, held_by=step_dir)   # no link out of the step, no FIFO
    try:
      names = set(filesystem.listdir(step_dir))
      record = self._read_json(step, "record") if "record" in names else None
      self._check_format(step, record)
      lines = self._incompatibilities(step, abstract_state, record)
      if lines:
        raise CheckpointMismatchError(
            f"The state saved at step {step} in {self.directory} differs from the one asked "
            "for:\n  " + "\n  ".join(lines))
      state = self._read_checked(step, names, abstract_state)
    except (CheckpointMismatchError, filesystem.UnsafeNameError):
      raise
    except Exception as error:  # pylint: disable=broad-except  (any read failure: named below)
      if not self._proven_damage(step, error):
        raise self._read_error(step, error) from error
      raise CheckpointDamagedError(
          f"The checkpoint {step_dir} cannot be read: {type(error).__name__}: "
          f"{str(error)[:500]}") from error
    return state

  def _set_aside(self, step: int, error: Exception) -> None:
    self._move_aside(step, error)
    self._manager.close()
    self._manager = self._new_manager()

  def _move_aside(self, step: int, error: Exception) -> None:
    source = filesystem.join(self.directory, str(step))
    target = filesystem.join(self.corrupt_directory, f"{step}-{int(time.time())}")
    earlier = sorted(int(n) for n in filesystem.listdir(self.directory)
                     if n.isdigit() and int(n) < step)
    fallback = (f"falling back to the previous checkpoint (step {max(earlier)})" if earlier
                else "there is no earlier checkpoint: the run starts from the beginning")
    message = (f"CHECKPOINT AT STEP {step} IS UNREADABLE ({type(error).__name__}: {error}). "
               f"Moved it to {target}; {fallback}.")
    logging.error(message)
    print(f"\n!!! {message}\n", flush=True)
    if jax.process_index() == 0:  # one process moves the shared directory
      filesystem.makedirs(self.corrupt_directory)
      filesystem.rename(source, target)


# TensorStore's status codes (its errors are ValueErrors whose text starts with one) and
# TensorFlow's error classes for a store that did not answer or refused, or memory that ran out:
# never evidence against a checkpoint, whatever else the error says.
_NOT_DAMAGE_CODES = re.compile(r"\b(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|"
                               r"PERMISSION_DENIED|UNAUTHENTICATED|ABORTED|CANCELLED)\b|"
                               r"retry attempts failed|[Oo]ut of memory")
_NOT_DAMAGE_TYPES = (MemoryError, PermissionError, ConnectionError, TimeoutError,
                     remote_storage.MissingBucketError)
_NOT_DAMAGE_TF_ERRORS = ("UnavailableError", "DeadlineExceededError", "ResourceExhaustedError",
                         "PermissionDeniedError", "UnauthenticatedError", "AbortedError",
                         "CancelledError")
# What a checkpoint's own files prove: data the store reports as lost or not matching its
# checksums, bytes that were read but do not decode (TensorStore's "Error decoding b-tree node:
# ZSTD_decompressStream() failed", which comes with no status code), a file shorter than its
# index says (OUT_OF_RANGE, "Requested byte range ... is not valid for value of size N":
# truncated), metadata that does not parse.
_DAMAGE_CODES = re.compile(r"\b(DATA_LOSS|OUT_OF_RANGE)\b|Error decoding")
_DAMAGE_TYPES = (CheckpointDamagedError, json.JSONDecodeError)
_DAMAGE_TF_ERRORS = ("DataLossError",)
_MISSING_CODES = re.compile(r"\bNOT_FOUND\b|was not found in the checkpoint")
_MISSING_TYPES = (FileNotFoundError,)
_MISSING_TF_ERRORS = ("NotFoundError",)


def _with_tf_errors(types: Tuple[type, ...], tf_names: Tuple[str, ...]) -> Tuple[type, ...]:
  """`types` and the named `tf.errors` classes, once TensorFlow is imported (an error of
  TensorFlow's can come only from a TensorFlow that was imported)."""
  tf = sys.modules.get("tensorflow")
  return types + tuple(getattr(tf.errors, name) for name in tf_names) if tf else types


def restore_error_kind(error: BaseException) -> str:
  """What an error raised restoring a checkpoint shows: "damaged" (its files are not what was
  written), "missing" (a file is gone: damage if its step directory is still there), or
  "transient" (anything else, storage and memory errors first: not proven damage). Read from
  `error` and every error it was raised from or during (Orbax wraps its handlers' errors)."""
  if isinstance(error, CheckpointDamagedError):   # our own proof (fingerprints, a lost item)
    return "damaged"
  chain = _chain(error)
  not_damage = _with_tf_errors(_NOT_DAMAGE_TYPES, _NOT_DAMAGE_TF_ERRORS)
  damage = _with_tf_errors(_DAMAGE_TYPES, _DAMAGE_TF_ERRORS)
  missing = _with_tf_errors(_MISSING_TYPES, _MISSING_TF_ERRORS)
  if any(isinstance(e, not_damage) or _NOT_DAMAGE_CODES.search(str(e)) for e in chain):
    return "transient"
  if any(isinstance(e, OSError) and e.errno == errno.EIO for e in chain):
    return "transient"   # the disk or network filesystem failed to read: not the content
  if any(isinstance(e, damage) or _DAMAGE_CODES.search(str(e)) for e in chain):
    return "damaged"
  if any(isinstance(e, missing) and not isinstance(e, InputMovedError)
         or _MISSING_CODES.search(str(e)) for e in chain):
    return "missing"
  return "transient"


def _chain(error: Optional[BaseException]) -> List[BaseException]:
  """`error` and the errors it was raised from or during, outermost first."""
  chain = []
  while error is not None and all(error is not e for e in chain):
    chain.append(error)
    error = error.__cause__ or error.__context__
  return chain


def _causes(error: BaseException) -> str:
  """The first line of `error` and of its innermost cause (where the words of the storage layer
  that failed are), for a one-line report."""
  def line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:400] if text else ''}"
  chain = _chain(error)
  return line(chain[0]) if len(chain) == 1 else f"{line(chain[0])} (from {line(chain[-1])})"


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
