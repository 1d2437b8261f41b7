"""Bad input files are named with the file and line, never a bare decoding error: text that is not
UTF-8 (a file saved as Latin-1) read anywhere through the filesystem layer, in a GLUE TSV and in
a CoNLL file; an empty GLUE file."""
import os

import pytest

from bert_jax.io import filesystem
from bert_jax.tasks.datasets import glue, ner
from tests import finetuning_fixtures as fx

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
