"""Bad input files are named with the file and line (or JSON path), never a bare decoding or key
error: text that is not UTF-8 (a file saved as Latin-1) read anywhere through the filesystem
layer, in a GLUE TSV, a CoNLL file, a SWAG CSV and a SQuAD JSON file; empty files; SQuAD JSON
that is malformed, lacks a field or has a field of the wrong type; a SQuAD training answer that
is not in its context (skipped, named and counted, as the original does); SWAG and CoNLL rows
with a column missing; a vocabulary that does not match the checkpoint for SQuAD and NER."""
import copy
import json
import logging
import os

import pytest

from bert_jax import tasks
from bert_jax.io import filesystem
from bert_jax.tasks.datasets import glue, ner, squad, swag
from experiments import ner as ner_experiment
from experiments import squad as squad_experiment
from tests import finetuning_fixtures as fx

SQUAD_FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "experiments", "fixtures", "squad_v1.1_tiny.json")

LATIN1 = "café au lait".encode("latin-1")   # b"caf\xe9 ...": not UTF-8


def _replace_line(path, number, raw):
  lines = open(path, "rb").read().splitlines()
  lines[number - 1] = raw
  with open(path, "wb") as f:
    f.write(b"\n".join(lines) + b"\n")


@pytest.mark.parametrize("read", ["iterate", "readline", "read"])
def test_every_text_read_names_the_file_and_line(tmp_path, read):
  path = str(tmp_path / "text.txt")
  with open(path, "wb") as f:
    f.write(b"first line\nsecond line\n" + LATIN1 + b"\nfourth\n")
  with pytest.raises(filesystem.NotUtf8Error, match=r"text\.txt:3: not valid UTF-8"):
    with filesystem.open(path) as f:
      if read == "iterate":
        list(f)
      elif read == "readline":
        while f.readline():
          pass
      else:
        f.read()
  # Valid files read as before, and a file may still ask for replacement characters.
  with open(path, "wb") as f:
    f.write("naïve\nthird\n".encode("utf-8") + LATIN1)
  assert filesystem.open(path, errors="replace").read().endswith("caf\ufffd au lait")


def test_a_glue_file_that_is_not_utf8(tmp_path):
  glue_dir = fx.write_glue_dir(str(tmp_path / "glue"))
  path = os.path.join(glue_dir, "SST-2", "train.tsv")
  _replace_line(path, 4, LATIN1 + b"\t1")
  with pytest.raises(filesystem.NotUtf8Error, match=r"SST-2/train\.tsv:4: not valid UTF-8"):
    glue.read_tsv(glue.spec_for("sst2"), path, True)


def test_an_empty_glue_file_is_named(tmp_path):
  glue_dir = fx.write_glue_dir(str(tmp_path / "glue"))
  path = os.path.join(glue_dir, "SST-2", "dev.tsv")
  open(path, "w").close()
  with pytest.raises(glue.GlueDataError, match=r"SST-2/dev\.tsv:1: header"):
    glue.read_tsv(glue.spec_for("sst2"), path, True)


def test_a_conll_file_that_is_not_utf8(tmp_path):
  path = str(tmp_path / "train.txt")
  with open(path, "wb") as f:
    f.write(b"-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n" + LATIN1 + b" NN I-NP O\n")
  with pytest.raises(filesystem.NotUtf8Error, match=r"train\.txt:4: not valid UTF-8"):
    ner.read_conll(path, "iob1")


# ------------------------------------------------------------------------------------- SQuAD


def _squad(edit=None):
  """The tiny SQuAD v1.1 fixture as a dict, changed by `edit(data)`."""
  with open(SQUAD_FIXTURE, encoding="utf-8") as f:
    data = json.load(f)
  if edit:
    edit(data)
  return data


def _write_json(tmp_path, data, name="train.json"):
  path = tmp_path / name
  path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
  return str(path)


def _pop(*keys):
  def edit(data):
    record = data
    for key in keys[:-1]:
      record = record[key]
    record.pop(keys[-1])
  return edit


