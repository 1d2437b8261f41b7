"""The one filesystem layer: every path the project reads or writes goes through here, so a
`gs://` path (or any URL TensorFlow's filesystems take) works wherever a local path does.

Local paths take Python's own calls (fast, no TensorFlow import); URLs go to `tf.io.gfile`, the
layer tf.data and TensorBoard use too. Orbax checkpoints take the same URLs (`etils.epath`).

Every write to a URL is checked once it is closed: the object must be there with the bytes
written (`WriteNotLandedError`, naming the path, otherwise), so that a write a store acknowledged
but did not keep fails where it happened, not when a later step reads it back. Writers of other
libraries that write to a URL themselves (TensorFlow's SavedModel, checkpoint and summary
writers) check nothing: they write into a local directory instead (`local_directory_target`),
uploaded file by file through the same checked `copy` and then listed against what was written
(`upload_tree`, `check_tree_landed`).

Timeouts and retries of every remote call, and the Cloud Storage emulator
(`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT`, the convention of Google's client libraries: every
`gs://` path goes to that endpoint, in every layer) are set up on import, before TensorFlow or
TensorStore load (`remote_storage.configure`).

Names a run reads back from its own files (a checkpoint's `position.json`, `data/DONE`,
`best.json`, a sharded checkpoint's index) go through one rule, `confined`: a plain relative name
inside the directory it names a file of, never a way out of it (`..`, an absolute path, a link)
or a file that is not a regular one (a FIFO would hang the read, `/dev/zero` never end it).
"""
import builtins
import contextlib
import errno
import glob as glob_lib
import io
import os
import posixpath
import shutil
import stat
import tempfile
from typing import IO, Any, Callable, Dict, Iterator, List, Optional

from bert_jax.io import remote_storage

remote_storage.configure()


def is_url(path) -> bool:
  """True for `scheme://...` paths (gs://, s3://, ...), which go through tf.io.gfile."""
  return "://" in os.fspath(path)


def _gfile():
  import tensorflow as tf  # only URLs need it
  remote_storage.guard_makedirs(tf.io.gfile)   # a missing bucket: an error, not a loop
  return tf.io.gfile


def absolute(path: str) -> str:
  """An absolute local path, or the URL as given (os.path.abspath would make `gs:/b/run` of it)."""
  path = os.fspath(path)
  return path if is_url(path) else os.path.abspath(path)


def join(base: str, *parts: str) -> str:
  base = os.fspath(base)
  return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def dirname(path: str) -> str:
  path = os.fspath(path)
  return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def basename(path: str) -> str:
  path = os.fspath(path)
  return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def normpath(path: str) -> str:
  """`os.path.normpath` (`a/b/../c` -> `a/c`); for a URL, of the part after `scheme://`."""
  path = os.fspath(path)
  if is_url(path):
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{posixpath.normpath(rest)}"
  return os.path.normpath(path)


def relpath(path: str, start: str) -> str:
  if is_url(path):
    prefix = start.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path
  return os.path.relpath(path, start)


def exists(path: str) -> bool:
  return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return exists(path) and not isdir(path)


def makedirs(path: str) -> None:
  if is_url(path):
    _gfile().makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def listdir(path: str) -> List[str]:
  if is_url(path):
    return sorted(name.rstrip("/") for name in _gfile().listdir(path))
  return sorted(os.listdir(path))


def has_magic(pattern: str) -> bool:
  """True when `pattern` has glob wildcards (`*`, `?`, `[`)."""
  return glob_lib.has_magic(os.fspath(pattern))


def glob(pattern: str) -> List[str]:
  return sorted(_gfile().glob(pattern) if is_url(pattern) else glob_lib.glob(pattern))


def getsize(path: str) -> int:
  return _gfile().stat(path).length if is_url(path) else os.path.getsize(path)


def mtime(path: str) -> float:
  """Last modification time in seconds (Cloud Storage: the object's)."""
  if is_url(path):
    return _gfile().stat(path).mtime_nsec / 1e9
  return os.path.getmtime(path)


class UnsafeNameError(ValueError):
  """A name read from a file a run wrote that would reach outside the directory it names a file
  of, or a file there that is not a regular file: refused before anything is opened."""


