"""Tiny generated fine-tuning data in the official formats, and a tiny random checkpoint.

`write_glue_dir` writes the folder layout of the GLUE download script (every task, the header
rows and column orders of the real files, MRPC's byte-order mark, CoLA without a header);
`write_swag_dir` the swagaf CSV files; `write_checkpoint` a `save_pretrained` directory with a
`vocab.txt` whose size is the model's.
"""
import csv
import os
from typing import Dict, List

import jax
import numpy as np

from bert_jax.io import checkpoints
from bert_jax import families
from bert_jax.model import layers
from bert_jax.model.config import BertConfig

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a cat dog sat ran on under mat tree good bad movie film is was not very "
         "man woman car road happy sad big small red blue what who where why . , ?").split()
VOCAB = SPECIAL + WORDS
NLI = ("entailment", "not_entailment")
MNLI = ("contradiction", "entailment", "neutral")


def sentence(rng: np.random.Generator, n: int = 6) -> str:
  return " ".join(rng.choice(WORDS[:-3], size=int(rng.integers(3, n + 1))))


def _write(path: str, rows: List[List[str]], bom: bool = False) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8-sig" if bom else "utf-8") as f:
    for row in rows:
      f.write("\t".join(row) + "\n")


def write_glue_dir(root: str, sizes: Dict[str, int] = None, seed: int = 0) -> str:
  """Every GLUE task's files; sizes: {"train": 12, "dev": 10, "test": 5} by default."""
  sizes = dict(dict(train=12, dev=10, test=5), **(sizes or {}))
  rng = np.random.default_rng(seed)
  s = lambda: sentence(rng)
  pick = lambda labels: str(rng.choice(labels))
  for split in ("train", "dev"):
    n = sizes[split]
    _write(f"{root}/CoLA/{split}.tsv",
           [["gj04", pick(["0", "1"]), "" if i % 2 else "*", s()] for i in range(n)])
    _write(f"{root}/SST-2/{split}.tsv",
           [["sentence", "label"]] + [[s(), pick(["0", "1"])] for _ in range(n)])
    _write(f"{root}/MRPC/{split}.tsv",
           [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]] +
           [[pick(["0", "1"]), str(100 + i), str(200 + i), s(), s()] for i in range(n)], bom=True)
    _write(f"{root}/STS-B/{split}.tsv",
           [["index", "genre", "filename", "year", "old_index", "source1", "source2",
             "sentence1", "sentence2", "score"]] +
           [[str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", s(), s(),
             f"{rng.uniform(0, 5):.3f}"] for i in range(n)])
    _write(f"{root}/QQP/{split}.tsv",
           [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]] +
           [[str(i), str(2 * i), str(2 * i + 1), s() + " ?", s() + " ?", pick(["0", "1"])]
            for i in range(n)])
    for name in ("QNLI",):
      _write(f"{root}/{name}/{split}.tsv", [["index", "question", "sentence", "label"]] +
             [[str(i), s() + " ?", s(), pick(NLI)] for i in range(n)])
    _write(f"{root}/RTE/{split}.tsv", [["index", "sentence1", "sentence2", "label"]] +
           [[str(i), s(), s(), pick(NLI)] for i in range(n)])
    _write(f"{root}/WNLI/{split}.tsv", [["index", "sentence1", "sentence2", "label"]] +
           [[str(i), s(), s(), pick(["0", "1"])] for i in range(n)])
  mnli_header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                 "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                 "sentence2"]
  _write(f"{root}/MNLI/train.tsv", [mnli_header + ["label1", "gold_label"]] + [
      [str(i), "1", f"{i}e", "fiction", "(x)", "(y)", "(X)", "(Y)", s(), s(), lab, lab]
      for i, lab in ((i, pick(MNLI)) for i in range(sizes["train"]))])
  for kind in ("matched", "mismatched"):
    _write(f"{root}/MNLI/dev_{kind}.tsv",
           [mnli_header + [f"label{k}" for k in range(1, 6)] + ["gold_label"]] + [
               [str(i), "1", f"{i}e", "fiction", "(x)", "(y)", "(X)", "(Y)", s(), s()] +
               [lab] * 5 + [lab] for i, lab in ((i, pick(MNLI)) for i in range(sizes["dev"]))])
    _write(f"{root}/MNLI/test_{kind}.tsv", [mnli_header] + [
        [str(i), "1", f"{i}e", "fiction", "(x)", "(y)", "(X)", "(Y)", s(), s()]
        for i in range(sizes["test"])])
  n = sizes["test"]
  _write(f"{root}/CoLA/test.tsv", [["index", "sentence"]] + [[str(i), s()] for i in range(n)])
  _write(f"{root}/SST-2/test.tsv", [["index", "sentence"]] + [[str(i), s()] for i in range(n)])
  _write(f"{root}/MRPC/test.tsv", [["index", "#1 ID", "#2 ID", "#1 String", "#2 String"]] +
         [[str(i), str(300 + i), str(400 + i), s(), s()] for i in range(n)])
  _write(f"{root}/STS-B/test.tsv",
         [["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
           "sentence2"]] +
         [[str(i), "main-news", "headlines", "2016", f"{i:04d}", "none", "none", s(), s()]
          for i in range(n)])
  _write(f"{root}/QQP/test.tsv", [["id", "question1", "question2"]] +
         [[str(i), s() + " ?", s() + " ?"] for i in range(n)])
  _write(f"{root}/QNLI/test.tsv", [["index", "question", "sentence"]] +
         [[str(i), s() + " ?", s()] for i in range(n)])
  for name in ("RTE", "WNLI"):
    _write(f"{root}/{name}/test.tsv", [["index", "sentence1", "sentence2"]] +
           [[str(i), s(), s()] for i in range(n)])
  _write(f"{root}/diagnostic/diagnostic.tsv", [["index", "sentence1", "sentence2"]] +
         [[str(i), s(), s()] for i in range(n)])
  return root


