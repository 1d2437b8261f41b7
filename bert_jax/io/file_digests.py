"""Digests of the files a run leaves for later use (a fine-tuned model's `best/`), recorded when
they are written and checked when they are read back.

A file cut short by a copy, or with bytes changed on a disk or in transit, often still decodes:
safetensors reads a truncated tensor region as an error without the file's name, and a changed
byte as a different weight, silently. The recorded size and SHA-256 turn both into an error that
names the file, before anything is computed with it.
"""
import hashlib
from typing import Dict, Iterable

from bert_jax.io import filesystem

_CHUNK = 1 << 22   # bytes read at a time: a BERT-large encoder is 1.3 GB


class DamagedFileError(ValueError):
  """A file whose size or content differs from what was recorded when it was written."""


def digest(path: str) -> Dict[str, object]:
  """{"bytes": size, "sha256": hex digest} of one file (local or a URL)."""
  sha, size = hashlib.sha256(), 0
  with filesystem.open(path, "rb") as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        break
      sha.update(chunk)
      size += len(chunk)
  return {"bytes": size, "sha256": sha.hexdigest()}


def digests(directory: str, names: Iterable[str]) -> Dict[str, Dict[str, object]]:
  """{name: digest} of the files `names` in `directory`."""
  return {name: digest(filesystem.join(directory, name)) for name in sorted(names)}


def check(directory: str, recorded: Dict[str, Dict[str, object]], record_name: str) -> None:
  """Raises DamagedFileError naming the first file of `directory` that is missing or differs
  from its digest in `recorded` (which `record_name`, e.g. best.json, holds)."""
  if not (isinstance(recorded, dict) and all(
      isinstance(name, str) and isinstance(d, dict) and isinstance(d.get("bytes"), int)
      and isinstance(d.get("sha256"), str) for name, d in recorded.items())):
    raise DamagedFileError(f"{record_name}: its digests are not {{name: {{\"bytes\": int, "
                           f"\"sha256\": str}}}} but {str(recorded)[:200]}: the file was edited "
                           "or damaged")
  for name, expected in sorted(recorded.items()):
    # A recorded name is read back from a file that may have been edited or crafted: confined
    # to `directory` (`filesystem.UnsafeNameError` otherwise) before anything is opened.
    path = filesystem.confined(directory, name, record_name)
    if not filesystem.exists(path):
      raise DamagedFileError(f"{path} is missing ({record_name} records it, "
                             f"{expected['bytes']} bytes)")
    found = digest(path)
    if found["bytes"] != expected["bytes"]:
      raise DamagedFileError(
          f"{path} has {found['bytes']} bytes where {record_name} records {expected['bytes']}: "
          "the file was cut short or replaced after it was written")
    if found["sha256"] != expected["sha256"]:
      raise DamagedFileError(
          f"{path}: its content differs from what was written (SHA-256 {found['sha256'][:16]}... "
          f"where {record_name} records {expected['sha256'][:16]}...): the file was changed "
          "on disk or in a copy")