def confined(directory: str, name, held_by: str, folder: bool = False) -> str:
  """`directory`/`name`, for a `name` read from the file `held_by` (a record a run wrote:
  position.json, DONE, best.json, an index), or `UnsafeNameError` naming `held_by` unless `name`
  is a plain relative path inside `directory`: a non-empty string, not absolute, not a URL, no
  backslash and no empty, `.` or `..` part; on a local disk also inside `directory` once links
  are resolved, and a regular file where one exists (never a FIFO, a device or a directory; with
  `folder`, a directory).

  The one rule for every name read back from a workdir: nothing is read, hashed or moved for a
  name it refuses, so an edited or crafted file cannot make a run read outside its workdir, hang
  on a FIFO or read `/dev/zero` until killed."""

  def refuse(why: str):
    where = f" ({directory.rstrip('/')}/{name})" if isinstance(name, str) and name else ""
    raise UnsafeNameError(
        f"{held_by}: the name {name!r}{where} {why}: refused, nothing read. The file was "
        "edited or comes from elsewhere; restore it from the run that wrote it, or start again "
        "in a new directory.")

  if not isinstance(name, str) or not name or "\0" in name:
    refuse("is not a file name")
  if name.startswith("/") or "\\" in name or is_url(name) or "://" in name:
    refuse(f"is not a relative name inside {directory}")
  if any(part in ("", ".", "..") for part in name.split("/")):
    refuse(f"climbs out of {directory} or is not a plain path")
  path = join(directory, name)
  if is_url(path):   # an object store has no links or special files
    return path
  root, real = os.path.realpath(directory), os.path.realpath(path)
  if os.path.commonpath([root, real]) != root:
    refuse(f"leads out of {directory} through a link (to {real})")
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    return path
  if folder and not stat.S_ISDIR(mode):
    refuse("is not a directory there")
  if not folder and not stat.S_ISREG(mode):
    refuse("is not a regular file there (a FIFO, a device or a directory)")
  return path


def check_tree(directory: str, held_by: str) -> None:
  """Every entry below a local `directory` a run wrote and reads back (a checkpoint's step, the
  data it built): regular files and directories only, nothing that leads out of it through a
  link (`confined`'s rule for each); the libraries that read them (TensorStore, tf.data) follow
  links and block on FIFOs. Nothing to check on an object store."""
  if is_url(directory) or not os.path.isdir(directory):
    return
  for parent, folders, files in os.walk(directory):
    for name in folders:
      confined(directory, relpath(join(parent, name), directory), held_by, folder=True)
    for name in files:
      confined(directory, relpath(join(parent, name), directory), held_by)


class WriteNotLandedError(OSError):
  """A write to a URL that finished without error, but whose object is then missing or holds
  another number of bytes than were written."""


