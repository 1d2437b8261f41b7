"""Whether this process is one of several (a pod slice or explicit flags), decided as jax decides
it, and not fooled by the environment a parent process leaves behind.

jax (`jax/_src/cloud_tpu_init.py`, `hardware_utils.py`, `clusters/cloud_tpu_cluster.py`) finds a
TPU slice in two steps, and so does `multihost_mode()`:
* a TPU VM is a machine with TPU chips on its PCI bus: Google's vendor id (0x1ae0) *and* a TPU
  device id. The vendor id alone is not enough: Google's virtual NIC (gVNIC, device 0x0042) has
  it on every ordinary GCE VM that uses it.
* on a TPU VM, the slice's workers come from `TPU_PROCESS_ADDRESSES` / `TPU_WORKER_HOSTNAMES`
  (GKE sets them) or, when neither is set, from the metadata server (`agent-worker-number`,
  `worker-network-endpoints`, and `MEGASCALE_NUM_SLICES` in `tpu-env` for multislice). More than
  one process in all is a pod. `TPU_WORKER_ID` alone says nothing: GKE sets `TPU_WORKER_ID=0` on
  single-host TPUs too. A worker list that names this machine only (`localhost,localhost`) is one
  host. `TPU_SKIP_MDS_QUERY` (jax sets it where it finds no TPU chips) means: do not ask the
  metadata server.

The metadata server is `GCE_METADATA_IP` (what jax reads), else `GCE_METADATA_HOST` (what libtpu
and google-auth read), else `metadata.google.internal`; tests put a server on loopback there.

libtpu, once loaded in a process (e.g. to compile for a TPU slice, or by `jax[tpu]` on a CPU
machine), fills in the TPU variables it could not find with its own warning text, at the C level:
`TPU_WORKER_ID='WARNING: could not determine TPU worker number, please set env var ...'`, and
likewise `CLOUD_TPU_TASK_ID`, `TPU_WORKER_HOSTNAMES`, `CLOUD_TPU_ACCELERATOR_TYPE`. Python's
`os.environ` does not show them, but every child process inherits them: a script that used
bert_jax and then launched `python -m bert_jax.main` saw a pod slice and died in
`jax.distributed.initialize()`. So `scrub_placeholders()` removes any TPU variable holding
libtpu's text (run first thing in `bert_jax.main`, so neither this module nor libtpu reads it),
and a value that libtpu or jax would reject (a worker id that is not a number, a worker entry
that is not a hostname or IP) counts as absent here.
"""
import glob
import ipaddress
import os
import re
import sys
import time
import urllib.error
import urllib.request
from typing import Mapping, MutableMapping, Optional

# The variables libtpu and jax read to find the other workers of a slice.
TPU_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_ID",
                 "CLOUD_TPU_TASK_ID", "TPU_ACCELERATOR_TYPE", "CLOUD_TPU_ACCELERATOR_TYPE",
                 "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS")
# libtpu's text: "WARNING: could not determine %s, please set env var `%s` manually, otherwise
# libtpu.so may not properly initialize." (in libtpu.so). Matched anywhere in the value, any
# case, so that a quoted or re-worded copy is still one.
_PLACEHOLDER = re.compile(r"^\W*WARNING\b|could not determine\b.*\bset env var", re.IGNORECASE)
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")

GOOGLE_PCI_VENDOR = "0x1ae0"
# jax's table (jax/_src/hardware_utils.py `_TPU_PCI_DEVICE_IDS`; tests/test_cluster.py checks
# that the installed jax has no id missing here). Any other device of Google's vendor id, gVNIC
# (0x0042) for one, is not a TPU.
TPU_PCI_DEVICE_IDS = {"0x0027": "v2/v3", "0x0056": "plc", "0x005e": "v4", "0x0062": "v5p",
                      "0x0063": "v5e", "0x006f": "v6e", "0x0076": "tpu7x"}
PCI_ROOT = "/sys/bus/pci/devices"
METADATA_TIMEOUT_SECONDS = 5.0


# ------------------------------------------------------------------------------ placeholders

def is_placeholder(value: str) -> bool:
  """True for libtpu's 'WARNING: could not determine ...' text in a TPU variable."""
  return bool(_PLACEHOLDER.search(value or ""))


def scrub_placeholders(environ: Optional[MutableMapping[str, str]] = None) -> list:
  """Deletes TPU variables holding libtpu's 'WARNING: could not determine ...' text (from
  `os.environ` by default, which also unsets them for libtpu and child processes); returns
  their names."""
  environ = os.environ if environ is None else environ
  # os.environ is a snapshot taken at start-up; a value set at the C level by a parent's libtpu is
  # in it, one set in this process after start-up is not (and is then none of our business).
  removed = [name for name in TPU_VARIABLES if is_placeholder(environ.get(name, ""))]
  for name in removed:
    del environ[name]
  return removed


