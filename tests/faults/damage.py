"""Ways a complete checkpoint step directory (`WORKDIR/checkpoints/<step>`) gets damaged on disk
after it was written: what the fault tests do to the newest one."""
import os


def _files(directory):
  return sorted(os.path.join(d, f) for d, _, names in os.walk(directory) for f in names)


def contents(directory) -> dict:
  """{path relative to `directory`: bytes} of every file under it: what "nothing moved or
  changed" compares."""
  found = {}
  for path in _files(directory):
    with open(path, "rb") as f:
      found[os.path.relpath(path, directory)] = f.read()
  return found


def _invert(path, offsets):
  with open(path, "r+b") as f:
    for offset in offsets:
      f.seek(offset)
      byte = f.read(1)
      f.seek(offset)
      f.write(bytes([byte[0] ^ 0xFF]))


def _data_files(step_dir):
  return [path for path in _files(os.path.join(step_dir, "state"))
          if os.path.basename(os.path.dirname(path)) == "d"]


def bytes_changed(step_dir):
  """One byte inverted in the middle of the largest array data file (an OCDBT `d/` file): the
  kind of damage no storage layer reports (the values decode, to other numbers)."""
  path = max(_data_files(step_dir), key=os.path.getsize)
  _invert(path, [os.path.getsize(path) // 2])


def bytes_changed_throughout(step_dir):
  """One byte in every KiB of every array data file inverted (a byte in the middle of one file
  may lie in a part no array is read from)."""
  for path in _data_files(step_dir):
    _invert(path, range(os.path.getsize(path) // 2 % 1024, os.path.getsize(path), 1024))


def truncated(step_dir):
  """Every file of the state cut to a third (a copy or a disk that stopped part way)."""
  for path in _files(os.path.join(step_dir, "state")):
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 3)


def no_commit_marker(step_dir):
  """Orbax's commit marker (`commit_success.txt`, of the step and of each item) removed."""
  for path in _files(step_dir):
    if os.path.basename(path) == "commit_success.txt":
      os.remove(path)


KINDS = {f.__name__: f for f in (bytes_changed, bytes_changed_throughout, truncated,
                                  no_commit_marker)}


def apply(kind: str, step_dir: str) -> None:
  assert os.path.isdir(step_dir), step_dir
  KINDS[kind](step_dir)
