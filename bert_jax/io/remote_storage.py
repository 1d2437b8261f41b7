"""Timeouts and retries for every call to remote storage (`gs://`), set in one place.

A storage outage must end in one of two ways: the run carries on once the store answers again
(retries with exponential backoff), or, past the retry budget, it stops with an error and a
non-zero exit, so that a job scheduler restarts it. A call that waits for ever is neither. Each
layer that talks to Cloud Storage has its own settings; `configure()` derives them all from
three environment variables, before TensorFlow or TensorStore is first used:

  BERT_JAX_STORAGE_TIMEOUT_SECS      a request that moves no byte for this long is abandoned
                                     (and retried); also the connect timeout. Default 30.
  BERT_JAX_STORAGE_RETRIES           retries of a failed or abandoned request. Default 6.
  BERT_JAX_STORAGE_RETRY_DELAY_SECS  the first wait before a retry; each next one doubles, up to
                                     32 times the first. Default 1.

With the defaults a request gives up after about 7 x 30 s + 1 min of waits when the store does
not answer (5 min at most with TensorStore, whose attempts take a few seconds longer), about
1 min when it refuses connections; a shorter outage is ridden out. A run spends up to two such
budgets before it exits (the call that failed, then the metrics written on its way out): the
demo with the emulator paused for good stopped 9 minutes into the outage. Raise them for a store
known to pause longer; the tests set them to seconds.

What each layer takes from them (a layer's own variable, when set, wins):
* TensorFlow's GCS filesystem (tf.io.gfile, tf.data, TensorBoard, etils.epath):
  `GCS_REQUEST_IDLE_TIMEOUT_SECS`, `GCS_REQUEST_CONNECTION_TIMEOUT_SECS`,
  `GCS_METADATA_REQUEST_TIMEOUT_SECS` (a whole metadata request: 4 x the timeout),
  `GCS_RETRY_CONFIG_MAX_RETRIES`, `GCS_RETRY_CONFIG_INIT_DELAY_TIME_US`,
  `GCS_RETRY_CONFIG_MAX_DELAY_TIME_US`. Reads and uploads keep TensorFlow's whole-request caps
  (`GCS_READ_REQUEST_TIMEOUT_SECS`, `GCS_WRITE_REQUEST_TIMEOUT_SECS`, an hour): a large transfer
  that keeps moving is not cut; one that stalls is, by the idle timeout.
* TensorStore (Orbax's arrays): `TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS` (with
  `TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES`, 1 byte/s: "no byte moved"),
  `TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS`, and the context resource `gcs_request_retries`
  (`tensorstore_context()`, which `training_checkpoints` gives Orbax).
* The Cloud Storage client (google-cloud-storage; Orbax asks it for the bucket once): its own
  bounded defaults, 60 s per request and retries for at most 120 s.
* The emulator relay (`storage_emulator`): the timeout on each request it passes on; a request
  the emulator does not answer in time is answered 504, which the caller retries.

A bucket that does not exist (a typo in its name, a store that lost its contents) is an error,
never a loop: TensorFlow's `makedirs` walks up a `gs://` path to the first part that exists, and
a missing bucket never does, so it asked the store again and again, for ever (the demo with the
emulator restarted empty sat in its next checkpoint's `makedirs`). `guard_makedirs()` replaces
it with one that creates the levels from the bucket down; `filesystem` and
`training_checkpoints` install it on `tf.io.gfile`, which Orbax's paths (`etils.epath`) call.

A bucket name Cloud Storage rejects (`gs://bk/run`: 2 characters) is said at start, naming the
rule (`check_paths`, which every command-line program calls on its paths): TensorFlow takes any
name, TensorStore refuses one only when Orbax opens the first checkpoint's arrays, after hours.

A command-line program (`configure(leave_at_once_after_error=True)`) leaves as soon as an error
has ended it: traceback, exit status 1. Left to the interpreter's shutdown, every upload that
had just failed would be tried again, once per layer that holds it (TensorFlow's writable files
retry their upload when they are destroyed), each time through the whole retry budget: a
process that has failed, but stays alive for as long as the store is down.
"""
import os
import re
import sys
from typing import Dict, Iterable, Optional

from bert_jax.io import storage_emulator

