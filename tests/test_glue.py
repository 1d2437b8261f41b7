"""GLUE readers (official folder layout and TFDS), metrics, bad input and submission files."""
import os

import ml_collections
import numpy as np
import pytest

from bert_jax.tasks.datasets import glue
from tests import finetuning_fixtures as fx

ALL = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
SIZES = dict(train=7, dev=5, test=3)


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
  return fx.write_glue_dir(str(tmp_path_factory.mktemp("glue")), SIZES)


def _data(glue_dir, source="tsv"):
  return ml_collections.ConfigDict(dict(source=source, glue_dir=glue_dir, tfds_data_dir=""))


@pytest.mark.parametrize("name", ALL)
def test_reader_reads_every_split_of_the_official_layout(glue_dir, name):
  spec = glue.spec_for(name)
  for split in ("train",) + spec.eval_splits + spec.test_splits:
    examples = glue.read_examples(spec, _data(glue_dir), split)
    expected = SIZES["train" if split == "train" else "test" if split in spec.test_splits
                     else "dev"]
    assert len(examples) == expected, (name, split)
    for e in examples:
      assert e.text_a and set(e.text_a.split()) <= set(fx.WORDS)
      assert (e.text_b is None) == (name in ("cola", "sst2"))
      if split in spec.test_splits:
        assert e.label is None
      elif spec.is_regression:
        assert 0.0 <= e.label <= 5.0
      else:
        assert e.label in spec.labels
    if split in spec.test_splits:   # the submission's index column, in file order
      assert [e.guid for e in examples] == [str(i) for i in range(expected)]