def _set(value, *keys):
  def edit(data):
    record = data
    for key in keys[:-1]:
      record = record[key]
    record[keys[-1]] = value
  return edit


QID = "Café_Müller-2"


@pytest.mark.parametrize("edit,expected", [
    (_pop("data", 0, "paragraphs"), r"data\[0\]: missing 'paragraphs'"),
    (_pop("data", 0, "paragraphs", 0, "context"), r"data\[0\]\.paragraphs\[0\]: missing "
     r"'context'"),
    (_pop("data", 0, "paragraphs", 0, "qas", 1, "question"),
     rf"data\[0\]\.paragraphs\[0\]\.qas\[1\] \(id {QID}\): missing 'question'"),
    (_pop("data", 0, "paragraphs", 0, "qas", 1, "id"),
     r"data\[0\]\.paragraphs\[0\]\.qas\[1\]: missing 'id'"),
    (_pop("data", 0, "paragraphs", 0, "qas", 1, "answers", 0, "answer_start"),
     rf"data\[0\]\.paragraphs\[0\]\.qas\[1\] \(id {QID}\)\.answers\[0\]: missing 'answer_start'"),
    (_set("22", "data", 0, "paragraphs", 0, "qas", 1, "answers", 0, "answer_start"),
     rf"data\[0\]\.paragraphs\[0\]\.qas\[1\] \(id {QID}\)\.answers\[0\]\.answer_start: "
     "expected int, got str"),
    (_set([], "data", 0, "paragraphs", 0, "qas", 1, "answers"),
     rf"data\[0\]\.paragraphs\[0\]\.qas\[1\] \(id {QID}\): answerable but has no answer"),
    (_set({"paragraphs": []}, "data"), r"not a SQuAD file \(no top-level 'data' list\)"),
])
def test_a_squad_file_without_a_field_names_its_json_path(tmp_path, edit, expected):
  path = _write_json(tmp_path, _squad(edit))
  with pytest.raises(squad.SquadDataError, match=r"train\.json: " + expected):
    squad.read_squad_json(path, is_training=True)


@pytest.mark.parametrize("text,expected", [
    (b"", r"train\.json:1: not valid JSON"),
    (b'{"data": [\n  {"paragraphs": [}\n]}', r"train\.json:2: not valid JSON"),
    (b'{"data": []}\n' + LATIN1, r"train\.json:2: not valid UTF-8"),
])
def test_an_empty_malformed_or_latin1_squad_file_is_named(tmp_path, text, expected):
  (tmp_path / "train.json").write_bytes(text)
  with pytest.raises(ValueError, match=expected):
    squad.read_squad_json(str(tmp_path / "train.json"), is_training=True)


def test_a_squad_answer_outside_its_context_is_named_and_counted(tmp_path, caplog):
  path = _write_json(tmp_path, _squad(_set(10_000, "data", 0, "paragraphs", 0, "qas", 1,
                                           "answers", 0, "answer_start")))
  stats = squad.ReadStats()
  with caplog.at_level(logging.WARNING):
    examples = squad.read_squad_json(path, is_training=True, stats=stats)
  assert (stats.num_questions, stats.num_skipped, stats.skipped_ids) == (
      len(examples) + 1, 1, [QID])
  assert (f"train.json: data[0].paragraphs[0].qas[1] (id {QID}): answer 'Zürich' is not in "
          "the context at offset 10000; skipped") in caplog.text


# -------------------------------------------------------------------------------------- SWAG


def _swag_file(tmp_path, edit):
  directory = fx.write_swag_dir(str(tmp_path / "swag"))
  path = os.path.join(directory, "train.csv")
  lines = open(path, "rb").read().splitlines()
  with open(path, "wb") as f:
    f.write(b"\n".join(edit(lines)) + (b"\n" if lines else b""))
  return path