TIMEOUT = "BERT_JAX_STORAGE_TIMEOUT_SECS"
RETRIES = "BERT_JAX_STORAGE_RETRIES"
RETRY_DELAY = "BERT_JAX_STORAGE_RETRY_DELAY_SECS"
_DEFAULTS = {TIMEOUT: 30.0, RETRIES: 6, RETRY_DELAY: 1.0}
_MAX_DELAY_FACTOR = 32   # the longest wait between two attempts, in first waits
# The layers' variables that configure() set (not the user): a child process inherits them, and
# derives them again from its own BERT_JAX_STORAGE_* values.
_DERIVED = "BERT_JAX_STORAGE_DERIVED"


def number_from_env(name: str, default: float, positive: bool = True) -> float:
  """The number in environment variable `name` (`default` when unset or empty): positive, or
  zero or more with positive=False; an error naming the variable otherwise."""
  text = os.environ.get(name, "").strip()
  if not text:
    return default
  try:
    value = float(text)
  except ValueError:
    raise ValueError(f"Environment variable {name}={text!r} is not a number.") from None
  if value < 0 or (positive and value == 0):
    raise ValueError(f"Environment variable {name}={text!r} must be "
                     f"{'positive' if positive else 'zero or more'}.")
  return value


def _number(name: str) -> float:
  return number_from_env(name, _DEFAULTS[name], positive=name == TIMEOUT)


def timeout_secs() -> float:
  return _number(TIMEOUT)


def retries() -> int:
  return int(_number(RETRIES))


def retry_delay_secs() -> float:
  return _number(RETRY_DELAY)


def configure(leave_at_once_after_error: bool = False) -> None:
  """Sets each layer's own timeout and retry variables from the BERT_JAX_STORAGE_* ones, then
  points every layer at `STORAGE_EMULATOR_HOST` if it is set (`storage_emulator.configure`).

  Idempotent; child processes inherit the result. TensorFlow reads its variables when its GCS
  filesystem is first used, TensorStore when its first HTTP transport is made: call this before.
  `leave_at_once_after_error`: for a program's entry point (never a library import), see the
  module docstring.
  """
  timeout = max(1, round(timeout_secs()))   # the layers take whole seconds
  delay_us = round(retry_delay_secs() * 1e6)
  settings = {
      "GCS_REQUEST_IDLE_TIMEOUT_SECS": timeout,
      "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": timeout,
      "GCS_METADATA_REQUEST_TIMEOUT_SECS": 4 * timeout,
      "GCS_RETRY_CONFIG_MAX_RETRIES": retries(),
      "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": delay_us,
      "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": _MAX_DELAY_FACTOR * delay_us,
      "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": timeout,
      "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": 1,
      "TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS": timeout,
  }
  derived = set(filter(None, os.environ.get(_DERIVED, "").split(",")))
  for name, value in settings.items():
    if name in derived or name not in os.environ:
      os.environ[name] = str(value)
      derived.add(name)
  os.environ[_DERIVED] = ",".join(sorted(derived))
  storage_emulator.configure(timeout_secs())
  if leave_at_once_after_error and sys.excepthook is not _leave_at_once:
    global _report_error
    _report_error = sys.excepthook
    sys.excepthook = _leave_at_once


_report_error = sys.excepthook