def _check_landed(path: str, expected_bytes: int) -> None:
  """Fails, naming `path`, unless the store now holds `expected_bytes` bytes there."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  try:
    stat = _gfile().stat(path)
  except tf.errors.NotFoundError as e:
    raise WriteNotLandedError(
        f"{path}: the write finished, but the object is not there ({str(e).strip()}). The "
        "store acknowledged bytes it did not keep.") from e
  if stat.is_directory or stat.length != expected_bytes:
    held = "a directory" if stat.is_directory else f"{stat.length} bytes"
    raise WriteNotLandedError(f"{path}: {expected_bytes} bytes were written, but the store holds "
                              f"{held} there.")


class _GFileRaw(io.RawIOBase):
  """A binary GFile as a raw stream: wrapped in `io.BufferedReader` / `io.TextIOWrapper`, a URL
  reads as `open` reads a file (`readline(limit)`, `errors=`, `newline=`). A writer counts its
  bytes and checks at `close` that they landed (`_check_landed`)."""

  def __init__(self, gfile, mode: str, path: str = "", size_before: int = 0):
    super().__init__()
    self._file, self._mode, self._path = gfile, mode, path
    self._expected_bytes = size_before   # what the object must hold once closed

  def readable(self) -> bool:
    return "r" in self._mode

  def writable(self) -> bool:
    return "w" in self._mode or "a" in self._mode

  def readinto(self, buffer) -> int:
    data = self._file.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)

  def readall(self) -> bytes:
    return self._file.read()

  def seekable(self) -> bool:
    return self.readable()

  def seek(self, offset: int, whence: int = 0) -> int:
    self._file.seek(offset, whence)
    return self._file.tell()

  def tell(self) -> int:
    return self._file.tell()

  def write(self, data) -> int:
    data = bytes(data)
    self._file.write(data)
    self._expected_bytes += len(data)
    return len(data)

  def close(self) -> None:
    if self.closed:
      return
    try:
      self._file.close()
    finally:
      # Closed even when the upload failed: its error is raised once, here, not again from
      # `__del__` at exit (blocking there on the same unreachable store).
      super().close()
    if self.writable():
      _check_landed(self._path, self._expected_bytes)


class NotUtf8Error(ValueError):
  """A text file that is not valid UTF-8, named with the line (and byte) where it stops being."""


class _NamedTextFile(io.TextIOWrapper):
  """A text file whose decoding errors name the file and the line: Python's own say only which
  byte of which internal chunk, not of which file (a GLUE TSV saved as Latin-1, say)."""

  def __init__(self, buffer, path: str, **kwargs):
    super().__init__(buffer, **kwargs)
    self._path = path

  def _error(self, error: UnicodeDecodeError) -> NotUtf8Error:
    # Text is decoded a chunk ahead of the lines handed out, so the line is found in the bytes:
    # the newlines before the first byte that does not decode.
    with open(self._path, "rb") as raw:
      data = raw.read()
    try:
      data.decode(self.encoding)
      where = error.start
    except UnicodeDecodeError as whole:
      where = whole.start
    line = data[:where].count(b"\n") + 1
    return NotUtf8Error(f"{self._path}:{line}: not valid UTF-8 (byte "
                        f"{data[where:where + 1]!r} at offset {where}); save the file as UTF-8")

  def __next__(self):
    try:
      return super().__next__()
    except UnicodeDecodeError as e:
      raise self._error(e) from None

  def readline(self, size=-1):
    try:
      return super().readline(size)
    except UnicodeDecodeError as e:
      raise self._error(e) from None

  def read(self, size=-1):
    try:
      return super().read(size)
    except UnicodeDecodeError as e:
      raise self._error(e) from None


def open(path: str, mode: str = "r", encoding: str = "utf-8", errors: Optional[str] = None,  # noqa: A001
         newline: Optional[str] = None) -> IO:
  """A file object; text modes are UTF-8 (as everywhere in the project), and a file that is not
  raises `NotUtf8Error` naming the file and line. `errors` and `newline` mean what they mean to
  Python's `open`, for URLs too (text goes through `io.TextIOWrapper`)."""
  if is_url(path):
    size_before = getsize(path) if "a" in mode and exists(path) else 0
    raw = _GFileRaw(_gfile().GFile(path, mode.replace("t", "").replace("b", "") + "b"), mode,
                    path, size_before)
    buffered = (io.BufferedReader(raw, 1 << 20) if raw.readable()
                else io.BufferedWriter(raw, 1 << 20))
    if "b" in mode:
      return buffered
    if raw.readable():
      return _NamedTextFile(buffered, path, encoding=encoding, errors=errors, newline=newline)
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, newline=newline)
  writes = any(c in mode for c in "wax+")
  opener = _no_follow if writes else None
  if "b" in mode:
    return _opened(path, lambda: builtins.open(path, mode, opener=opener))
  if not writes:
    return _NamedTextFile(builtins.open(path, "rb"), path, encoding=encoding, errors=errors,
                          newline=newline)
  return _opened(path, lambda: builtins.open(path, mode, encoding=encoding, errors=errors,
                                             newline=newline, opener=opener))


class LinkNotFollowedError(OSError):
  """A write to a path that is a symbolic link: refused, so that a link planted in a workdir
  cannot send a run's writes (or appends) to a file outside it."""