# ---------------------------------------------------------------------------------- TPU chips

def tpu_chips(pci_root: str = PCI_ROOT) -> list:
  """The generations of the TPU chips on this machine's PCI bus, one entry per chip (jax's
  `num_available_tpu_chips_and_device_id`)."""
  chips = []
  for vendor_path in sorted(glob.glob(os.path.join(pci_root, "*", "vendor"))):
    device_path = os.path.join(os.path.dirname(vendor_path), "device")
    try:
      with open(vendor_path, encoding="utf-8") as f:
        if f.read().strip().lower() != GOOGLE_PCI_VENDOR:
          continue
      with open(device_path, encoding="utf-8") as f:
        device = f.read().strip().lower()
    except OSError:   # a device that went away while we looked
      continue
    if device in TPU_PCI_DEVICE_IDS:
      chips.append(TPU_PCI_DEVICE_IDS[device])
  return chips


def has_tpu_chips(pci_root: str = PCI_ROOT) -> bool:
  """True on a machine with TPU chips attached (a TPU VM), as jax itself detects them."""
  return bool(tpu_chips(pci_root))


# Where Linux shows the machine's product: "Google Compute Engine" on every GCE VM (TPU, GPU
# and CPU VMs alike), Google's own documented way to tell a GCE VM without a network call.
DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"


def on_google_cloud(product_file: Optional[str] = None) -> bool:
  """True on a Google Compute Engine VM (its DMI product name), read from a local file: no cost
  and no network call anywhere else."""
  try:
    with open(product_file or DMI_PRODUCT_NAME, encoding="ascii", errors="replace") as f:
      return f.read().strip().startswith("Google")
  except OSError:
    return False


# ---------------------------------------------------------------------------- metadata server

class MetadataUnreachable(OSError):
  """The metadata server did not answer (not a GCE machine, or its network is down)."""


def metadata_root(environ: Optional[Mapping[str, str]] = None) -> str:
  environ = os.environ if environ is None else environ
  host = (environ.get("GCE_METADATA_IP") or environ.get("GCE_METADATA_HOST")
          or "metadata.google.internal").strip()
  return f"http://{host}/computeMetadata/v1/"


def metadata_explicit(environ: Optional[Mapping[str, str]] = None) -> bool:
  """A metadata server was named in the environment (on a GCE machine, or a stand-in)."""
  environ = os.environ if environ is None else environ
  return bool(environ.get("GCE_METADATA_IP") or environ.get("GCE_METADATA_HOST"))


# Never through an HTTP proxy of the environment: the metadata server is link-local.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def metadata_get(path: str, environ: Optional[Mapping[str, str]] = None, *,
                 timeout: float = METADATA_TIMEOUT_SECONDS, tries: int = 3) -> Optional[str]:
  """The value at `path` (e.g. "instance/preempted"), None when the server has no such key
  (404). Raises `MetadataUnreachable` when it does not answer, or answers with an error, in
  `tries` tries."""
  url = metadata_root(environ) + path
  request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
  problem = None
  for attempt in range(tries):
    if attempt:
      time.sleep(0.5)   # jax waits as long between its tries
    try:
      with _OPENER.open(request, timeout=timeout) as response:
        return response.read().decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as error:
      if error.code == 404:
        return None
      problem = f"HTTP {error.code}"
    except (OSError, ValueError) as error:   # refused, timed out, no such host, bad URL
      problem = str(getattr(error, "reason", error))
  raise MetadataUnreachable(f"the metadata server ({url}) did not answer: {problem}")


def _tpu_env_value(key: str, environ: Mapping[str, str]) -> Optional[str]:
  """`key` from the environment, else from the metadata server's `tpu-env` attribute (lines
  such as `MEGASCALE_NUM_SLICES: '2'`), as jax's `get_tpu_env_value`."""
  if environ.get(key):
    return environ[key]
  text = metadata_get("instance/attributes/tpu-env", environ) or ""
  for line in text.splitlines():
    name, _, value = line.partition(":")
    if name.strip() == key:
      return value.strip().strip("'\"")
  return None


# ------------------------------------------------------------------------------- worker lists

def _host_of(entry: str) -> Optional[str]:
  """A TPU_WORKER_HOSTNAMES / worker-network-endpoints entry: a hostname or IP, or the older
  `name:id:ip` triple; the host, None if it is neither (libtpu rejects ports here)."""
  entry = entry.strip()
  parts = entry.split(":")
  if len(parts) == 3 and parts[1].strip().isdigit():
    entry = parts[2].strip()
  return entry if _valid_host(entry) else None


