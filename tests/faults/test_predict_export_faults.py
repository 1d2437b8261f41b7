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


# Runs a CLI module that stops itself (SIGSTOP) just before it moves `OUTPUT.partial` into place:
# an export that writes its few files faster than a test can look still gets caught with its files
# written and unfinished (seen from outside, a look every millisecond can miss such an export).
_STOPPED_BEFORE_THE_MOVE = """
import os, runpy, signal, sys
def stop_before_the_move(event, args):
  if event == "os.rename" and os.fspath(args[0]).rstrip("/").endswith(".partial"):
    os.kill(os.getpid(), signal.SIGSTOP)
sys.addaudithook(stop_before_the_move)
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _cli_stopped_before_the_move(module, *flags):
  return [sys.executable, "-c", _STOPPED_BEFORE_THE_MOVE, module, *flags]


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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _files_under(directory):
  """{path relative to `directory`: size} of every file under it ({} if it does not exist)."""
  sizes = {}
  for d, _, names in os.walk(directory):
    for name in names:
      try:
        sizes[os.path.relpath(os.path.join(d, name), directory)] = os.path.getsize(
            os.path.join(d, name))
      except FileNotFoundError:   # renamed between the listing and the look (a writer's .tmp)
        pass
  return sizes


def _export_outputs(directory):
  """What the SavedModel in `directory` computes for a fixed batch (int32 ids, mask, segments)."""
  import tensorflow as tf
  ids = np.array([[2, 7, 9, 11, 3, 0], [2, 8, 3, 12, 13, 3]], np.int32)   # [B, S]
  mask, segments = (ids > 0).astype(np.int32), np.array([[0] * 6, [0, 0, 0, 1, 1, 1]], np.int32)
  got = tf.saved_model.load(directory).signatures[serving.SERVING_SIGNATURE](
      input_ids=tf.constant(ids), input_mask=tf.constant(mask), segment_ids=tf.constant(segments))
  return {name: value.numpy() for name, value in got.items()}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["saved_model", "huggingface"])
def test_export_killed_after_its_first_file_is_not_taken_for_finished_and_the_rerun_is_whole(
    fmt, fine_tuned_runs, tmp_path):
  """`python -m bert_jax.export` killed (-9) once a first file of the export exists and before
  the export has finished (its `signature.json`, written last, absent). Seen from outside, the
  export is stopped (SIGSTOP) as soon as a file appears under `OUTPUT.partial` (or `OUTPUT`); an
  export too fast for that stops itself just before it moves `OUTPUT.partial` into place. It is
  looked at again: it must hold a file and no `OUTPUT/signature.json`; then it is killed. After
  the kill nothing stands at OUTPUT that looks finished: OUTPUT absent with the files in
  `OUTPUT.partial`, or (killed after the move, before `signature.json`) OUTPUT without
  `signature.json`. The same command then writes the whole export: no `OUTPUT.partial` left, the
  same files as an uninterrupted export of the same model (the same bytes for `huggingface`; for
  the SavedModel the same outputs, bit for bit, and `signature.json` byte for byte)."""
  model = fine_tuned_runs["mrpc"]
  flags = lambda output: (f"--model={model}", f"--format={fmt}", f"--output={output}")
  command = lambda output: _cli("bert_jax.export", *flags(output))
  uninterrupted = str(tmp_path / "uninterrupted")
  run = subprocess.run(command(uninterrupted), cwd=demo_runs.ROOT, env=demo_runs.env(),
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  expected = _files_under(uninterrupted)
  assert serving.SIGNATURE_FILE in expected and len(expected) > 1, expected

  output = str(tmp_path / "export")
  partial, signature = output + ".partial", os.path.join(output, serving.SIGNATURE_FILE)
  log = str(tmp_path / "killed.log")
  with open(log, "w") as out:
    process = subprocess.Popen(_cli_stopped_before_the_move("bert_jax.export", *flags(output)),
                               cwd=demo_runs.ROOT, env=demo_runs.env(),
                               stdout=out, stderr=subprocess.STDOUT)
  caught, deadline = None, time.time() + 300
  try:
    while caught is None:
      assert process.poll() is None, ("the export ended before it was caught with a file "
                                      f"written:\n{open(log).read()[-3000:]}")
      assert time.time() < deadline, "no file of the export written in 300 s"
      if _files_under(partial) or os.path.exists(output):
        process.send_signal(signal.SIGSTOP)
        assert not os.path.exists(signature), "caught too late: the export had finished"
        caught = {**_files_under(partial), **_files_under(output)}
        if not caught:   # OUTPUT.partial emptied and OUTPUT made between two looks: look again
          caught = None
          process.send_signal(signal.SIGCONT)
      time.sleep(0.001)
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL

  # No export taken for a finished one.
  assert not os.path.exists(signature), "a killed export is marked finished"
  if os.path.exists(output):   # killed after the move, before signature.json
    assert not os.path.exists(partial)
    # Moved whole (one rename): every file of the export but signature.json, none cut short.
    moved = _files_under(output)
    assert sorted(moved) == sorted(n for n in expected if n != serving.SIGNATURE_FILE)
    if fmt == "huggingface":
      assert all(moved[n] == expected[n] for n in moved), (moved, expected)
    where = "OUTPUT without signature.json"
  else:
    assert _files_under(partial), "the files written before the kill are gone"
    where = "OUTPUT.partial, OUTPUT absent"

  rerun = subprocess.run(command(output), cwd=demo_runs.ROOT, env=demo_runs.env(),
                         capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert not os.path.exists(partial)
  assert sorted(_files_under(output)) == sorted(expected)
  with open(signature, "rb") as a, open(os.path.join(uninterrupted, serving.SIGNATURE_FILE),
                                        "rb") as b:
    assert a.read() == b.read()
  if fmt == "huggingface":
    for name in expected:
      with open(os.path.join(output, name), "rb") as a, open(os.path.join(uninterrupted, name),
                                                             "rb") as b:
        assert a.read() == b.read(), name
  else:
    ours, theirs = _export_outputs(output), _export_outputs(uninterrupted)
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
      np.testing.assert_array_equal(ours[name], value, err_msg=name)
  print(f"{fmt}: killed with {len(caught)} of {len(expected) - 1} files written ({where})")
