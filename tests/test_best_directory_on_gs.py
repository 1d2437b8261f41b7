"""WORKDIR/best/ on Cloud Storage (the emulator of tests/test_cloud_storage.py), where a rename
is a copy of every object and then a delete: `save_best` replaces it whole, and a swap caught
half-way (the old best/ moved aside, the new one half copied into place, best.json among the
copied objects) still leaves a complete best model that every reader finds and that the end of
the run puts back at best/."""
import os
import subprocess
import sys

import pytest

from tests import test_cloud_storage

emulator = test_cloud_storage.emulator   # the fixture: fake-gcs-server, STORAGE_EMULATOR_HOST set


def on_gs(workdir: str, scratch: str) -> None:
  """The checks, in a process of its own (the emulator's address is read when bert_jax.io is
  first imported)."""
  from bert_jax.io import filesystem
  from bert_jax.tasks.framework import best_model
  from bert_jax.tasks.tools import fine_tuned
  from tests import test_best_directory as local
  model = local.tiny_model(scratch)
  best = filesystem.join(workdir, "best")
  local.save(model, best, 1)
  local.save(model, best, 2)
  assert filesystem.listdir(workdir) == ["best"] and local.step_of(best) == 2

  local.save(model, filesystem.join(workdir, "new"), 3)
  filesystem.rename(best, best + ".old")
  filesystem.rename(filesystem.join(workdir, "new"), best + ".partial")
  for name in (best_model.BEST_INFO, "vocab.txt"):   # best.partial/ -> best/, stopped half-way
    filesystem.copy(filesystem.join(best + ".partial", name), filesystem.join(best, name))
  assert best_model.best_location(best) == best + ".partial"
  assert fine_tuned.best_directory(workdir) == best + ".partial"
  assert best_model.read_best_info(workdir)["step"] == 3
  best_model.settle_best(best)
  assert filesystem.listdir(workdir) == ["best"] and local.step_of(best) == 3


@pytest.mark.slow
def test_best_on_gs_is_replaced_whole_and_a_half_done_swap_is_found(emulator, tmp_path):
  workdir = f"gs://{test_cloud_storage.BUCKET}/best_directory"
  code = (f"from tests.test_best_directory_on_gs import on_gs; "
          f"on_gs({workdir!r}, {str(tmp_path / 'encoder')!r})")
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=test_cloud_storage._env(),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert not os.path.exists(tmp_path / "gs:")   # every path went to the bucket