def _no_follow(path: str, flags: int) -> int:
  return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def _opened(path: str, opening):
  """`opening()`, with the error of a write refused at a symbolic link named."""
  try:
    return opening()
  except OSError as error:
    if error.errno == errno.ELOOP and os.path.islink(path):
      raise LinkNotFollowedError(
          errno.ELOOP, f"{path} is a symbolic link (to {os.readlink(path)}): bert_jax does "
          "not write through a link it did not make; remove it, or choose another "
          "directory", path) from None
    raise


def _exclusive_temporary(path: str) -> int:
  """A new file `path`.tmp open for writing (its descriptor): any file or link already at that
  name removed first, then created with O_EXCL | O_NOFOLLOW, so the bytes never go through a
  link planted there (a link planted in between fails the creation instead)."""
  temporary = path + ".tmp"
  with contextlib.suppress(FileNotFoundError):
    os.unlink(temporary)
  return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)


class RecordWriter:
  """`tf.io.TFRecordWriter` for any path; on a URL, `close` checks that the file landed whole
  (its records plus their framing: a length, its checksum and the data's checksum)."""

  _FRAMING_BYTES = 8 + 4 + 4

  def __init__(self, path: str):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    self.path = path
    self._writer = tf.io.TFRecordWriter(path)
    self._bytes = 0

  def write(self, record: bytes) -> None:
    self._writer.write(record)
    self._bytes += len(record) + self._FRAMING_BYTES

  def close(self) -> None:
    self._writer.close()
    if is_url(self.path):
      _check_landed(self.path, self._bytes)

  def __enter__(self) -> "RecordWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# How storage layers say "no space": errno ENOSPC, TensorStore's RESOURCE_EXHAUSTED, quotas.
_NO_SPACE = ("No space left on device", "RESOURCE_EXHAUSTED", "Disk quota exceeded",
             "ENOSPC", "Failed to write")


def no_space(error: BaseException) -> bool:
  """True for an error that says the disk (or the quota) is full."""
  return getattr(error, "errno", None) == 28 or any(m in str(error) for m in _NO_SPACE)


def read_text(path: str) -> str:
  with open(path) as f:
    return f.read()


def write_text(path: str, text: str) -> None:
  """Writes `text` whole: to a temporary name first, then renamed over `path`, so a reader never
  sees half a file (Cloud Storage objects appear whole anyway)."""
  if is_url(path):
    with open(path, "w") as f:
      f.write(text)
    return
  _write_whole(path, lambda f: f.write(text.encode("utf-8")))


def _write_whole(path: str, write: Callable[[IO[bytes]], Any]) -> None:
  """A local file written whole by `write(binary file)`: into a temporary created afresh, never
  through a link (`_exclusive_temporary`), then renamed over `path`, which replaces a link at
  `path` (the directory entry) rather than writing to its target. A full disk fails at the
  flush, with no file name in Python's error: named here, the half-written temporary removed."""
  try:
    with builtins.open(_exclusive_temporary(path), "wb") as f:
      write(f)
  except OSError as error:
    with contextlib.suppress(OSError):
      os.remove(path + ".tmp")
    raise OSError(error.errno, error.strerror or str(error), path) from error
  os.replace(path + ".tmp", path)


def copy(source: str, target: str) -> None:
  if is_url(source) or is_url(target):
    _gfile().copy(source, target, overwrite=True)
    if is_url(target):
      _check_landed(target, getsize(source))
  else:
    with builtins.open(source, "rb") as f:
      _write_whole(target, lambda g: shutil.copyfileobj(f, g, 1 << 20))


def rename(source: str, target: str) -> None:
  """Moves a file or a directory tree (on Cloud Storage: object by object)."""
  if is_url(source) or is_url(target):
    if isdir(source):
      for directory, _, files in _gfile().walk(source):
        relative = relpath(directory, source) if directory != source else ""
        makedirs(join(target, relative) if relative else target)
        for name in files:
          _rename_file(join(directory, name),
                       join(target, relative, name) if relative else join(target, name))
      _gfile().rmtree(source)
    else:
      _rename_file(source, target)
  else:
    shutil.move(source, target)


