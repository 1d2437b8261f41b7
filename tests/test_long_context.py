"""benchmarks/long_context: the far-evidence probe's rows and scores (fast), and the study end to
end at toy scale on time-to-quality's tiny data (slow): both extensions train from its modern
side, every model is scored, the table and the plot are written."""
import os
import shutil

import numpy as np
import pytest

from benchmarks import long_context
from benchmarks import time_to_quality as ttq
from bert_jax.io import checkpoints
from tests import ttq_fixtures

SPECIAL = dict(cls=1, sep=2, mask=3)
PROBE = long_context.Probe("past", length=22, distance=5)   # body 20: far 10, local 10


def _excluded(vocab_size=100, frequent=()):
  excluded = np.zeros(vocab_size, bool)
  excluded[[0, 1, 2, 3] + list(frequent)] = True
  return excluded


def _documents():
  """Two documents of 20 tokens (one window each). Document 0: id 50 in the far part and in the
  last 5 tokens (a target); 51 in the last 5 and also in the local part's first half (no
  target: near evidence); 52 in the last 5 only (no target: no evidence); 53 in the far part and
  twice in the last 5 (no target: not once in the local part)."""
  first = np.array([50, 10, 11, 53, 12, 13, 14, 15, 16, 17,      # far
                    18, 51, 19, 20, 21,                           # local, first half
                    50, 51, 52, 53, 53], np.int32)                # local, last 5: the targets' zone
  second = np.arange(60, 80, dtype=np.int32)
  return [first, second]


def test_a_target_is_a_token_whose_only_evidence_is_far():
  rows = long_context.probe_rows(_documents(), PROBE, _excluded(), SPECIAL, max_targets=4)
  assert len(rows["positions"]) == 1                   # document 1's window has no repeat
  assert rows["positions"][0].tolist() == [1 + 15, 0, 0, 0]
  assert rows["ids"][0].tolist() == [50, 0, 0, 0]
  assert rows["weights"][0].tolist() == [1, 0, 0, 0]
  full, control = rows["full"][0], rows["control"][0]
  assert len(full) == len(control) == PROBE.length
  assert full[0] == control[0] == SPECIAL["cls"] and full[-1] == control[-1] == SPECIAL["sep"]
  assert full[16] == control[16] == SPECIAL["mask"]
  # The same local part; the far part (where the evidence was) replaced by the other document's.
  assert (full[11:21] == control[11:21]).all()
  assert full[1] == 50 and control[1:11].tolist() == list(range(60, 70))
  assert 50 not in control.tolist()


def test_frequent_ids_and_ids_in_the_replacement_are_never_targets():
  with pytest.raises(ValueError, match="no target"):
    long_context.probe_rows(_documents(), PROBE, _excluded(frequent=[50]), SPECIAL, 4)
  documents = _documents()
  documents[1][3] = 50                                  # the control's far part holds it too
  with pytest.raises(ValueError, match="no target"):
    long_context.probe_rows(documents, PROBE, _excluded(), SPECIAL, 4)


def test_rows_too_short_for_a_far_part_are_refused():
  with pytest.raises(ValueError, match="no far part"):
    long_context.probe_rows(_documents(), long_context.Probe("x", 12, 5), _excluded(), SPECIAL, 4)


def test_targets_past_the_cap_are_sampled():
  rng = np.random.default_rng(0)
  far = rng.permutation(np.arange(10, 60))[:30].astype(np.int32)
  local = np.concatenate([np.arange(60, 80), far[:10]]).astype(np.int32)  # 10 targets at the end
  documents = [np.concatenate([far, local]), np.arange(100, 160, dtype=np.int32)]
  probe = long_context.Probe("p", length=62, distance=10)                 # far 30, local 30
  rows = long_context.probe_rows(documents, probe, _excluded(200), SPECIAL, max_targets=4)
  assert rows["weights"].sum() == 4 and len(set(rows["positions"][0].tolist())) == 4
  assert set(rows["ids"][0].tolist()) <= set(far[:10].tolist())


def test_excluded_ids_are_the_most_frequent_and_the_special():
  docs = [np.array([5, 5, 5, 6, 6, 7], np.int32), np.array([6, 8], np.int32)]
  excluded = long_context.excluded_ids(docs, 10, frequent=2, special_ids=[0])
  assert np.flatnonzero(excluded).tolist() == [0, 5, 6]


def test_paired_gain_and_its_standard_error():
  full, control = np.array([1, 1, 0, 1], bool), np.array([0, 1, 0, 0], bool)
  gain = long_context.paired(full, control)
  assert gain["mean"] == pytest.approx(0.5)
  assert gain["stderr"] == pytest.approx(np.std([1, 0, 0, 1], ddof=1) / 2)


