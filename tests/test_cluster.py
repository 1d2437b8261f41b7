"""Pod detection as jax does it (bert_jax/runtime/cluster.py): TPU chips by their PCI device
ids, the slice's workers from the GKE variables or the metadata server, and libtpu's placeholder
text (inherited by any process a bert_jax-using script launches) meaning one process, not a pod.
Each environment is a faked sysfs tree, its variables and, where jax would ask it, a metadata
server on loopback."""
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from bert_jax.runtime import cluster
from tests.metadata_server import MetadataServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACEHOLDER = ("WARNING: could not determine TPU worker hostnames or IP addresses, please set env "
               "var `TPU_WORKER_HOSTNAMES` manually, otherwise libtpu.so may not properly "
               "initialize.")
WORKER_PLACEHOLDER = ("WARNING: could not determine TPU worker number, please set env var "
                      "`TPU_WORKER_ID` manually, otherwise libtpu.so may not properly initialize.")

GOOGLE = "0x1ae0"
GVNIC = (GOOGLE, "0x0042")           # Google's virtual NIC: Google's vendor id, not a TPU
INTEL_HOST_BRIDGE = ("0x8086", "0x1237")
NVIDIA_H100 = ("0x10de", "0x2330")
V2_V3, V4, V5P, V5E, V6E = ((GOOGLE, d) for d in ("0x0027", "0x005e", "0x0062", "0x0063",
                                                  "0x006f"))


def _sysfs(root, devices):
  """/sys/bus/pci/devices as the kernel lays it out: one folder per device, `vendor` and
  `device` files of hex ids."""
  root.mkdir()
  for i, (vendor, device) in enumerate(devices):
    folder = root / f"0000:00:{i + 4:02x}.0"
    folder.mkdir()
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(device + "\n")
    (folder / "class").write_text("0x120000\n")
  return str(root)


GCE_BASE = {"instance/hostname": "vm.c.project.internal", "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE"}


def _pod_metadata(worker, endpoints, tpu_env=""):
  return dict(GCE_BASE, **{"instance/attributes/agent-worker-number": str(worker),
                           "instance/attributes/worker-network-endpoints": endpoints,
                           "instance/attributes/tpu-env": tpu_env})


