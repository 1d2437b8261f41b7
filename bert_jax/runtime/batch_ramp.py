"""Batch-size warm-up by tokens: the global batch of a step rises from a start size to the
final one as the tokens trained grow (ModernBERT: 768 -> 4,608 sequences over 50B tokens).

    ramp = BatchRamp(start=768, final=4608, tokens=50e9, seq_len=1024)
    ramp.multiple(step)        # k: the step trains k micro-batches of `start` rows
    ramp.micro_batches_before(step)   # what the input has yielded before the step
    ramp.steps_for_tokens(1.7e12)     # steps to train that many tokens

The input yields micro-batches of the start size, always (so the tf.data pipeline and its saved
position are those of a run at that batch), and step `s` consumes k(s) of them, its gradient
accumulated over the k (`runtime.step`: the loss normalised by the whole step's totals, so the
update is the k * start batch's). k is a pure function of the step: the tokens trained before
step s are the sum of k * start * seq_len over the steps before it, and k rises from 1 to
K = final / start as ModernBERT's `BatchSizeWarmupScheduler` (its sequence_packer.py) raises its
batch: level k (k * start rows) lasts until the tokens trained reach

    threshold(k) = ceil(tokens * (1 + 2 + ... + k) / (1 + 2 + ... + (K - 1))),

so every level spends the same number of steps (the tokens of level k grow with its batch), and
the batch is K from `tokens` on. (Equal tokens per level would spend K - 1 times as many steps on
the first level as on the last: about 37% more steps over ModernBERT's ramp.) ModernBERT counts
each GPU's non-padding tokens against tokens / GPUs; here tokens are row positions (rows x
max_seq_length, padding included) of all hosts together: the same switch points within a step for
packed rows. A resumed run computes the same k for every step, and the input position saved
with a checkpoint is the micro-batch it stopped at: exact resume anywhere on the ramp.
"""
import bisect
import dataclasses
import functools
import math
from typing import List, Tuple


@dataclasses.dataclass(frozen=True)
class BatchRamp:
  start: int       # rows of the first steps, all hosts together (the input's micro-batch)
  final: int       # rows once the ramp is over (config.global_batch_size)
  tokens: float    # tokens over which the batch rises
  seq_len: int     # tokens per row

  def __post_init__(self):
    if self.start <= 0 or self.final % self.start:
      raise ValueError(f"batch warm-up: the final batch {self.final} must be a whole number of "
                       f"start batches ({self.start} rows)")
    if self.tokens < 0:
      raise ValueError(f"batch warm-up: tokens={self.tokens} must be >= 0")

  @property
  def max_multiple(self) -> int:
    return self.final // self.start

  def threshold(self, k: int) -> int:
    """The tokens trained at which level k (k * start rows) ends, 1 <= k < K (module docstring):
    ceil(tokens * k (k + 1) / (K (K - 1))), exact integers."""
    big_k = self.max_multiple
    return -(-int(self.tokens) * k * (k + 1) // (big_k * (big_k - 1)))

  @functools.cached_property
  def _segments(self) -> List[Tuple[int, int, int]]:
    """(first step, k, micro-batches before that step) of each k, ascending; exact integers."""
    segments, step, micro = [(0, 1, 0)], 0, 0
    unit = self.start * self.seq_len   # tokens per micro-batch
    for k in range(1, self.max_multiple):   # the first step at k + 1: tokens >= threshold(k)
      missing = self.threshold(k) - micro * unit
      steps = 0 if missing <= 0 else -(-missing // (k * unit))
      step, micro = step + steps, micro + steps * k
      segments.append((step, k + 1, micro))
    return segments

  def _segment(self, step: int) -> Tuple[int, int, int]:
    index = bisect.bisect_right([s for s, _, _ in self._segments], step) - 1
    return self._segments[index]

  def multiple(self, step: int) -> int:
    """k: step `step` (0-based) trains k * start rows."""
    return self._segment(step)[1]

  def rows(self, step: int) -> int:
    return self.multiple(step) * self.start

  def micro_batches_before(self, step: int) -> int:
    """Micro-batches of `start` rows the steps before `step` consumed."""
    first, k, micro = self._segment(step)
    return micro + (step - first) * k

  def tokens_before(self, step: int) -> int:
    return self.micro_batches_before(step) * self.start * self.seq_len

  def steps_for_tokens(self, tokens: float) -> int:
    """The fewest steps that train at least `tokens` tokens."""
    want = -(-math.ceil(tokens) // (self.start * self.seq_len))   # micro-batches
    for first, k, micro in reversed(self._segments):
      if micro <= want:
        return first + -(-(want - micro) // k)
    return 0


def from_config(config) -> "BatchRamp | None":
  """The ramp `config.batch_warmup` describes; None when it is off (start_batch_size 0)."""
  warmup = config.batch_warmup
  if not warmup.start_batch_size:
    return None
  try:
    return BatchRamp(start=warmup.start_batch_size, final=config.global_batch_size,
                     tokens=warmup.tokens, seq_len=config.max_seq_length)
  except ValueError as e:
    raise ValueError(f"config.batch_warmup.start_batch_size={warmup.start_batch_size}, "
                     f"config.global_batch_size={config.global_batch_size}, "
                     f"config.batch_warmup.tokens={warmup.tokens}: {e} (0 turns the warm-up "
                     "off)") from None