def _out_of_retries(error: BaseException) -> bool:
  """True if `error`, or one it was raised from or during, is a storage layer giving up."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if "retry attempts failed" in str(error):   # TensorFlow's and TensorStore's words
      return True
    error = error.__cause__ or error.__context__
  return False


def _leave_at_once(kind, error, trace) -> None:
  """An uncaught error: reported as usual, then the process exits with status 1 at once."""
  _report_error(kind, error, trace)
  if _out_of_retries(error):
    print(f"\nRemote storage did not answer within the retry budget ({TIMEOUT}="
          f"{timeout_secs():g}, {RETRIES}={retries()}, {RETRY_DELAY}={retry_delay_secs():g}; "
          "the error above names the path). A checkpoint is complete once written whole: run "
          "the same command again to resume from the newest complete one.", file=sys.stderr)
  try:
    from absl import logging  # pylint: disable=import-outside-toplevel
    logging.flush()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access


class BadBucketNameError(ValueError):
  """A `gs://` path whose bucket name Cloud Storage rejects: said at start, naming the rule."""


NAMING_RULES = "https://cloud.google.com/storage/docs/buckets#naming"
_BUCKET_CHARACTERS = re.compile(r"[a-z0-9_.-]*")
_DOTTED_DECIMAL = re.compile(r"\d{1,3}(\.\d{1,3}){3}")


def bucket_name_problem(bucket: str, written: bool = False) -> Optional[str]:
  """The rule of Cloud Storage's bucket naming that `bucket` breaks, or None.

  The rules every bucket meets (TensorStore checks them when Orbax first opens an array, so a
  name that breaks one fails only at the first checkpoint): 3 to 63 characters, or up to 222
  with dots, each dot-separated part 1 to 63 characters and neither starting nor ending with
  '-'; lowercase letters, digits, '-', '_' and '.'; a letter or digit first and last.
  `written` (a path the command writes: the bucket is the user's own) adds the rules for names a
  user can create: not an IP address, no "goog" prefix, no "google" (Google's own buckets, e.g.
  gs://google-code-archive, are read, never written)."""
  if not 3 <= len(bucket) <= 222 or ("." not in bucket and len(bucket) > 63):
    return (f"has {len(bucket)} characters: a bucket name has 3 to 63 (up to 222 when it has "
            "dots, each dot-separated part at most 63)")
  bad = next((c for c in bucket if not _BUCKET_CHARACTERS.fullmatch(c)), None)
  if bad is not None:
    return (f"has {bad!r}: a bucket name has only lowercase letters, digits, '-', '_' and '.'")
  if not (bucket[0].isalnum() and bucket[-1].isalnum()):
    return "must start and end with a letter or a digit"
  part = next((p for p in bucket.split(".")
               if not 1 <= len(p) <= 63 or p.startswith("-") or p.endswith("-")), None)
  if part is not None:
    return (f"has the dot-separated part {part!r}: each part has 1 to 63 characters and "
            "neither starts nor ends with '-'")
  if written and _DOTTED_DECIMAL.fullmatch(bucket):
    return "is an IP address in dotted-decimal notation"
  if written and bucket.startswith("goog"):
    return "starts with \"goog\" (reserved for Google)"
  if written and "google" in bucket:
    return "contains \"google\" (reserved for Google)"
  return None


def check_path(path: str, what: str, written: bool = False) -> None:
  """Raises BadBucketNameError, naming `what` (e.g. "--workdir") and the rule, if `path` is a
  `gs://` path whose bucket Cloud Storage rejects. Other paths pass."""
  if not path.startswith("gs://"):
    return
  bucket = path[len("gs://"):].partition("/")[0]
  problem = bucket_name_problem(bucket, written)
  if problem:
    raise BadBucketNameError(f"{what}={path}: the bucket name {bucket!r} {problem} "
                             f"(Cloud Storage's bucket naming rules: {NAMING_RULES}).")


def check_paths(paths: Dict[str, object], written: Iterable[str] = ()) -> None:
  """`check_path` on every `gs://` path among `paths` ({what: value}; a value may be a comma
  list, values that are not strings are skipped); the keys in `written` are outputs."""
  written = set(written)
  for what, value in paths.items():
    if isinstance(value, str) and "gs://" in value:
      for path in value.split(","):
        check_path(path.strip(), what, written=what in written)


class MissingBucketError(FileNotFoundError):
  """A `gs://` path's bucket does not exist (or these credentials cannot see it)."""


def guard_makedirs(gfile) -> None:
  """Makes `gfile.makedirs` (TensorFlow's `tf.io.gfile`) create a `gs://` path one level at a
  time, from the bucket down (a bounded number of requests, each with its retries), and raise
  `MissingBucketError` naming the bucket where TensorFlow's own would loop for ever (see the
  module docstring; checking the bucket first is not enough: it can vanish in between).
  Idempotent."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  original = gfile.makedirs
  if getattr(original, "level_by_level", False):
    return

  def makedirs(path) -> None:
    text = os.fspath(path)
    if not text.startswith("gs://"):
      original(path)
      return
    bucket, _, rest = text[len("gs://"):].partition("/")
    directory = f"gs://{bucket}"
    try:
      gfile.mkdir(directory)   # the bucket itself: NotFound if it does not exist
      for part in filter(None, rest.split("/")):
        directory += "/" + part
        try:
          gfile.mkdir(directory)
        except tf.errors.AlreadyExistsError:
          pass
    except tf.errors.NotFoundError as e:
      raise MissingBucketError(f"Cannot create {text}: the bucket gs://{bucket} does not exist "
                               "(a typo in its name, or a store that lost its contents?)") from e

  makedirs.level_by_level = True
  gfile.makedirs = makedirs


def tensorstore_context() -> Dict:
  """The TensorStore context resources that bound its Cloud Storage retries (a spec to merge
  into the context Orbax opens arrays with)."""
  delay = retry_delay_secs()
  return {"gcs_request_retries": {
      "max_retries": retries(),
      "initial_delay": f"{delay}s",
      "max_delay": f"{_MAX_DELAY_FACTOR * delay}s",
  }}
