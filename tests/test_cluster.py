"""Pod detection is not fooled: libtpu's placeholder text in the TPU variables (inherited by any
process a bert_jax-using script launches) means one process, not a pod slice."""
import os
import subprocess
import sys
import textwrap

import pytest

from bert_jax.runtime import cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACEHOLDER = ("WARNING: could not determine TPU worker hostnames or IP addresses, please set env "
               "var `TPU_WORKER_HOSTNAMES` manually, otherwise libtpu.so may not properly "
               "initialize.")


def test_scrub_removes_placeholders_only():
  environ = {"TPU_WORKER_HOSTNAMES": PLACEHOLDER, "CLOUD_TPU_TASK_ID": "WARNING: could not",
             "TPU_WORKER_ID": "3", "HOME": "/root"}
  assert sorted(cluster.scrub_placeholders(environ)) == ["CLOUD_TPU_TASK_ID",
                                                         "TPU_WORKER_HOSTNAMES"]
  assert environ == {"TPU_WORKER_ID": "3", "HOME": "/root"}


@pytest.mark.parametrize("environ, tpu, expected", [
    ({}, False, None),
    ({"TPU_WORKER_HOSTNAMES": "t1-w-0,t1-w-1"}, False, None),       # no TPU here: never a pod
    ({"TPU_WORKER_HOSTNAMES": "t1-w-0,t1-w-1"}, True, "tpu_pod"),
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}, True, "tpu_pod"),
    ({"TPU_WORKER_HOSTNAMES": "w0:0:10.0.0.2,w1:1:10.0.0.3"}, True, "tpu_pod"),
    ({"TPU_WORKER_HOSTNAMES": "t1-w-0"}, True, None),                # one host
    ({"TPU_WORKER_HOSTNAMES": PLACEHOLDER}, True, None),
    ({"TPU_WORKER_HOSTNAMES": "host:8476,other:8476"}, True, None),  # ports are not hostnames
    ({"CLOUD_TPU_TASK_ID": "1"}, True, "tpu_pod"),
    ({"CLOUD_TPU_TASK_ID": "WARNING: could not determine TPU worker number"}, True, None),
    ({"CLOUD_TPU_TASK_ID": "1", "TPU_WORKER_HOSTNAMES": PLACEHOLDER}, True, None),
])
def test_multihost_mode(environ, tpu, expected):
  assert cluster.multihost_mode(environ, tpu_present=tpu) == expected


def test_flags_decide_when_given():
  assert cluster.multihost_mode({}, flags_given=True, tpu_present=False) == "flags"


def test_this_machine_has_no_tpu_chips():
  assert not cluster.has_tpu_chips()


def _env(**extra):
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **extra)


def _demo(workdir):
  return [sys.executable, "-m", "bert_jax.main", "--config=experiments/pretrain_demo.py:quick",
          f"--workdir={workdir}"]


def test_the_quick_demo_runs_with_placeholder_values_set_by_hand(tmp_path):
  result = subprocess.run(
      _demo(tmp_path / "work"), cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=_env(TPU_WORKER_HOSTNAMES=PLACEHOLDER,
               CLOUD_TPU_TASK_ID="WARNING: could not determine TPU worker number"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "coordinator_address" not in result.stderr


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
