"""SQuAD exact match and F1, as the official evaluation scripts define them.

`evaluate-v1.1.py` and `evaluate-v2.0.py` share `normalize_answer` (lower-case, drop
`string.punctuation`, drop the articles a/an/the, collapse whitespace), token-level F1 and the
maximum over the gold answers. v2.0 adds: an unanswerable question's only gold answer is "";
HasAns / NoAns breakdowns; and, given the null odds of every question, the best EM / F1 over all
thresholds ("best_exact", "best_f1" and their thresholds). Each function below mirrors the
official function of the same name; the tests check them on hand-computed cases.

One difference from v1.1: the v2.0 script drops gold answers that normalise to "" (such as "the")
before taking the maximum; both scripts agree on every real v1.1 question, and we follow v2.0.
"""
import collections
import re
import string
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
  """Lower text and remove punctuation, articles and extra whitespace (the official order)."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCTUATION)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def get_tokens(s: str) -> List[str]:
  return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
  return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
  gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
  if not gold_toks or not pred_toks:
    # A no-answer on either side: F1 is 1 if both are no-answer, 0 otherwise.
    return float(gold_toks == pred_toks)
  common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_toks)
  recall = num_same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def gold_texts(answers: Iterable[str]) -> List[str]:
  """Gold answers that survive normalisation; [""] for an unanswerable question."""
  golds = [a for a in answers if normalize_answer(a)]
  return golds or [""]


def get_raw_scores(gold: Mapping[str, Sequence[str]], preds: Mapping[str, str]
                   ) -> Tuple[Dict[str, float], Dict[str, float]]:
  """Per-question EM and F1 (maximum over the gold answers). `gold`: qid -> answer texts."""
  exact, f1 = {}, {}
  for qid, answers in gold.items():
    if qid not in preds:
      continue  # the official script prints "Missing prediction" and leaves it out
    golds = gold_texts(answers)
    exact[qid] = float(max(compute_exact(a, preds[qid]) for a in golds))
    f1[qid] = max(compute_f1(a, preds[qid]) for a in golds)
  return exact, f1


def apply_no_ans_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float],
                           qid_to_has_ans: Mapping[str, bool], na_prob_thresh: float
                           ) -> Dict[str, float]:
  """Scores when every question with na_prob > thresh is answered with no answer."""
  return {qid: (float(not qid_to_has_ans[qid]) if na_probs[qid] > na_prob_thresh else s)
          for qid, s in scores.items()}


def make_eval_dict(exact: Mapping[str, float], f1: Mapping[str, float],
                   qid_list: Optional[Sequence[str]] = None) -> Dict[str, float]:
  qids = list(qid_list) if qid_list else list(exact)
  total = len(qids)
  if not total:
    return {"exact": 0.0, "f1": 0.0, "total": 0}
  return {"exact": 100.0 * sum(exact[k] for k in qids) / total,
          "f1": 100.0 * sum(f1[k] for k in qids) / total, "total": total}


def find_best_thresh(preds: Mapping[str, str], scores: Mapping[str, float],
                     na_probs: Mapping[str, float], qid_to_has_ans: Mapping[str, bool]
                     ) -> Tuple[float, float]:
  """(best score in %, threshold): the official sweep over na_prob in increasing order.

  Starting from "no answer everywhere", questions switch to their predicted text one by one; the
  threshold is the na_prob of the question at which the running score peaked (a question is then
  answered "" when its na_prob > threshold). Ties keep the earliest peak, as the official script.
  """
  cur_score = best_score = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if qid_to_has_ans[qid]:
      diff = scores[qid]
    else:
      diff = -1 if preds[qid] else 0
    cur_score += diff
    if cur_score > best_score:
      best_score, best_thresh = cur_score, na_probs[qid]
  return 100.0 * best_score / max(len(scores), 1), best_thresh


def evaluate(gold: Mapping[str, Sequence[str]], preds: Mapping[str, str],
             na_probs: Optional[Mapping[str, float]] = None, na_prob_thresh: float = 1.0
             ) -> Dict[str, float]:
  """The official output dict: exact, f1, total; HasAns_* / NoAns_* when the set has both kinds
  (v2.0); best_exact(_thresh), best_f1(_thresh) when `na_probs` (null odds) are given.

  gold: qid -> gold answer texts ([] for an unanswerable question).
  """
  qid_to_has_ans = {qid: bool([a for a in answers if normalize_answer(a)])
                    for qid, answers in gold.items()}
  probs = dict(na_probs) if na_probs is not None else {k: 0.0 for k in preds}
  exact_raw, f1_raw = get_raw_scores(gold, preds)
  exact = apply_no_ans_threshold(exact_raw, probs, qid_to_has_ans, na_prob_thresh)
  f1 = apply_no_ans_threshold(f1_raw, probs, qid_to_has_ans, na_prob_thresh)
  out = make_eval_dict(exact, f1)
  has_ans = [k for k, v in qid_to_has_ans.items() if v and k in exact]
  no_ans = [k for k, v in qid_to_has_ans.items() if not v and k in exact]
  # The v2.0 script adds each non-empty breakdown; on v1.1 data (no unanswerable question)
  # HasAns would only repeat exact / f1, so it is left out as the v1.1 script does.
  for prefix, qids in (("HasAns", has_ans), ("NoAns", no_ans)) if no_ans else ():
    if qids:
      for key, value in make_eval_dict(exact, f1, qids).items():
        out[f"{prefix}_{key}"] = value
  if na_probs is not None:
    out["best_exact"], out["best_exact_thresh"] = find_best_thresh(
        preds, exact_raw, probs, qid_to_has_ans)
    out["best_f1"], out["best_f1_thresh"] = find_best_thresh(preds, f1_raw, probs, qid_to_has_ans)
  return out


def tune_null_threshold(gold: Mapping[str, Sequence[str]], best_non_null: Mapping[str, str],
                        null_odds: Mapping[str, float]) -> Tuple[float, Dict[str, float]]:
  """The v2.0 null threshold that maximises F1 on `gold`, and the metrics at it.

  best_non_null: every question's best non-empty answer (so that the sweep can switch any
  question to an answer); null_odds: s_null - s_best_non_null. A question is then answered ""
  when its null odds exceed the threshold. When answering nothing at all is best, the threshold
  sits just below the smallest null odds.
  """
  qid_to_has_ans = {qid: bool([a for a in answers if normalize_answer(a)])
                    for qid, answers in gold.items()}
  _, f1_raw = get_raw_scores(gold, best_non_null)
  best_f1, thresh = find_best_thresh(best_non_null, f1_raw, null_odds, qid_to_has_ans)
  all_null_f1 = 100.0 * sum(1 for k in f1_raw if not qid_to_has_ans[k]) / max(len(f1_raw), 1)
  if best_f1 <= all_null_f1 and null_odds:
    thresh = min(null_odds[k] for k in f1_raw) - 1.0
  preds = {qid: ("" if null_odds[qid] > thresh else text) for qid, text in best_non_null.items()}
  metrics = evaluate(gold, preds, null_odds)
  return float(thresh), metrics


def gold_from_examples(examples) -> Dict[str, List[str]]:
  """qid -> gold answer texts, from `bert_jax.tasks.datasets.squad.SquadExample`s."""
  return {ex.qas_id: [text for text, _ in ex.answers] for ex in examples}