@pytest.mark.parametrize("edit,expected", [
    (lambda lines: [], r"train\.csv:1: header has no column\(s\)"),
    (lambda lines: lines[:3] + [lines[3].rsplit(b",", 2)[0]] + lines[4:],
     r"train\.csv:4: expected 12 columns"),
    (lambda lines: lines[:3] + [lines[3][:-1] + b"7"] + lines[4:],
     r"train\.csv:4: label '7' is not one of 0-3"),
    (lambda lines: lines[:5] + [LATIN1 + b"," + lines[5]] + lines[6:],
     r"train\.csv:6: not valid UTF-8"),
])
def test_a_bad_swag_row_names_the_file_and_line(tmp_path, edit, expected):
  path = _swag_file(tmp_path, edit)
  with pytest.raises(ValueError, match=expected):
    swag.read_csv(path, labelled=True)


# ------------------------------------------------------------------------------------ CoNLL


@pytest.mark.parametrize("text,expected", [
    (b"", r"train\.txt: no sentences"),
    (b"-DOCSTART- -X- -X- O\n\n", r"train\.txt: no sentences"),
    (b"EU NNP B-NP B-ORG\nrejects\n", r"train\.txt:2: expected 4 columns, got 1"),
    (b"EU\nrejects VBZ B-VP O\n", r"train\.txt:1: expected at least 2 columns"),
    (b"EU NNP B-NP B-ORGANISATION\n", r"train\.txt:1: unknown label 'B-ORGANISATION'"),
])
def test_a_bad_conll_file_names_the_file_and_line(tmp_path, text, expected):
  (tmp_path / "train.txt").write_bytes(text)
  with pytest.raises(ValueError, match=expected):
    ner.read_conll(str(tmp_path / "train.txt"), "iob1", labels=ner.label_list("conll2003"))


# ------------------------------------------------------------------ vocabulary vs checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """A tiny checkpoint, and a vocabulary one entry longer than its vocab_size."""
  root = tmp_path_factory.mktemp("checkpoints")
  checkpoint = fx.write_checkpoint(str(root / "ckpt"))
  other = root / "other_vocab.txt"
  other.write_text("\n".join(fx.VOCAB + ["extra"]) + "\n", encoding="utf-8")
  return checkpoint, str(other)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", [squad_experiment, ner_experiment])
def test_a_vocabulary_that_does_not_match_the_checkpoint(checkpoints, tmp_path, experiment):
  checkpoint, other_vocab = checkpoints
  config = experiment.get_config("quick")
  config.init_checkpoint, config.tokenizer.vocab_file = checkpoint, other_vocab
  with pytest.raises(ValueError, match=r"other_vocab\.txt has 41 entries but the checkpoint "
                                       r".*ckpt has vocab_size=40: they do not belong together"):
    tasks.run(copy.deepcopy(config), str(tmp_path / "workdir"))
  assert not os.path.exists(tmp_path / "workdir" / "checkpoints")


# ------------------------------------------------------------------------- a run, as it starts


@pytest.mark.parametrize("experiment,field,text,expected", [
    (squad_experiment, "train_file", b'{"data": [{"title": "x"}]}',
     r"train\.json: data\[0\]: missing 'paragraphs'"),
    (squad_experiment, "dev_file", b"", r"train\.json:1: not valid JSON"),
    (ner_experiment, "train_file", b"EU NNP B-NP B-ORG\nrejects\n",
     r"train\.json:2: expected 4 columns, got 1"),
    (ner_experiment, "dev_file", b"", r"train\.json: no sentences"),
])
def test_a_run_given_a_bad_file_stops_before_training(checkpoints, tmp_path, experiment, field,
                                                       text, expected):
  """`tasks.run`, what `python -m bert_jax.main` calls: the bad file is named before a step."""
  (tmp_path / "train.json").write_bytes(text)
  config = experiment.get_config("quick")
  config.init_checkpoint = checkpoints[0]
  config.data[field] = str(tmp_path / "train.json")
  with pytest.raises(ValueError, match=expected):
    tasks.run(config, str(tmp_path / "workdir"))
  assert not os.path.exists(tmp_path / "workdir" / "checkpoints")
