"""`python -m bert_jax.predict`: a fine-tuned best/ on raw input predicts what the fine-tuning run
itself predicted for the same examples, for every output kind; bad lines are reported and
counted; chunked streaming changes nothing."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from bert_jax.tasks.datasets import glue, ner

from bert_jax.tasks.framework import best_model, output_kinds

from bert_jax.tasks.tools import fine_tuned, prediction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "experiments", "fixtures")


def _jsonl(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _predict(workdir, tmp_path, text, name="input.txt", **kwargs):
  source = tmp_path / name
  source.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
  target = tmp_path / (name + ".out.jsonl")
  messages = []
  counts = prediction.predict_file(fine_tuned.load(workdir), str(source), str(target),
                                   progress=False, report=messages.append, **kwargs)
  return counts, _jsonl(target), messages


def _dev_predictions(workdir):
  with open(os.path.join(workdir, "dev_predictions.tsv"), encoding="utf-8") as f:
    return [line.rstrip("\n").split("\t")[1] for line in f][1:]


def test_classification_equals_the_runs_dev_predictions_and_reports_bad_lines(fine_tuned_runs,
                                                                             tmp_path):
  workdir = fine_tuned_runs["mrpc"]
  dev = glue.read_examples(glue.spec_for("mrpc"), fine_tuned.load(workdir).config.data, "dev")
  lines = [f"{e.text_a}\t{e.text_b}" for e in dev]
  # A line with one column (a pair task), a blank line (not an example) and invalid UTF-8.
  text = ("\n".join(lines[:3]) + "\nonly one column\n\n").encode() + b"bad \xff\tbyte\n" + (
      "\n".join(lines[3:]) + "\n").encode()
  counts, out, messages = _predict(workdir, tmp_path, text)
  assert (counts.lines, counts.predicted, counts.bad) == (len(dev) + 2, len(dev), 2)
  assert [m.split(": ", 1)[0].rsplit(":", 1)[1] for m in messages] == ["4", "6"]
  assert "expected 2 tab-separated columns" in messages[0] and "not UTF-8" in messages[1]
  assert [o["line"] for o in out] == [1, 2, 3] + list(range(7, 7 + len(dev) - 3))
  assert [o["label"] for o in out] == _dev_predictions(workdir)
  for o in out:
    assert sorted(o["probabilities"]) == ["0", "1"]
    assert abs(sum(o["probabilities"].values()) - 1) < 1e-6
    assert o["probability"] == max(o["probabilities"].values())


def test_chunks_and_batches_do_not_change_predictions(fine_tuned_runs, tmp_path):
  workdir = fine_tuned_runs["mrpc"]
  dev = glue.read_examples(glue.spec_for("mrpc"), fine_tuned.load(workdir).config.data, "dev")
  text = "".join(f"{e.text_a}\t{e.text_b}\n" for e in dev)
  _, whole, _ = _predict(workdir, tmp_path, text, name="a.txt")
  _, chunked, _ = _predict(workdir, tmp_path, text, name="b.txt", chunk_size=3, batch_size=2,
                           length_bucket=0)
  assert [o["label"] for o in chunked] == [o["label"] for o in whole]
  for a, b in zip(whole, chunked):
    assert abs(a["probability"] - b["probability"]) < 1e-5


def test_regression_from_json_lines(fine_tuned_runs, tmp_path):
  workdir = fine_tuned_runs["stsb"]
  dev = glue.read_examples(glue.spec_for("stsb"), fine_tuned.load(workdir).config.data, "dev")
  text = "".join(json.dumps({"id": f"q{i}", "text_a": e.text_a, "text_b": e.text_b}) + "\n"
                 for i, e in enumerate(dev)) + '{"text_a": "no pair"}\n[1, 2]\n'
  counts, out, messages = _predict(workdir, tmp_path, text, name="input.jsonl")
  assert (counts.predicted, counts.bad) == (len(dev), 2)
  assert 'missing "text_b"' in messages[0] and "expected a JSON object" in messages[1]
  assert [o["id"] for o in out] == [f"q{i}" for i in range(len(dev))]
  assert [f"{o['score']:.3f}" for o in out] == _dev_predictions(workdir)


def test_tagging_gives_one_tag_per_word_as_the_run_did(fine_tuned_runs, tmp_path):
  workdir = fine_tuned_runs["ner"]
  sentences = ner.read_conll(os.path.join(FIXTURES, "conll2003_tiny.iob1"), "iob1")
  counts, out, _ = _predict(workdir, tmp_path, "".join(" ".join(s.words) + "\n"
                                                       for s in sentences))
  assert counts.predicted == len(sentences)
  with open(os.path.join(workdir, "dev_predictions.txt"), encoding="utf-8") as f:
    run_tags = [line.split()[2] for line in f if line.strip()]
  assert [t for o in out for t in o["tags"]] == run_tags
  for o, s in zip(out, sentences):
    assert o["words"] == s.words
    assert [(e["type"], e["start"], e["end"] - 1) for e in o["entities"]] == \
        output_kinds.get_entities(o["tags"])


def test_squad_json_answers_equal_the_runs_predictions(fine_tuned_runs, tmp_path):
  workdir = fine_tuned_runs["squad"]
  fixture = os.path.join(FIXTURES, "squad_v1.1_tiny.json")
  target = tmp_path / "answers.jsonl"
  counts = prediction.predict_file(fine_tuned.load(workdir), fixture, str(target),
                                   progress=False)
  out = _jsonl(target)
  with open(os.path.join(workdir, "predictions.json"), encoding="utf-8") as f:
    expected = json.load(f)
  assert counts.predicted == len(expected)
  assert {o["id"]: o["answer"] for o in out} == expected
  assert all(o["nbest"][0]["probability"] >= o["nbest"][-1]["probability"] for o in out)


def test_cli_end_to_end_and_a_best_dir_without_task_config(fine_tuned_runs, tmp_path):
  source = tmp_path / "in.txt"
  source.write_text("the cat sat\tthe dog ran\nbroken line\n", encoding="utf-8")
  target = tmp_path / "out.jsonl"
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.predict", f"--model={fine_tuned_runs['mrpc']}",
       f"--input={source}",
       f"--output={target}", "--noprogress"], capture_output=True, text=True, cwd=ROOT,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "2 examples read: 1 predicted" in result.stdout and "1 skipped" in result.stdout
  assert f"{source}:2: expected 2 tab-separated columns" in result.stderr
  assert [o["line"] for o in _jsonl(target)] == [1]
  # A best/ of a release that recorded neither task_config.json nor the files' digests.
  best = str(tmp_path / best_model.BEST_DIR)
  shutil.copytree(os.path.join(fine_tuned_runs["mrpc"], best_model.BEST_DIR), best)
  os.remove(os.path.join(best, best_model.TASK_CONFIG))
  info_path = os.path.join(best, best_model.BEST_INFO)
  with open(info_path, encoding="utf-8") as f:
    info = json.load(f)
  del info["file_digests"]
  with open(info_path, "w", encoding="utf-8") as f:
    json.dump(info, f)
  with pytest.raises(FileNotFoundError, match="task_config.json is missing"):
    fine_tuned.load(best)
