"""`bert_jax.predict` and `bert_jax.export` given what a user may get wrong, and an export killed
half-way: a missing model or input file and an empty input are errors naming the path; a best/
whose vocabulary does not match its encoder is an error naming both; a best/ whose files were cut
short, changed or lost after the run wrote them (best.json records their sizes and SHA-256), and a
training workdir whose newest checkpoint is damaged, are errors naming the file or checkpoint,
with nothing predicted or exported; kill -9 during an export
leaves no half-written export in its place (only `OUTPUT.partial`), and the same command then
writes a complete one that TensorFlow loads and that computes what bert_jax computes."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bert_jax.io import file_digests
from bert_jax.tasks.tools import fine_tuned, prediction, serving
from tests import demo_runs
from tests.faults import damage


def _cli(module, *flags):
  return [sys.executable, "-m", module, *flags]


def test_predict_without_a_model_names_the_path(tmp_path):
  source = tmp_path / "in.txt"
  source.write_text("the cat sat\n", encoding="utf-8")
  run = subprocess.run(_cli("bert_jax.predict", f"--model={tmp_path}/no_such_run",
                            f"--input={source}", f"--output={tmp_path}/out.jsonl"),
                       cwd=demo_runs.ROOT, env=demo_runs.env(), capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 1
  assert f"{tmp_path}/no_such_run: not a fine-tuned model (no best.json" in run.stderr
  assert not os.path.exists(tmp_path / "out.jsonl")


def test_predict_on_a_missing_or_empty_input_names_it(fine_tuned_runs, tmp_path):
  model = fine_tuned.load(fine_tuned_runs["mrpc"])
  with pytest.raises(FileNotFoundError, match=f"Input file not found: {tmp_path}/missing.txt"):
    prediction.predict_file(model, str(tmp_path / "missing.txt"), str(tmp_path / "out.jsonl"),
                            progress=False)
  for text in (b"", b"\n  \n\n"):
    (tmp_path / "empty.txt").write_bytes(text)
    with pytest.raises(ValueError, match=rf"{tmp_path}/empty\.txt: no examples \(the file is "
                                         "empty or holds only blank lines\\)"):
      prediction.predict_file(model, str(tmp_path / "empty.txt"), str(tmp_path / "out.jsonl"),
                              progress=False)
  assert not os.path.exists(tmp_path / "out.jsonl")


def test_a_best_dir_whose_vocabulary_does_not_match_its_encoder(fine_tuned_runs, tmp_path):
  best = str(tmp_path / "best")
  shutil.copytree(os.path.join(fine_tuned_runs["mrpc"], "best"), best)
  with open(os.path.join(best, "vocab.txt"), "a", encoding="utf-8") as f:
    f.write("extra\n")
  # As a best/ written before file digests were recorded (else the changed vocab.txt is named
  # as a damaged file first).
  info_path = os.path.join(best, "best.json")
  with open(info_path, encoding="utf-8") as f:
    info = json.load(f)
  del info["file_digests"]
  with open(info_path, "w", encoding="utf-8") as f:
    json.dump(info, f)
  with pytest.raises(ValueError, match=r"best/vocab\.txt has 41 entries but the checkpoint "
                                       r".*best has vocab_size=40"):
    fine_tuned.load(best)


def test_export_without_a_model_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match=f"Checkpoint not found: {tmp_path}/no_such_run"):
    serving.export(str(tmp_path / "no_such_run"), "saved_model", str(tmp_path / "export"))
  assert not os.path.exists(tmp_path / "export")


def test_kill_9_during_export_then_rerun_gives_a_complete_export(fine_tuned_runs, tmp_path):
  import tensorflow as tf
  model, output = fine_tuned_runs["mrpc"], str(tmp_path / "export")
  command = _cli("bert_jax.export", f"--model={model}", "--format=saved_model",
                 f"--output={output}")
  process = subprocess.Popen(command, cwd=demo_runs.ROOT, env=demo_runs.env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  # Killed while the SavedModel is being written (lowered, serialized) into OUTPUT.partial.
  while time.time() < deadline and not os.path.exists(output + ".partial"):
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=60)
  assert os.path.isdir(output + ".partial"), "killed before the export started"
  assert not os.path.exists(output), "killed too late, or a half-written export in place"

  rerun = subprocess.run(command, cwd=demo_runs.ROOT, env=demo_runs.env(), capture_output=True,
                         text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert not os.path.exists(output + ".partial")
  assert os.path.exists(os.path.join(output, serving.SIGNATURE_FILE))
  servable = serving.load(model)
  ids = np.array([[2, 7, 9, 11, 3, 0], [2, 8, 3, 12, 13, 3]], np.int32)   # [B, S]
  mask, segments = (ids > 0).astype(np.int32), np.array([[0] * 6, [0, 0, 0, 1, 1, 1]], np.int32)
  got = tf.saved_model.load(output).signatures[serving.SERVING_SIGNATURE](
      input_ids=tf.constant(ids), input_mask=tf.constant(mask), segment_ids=tf.constant(segments))
  expected = jax.jit(serving.serving_function(servable))(servable.params, ids, mask, segments)
  np.testing.assert_allclose(got["probabilities"].numpy(), np.asarray(expected["probabilities"]),
                             atol=1e-4, rtol=0)


def _damaged_copy(best, tmp_path, damage):
  """A copy of the best/ directory `best` with `damage(copy)` applied."""
  copy = str(tmp_path / "best")
  shutil.copytree(best, copy)
  damage(copy)
  return copy


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _change_a_byte(path):
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) - 5)   # inside the last tensor's values: still decodes
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))


BEST_DAMAGES = {
    "encoder_truncated": (lambda d: _truncate(os.path.join(d, "params.safetensors")),
                          r"params\.safetensors has \d+ bytes where .*best\.json records \d+"),
    "head_byte_changed": (lambda d: _change_a_byte(os.path.join(d, "head.safetensors")),
                          r"head\.safetensors: its content differs from what was written"),
    "vocabulary_missing": (lambda d: os.remove(os.path.join(d, "vocab.txt")),
                           r"vocab\.txt is missing \(.*best\.json records it"),
}


@pytest.mark.parametrize("kind", sorted(BEST_DAMAGES))
def test_a_damaged_best_dir_is_named_before_anything_is_predicted(kind, fine_tuned_runs,
                                                                   tmp_path):
  damage, message = BEST_DAMAGES[kind]
  best = _damaged_copy(os.path.join(fine_tuned_runs["mrpc"], "best"), tmp_path, damage)
  with pytest.raises(file_digests.DamagedFileError, match=message):
    fine_tuned.load(best)


def test_predict_and_export_of_a_damaged_best_dir_stop_naming_the_file(fine_tuned_runs,
                                                                      tmp_path):
  """As a user runs them: exit 1 with the file named, nothing written."""
  damage, message = BEST_DAMAGES["head_byte_changed"]
  best = _damaged_copy(os.path.join(fine_tuned_runs["mrpc"], "best"), tmp_path, damage)
  source = tmp_path / "in.txt"
  source.write_text("the cat sat\tthe dog sat\n", encoding="utf-8")
  for command, output in (
      (_cli("bert_jax.predict", f"--model={best}", f"--input={source}",
            f"--output={tmp_path}/out.jsonl"), tmp_path / "out.jsonl"),
      (_cli("bert_jax.export", f"--model={best}", "--format=huggingface",
            f"--output={tmp_path}/export"), tmp_path / "export")):
    run = subprocess.run(command, cwd=demo_runs.ROOT, env=demo_runs.env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert re.search(message, run.stderr), run.stderr[-3000:]
    assert not os.path.exists(output)
    assert not os.path.exists(str(output) + ".partial")


@pytest.mark.parametrize("kind", ["bytes_changed", "truncated"])
def test_export_of_a_pretraining_workdir_whose_newest_checkpoint_is_damaged(kind, reference,
                                                                           tmp_path):
  """The encoder of a training workdir is its newest complete checkpoint: damaged, it is named
  (with the step before it, which the user may take instead), and nothing is exported."""
  workdir = str(tmp_path / "run")
  shutil.copytree(reference("pretraining")[0], workdir)
  steps = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
  damage.apply(kind, os.path.join(workdir, "checkpoints", str(steps[-1])))
  run = subprocess.run(_cli("bert_jax.export", f"--model={workdir}", "--format=huggingface",
                            f"--output={tmp_path}/export"), cwd=demo_runs.ROOT,
                       env=demo_runs.env(), capture_output=True, text=True, timeout=300)
  assert run.returncode == 1, run.stderr[-3000:]
  assert (f"CheckpointDamagedError: The checkpoint {workdir}/checkpoints/{steps[-1]} cannot be "
          "read") in run.stderr, run.stderr[-3000:]
  assert (f"the checkpoint before it (step {steps[-2]}) is used once "
          f"{workdir}/checkpoints/{steps[-1]} is moved away") in run.stderr, run.stderr[-3000:]
  assert not os.path.exists(tmp_path / "export")
