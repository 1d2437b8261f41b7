"""SQuAD metrics against hand-computed values of the official evaluate-v1.1 / v2.0 definitions."""
import pytest

from bert_jax.tasks.datasets import squad_metrics as m


def test_normalize_answer():
  # lower -> drop punctuation -> drop articles -> collapse whitespace (the official order:
  # "brown-fox" loses its hyphen before splitting, so it is one token).
  assert m.normalize_answer("The Quick,  Brown-Fox!") == "quick brownfox"
  assert m.normalize_answer("An apple a day") == "apple day"
  assert m.normalize_answer("theater") == "theater"          # articles only as whole words
  assert m.normalize_answer("  \tA\n") == ""


def test_exact_and_f1():
  assert m.compute_exact("The Denver Broncos", "denver broncos!") == 1
  assert m.compute_f1("the cat sat on the mat", "cat on a mat today") == pytest.approx(0.75)
  # Token multisets: gold {dog:2, cat:1}, pred {dog:1, cat:2} share 2 of 3 each way.
  assert m.compute_f1("dog dog cat", "dog cat cat") == pytest.approx(2 / 3)
  assert m.compute_f1("", "") == 1.0 and m.compute_f1("", "x") == 0.0
  assert m.compute_f1("x", "") == 0.0 and m.compute_f1("a b", "c") == 0.0


def test_maximum_over_gold_answers_and_empty_golds():
  gold = {"q": ["Denver Broncos", "The Denver Broncos", "Broncos"], "r": ["the", "Paris"]}
  exact, f1 = m.get_raw_scores(gold, {"q": "Broncos", "r": "the Paris"})
  assert exact == {"q": 1.0, "r": 1.0} and f1 == {"q": 1.0, "r": 1.0}
  result = m.evaluate(gold, {"q": "the broncos team", "r": "Lyon"})
  # q: max(F1 vs "denver broncos" = 0.5, vs "broncos" = 2/3) ; r: 0.
  assert result["f1"] == pytest.approx(100 * (2 / 3) / 2)
  assert result["exact"] == 0.0 and result["total"] == 2


GOLD = {"q1": ["Paris"], "q2": [], "q3": ["blue whale"], "q4": []}
NA = {"q1": -2.0, "q2": 3.0, "q3": 0.5, "q4": 1.0}


def test_v2_breakdowns_and_best_threshold():
  preds = {"q1": "Paris", "q2": "", "q3": "whale", "q4": "London"}
  r = m.evaluate(GOLD, preds, NA)   # na_prob_thresh 1.0: only q2 (3.0 > 1.0) forced to no-answer
  assert r["exact"] == pytest.approx(50.0)
  assert r["f1"] == pytest.approx(100 * (1 + 1 + 2 / 3 + 0) / 4)
  assert r["HasAns_exact"] == pytest.approx(50.0) and r["HasAns_total"] == 2
  assert r["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
  assert r["NoAns_exact"] == pytest.approx(50.0) and r["NoAns_f1"] == pytest.approx(50.0)
  # Sweep in na order q1, q3, q4, q2 from "all no-answer" (2 correct): +1, +2/3, -1, 0.
  assert r["best_f1"] == pytest.approx(100 * (2 + 1 + 2 / 3) / 4)
  assert r["best_f1_thresh"] == 0.5
  assert r["best_exact"] == pytest.approx(75.0) and r["best_exact_thresh"] == -2.0


def test_tune_null_threshold_maximises_f1():
  best_non_null = {"q1": "Paris", "q2": "Lyon", "q3": "whale", "q4": "London"}
  threshold, metrics = m.tune_null_threshold(GOLD, best_non_null, NA)
  assert threshold == 0.5
  # At tau = 0.5: q1 and q3 answered (odds not > 0.5), q2 and q4 abstain.
  assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 1) / 4)
  assert metrics["f1"] == pytest.approx(metrics["best_f1"])
  # No threshold does better.
  for tau in (-3.0, -2.0, 0.0, 0.5, 0.9, 1.0, 2.0, 3.0):
    preds = {q: ("" if NA[q] > tau else t) for q, t in best_non_null.items()}
    assert m.evaluate(GOLD, preds)["f1"] <= metrics["f1"] + 1e-9


def test_tune_null_threshold_when_abstaining_everywhere_is_best():
  gold = {"a": [], "b": []}
  threshold, metrics = m.tune_null_threshold(gold, {"a": "x", "b": "y"}, {"a": 0.3, "b": -1.0})
  assert threshold < -1.0 and metrics["f1"] == 100.0