def _rename_file(source: str, target: str) -> None:
  """One file to or from a URL. Across stores or on an object store (where a rename is a copy
  and a delete anyway), the source is deleted only once its copy has landed."""
  if source.startswith("file://") and target.startswith("file://"):
    _gfile().rename(source, target, overwrite=True)
    return
  copy(source, target)
  remove(source)


def remove(path: str) -> None:
  if is_url(path):
    _gfile().remove(path)
  else:
    os.remove(path)


def rmtree(path: str) -> None:
  if is_url(path):
    _gfile().rmtree(path)
  else:
    shutil.rmtree(path)


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
  """A local file path with `path`'s content, for readers that take only local files
  (safetensors, SentencePiece); a local path is yielded as it is."""
  if not is_url(path):
    yield path
    return
  with tempfile.TemporaryDirectory(prefix="bert_jax_") as directory:
    local = os.path.join(directory, basename(path))
    copy(path, local)
    yield local


@contextlib.contextmanager
def local_target(path: str) -> Iterator[str]:
  """A local path to write to, uploaded to `path` when the block ends (writers that take only
  local files); a local path is yielded as it is."""
  if not is_url(path):
    yield path
    return
  with tempfile.TemporaryDirectory(prefix="bert_jax_") as directory:
    local = os.path.join(directory, basename(path))
    yield local
    copy(local, path)


# ----------------------------------------------------------------------------------- trees


def tree_sizes(root: str) -> Dict[str, int]:
  """{path below `root`, "/"-separated: size in bytes} of every file under `root`."""
  root = root.rstrip("/") if is_url(root) else root
  found = {}
  for directory, _, files in (_gfile().walk(root) if is_url(root) else os.walk(root)):
    directory = directory.rstrip("/") if is_url(directory) else directory
    below = "" if directory == root else relpath(directory, root)
    parts = [part for part in below.replace(os.sep, "/").split("/") if part]
    for name in files:
      found["/".join(parts + [name])] = getsize(join(directory, name))
  return found


def check_tree_landed(root: str, expected: Dict[str, int]) -> None:
  """Fails, naming the first file, unless every file of `expected` ({path below `root`: bytes})
  is under `root` with its size: a tree written file by file is whole only if its listing says
  so, whatever each write answered."""
  held = tree_sizes(root) if exists(root) else {}
  missing = sorted(name for name in expected if name not in held)
  short = sorted(name for name in expected if name in held and held[name] != expected[name])
  if not missing and not short:
    return
  if missing:
    shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
    raise WriteNotLandedError(
        f"{join(root, missing[0])}: the write finished, but the object is not there ("
        f"{len(missing)} of the {len(expected)} files written to {root} are missing: {shown}). "
        "The store acknowledged files it did not keep.")
  first = short[0]
  raise WriteNotLandedError(f"{join(root, first)}: {expected[first]} bytes were written, but the "
                            f"store holds {held[first]} bytes there.")


def upload_tree(local_root: str, root: str) -> Dict[str, int]:
  """Copies the local directory `local_root` to `root` (a URL or a local path) file by file,
  each copy checked (`copy`), then checks the listing of `root` (`check_tree_landed`). Returns
  {path below the root: bytes}, what `root` holds now."""
  expected = tree_sizes(local_root)
  makedirs(root)
  for directory, _, _ in os.walk(local_root):   # empty folders too (assets/ of a SavedModel)
    below = os.path.relpath(directory, local_root)
    if below != ".":
      makedirs(join(root, *below.split(os.sep)))
  for name in sorted(expected):
    copy(os.path.join(local_root, *name.split("/")), join(root, *name.split("/")))
  check_tree_landed(root, expected)
  return expected


@contextlib.contextmanager
def local_directory_target(path: str) -> Iterator[str]:
  """A local directory to write a tree into, uploaded to `path` when the block ends, every file
  checked (`upload_tree`): for writers that write URLs themselves and check nothing. A local path
  is yielded as it is (made, if missing)."""
  if not is_url(path):
    makedirs(path)
    yield path
    return
  with tempfile.TemporaryDirectory(prefix="bert_jax_") as directory:
    yield directory
    upload_tree(directory, path)
