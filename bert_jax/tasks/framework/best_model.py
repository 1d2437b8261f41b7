"""WORKDIR/best/: the best fine-tuned model of a run, kept for predict-only runs,
`bert_jax.predict` and `bert_jax.export`.

It holds the encoder (`save_pretrained`), `head.safetensors` (a model with a task head), the
vocabulary (`vocab.txt`, the SentencePiece model or the `tokenizer.json`), the run's config
(`task_config.json`), the job's own files (the embedding job's `embedding.json`) and `best.json`
(the step and metric, and the size and SHA-256 of every other file, written last). A new best model
is written whole beside the old one (`best.partial/`) and swapped in by renames, so a save that
fails or is killed never leaves the previous one half overwritten; every reader finds the complete
one (`best_location`), and a file changed after it was written is named (`check_best`).
"""
import contextlib
import json
from typing import Dict, Optional, Tuple

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from bert_jax.io import checkpoints, file_digests, filesystem
from bert_jax.model.config import BertConfig
from bert_jax.parallel import sharding
from bert_jax.runtime import outputs

BEST_DIR = "best"
HEAD_FILE = "head.safetensors"
BEST_INFO = "best.json"
# The experiment config a best/ model was fine-tuned with: what predict and export rebuild the
# task from (its head, labels, max_seq_length, casing).
TASK_CONFIG = "task_config.json"
SPM_COPY = checkpoints.SPM_CANDIDATES[0]  # the SentencePiece model saved beside best/
TOKENIZER_JSON_COPY = checkpoints.TOKENIZER_JSON_CANDIDATES[0]  # a tokenizer.json saved there


def _flat(tree) -> Dict[str, np.ndarray]:
  return {"/".join(k): np.ascontiguousarray(np.asarray(v, np.float32))
          for k, v in traverse_util.flatten_dict(jax.device_get(tree)).items()}


class BestWriteError(OSError):
  """best/ could not be written (a full disk, a store that refused it): the best model saved
  before it is still complete, and the same command, run again, writes the new one."""


def _best_siblings(directory: str) -> Tuple[str, str, str]:
  """(best/, best.partial/, best.old/): where `save_best` writes a new best/ before it swaps
  it in, and where the one it replaces waits until the new one is in place."""
  directory = directory.rstrip("/")
  return directory, directory + ".partial", directory + ".old"


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_info(directory: str) -> Dict:
  """best.json of the best/ directory `directory`: the step, metric and value of the best model
  and its files' digests, as `save_best` wrote them. The file itself is confined to `directory`
  (`filesystem.confined`: a link out of it, to a device or a directory in its place is refused
  before anything is read), and a best.json that is not such a record (cut short, emptied,
  edited) is a `file_digests.DamagedFileError` naming it, never an error that names nothing."""
  path = filesystem.confined(directory, BEST_INFO, held_by=directory)

  def damaged(why: str):
    return file_digests.DamagedFileError(
        f"{path}: {why}: the file was damaged or edited after the run wrote it (it records the "
        f"best model's step and metric value, which the run compares later evaluations "
        f"with); restore it, or the whole {directory}, from a copy of the run, or fine-tune "
        "again in a new directory")

  try:
    info = json.loads(filesystem.read_text(path))
  except ValueError as error:   # not UTF-8, not JSON
    raise damaged(f"not JSON ({str(error).splitlines()[0][:200]})") from error
  if not isinstance(info, dict):
    raise damaged(f"not a JSON object but {type(info).__name__}")
  if not isinstance(info.get("step"), int) or isinstance(info.get("step"), bool):
    raise damaged(f"its step is {info.get('step')!r}, not a whole number")
  if "value" not in info or not (info["value"] is None or _number(info["value"])):
    raise damaged(f"its value is {info.get('value', 'missing')!r}, not a number or null")
  if not isinstance(info.get("metric"), (str, type(None))):
    raise damaged(f"its metric is {info['metric']!r}, not a name or null")
  if not isinstance(info.get("file_digests", {}), dict):
    raise damaged("its file_digests are not a JSON object")
  return info


