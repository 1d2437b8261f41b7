"""A real GLUE fine-tuning job (MRPC, `python -m bert_jax.main`, `job_runs`, with a dev set of
both labels and a learning rate under which its f1 improves: best/ is written, then replaced)
killed (SIGKILL) in the middle of replacing WORKDIR/best/: `best_model.save_best` writes the new best model whole
into `best.partial/`, then renames best/ -> best.old/, best.partial/ -> best/, and removes
best.old/. The kill comes at a moment of that swap:

* `between_the_renames`: best/ absent, best.old/ (the previous best) and best.partial/ (the new
  one) both complete;
* `before_old_is_removed`: best/ (the new one) and best.old/ both there.

Each is checked on disk after the kill (which directories exist, each complete by the digests of
its best.json, `best_location` finding the new one); the same command then resumes, puts the
complete best model back at best/ (`settle_best`), leaves nothing beside it, and ends as the
uninterrupted run: best/ passes its digest check and holds byte for byte the files of the
uninterrupted run's best/, and metrics.jsonl, results.json, the predictions and the final
parameters are those of the uninterrupted run.

How the kill lands in a window of microseconds: the job runs with a `sitecustomize.py` of this
test first on its PYTHONPATH (no library code changed), which wraps `os.rename` (what
`filesystem.rename` -> `shutil.move` calls on a local disk): after the first rename that makes
the chosen state, it writes a marker file and sleeps; the test sees the marker and kills the
process, which is then exactly in that state. The rerun is the job's command without the hook.
"""
import json
import os
import signal
import subprocess
import time

import pytest

from bert_jax.io import file_digests
from bert_jax.tasks.framework import best_model
from tests import demo_runs
from tests import finetuning_fixtures as fx
from tests.faults import job_runs
from tests.faults.job_runs import output

# The whole file is the slow tier (tests/conftest.py): end-to-end runs of minutes each.
pytestmark = pytest.mark.slow

# Runs in the job's own process (imported by `site` at start), only where the test sets
# BEST_SWAP_TEST_MARKER: after the rename of the chosen moment, say so and wait to be killed.
HOOK = '''
import os
import time

_MARKER = os.environ.get("BEST_SWAP_TEST_MARKER")
_MOMENT = os.environ.get("BEST_SWAP_TEST_MOMENT")
if _MARKER:
  _rename = os.rename

  def _renamed(source, target, *args, **kwargs):
    _rename(source, target, *args, **kwargs)
    source, target = os.fspath(source).rstrip("/"), os.fspath(target).rstrip("/")
    caught = (target.endswith(os.sep + "best.old") if _MOMENT == "between_the_renames" else
              source.endswith(os.sep + "best.partial") and target.endswith(os.sep + "best")
              and os.path.isdir(target + ".old"))
    if caught and not os.path.exists(_MARKER):
      with open(_MARKER + ".tmp", "w") as f:
        f.write(source + " -> " + target)
      _rename(_MARKER + ".tmp", _MARKER)
      time.sleep(3600)

  os.rename = _renamed
'''

MOMENTS = ("between_the_renames", "before_old_is_removed")


def _files(directory):
  names = sorted(os.listdir(directory))
  assert all(os.path.isfile(os.path.join(directory, n)) for n in names), names
  out = {}
  for name in names:
    with open(os.path.join(directory, name), "rb") as f:
      out[name] = f.read()
  return out


def _info(directory):
  with open(os.path.join(directory, best_model.BEST_INFO), encoding="utf-8") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def improving(jobs):
  """(flags, the uninterrupted run's workdir, its `job_runs.outcome`): an MRPC run whose f1
  improves after its first evaluation (evaluated every step), so that best/ is replaced."""
  glue_dir = os.path.join(jobs.root, "glue_improving")
  if not os.path.exists(glue_dir):
    fx.write_glue_dir(glue_dir, dict(train=16, dev=10), seed=1)
  flags = (f"--config.data.glue_dir={glue_dir}", "--config.learning_rate=1e-2",
           "--config.eval_every_steps=1")
  workdir = os.path.join(jobs.root, "glue-improving-reference")
  if not os.path.exists(os.path.join(workdir, "results.json")):
    result = jobs.run("glue", workdir, *flags)
    assert result.returncode == 0, result.stderr[-3000:]
  outcome = job_runs.outcome("glue", workdir)
  f1 = [r["f1"] for r in outcome["metrics"] if r["split"] == "eval"]
  assert any(b > max(f1[:i + 1]) for i, b in enumerate(f1[1:])), \
      f"the run's f1 never improves after its first evaluation: best/ is never replaced: {f1}"
  return flags, workdir, outcome


@pytest.mark.slow
@pytest.mark.parametrize("moment", MOMENTS)
def test_a_job_killed_mid_swap_of_best_resumes_to_the_uninterrupted_best(moment, jobs, improving,
                                                                          tmp_path):
  flags, reference_workdir, expected = improving
  hook = tmp_path / "hook"
  hook.mkdir()
  (hook / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
  marker = str(tmp_path / "caught")
  workdir = str(tmp_path / "run")
  log = str(tmp_path / "killed")
  env = dict(jobs.env, PYTHONPATH=f"{hook}{os.pathsep}{demo_runs.ROOT}",
             BEST_SWAP_TEST_MARKER=marker, BEST_SWAP_TEST_MOMENT=moment)
  with open(log + ".out", "w") as out, open(log + ".err", "w") as err:
    process = subprocess.Popen(jobs.command("glue", workdir, *flags), cwd=demo_runs.ROOT,
                               env=env, stdout=out, stderr=err)
  deadline = time.time() + 300
  try:
    while not os.path.exists(marker):
      assert process.poll() is None, (f"the run ended (exit {process.returncode}) without "
                                      f"replacing a best/ ({moment}):\n{output(log)[-4000:]}")
      assert time.time() < deadline, f"no best/ swap reached ({moment}) in 300 s"
      time.sleep(0.01)
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL

  # Killed in the swap: the state on disk is the one asked for, and every piece is complete.
  best, partial, old = (os.path.join(workdir, name)
                        for name in ("best", "best.partial", "best.old"))
  if moment == "between_the_renames":
    assert not os.path.exists(best) and os.path.isdir(partial) and os.path.isdir(old)
    new = partial
  else:
    assert os.path.isdir(best) and not os.path.exists(partial) and os.path.isdir(old)
    new = best
  for directory in (new, old):
    best_model.check_best(directory)   # every file as its best.json records (size, SHA-256)
  steps = {d: _info(d)["step"] for d in (new, old)}
  assert steps[new] > steps[old], steps
  assert best_model.best_location(best) == new

  # The same command (without the hook) resumes and ends as the uninterrupted run.
  rerun = jobs.run("glue", workdir, *flags)
  assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  assert "Resumed from the checkpoint at step" in rerun.stdout, rerun.stdout[-3000:]
  assert not os.path.exists(partial) and not os.path.exists(old), "left beside best/"
  # Whole: best.json records every other file of best/, each with its size and SHA-256.
  recorded = _info(best)["file_digests"]
  assert sorted(recorded) == sorted(n for n in os.listdir(best) if n != best_model.BEST_INFO)
  file_digests.check(best, recorded, os.path.join(best, best_model.BEST_INFO))
  best_model.check_best(best)
  assert _files(best) == _files(os.path.join(reference_workdir, "best"))
  job_runs.assert_same_outcome(job_runs.outcome("glue", workdir), expected)