def test_reader_values_match_the_file(glue_dir):
  # MRPC: BOM-prefixed header, Quality first, strings in columns 4 and 5.
  with open(os.path.join(glue_dir, "MRPC", "dev.tsv"), encoding="utf-8-sig") as f:
    rows = [line.rstrip("\n").split("\t") for line in f][1:]
  examples = glue.read_examples(glue.spec_for("mrpc"), _data(glue_dir), "dev")
  assert [(e.label, e.text_a, e.text_b) for e in examples] == [(r[0], r[3], r[4]) for r in rows]
  # CoLA: no header; label in column 2, sentence in column 4.
  with open(os.path.join(glue_dir, "CoLA", "train.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f]
  examples = glue.read_examples(glue.spec_for("cola"), _data(glue_dir), "train")
  assert [(e.label, e.text_a) for e in examples] == [(r[1], r[3]) for r in rows]
  # MNLI: gold_label is the last column of dev (after label1..5).
  with open(os.path.join(glue_dir, "MNLI", "dev_mismatched.tsv"), encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f][1:]
  examples = glue.read_examples(glue.spec_for("mnli"), _data(glue_dir), "dev_mismatched")
  assert [(e.label, e.text_a, e.text_b) for e in examples] == [(r[-1], r[8], r[9]) for r in rows]


def _corrupt(glue_dir, tmp_path, folder, filename, line_no, transform):
  target = tmp_path / "glue"
  import shutil
  shutil.copytree(glue_dir, target)
  path = target / folder / filename
  lines = path.read_text(encoding="utf-8-sig").split("\n")
  lines[line_no - 1] = transform(lines[line_no - 1])
  path.write_text("\n".join(lines), encoding="utf-8")
  return str(target), str(path)


def test_wrong_column_count_names_file_and_line(glue_dir, tmp_path):
  root, path = _corrupt(glue_dir, tmp_path, "RTE", "train.tsv", 4, lambda l: l + "\textra")
  with pytest.raises(glue.GlueDataError, match=f"{path}:4: expected 4 tab-separated columns, "
                                                "got 5"):
    glue.read_examples(glue.spec_for("rte"), _data(root), "train")


def test_label_outside_the_label_set_names_file_and_line(glue_dir, tmp_path):
  root, path = _corrupt(glue_dir, tmp_path, "SST-2", "dev.tsv", 3,
                        lambda l: l.rsplit("\t", 1)[0] + "\t2")
  with pytest.raises(glue.GlueDataError, match=f"{path}:3: label '2' is not one of"):
    glue.read_examples(glue.spec_for("sst2"), _data(root), "dev")
  root2, path2 = _corrupt(glue_dir, tmp_path / "b", "STS-B", "train.tsv", 2,
                          lambda l: l.rsplit("\t", 1)[0] + "\t7.5")
  with pytest.raises(glue.GlueDataError, match=f"{path2}:2: score 7.5 is outside"):
    glue.read_examples(glue.spec_for("stsb"), _data(root2), "train")


def test_qqp_known_bad_rows_are_skipped_and_counted(glue_dir, tmp_path, capsys):
  root, path = _corrupt(glue_dir, tmp_path, "QQP", "train.tsv", 3,
                        lambda l: "\t".join(l.split("\t")[:4]))
  examples = glue.read_examples(glue.spec_for("qqp"), _data(root), "train")
  assert len(examples) == SIZES["train"] - 1
  assert f"{path}: skipped 1 malformed rows" in capsys.readouterr().out


def test_missing_file_says_what_to_pass(tmp_path):
  with pytest.raises(FileNotFoundError, match="glue_dir"):
    glue.read_examples(glue.spec_for("rte"), _data(str(tmp_path)), "train")


def test_metrics_against_hand_computed_values():
  y = ["1", "1", "0", "0", "1", "0"]
  p = ["1", "0", "0", "0", "1", "1"]
  # TP=2 FN=1 TN=2 FP=1: MCC = (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3; F1 = 2/3; accuracy 4/6.
  assert glue.compute_metrics(glue.spec_for("cola"), y, p) == pytest.approx(
      {"matthews_corr": 1 / 3})
  assert glue.compute_metrics(glue.spec_for("mrpc"), y, p) == pytest.approx(
      {"f1": 2 / 3, "accuracy": 4 / 6})
  assert glue.compute_metrics(glue.spec_for("qqp"), y, p) == pytest.approx(
      {"f1": 2 / 3, "accuracy": 4 / 6})
  for name in ("sst2", "wnli"):
    assert glue.compute_metrics(glue.spec_for(name), y, p) == pytest.approx({"accuracy": 4 / 6})
  nli_y = ["entailment", "not_entailment", "entailment", "entailment"]
  nli_p = ["entailment", "entailment", "entailment", "not_entailment"]
  for name in ("rte", "qnli"):
    assert glue.compute_metrics(glue.spec_for(name), nli_y, nli_p) == {"accuracy": 0.5}
  assert glue.compute_metrics(glue.spec_for("mnli"), ["neutral", "contradiction", "entailment"],
                              ["neutral", "entailment", "entailment"]) == pytest.approx(
                                  {"accuracy": 2 / 3})
  # STS-B: y = 1..4, p = 1, 2, 3, 5: Pearson = 6.5 / sqrt(5 * 8.75); same ranks: Spearman 1.
  assert glue.compute_metrics(glue.spec_for("stsb"), [1, 2, 3, 4], [1, 2, 3, 5]) == pytest.approx(
      {"pearson": 6.5 / np.sqrt(5 * 8.75), "spearman": 1.0})


def test_submission_files_use_leaderboard_names_and_labels(tmp_path):
  spec = glue.spec_for("mnli")
  examples = [glue.GlueExample(str(i), "a", "b", None) for i in (0, 1)]
  written = {}
  for split in spec.test_splits:
    path, = glue.write_predictions(spec, str(tmp_path), split, examples,
                                   ["entailment", "neutral"])
    written[split] = os.path.basename(path)
    assert open(path).read() == "index\tprediction\n0\tentailment\n1\tneutral\n"
  assert written == {"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "ax": "AX.tsv"}
  names = {glue.spec_for(t).submissions[0][1] for t in ALL}
  assert names == {"CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv",
                   "QNLI.tsv", "RTE.tsv", "WNLI.tsv"}
  path, = glue.write_predictions(glue.spec_for("stsb"), str(tmp_path), "test", examples,
                                 [1.23456, 4.0])
  assert open(path).read() == "index\tprediction\n0\t1.235\n1\t4.000\n"


def test_score_table_averages_task_scores():
  results = {"mrpc": {"dev": {"f1": 0.9, "accuracy": 0.8}},
             "cola": {"dev": {"matthews_corr": 0.5}},
             "mnli": {"dev": {"accuracy": 0.8}, "dev_mismatched": {"accuracy": 0.6}}}
  table = glue.score_table(results)
  assert "| MRPC | f1/accuracy | 90.0/80.0 | 85.0 |" in table
  assert "| MNLI | accuracy | 80.0/60.0 | 70.0 |" in table
  assert f"**{(85 + 50 + 70) / 3:.1f}**" in table


@pytest.mark.parametrize("name,split", [("mrpc", "dev"), ("stsb", "train"), ("cola", "test"),
                                        ("mnli", "dev_mismatched"), ("mnli", "ax")])
def test_tfds_reader_under_mock_data(name, split):
  tfds = pytest.importorskip("tensorflow_datasets")
  spec = glue.spec_for(name)
  with tfds.testing.mock_data(num_examples=4):
    examples = glue.read_examples(spec, _data("", source="tfds"), split)
  assert len(examples) == 4
  for e in examples:
    assert isinstance(e.text_a, str) and (e.text_b is None) == (name == "cola")
    if spec.is_regression:
      assert isinstance(e.label, float)
    elif e.label is not None:   # mock data draws labels for test splits too
      assert e.label in spec.labels