# (name, PCI devices, variables, metadata server's keys, expected mode, metadata server asked)
ENVIRONMENTS = [
    ("plain CPU machine", [INTEL_HOST_BRIDGE], {}, {}, None, False),
    ("GCE VM with gVNIC and a GPU", [INTEL_HOST_BRIDGE, GVNIC, NVIDIA_H100], {}, GCE_BASE, None,
     False),
    ("GCE VM with gVNIC and stray TPU variables", [GVNIC],
     {"TPU_WORKER_HOSTNAMES": "t-w-0,t-w-1", "TPU_WORKER_ID": "1"}, GCE_BASE, None, False),
    ("GKE single-host v5e: TPU_WORKER_ID=0 alone", [GVNIC] + [V5E] * 4,
     {"TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "v5litepod-4"}, GCE_BASE, None, True),
    ("GKE single host: TPU_WORKER_HOSTNAMES=localhost,localhost", [V6E] * 4,
     {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost,localhost"}, GCE_BASE, None, False),
    ("GKE single host: 127.0.0.1 and localhost", [V6E] * 4,
     {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "127.0.0.1,localhost"}, GCE_BASE, None, False),
    ("GKE v5e pod worker (v5litepod-16)", [GVNIC] + [V5E] * 4,
     {"TPU_WORKER_ID": "2", "TPU_ACCELERATOR_TYPE": "v5litepod-16",
      "TPU_WORKER_HOSTNAMES": "job-0-0.job,job-0-1.job,job-0-2.job,job-0-3.job"}, GCE_BASE,
     "tpu_pod", False),
    ("GKE v5p pod worker by process addresses", [V5P] * 4,
     {"TPU_WORKER_ID": "1", "TPU_PROCESS_ADDRESSES": "10.8.0.4:8476,10.8.0.5:8476"}, GCE_BASE,
     "tpu_pod", False),
    ("GKE multislice, one host per slice", [V5E] * 8,
     {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "job-1-0.job", "MEGASCALE_NUM_SLICES": "2"},
     GCE_BASE, "tpu_pod", False),
    ("GKE worker list with ports (libtpu rejects it)", [V4] * 4,
     {"TPU_WORKER_HOSTNAMES": "host:8476,other:8476"}, GCE_BASE, None, False),
    ("GCE v4-32 pod worker (name:id:ip endpoints)", [GVNIC] + [V4] * 4, {},
     _pod_metadata(1, "t-w-0:0:10.130.0.2,t-w-1:1:10.130.0.3,t-w-2:2:10.130.0.4,"
                      "t-w-3:3:10.130.0.5"), "tpu_pod", True),
    ("GCE v5p-16 pod worker (hostname endpoints)", [V5P] * 4, {},
     _pod_metadata(0, "10.0.0.2,10.0.0.3"), "tpu_pod", True),
    ("GCE v5e pod worker whose libtpu left placeholders", [V5E] * 4,
     {"TPU_WORKER_ID": WORKER_PLACEHOLDER, "CLOUD_TPU_TASK_ID": WORKER_PLACEHOLDER},
     _pod_metadata(3, "10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5"), "tpu_pod", True),
    ("GCE single-host v5e-8 TPU VM", [V5E] * 8, {}, _pod_metadata(0, "10.0.0.2"), None, True),
    ("GCE multislice of two v5e-8 (tpu-env)", [V5E] * 8, {},
     _pod_metadata(0, "10.0.0.2", "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '0'"),
     "tpu_pod", True),
    ("GCE single-host v4 with libtpu's placeholders", [V4] * 4,
     {"TPU_WORKER_HOSTNAMES": PLACEHOLDER, "TPU_WORKER_ID": WORKER_PLACEHOLDER,
      "CLOUD_TPU_TASK_ID": WORKER_PLACEHOLDER}, _pod_metadata(0, "10.0.0.2"), None, True),
    ("TPU_SKIP_MDS_QUERY: the metadata server is not asked", [V4] * 4,
     {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_ID": "1"}, _pod_metadata(1, "10.0.0.2,10.0.0.3"),
     None, False),
    ("Colab TPU v5e-1", [V5E], {"COLAB_RELEASE_TAG": "release-colab_20251120-060052_RC00",
                                "TPU_ACCELERATOR_TYPE": "v5litepod-1"}, GCE_BASE, None, True),
    ("Colab TPU v2-8", [V2_V3] * 4, {"COLAB_RELEASE_TAG": "release-colab_20251120-060052_RC00",
                                     "TPU_WORKER_ID": "0"}, GCE_BASE, None, True),
]


@pytest.mark.parametrize("name, devices, variables, metadata, expected, asked", ENVIRONMENTS,
                         ids=[e[0] for e in ENVIRONMENTS])
def test_environments(tmp_path, name, devices, variables, metadata, expected, asked):
  del name
  pci_root = _sysfs(tmp_path / "pci", devices)
  with MetadataServer(metadata) as server:
    environ = dict(variables, GCE_METADATA_IP=server.address)
    assert cluster.multihost_mode(environ, pci_root=pci_root) == expected
  assert bool(server.asked) == asked, server.asked


def test_tpu_chips_by_device_id_not_by_vendor(tmp_path):
  root = _sysfs(tmp_path / "pci", [GVNIC, GVNIC, INTEL_HOST_BRIDGE, V5E, V5E, V4])
  assert cluster.tpu_chips(root) == ["v5e", "v5e", "v4"]
  assert not cluster.has_tpu_chips(_sysfs(tmp_path / "gvnic", [GVNIC, NVIDIA_H100]))


def test_every_tpu_device_id_jax_knows_is_known_here():
  from jax._src import hardware_utils
  jax_ids = set(hardware_utils._TPU_PCI_DEVICE_IDS)   # pylint: disable=protected-access
  assert jax_ids <= set(cluster.TPU_PCI_DEVICE_IDS), jax_ids - set(cluster.TPU_PCI_DEVICE_IDS)
  assert "0x0042" not in cluster.TPU_PCI_DEVICE_IDS


def test_the_metadata_server_is_asked_as_jax_asks_it():
  """GCE_METADATA_IP (jax's variable) first, GCE_METADATA_HOST (libtpu's) next; the header the
  real server insists on."""
  with MetadataServer({"instance/attributes/agent-worker-number": "3"}) as server:
    for environ in ({"GCE_METADATA_IP": server.address},
                    {"GCE_METADATA_HOST": server.address},
                    {"GCE_METADATA_IP": server.address, "GCE_METADATA_HOST": "192.0.2.1"}):
      assert cluster.metadata_get("instance/attributes/agent-worker-number", environ) == "3"
      assert cluster.metadata_get("instance/attributes/no-such-key", environ) is None
  assert cluster.metadata_root({}) == "http://metadata.google.internal/computeMetadata/v1/"


def test_an_unreachable_metadata_server_means_one_process_with_a_word(tmp_path, capsys):
  closed = socket.socket()
  closed.bind(("127.0.0.1", 0))
  address = f"127.0.0.1:{closed.getsockname()[1]}"   # bound, never listening: refused
  try:
    mode = cluster.multihost_mode({"GCE_METADATA_IP": address},
                                  pci_root=_sysfs(tmp_path / "pci", [V4] * 4))
  finally:
    closed.close()
  assert mode is None
  assert "did not answer" in capsys.readouterr().err


def test_flags_decide_when_given():
  assert cluster.multihost_mode({}, flags_given=True, tpu_present=False) == "flags"


def test_this_machine_is_detected_as_jax_detects_it():
  from jax._src import hardware_utils
  chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  assert len(cluster.tpu_chips()) == chips


# ---------------------------------------------------------------------------- placeholders

@pytest.mark.parametrize("value", [
    PLACEHOLDER, WORKER_PLACEHOLDER, f"'{PLACEHOLDER}'", PLACEHOLDER.lower(),
    "libtpu: could not determine TPU accelerator type, please set env var "
    "`TPU_ACCELERATOR_TYPE` manually",
])
def test_placeholders_are_recognised(value):
  assert cluster.is_placeholder(value)


@pytest.mark.parametrize("value", ["t1-w-0,t1-w-1", "3", "v5litepod-16", "2,2,1", ""])
def test_real_values_are_not_placeholders(value):
  assert not cluster.is_placeholder(value)


def test_scrub_removes_placeholders_only():
  environ = {"TPU_WORKER_HOSTNAMES": PLACEHOLDER, "CLOUD_TPU_TASK_ID": "WARNING: could not",
             "TPU_ACCELERATOR_TYPE": f'"{WORKER_PLACEHOLDER}"', "TPU_WORKER_ID": "3",
             "HOME": "/root"}
  assert sorted(cluster.scrub_placeholders(environ)) == [
      "CLOUD_TPU_TASK_ID", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES"]
  assert environ == {"TPU_WORKER_ID": "3", "HOME": "/root"}


def test_the_placeholders_libtpu_really_leaves_are_scrubbed_and_make_no_pod(tmp_path):
  """The values libtpu sets at the C level in a process that loaded it (what a child inherits),
  read from a real child: each is recognised, and on a (faked) single-host TPU VM they make one
  process."""
  pytest.importorskip("libtpu")
  script = textwrap.dedent("""
      import os, subprocess, sys, jax
      from jax._src import xla_bridge
      try:
        xla_bridge.get_backend("tpu")     # loads libtpu, which fills the variables it lacks
      except Exception:
        pass
      out = subprocess.run(["env", "-0"], capture_output=True, text=True).stdout
      sys.stdout.write(out)
      """)
  env = {k: v for k, v in os.environ.items() if k not in cluster.TPU_VARIABLES}
  # ALLOW_MULTIPLE_LIBTPU_LOAD: past libtpu's one-process lockfile, which any other JAX process
  # on the machine that probed for a TPU holds (a run in the background, another test worker).
  env.update(JAX_PLATFORMS="cpu,tpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
  inherited = dict(entry.split("=", 1) for entry in result.stdout.split("\0") if "=" in entry)
  filled = {k: v for k, v in inherited.items() if k in cluster.TPU_VARIABLES}
  assert filled, f"libtpu set no TPU variable here: {result.stderr[-2000:]}"
  assert sorted(cluster.scrub_placeholders(dict(filled))) == sorted(filled)
  with MetadataServer(_pod_metadata(0, "10.0.0.2")) as server:
    environ = dict(filled, GCE_METADATA_IP=server.address)
    assert cluster.multihost_mode(environ, pci_root=_sysfs(tmp_path / "pci", [V4] * 4)) is None


def _env(**extra):
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **extra)


def _demo(workdir):
  return [sys.executable, "-m", "bert_jax.main", "--config=experiments/pretrain_demo.py:quick",
          f"--workdir={workdir}"]


@pytest.mark.slow
def test_the_quick_demo_runs_with_placeholder_values_set_by_hand(tmp_path):
  result = subprocess.run(
      _demo(tmp_path / "work"), cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=_env(TPU_WORKER_HOSTNAMES=PLACEHOLDER,
               CLOUD_TPU_TASK_ID="WARNING: could not determine TPU worker number"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "coordinator_address" not in result.stderr


@pytest.mark.slow
def test_a_script_that_used_bert_jax_can_launch_a_run(tmp_path):
  """The reported reproduction: load a workdir's model (jax with libtpu installed fills the TPU
  variables of the process with placeholders), then start `bert_jax.main` with Popen."""
  first = tmp_path / "first"
  subprocess.run(_demo(first), cwd=ROOT, env=_env(), check=True, capture_output=True,
                 timeout=600)
  script = textwrap.dedent(f"""
      import subprocess, sys
      from bert_jax.io import checkpoints
      checkpoints.load_pretrained({str(first)!r})
      child = subprocess.Popen({_demo(tmp_path / "second")!r}, stderr=subprocess.PIPE, text=True)
      _, err = child.communicate(timeout=600)
      sys.stderr.write(err)
      sys.exit(child.returncode)
      """)
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert os.path.exists(tmp_path / "second" / "metrics.jsonl")
