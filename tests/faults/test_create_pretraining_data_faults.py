"""`create_pretraining_data` killed half-way, on a disk that fills up, and given an empty input,
on one machine and on Beam's DirectRunner.

Outputs are written in `.NAME.partial/` beside the first output and moved into place only when
complete: kill -9 leaves no file at an output's name (an empty or half-written TFRecord file
would pass for a finished one), and the same command afterwards writes exactly the files of an
uninterrupted run. A full disk (the output directory on a small tmpfs, mounted by the test; root
only) is an error naming the outputs, with none at its name and nothing left behind; once space
is freed the same command writes the uninterrupted run's files. An input with no text is an error
naming it, with no output left behind.

The Beam kill and full disk are the longer variants (two multi-process DirectRunner runs each,
about a minute):
  python -m pytest --tier=slow tests/faults/test_create_pretraining_data_faults.py
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from data_pipelines import create_pretraining_data as cpd
from tests import test_create_pretraining_data as single_machine_tests

SEQ, PREDS, ROOT = single_machine_tests.SEQ, single_machine_tests.PREDS, single_machine_tests.ROOT
OPTIONS = dict(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=10)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return single_machine_tests.write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
  """The uninterrupted run's two output files (bytes), with the command line's defaults."""
  vocab, text = corpus
  outputs = cpd.expand_output_files(f"{tmp_path_factory.mktemp('reference')}/train.tfrecord@2")
  cpd.create_pretraining_data([text], outputs, single_machine_tests._tokenizer(vocab),
                              progress=False, **OPTIONS)
  return [open(path, "rb").read() for path in outputs]


def _command(corpus, output, *extra):
  vocab, text = corpus
  return [sys.executable, "-m", "data_pipelines.create_pretraining_data", f"--input_file={text}",
          f"--output_file={output}@2", f"--vocab_file={vocab}", "--noprogress",
          *[f"--{name}={value}" for name, value in OPTIONS.items()], *extra]


def _env():
  return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def _kill_9_then_rerun(command, output, reference):
  partial = os.path.join(os.path.dirname(output), f".{os.path.basename(output)}-00000-of-00002"
                         ".partial")
  # Its own process group: Beam's worker processes die with the run, as on a machine that died.
  process = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
  deadline = time.time() + 240
  while time.time() < deadline and not os.path.exists(partial):   # the run has started work
    time.sleep(0.01)
  os.killpg(process.pid, signal.SIGKILL)
  process.wait(timeout=60)
  outputs = cpd.expand_output_files(f"{output}@2")
  assert os.path.isdir(partial), "killed before the run started its work"
  assert not any(os.path.exists(path) for path in outputs), "an unfinished output in place"

  _rerun_writes_the_reference(command, output, reference)


def _rerun_writes_the_reference(command, output, reference):
  outputs = cpd.expand_output_files(f"{output}@2")
  rerun = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert [open(path, "rb").read() for path in outputs] == reference
  assert sorted(os.listdir(os.path.dirname(output))) == sorted(
      os.path.basename(path) for path in outputs)   # nothing of the failed run left


def _full_disk_then_rerun(small_disk, corpus, reference, *extra):
  """The output directory on a tmpfs with room for the outputs and half again: the run's
  temporary files (buckets, or Beam's pieces) and the outputs do not fit together."""
  mount_point, mount = small_disk
  room = sum(len(data) for data in reference) * 3 // 2 // 1024
  mount(room)
  output = str(mount_point / "out" / "train.tfrecord")
  command = _command(corpus, output, *extra)
  failed = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
  assert failed.returncode != 0
  outputs = cpd.expand_output_files(f"{output}@2")
  assert (f"OutputWriteError: Could not write {', '.join(outputs)}: the disk is full"
          in failed.stderr), failed.stderr[-3000:]
  assert os.listdir(os.path.dirname(output)) == []   # no output at its name, no partial files

  mount(room * 4, remount=True)   # space freed
  _rerun_writes_the_reference(command, output, reference)


@pytest.mark.slow
def test_kill_9_then_rerun_writes_the_uninterrupted_files(corpus, reference, tmp_path):
  output = str(tmp_path / "out" / "train.tfrecord")
  _kill_9_then_rerun(_command(corpus, output), output, reference)


@pytest.mark.parametrize("text", [b"", b"\n\n   \n\n"])
def test_an_input_without_text_is_named(corpus, tmp_path, text):
  vocab, _ = corpus
  source = tmp_path / "corpus.txt"
  source.write_bytes(text)
  outputs = cpd.expand_output_files(f"{tmp_path}/out/train.tfrecord@2")
  with pytest.raises(ValueError, match=rf"No instances from {source}: \d line\(s\), 0 "
                                       r"document\(s\) with text \(an empty input\?\)"):
    cpd.create_pretraining_data([str(source)], outputs, single_machine_tests._tokenizer(vocab),
                                progress=False, **OPTIONS)
  assert os.listdir(tmp_path / "out") == []


def test_an_input_without_text_is_named_on_beam(corpus, tmp_path):
  pytest.importorskip("apache_beam", reason="apache-beam is not installed (pip install "
                      "'bert_jax[beam]'), so the Beam builder (--runner) is not tested")
  from data_pipelines import beam_pipeline
  vocab, _ = corpus
  source = tmp_path / "corpus.txt"
  source.write_bytes(b"\n\n")
  outputs = cpd.expand_output_files(f"{tmp_path}/out/train.tfrecord@2")
  with pytest.raises(ValueError, match=rf"No instances from {source}"):
    beam_pipeline.create_pretraining_data(
        [str(source)], outputs, single_machine_tests._tokenizer(vocab),
        pipeline_args=["--runner=DirectRunner"], progress=False, **OPTIONS)
  assert os.listdir(tmp_path / "out") == []


@pytest.mark.slow
@pytest.mark.long_fault
def test_kill_9_then_rerun_on_beam_writes_the_uninterrupted_files(corpus, reference, tmp_path):
  pytest.importorskip("apache_beam", reason="apache-beam is not installed (pip install "
                      "'bert_jax[beam]'), so the Beam builder (--runner) is not tested")
  output = str(tmp_path / "out" / "train.tfrecord")
  _kill_9_then_rerun(_command(corpus, output, "--runner=DirectRunner",
                              "--direct_num_workers=2", "--direct_running_mode=multi_processing"),
                     output, reference)


@pytest.mark.slow
def test_a_full_disk_is_named_and_the_rerun_writes_the_uninterrupted_files(small_disk, corpus,
                                                                           reference):
  _full_disk_then_rerun(small_disk, corpus, reference)


@pytest.mark.slow
@pytest.mark.long_fault
def test_a_full_disk_on_beam_is_named_and_the_rerun_writes_the_uninterrupted_files(
    small_disk, corpus, reference):
  pytest.importorskip("apache_beam", reason="apache-beam is not installed (pip install "
                      "'bert_jax[beam]'), so the Beam builder (--runner) is not tested")
  _full_disk_then_rerun(small_disk, corpus, reference, "--runner=DirectRunner",
                        "--direct_num_workers=2", "--direct_running_mode=multi_processing")
