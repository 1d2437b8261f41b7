"""Whether this process is one of several (a pod slice or explicit flags), decided without being
fooled by the environment a parent process leaves behind.

libtpu, once loaded in a process (e.g. to compile for a TPU slice, or by `jax[tpu]` on a CPU
machine), fills in the TPU variables it could not find with its own warning text, at the C level:
`CLOUD_TPU_TASK_ID='WARNING: could not determine TPU worker number, ...'`, and likewise
`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, `CLOUD_TPU_ACCELERATOR_TYPE`. Python's `os.environ` does
not show them, but every child process inherits them: a script that used bert_jax and then launched
`python -m bert_jax.main` saw a pod slice and died in `jax.distributed.initialize()`. So:

* `scrub_placeholders()` removes any TPU variable whose value is such a placeholder (run first
  thing in `bert_jax.main`, so neither this module nor libtpu reads it);
* `multihost_mode()` says "flags" when the coordinator flags are given, "tpu_pod" only on a machine
  that has TPU chips and a valid worker list of more than one host, and None otherwise.
"""
import glob
import ipaddress
import os
import re
from typing import Mapping, MutableMapping, Optional

# The variables libtpu and jax read to find the other workers of a slice.
TPU_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_ID",
                 "CLOUD_TPU_TASK_ID", "TPU_ACCELERATOR_TYPE", "CLOUD_TPU_ACCELERATOR_TYPE",
                 "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS")
_PLACEHOLDER = re.compile(r"^\s*WARNING\b", re.IGNORECASE)
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_GOOGLE_PCI_VENDOR = "0x1ae0"   # TPU chips are PCI devices of Google's vendor id


def scrub_placeholders(environ: Optional[MutableMapping[str, str]] = None) -> list:
  """Deletes TPU variables holding libtpu's 'WARNING: could not determine ...' text (from
  `os.environ` by default, which also unsets them for libtpu and child processes); returns
  their names."""
  environ = os.environ if environ is None else environ
  # os.environ is a snapshot taken at start-up; a value set at the C level by a parent's libtpu is
  # in it, one set in this process after start-up is not (and is then none of our business).
  removed = [name for name in TPU_VARIABLES if _PLACEHOLDER.match(environ.get(name, ""))]
  for name in removed:
    del environ[name]
  return removed


def _valid_host(entry: str) -> bool:
  """A worker entry: a hostname or IP, or the older `name:id:ip` triple (no port)."""
  parts = entry.strip().split(":")
  if len(parts) == 3:
    entry = parts[2]
  elif len(parts) != 1:
    try:
      ipaddress.ip_address(entry.strip())   # a bare IPv6 address has colons
      return True
    except ValueError:
      return False
  entry = entry.strip()
  try:
    ipaddress.ip_address(entry)
    return True
  except ValueError:
    return bool(_HOSTNAME.match(entry))


def worker_list(environ: Mapping[str, str]) -> Optional[list]:
  """The slice's workers from TPU_PROCESS_ADDRESSES or TPU_WORKER_HOSTNAMES; None when absent
  or when any entry is not a hostname or IP address."""
  value = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES") or ""
  workers = [w for w in value.split(",") if w.strip()]
  if not workers or not all(_valid_host(w) for w in workers):
    return None
  return workers


def has_tpu_chips(pci_root: str = "/sys/bus/pci/devices") -> bool:
  """True on a machine with TPU chips attached (a TPU VM), as jax itself detects them."""
  for vendor_path in glob.glob(os.path.join(pci_root, "*", "vendor")):
    try:
      with open(vendor_path, encoding="utf-8") as f:
        if f.read().strip() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def multihost_mode(environ: Optional[Mapping[str, str]] = None, *, flags_given: bool = False,
                   tpu_present: Optional[bool] = None) -> Optional[str]:
  """"flags": initialise jax.distributed from --coordinator_address / --num_processes;
  "tpu_pod": a worker of a TPU slice (TPU chips here, and a valid worker list of more than one
  host or an integer worker id), which `jax.distributed.initialize()` configures by itself;
  None: one process."""
  if flags_given:
    return "flags"
  environ = os.environ if environ is None else environ
  tpu_present = has_tpu_chips() if tpu_present is None else tpu_present
  if not tpu_present:
    return None
  workers = worker_list(environ)
  if workers is not None and len(workers) > 1:
    return "tpu_pod"
  task_id = environ.get("CLOUD_TPU_TASK_ID", environ.get("TPU_WORKER_ID", "")).strip()
  return "tpu_pod" if task_id.isdigit() and not _has_worker_value(environ) else None


def _has_worker_value(environ: Mapping[str, str]) -> bool:
  """A worker-list variable is set (valid or not): with an invalid one, a task id says nothing."""
  return bool(environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES"))
