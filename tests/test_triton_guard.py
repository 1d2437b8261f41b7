"""TensorFlow and Triton in one process: `import tensorflow` then `import triton` segfaults, and
torch imports triton by itself wherever its default CUDA build is installed (as `pip install -e
".[test]"` gives on a machine without a CPU-only wheel preferred). bert_jax keeps Triton out of
its processes (bert_jax/__init__.py). Shown with a stand-in `triton` package on the path whose
import kills the process with SIGSEGV, as the real one does after TensorFlow: without the guard
the parity path (TensorFlow, then a transformers model's forward and backward) dies; with
`import bert_jax` first it runs."""
import importlib.machinery
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers", reason="the parity path is transformers'")

PARITY_PATH = textwrap.dedent("""
    import tensorflow
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM
    model = ModernBertForMaskedLM(ModernBertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=100, pad_token_id=0, eos_token_id=1, bos_token_id=2, cls_token_id=2,
        sep_token_id=1))
    model(torch.zeros(1, 8, dtype=torch.long)).logits.sum().backward()
    print("survived")
""")


def _run(tmp_path, prelude: str, allow: bool = False):
  package = tmp_path / "site" / "triton"
  package.mkdir(parents=True, exist_ok=True)
  (package / "__init__.py").write_text(
      "import os, signal\n"
      f"open({str(tmp_path / 'imported')!r}, 'w').close()\n"
      "os.kill(os.getpid(), signal.SIGSEGV)\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
  env.pop("BERT_JAX_ALLOW_TRITON", None)
  if allow:
    env["BERT_JAX_ALLOW_TRITON"] = "1"
  return subprocess.run([sys.executable, "-c", prelude + PARITY_PATH], env=env,
                        capture_output=True, text=True, timeout=600)


def test_without_the_guard_the_parity_path_imports_triton_and_dies(tmp_path):
  # The premise: this path really imports triton (so a real one would segfault here).
  done = _run(tmp_path, "import bert_jax\n", allow=True)
  assert done.returncode == -signal.SIGSEGV, done.stdout + done.stderr
  assert (tmp_path / "imported").exists()


def test_a_bert_jax_process_never_imports_triton(tmp_path):
  done = _run(tmp_path, "import bert_jax\n")
  assert done.returncode == 0, done.stdout + done.stderr
  assert "survived" in done.stdout
  assert not (tmp_path / "imported").exists()


# Looked up on the path itself: `import bert_jax` (conftest) has put None in sys.modules.
@pytest.mark.skipif(importlib.machinery.PathFinder.find_spec("triton") is None,
                    reason="no real triton installed (torch's CPU-only build)")
def test_with_the_real_triton_installed_the_parity_path_runs():
  # Where `pip install -e ".[test]"` gave torch's default build (as README's command and CI do).
  done = subprocess.run(
      [sys.executable, "-c", "import bert_jax\n" + PARITY_PATH
       + "import sys\nassert sys.modules.get('triton') is None\n"],
      env={k: v for k, v in os.environ.items() if k != "BERT_JAX_ALLOW_TRITON"},
      capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "survived" in done.stdout