def test_scores_are_per_target_and_equal_where_the_rows_are():
  """A random tiny ModernBERT model: one score per target (padding left out, batches padded to
  one shape), and the same rows under both conditions give a gain of exactly 0."""
  import jax
  from bert_jax import families
  from bert_jax.families.modernbert.config import ModernBertConfig
  config = ModernBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3,
                            num_attention_heads=2, intermediate_size=48, local_attention=8,
                            pad_token_id=0)
  model = families.of(config).pretraining_model(config, use_nsp=False)
  rng = np.random.default_rng(0)
  ids = rng.integers(4, 100, size=(5, 22)).astype(np.int32)
  positions = np.array([[3, 7, 0], [4, 0, 0], [5, 6, 9], [2, 0, 0], [8, 1, 0]], np.int32)
  weights = (positions > 0).astype(np.float32)
  rows = dict(full=ids, control=ids, positions=positions, weights=weights,
              ids=np.where(positions > 0, 7, 0).astype(np.int32))
  params = model.init(jax.random.PRNGKey(0), ids[:1], np.ones_like(ids[:1]),
                      np.zeros_like(ids[:1]), masked_lm_positions=positions[:1])["params"]
  scores = long_context.target_scores(model, params, rows, batch=2)
  assert len(scores["full"]["correct"]) == len(scores["control"]["log_prob"]) == 9
  summary = long_context.summarize(scores)
  assert summary["targets"] == 9 and summary["log_prob_gain"]["mean"] == 0.0
  assert np.all(scores["full"]["log_prob"] < 0)


def _pseudo_words(count: int):
  """`count` distinct made-up words (2-3 syllables): enough different ids that a word can occur
  once in a row's local part and again far away."""
  rng = np.random.default_rng(7)
  syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
  words = set()
  while len(words) < count:
    words.add("".join(rng.choice(syllables, size=int(rng.integers(2, 4)))))
  return sorted(words)


@pytest.mark.slow
def test_end_to_end_tiny(tmp_path):
  """Time-to-quality's modern side at toy scale (8 steps at 32 tokens), then the study: both
  extensions (2 steps at 96 tokens each, the moments carried), every model scored by both
  probes and on both held-out sets, the report and the plot; run again, nothing is retrained."""
  tiny = ttq_fixtures.prepare_tiny(tmp_path / "data", words=_pseudo_words(400),
                                   sentences_per_document=40)
  ttq_out = str(tmp_path / "ttq")
  shutil.copytree(tiny["data"], os.path.join(ttq_out, "data"))
  ttq.main(ttq_fixtures.FLAGS + ttq_fixtures.MODERN + [
      f"--out={ttq_out}", "--side=bert_jax_modern", "--max_steps=8",
      "--eval_every_minutes=0.0001", "--checkpoint_every_minutes=0.134"])
  out, plot = str(tmp_path / "long_context"), str(tmp_path / "plot.png")
  flags = [f"--ttq_out={ttq_out}", f"--out={out}", f"--plot={plot}", "--extend_length=96",
           "--extend_steps=2", "--frequent=20", "--max_targets=4", "--batch=4"]
  result = long_context.main(flags)
  for name in long_context.EXTENSIONS:
    extension = result["extensions"][name]
    assert extension["steps"] == 2 and extension["length"] == 96
    assert extension["rows"] == 8 * 32 // 96 and extension["global_rope_theta"] == 160_000.0
    config, _ = checkpoints.load_pretrained(
        long_context.model_workdir(long_context.parse_args(flags), name))
    assert config.global_rope_theta == 160_000.0 and config.local_rope_theta == 10_000.0
  assert [p["name"] for p in result["probes"]] == ["within", "past"]
  assert [p["distance"] for p in result["probes"]] == [8, 32]
  for name in long_context.MODELS:
    for probe in ("within", "past"):
      score = result["scores"][name][probe]
      assert score["targets"] > 0 and 0 <= score["full_accuracy"] <= 1, (name, probe)
      assert np.isfinite(score["log_prob_gain"]["mean"]), (name, probe)
      # The far part differs between the conditions, and global layers read it.
      assert score["full_log_prob"] != score["control_log_prob"], (name, probe)
    assert set(result["held_out"][name]) == {"32", "96"}
    assert all(np.isfinite(m["mlm_loss"]) for m in result["held_out"][name].values())
  with open(os.path.join(out, "long_context.md")) as f:
    table = f.read()
  assert "| extend_crossing | + 96 tokens, contiguous |" in table
  assert os.path.getsize(plot) > 0
  again = long_context.main(flags)
  assert again["extensions"] == result["extensions"]