def _recorded_digests(directory: str) -> Dict[str, Dict[str, object]]:
  """best.json's {file name: digest}. best.json and every name it records are confined to best/
  (`filesystem.confined`): a name that leads out of it (a best.json edited or from elsewhere)
  is refused before any file is opened."""
  info = filesystem.join(directory, BEST_INFO)
  recorded = read_info(directory).get("file_digests") or {}
  for name in recorded:
    filesystem.confined(directory, name, held_by=info)
  return recorded


def _is_complete(directory: str) -> bool:
  """best.json there, and every file it records there with its recorded size (on Cloud
  Storage a directory moves object by object: one caught half-moved lacks some)."""
  if not filesystem.exists(filesystem.join(directory, BEST_INFO)):
    return False
  try:
    recorded = _recorded_digests(directory)
  except ValueError:   # best.json itself damaged, or a name outside best/: check_best names it
    return False
  return all(filesystem.exists(filesystem.join(directory, name))
             and filesystem.getsize(filesystem.join(directory, name)) == digest["bytes"]
             for name, digest in recorded.items())


def best_location(directory: str) -> Optional[str]:
  """Where the best model saved as `directory` (WORKDIR/best) is: `directory` itself, or after a
  save stopped between its renames the complete one beside it (`best.partial`, the new one, or
  `best.old`). None if there is none; a best/ whose files differ from their record is returned
  when nothing complete is found, so that `check_best` names the damaged file."""
  candidates = _best_siblings(directory)
  complete = [c for c in candidates if _is_complete(c)]
  if complete:
    return complete[0]
  return directory if filesystem.exists(filesystem.join(directory, BEST_INFO)) else None


def settle_best(directory: str) -> None:
  """Puts the complete best model back at `directory` after a save that stopped half-way, and
  removes what that save left beside it. At every instant a complete one stays findable by
  `best_location` (on Cloud Storage a rename is a copy, then a delete)."""
  current = next((c for c in _best_siblings(directory) if _is_complete(c)), None)
  _, partial, old = _best_siblings(directory)
  for stale in (partial, old):
    if stale != current and filesystem.exists(stale):
      filesystem.rmtree(stale)
  if current not in (None, directory):
    if filesystem.exists(directory):   # a best/ caught half-copied: the complete one is current
      filesystem.rmtree(directory)
    filesystem.rename(current, directory)


def save_best(directory: str, bert_config: BertConfig, params: Dict, info: Dict,
              tokenizer=None, task_config: Optional[ml_collections.ConfigDict] = None,
              files: Optional[Dict[str, str]] = None) -> None:
  """`directory`: an encoder `load_pretrained` reads, `head.safetensors` (when `params` has a
  `head`), `best.json`, the vocabulary (`vocab.txt`, `spm.model` or `tokenizer.json`), the
  run's config (`task_config.json`) and `files` ({name: text}, e.g. the embedding job's
  `embedding.json`): everything a later predict-only run, `bert_jax.predict` or
  `bert_jax.export` needs, each file's digest recorded in best.json.

  The new best/ is written whole beside the old one (`best.partial/`), then swapped in with two
  renames (the old one to `best.old/`, removed last): a save that fails (a full disk) or is
  killed never leaves the previous best model half overwritten."""
  params = sharding.to_host(params)  # every process: gathers parameters split across hosts
  if not outputs.is_writer():
    return
  _, partial, old = _best_siblings(directory)
  try:
    settle_best(directory)   # also removes a best.partial/ left unfinished
    filesystem.makedirs(partial)
    _write_best_files(partial, bert_config, params, info, tokenizer, task_config, files or {})
    if filesystem.exists(directory):
      filesystem.rename(directory, old)
    filesystem.rename(partial, directory)
    if filesystem.exists(old):
      filesystem.rmtree(old)
  except Exception as error:  # pylint: disable=broad-except  (safetensors' own errors too)
    with contextlib.suppress(OSError):   # the space an unfinished one took, given back
      if filesystem.exists(partial) and not _is_complete(partial):
        filesystem.rmtree(partial)
    kept = best_location(directory)
    full = filesystem.no_space(error)
    raise BestWriteError(
        f"Could not write the best model of step {info.get('step')} in {partial} (to replace "
        f"{directory}): {'the disk is full' if full else type(error).__name__} "
        f"({str(error).splitlines()[0][:300] if str(error) else ''}). Nothing complete was "
        "lost: " + (f"{kept} holds the best model before it" if kept else
                    "there was no best model before it")
        + f"; {'free space and ' if full else ''}run the same command again to resume.") from error