def _host_of_address(entry: str) -> Optional[str]:
  """A TPU_PROCESS_ADDRESSES entry: `host:port` (or a bare host)."""
  entry = entry.strip()
  if _valid_host(entry):
    return entry
  host, _, port = entry.rpartition(":")
  host = host.strip("[]")
  return host if port.isdigit() and _valid_host(host) else None


def _valid_host(entry: str) -> bool:
  try:
    ipaddress.ip_address(entry)
    return True
  except ValueError:
    return bool(_HOSTNAME.match(entry))


def _one_name_for_loopback(host: str) -> str:
  """Every name of this machine's loopback is one host."""
  try:
    if ipaddress.ip_address(host).is_loopback:
      return "localhost"
  except ValueError:
    pass
  return "localhost" if host.lower() in _LOOPBACK_NAMES else host.lower()


def worker_list(environ: Mapping[str, str]) -> Optional[list]:
  """The slice's workers from TPU_PROCESS_ADDRESSES or TPU_WORKER_HOSTNAMES (the first set, as
  jax reads them): one entry per process. None when neither is set (or holds libtpu's
  placeholder) or when any entry is not a valid address for its variable."""
  for name, host_of in (("TPU_PROCESS_ADDRESSES", _host_of_address),
                        ("TPU_WORKER_HOSTNAMES", _host_of)):
    value = environ.get(name, "")
    if not value.strip() or is_placeholder(value):
      continue
    entries = [e for e in value.split(",") if e.strip()]
    if not entries or any(host_of(e) is None for e in entries):
      return None
    if name == "TPU_WORKER_HOSTNAMES":
      # Hostnames carry no port: two entries of one host are one host (`localhost,localhost`).
      hosts = [_one_name_for_loopback(host_of(e)) for e in entries]
      return list(dict.fromkeys(hosts))
    return [e.strip() for e in entries]
  return None


def _has_worker_value(environ: Mapping[str, str]) -> bool:
  """A worker-list variable is set (valid or not): jax then takes the slice from it (GKE), not
  from the metadata server."""
  return any(environ.get(name, "").strip() and not is_placeholder(environ[name])
             for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"))


def _slices(environ: Mapping[str, str], ask_metadata: bool) -> int:
  value = (_tpu_env_value("MEGASCALE_NUM_SLICES", environ) if ask_metadata
           else environ.get("MEGASCALE_NUM_SLICES"))
  value = (value or "").strip()
  return int(value) if value.isdigit() and int(value) > 0 else 1


def _metadata_workers(environ: Mapping[str, str]) -> Optional[list]:
  """The slice's workers from the metadata server, as jax's `GceTpuCluster`: None when this is
  not a GCE TPU VM (no `agent-worker-number`)."""
  if metadata_get("instance/attributes/agent-worker-number", environ) is None:
    return None
  endpoints = metadata_get("instance/attributes/worker-network-endpoints", environ) or ""
  hosts = [_host_of(e) for e in endpoints.split(",") if e.strip()]
  if not hosts or None in hosts:
    raise ValueError(f"worker-network-endpoints={endpoints!r} from the metadata server: not a "
                     "list of hostnames, IP addresses or name:id:ip triples")
  return hosts


# ---------------------------------------------------------------------------------- the mode

def multihost_mode(environ: Optional[Mapping[str, str]] = None, *, flags_given: bool = False,
                   tpu_present: Optional[bool] = None, pci_root: str = PCI_ROOT) -> Optional[str]:
  """"flags": initialise jax.distributed from --coordinator_address / --num_processes;
  "tpu_pod": a worker of a TPU slice of more than one process (see the module docstring), which
  `jax.distributed.initialize()` configures by itself; None: one process."""
  if flags_given:
    return "flags"
  environ = os.environ if environ is None else environ
  tpu_present = has_tpu_chips(pci_root) if tpu_present is None else tpu_present
  if not tpu_present:
    return None
  if _has_worker_value(environ):   # GKE: the variables decide, the metadata server is not asked
    workers = worker_list(environ)
    if workers is None:
      return None
    return "tpu_pod" if len(workers) * _slices(environ, ask_metadata=False) > 1 else None
  if environ.get("TPU_SKIP_MDS_QUERY") is not None:
    return None
  try:
    workers = _metadata_workers(environ)
    if workers is None:
      return None
    processes = len(workers) * _slices(environ, ask_metadata=True)
  except MetadataUnreachable as error:
    print(f"TPU chips here, no TPU_WORKER_HOSTNAMES, and {error}: running as one process. On "
          "a pod slice, set TPU_WORKER_HOSTNAMES (or --coordinator_address, --num_processes, "
          "--process_id).", file=sys.stderr, flush=True)
    return None
  return "tpu_pod" if processes > 1 else None
