"""A pre-training step a newcomer can trace: from `python -m bert_jax.main --config=...` to the
loss and the optimizer update in at most 8 files, for every family, and WORKSPACE.md's table
("One pre-training step, traced") lists exactly the files the run passes through.

The measure is `tests/step_trace.py`: a real one-step run of each family's quick experiment with a
profile hook (the files of the functions on the call stack where the job is made, where the
step's forward enters the model, where it computes the loss and where it applies the update)."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = {"bert": "experiments/pretrain_demo.py:quick",
               "modernbert": "experiments/pretrain_modernbert.py:quick",
               "roberta": "experiments/pretrain_roberta.py:quick"}


def _trace(experiment: str, tmp_path) -> dict:
  out = tmp_path / "trace.json"
  env = dict(os.environ, TMPDIR=str(tmp_path))   # the run's workdir
  result = subprocess.run(
      [sys.executable, "-m", "tests.step_trace", f"--experiment={experiment}",
       "--demo_documents=50", f"--json={out}"],
      capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(out.read_text())


def workspace_files(family: str):
  """The files WORKSPACE.md's traced-step table lists for `family`, in order."""
  with open(os.path.join(ROOT, "WORKSPACE.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## One pre-training step, traced", 1)[1].split("\n## ", 1)[0]
  files = []
  for row in re.findall(r"^\| \d+ \| (.*?) \| (.*?) \|$", section, re.M):
    if row[0].startswith("`"):
      files.append(row[0].strip("`"))
    else:   # the family's own row: "bert: `file` (...); modernbert and roberta: `file` ..."
      for names, path in re.findall(r"([a-z ]+): `([^`]+)`", row[1]):
        if family in names.replace(" and ", " ").split():
          files.append(path)
  return files


@pytest.mark.parametrize("family", [
    "bert",
    pytest.param("modernbert", marks=pytest.mark.slow),
    pytest.param("roberta", marks=pytest.mark.slow)])
def test_a_pre_training_step_traces_in_eight_files_as_workspace_lists(family, tmp_path):
  trace = _trace(EXPERIMENTS[family], tmp_path)
  assert len(trace["files"]) <= 8, trace
  assert trace["files"] == workspace_files(family), trace["points"]
  points = trace["points"]
  assert points["job"][-1] == "bert_jax/tasks/jobs/pretraining.py"
  assert points["loss"][-1] == points["update"][-1] == "bert_jax/runtime/step.py"
  # The step ran through the same `jobs.run(registry.job(...))` as every job.
  assert points["forward"][:4] == ["bert_jax/main.py", "bert_jax/tasks/registry.py",
                                   "bert_jax/runtime/job.py", "bert_jax/runtime/loop.py"]
  assert f"bert_jax/families/{family}/__init__.py" in trace["calls"]["pretraining_model"]
  assert "bert_jax/runtime/optim.py" in trace["calls"]["create_optimizer"]


def test_workspace_lists_a_model_file_for_every_family():
  from bert_jax import families
  for name in families.FAMILIES:
    files = workspace_files(name)
    assert len(files) == 8 and all(os.path.exists(os.path.join(ROOT, f)) for f in files), files