def write_swag_dir(root: str, sizes: Dict[str, int] = None, seed: int = 0) -> str:
  """swagaf-format train.csv / val.csv / test.csv."""
  sizes = dict(dict(train=12, dev=6, test=3), **(sizes or {}))
  rng = np.random.default_rng(seed)
  header = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
            "ending0", "ending1", "ending2", "ending3", "label"]
  os.makedirs(root, exist_ok=True)
  for split, filename in (("train", "train.csv"), ("dev", "val.csv"), ("test", "test.csv")):
    with open(os.path.join(root, filename), "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(header if split != "test" else header[:-1])
      for i in range(sizes[split]):
        sent1, sent2 = sentence(rng), "the man"
        row = [str(i), f"anetv_{i}", str(1000 + i), f"{sent1} {sent2}", sent1, sent2, "gen"]
        row += [sentence(rng, 4) for _ in range(4)]
        if split != "test":
          row.append(str(int(rng.integers(0, 4))))
        writer.writerow(row)
  return root


def tiny_bert_config(**overrides) -> BertConfig:
  fields = dict(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
  fields.update(overrides)
  return BertConfig.create(**fields)


def write_checkpoint(directory: str, seed: int = 0, vocab: List[str] = None, **overrides) -> str:
  """A random tiny encoder (+ pre-training heads) via save_pretrained, and its vocab.txt
  (`architecture="modernbert"` in `overrides`: a ModernBERT-family one)."""
  config = tiny_bert_config(**overrides)
  family = families.of(config)
  model = family.pretraining_model(
      config, use_nsp="cls/seq_relationship" in family.pretraining_heads)
  params = layers.init_params(model, jax.random.PRNGKey(seed))
  checkpoints.save_pretrained(config, params, directory)
  with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(vocab or VOCAB) + "\n")
  return directory


def fine_tune(root: str, kind: str, checkpoint: str) -> str:
  """A quick fine-tuning run from `checkpoint` into ROOT/<kind>; returns its workdir (with best/).

  kind: mrpc (pair classification), sst2 (one sentence), stsb (regression), ner (tagging),
  squad / squad2 (spans, SQuAD v1.1 / v2.0), swag (multiple choice)."""
  from bert_jax import tasks
  from experiments import glue, ner, squad, swag
  workdir = os.path.join(root, kind)
  if kind in ("mrpc", "sst2", "stsb"):
    config = glue.get_config(f"task={kind},quick")
    config.data.glue_dir = write_glue_dir(os.path.join(root, "glue_data"))
    config.max_seq_length = 16
  elif kind == "ner":
    config = ner.get_config("quick")
  elif kind in ("squad", "squad2"):
    config = squad.get_config("version=2.0,quick" if kind == "squad2" else "quick")
  elif kind == "swag":
    config = swag.get_config("quick")
    config.data.swag_dir = write_swag_dir(os.path.join(root, "swag_data"))
  else:
    raise ValueError(kind)
  config.init_checkpoint = checkpoint
  config.num_train_epochs = 1.0
  config.do_predict = False
  tasks.run(config, workdir)
  return workdir