def _write_best_files(directory: str, bert_config: BertConfig, params: Dict, info: Dict,
                      tokenizer, task_config: Optional[ml_collections.ConfigDict],
                      files: Dict[str, str]) -> None:
  from safetensors.numpy import save
  checkpoints.save_pretrained(bert_config, {"bert": params["bert"]}, directory)
  if getattr(tokenizer, "spm_model_file", None):
    filesystem.copy(tokenizer.spm_model_file, filesystem.join(directory, SPM_COPY))
  elif getattr(tokenizer, "tokenizer_file", None):   # one tokenizer.json, whatever it was read from
    filesystem.write_text(filesystem.join(directory, TOKENIZER_JSON_COPY),
                          tokenizer.tokenizer_json())
  elif getattr(tokenizer, "vocab_file", None):
    filesystem.copy(tokenizer.vocab_file, filesystem.join(directory, "vocab.txt"))
  if "head" in params:   # an encoder alone (the embedding job's) has none
    with filesystem.open(filesystem.join(directory, HEAD_FILE), "wb") as f:
      f.write(save(_flat(params["head"])))
  for name, text in files.items():
    filesystem.write_text(filesystem.join(directory, name), text)
  if task_config is not None:
    filesystem.write_text(filesystem.join(directory, TASK_CONFIG),
                          task_config.to_json_best_effort(indent=2, sort_keys=True))
  # Written last: a best/ directory with best.json is complete. It records every other file's
  # size and SHA-256, which `check_best` compares before the files are used.
  digests = file_digests.digests(
      directory, [n for n in filesystem.listdir(directory)
                  if n != BEST_INFO and filesystem.isfile(filesystem.join(directory, n))])
  filesystem.write_text(filesystem.join(directory, BEST_INFO),
                        json.dumps(dict(info, file_digests=digests), indent=2, sort_keys=True))


def check_best(directory: str) -> None:
  """Raises file_digests.DamagedFileError naming a file of best/ that was cut short or changed
  after the run wrote it, or an entry of best.json that is not a file of best/ (best/ written
  before digests were recorded is taken as it is)."""
  recorded = _recorded_digests(directory)
  if recorded:
    file_digests.check(directory, recorded, filesystem.join(directory, BEST_INFO))


def read_head(directory: str) -> Dict:
  """The task head's parameters saved by `save_best`."""
  from safetensors.numpy import load
  with filesystem.open(filesystem.join(directory, HEAD_FILE), "rb") as f:
    flat = load(f.read())
  return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


def load_best(directory: str, bert_config: BertConfig) -> Dict:
  check_best(directory)
  _, encoder = checkpoints.load_pretrained(directory)
  encoder = checkpoints.to_model_layout(encoder, bert_config)
  return {"bert": encoder["bert"], "head": read_head(directory)}


def read_best_info(workdir: str) -> Optional[Dict]:
  """best.json (`read_info`) of WORKDIR's best model, None if it has none."""
  directory = best_location(filesystem.join(workdir, BEST_DIR))
  if directory is None:
    return None
  return read_info(directory)
