"""The long-context probe of `benchmarks/modern_phases.py`: its rows hold the evidence of a masked
copy near, far or nowhere, and nothing else differs."""
import numpy as np

from benchmarks import modern_phases
from data_pipelines import masking

SPECIAL = masking.SpecialTokens(cls_id=2, sep_id=3, pad_id=0, mask_id=4, vocab_size=1000)


def test_the_probe_places_the_evidence_near_far_or_nowhere():
  stream = np.arange(10, 5010, dtype=np.int32)      # every token distinct: where it is says all
  length, gap, span = 256, 16, modern_phases.SPAN
  rows, positions = modern_phases.probe_rows(stream, length, gap, SPECIAL)
  for condition in modern_phases.CONDITIONS:
    assert rows[condition].shape == (modern_phases.PROBE_ROWS, length)
    assert (rows[condition][:, 0] == SPECIAL.cls_id).all()
    assert (rows[condition][:, -1] == SPECIAL.sep_id).all()
  copy = slice(length - 1 - span, length - 1)        # the second copy, masked in places
  for condition in modern_phases.CONDITIONS[1:]:
    np.testing.assert_array_equal(rows[condition][:, copy], rows["near"][:, copy])
  assert np.all(np.take_along_axis(rows["far"], positions, axis=1) == SPECIAL.mask_id)
  assert positions.shape[1] == round(0.15 * span)
  for r in range(modern_phases.PROBE_ROWS):
    second = rows["far"][r, copy]
    first_far = rows["far"][r, 1:1 + span]
    unmasked = second != SPECIAL.mask_id
    np.testing.assert_array_equal(first_far[unmasked], second[unmasked])
    # The evidence of every masked token: the first copy, at its distance in each condition.
    for condition, farthest in (("near", gap + span), ("far", length - 2 - span)):
      where = {int(t): i for i, t in enumerate(rows[condition][r])}
      for p in positions[r]:
        truth = int(first_far[p - (length - 1 - span)])
        assert truth in where and 0 < p - where[truth] <= farthest
        if condition == "far":
          assert p - where[truth] > length // 2
    assert not set(first_far.tolist()) & set(rows["control"][r, :copy.start].tolist())
