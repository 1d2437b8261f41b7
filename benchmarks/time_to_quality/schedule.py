"""Each side's step count from its own measured speed, so its schedule ends at the budget.

BERT's recipe: `num_train_steps = (budget - start-up) x steps/s`, the warm-up a fraction of
them. The modern recipe's batch rises over its first tokens (`batch_ramp`), so its steps are
not all alike: the calibration measures steps/s at the full batch, the budget is turned into
tokens at that rate (`full-batch steps x batch x seq`: time per token taken as the same at every
batch size), and the steps are those that train these tokens through the ramp
(`BatchRamp.steps_for_tokens`), the ramp over `--batch_warmup_fraction` of them and the
learning-rate warm-up over `--warmup_proportion` of them (counted through the ramp, as
experiments/pretrain_modernbert.py counts ModernBERT's), the 1-sqrt decay over the last
`--decay_fraction` of the steps. bert_jax compiles its step once per batch size on the ramp:
each further compile is charged the calibration's start-up.
"""
import dataclasses
import json
import os
from typing import Optional, Sequence, Tuple

from benchmarks.time_to_quality import common


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A side's speed from a short run: steps/s after the first window, and the start-up cost."""
  steps_per_sec: float
  startup_seconds: float      # the first window's time beyond what its steps take at that rate
  windows: Tuple[Tuple[int, float], ...]   # (steps, seconds) per window

  @classmethod
  def from_windows(cls, windows: Sequence[Tuple[int, float]]) -> "Calibration":
    if len(windows) < 2:
      raise ValueError("calibration needs at least 2 windows (the first holds start-up)")
    steps = sum(s for s, _ in windows[1:])
    rate = steps / sum(t for _, t in windows[1:])
    first_steps, first_seconds = windows[0]
    return cls(rate, max(0.0, first_seconds - first_steps / rate),
               tuple((int(s), float(t)) for s, t in windows))

  def steps_for(self, budget_seconds: float) -> int:
    """Steps that fill `budget_seconds` of training time, start-up included."""
    return max(1, int((budget_seconds - self.startup_seconds) * self.steps_per_sec))


def every(seconds: float, steps_per_sec: float, multiple: int = 1) -> int:
  """A step interval of about `seconds`, a multiple of `multiple` (at least one multiple)."""
  return multiple * max(1, int(round(seconds * steps_per_sec / multiple)))


@dataclasses.dataclass
class Plan:
  """What a side's run does; written once (OUT/<side>/plan.json) so a resume reuses it."""
  side: str
  budget_seconds: float
  calibration: Calibration
  num_train_steps: int
  warmup_steps: int
  eval_every_steps: int        # bert_jax only (the transformers sides evaluate by their clock)
  checkpoint_every_steps: int
  # The modern recipe (0: BERT's, no ramp, linear decay over all steps).
  batch_warmup_start: int = 0      # the ramp's first batch (rows); 0: no ramp
  batch_warmup_tokens: float = 0.0
  decay_steps: int = 0             # the 1-sqrt decay's steps, at the end
  batch: int = 0                   # the full batch (rows)
  seq: int = 0

  def ramp(self):
    """The batch ramp (bert_jax.runtime.batch_ramp.BatchRamp), or None."""
    return make_ramp(self.batch_warmup_start, self.batch, self.batch_warmup_tokens, self.seq)

  def rows(self, step: int) -> int:
    """The batch of step `step` (0-based)."""
    ramp = self.ramp()
    return ramp.rows(step) if ramp else self.batch

  def sequences(self, steps: Optional[int] = None) -> int:
    """Rows trained by the first `steps` steps (all of them by default)."""
    steps = self.num_train_steps if steps is None else steps
    ramp = self.ramp()
    return ramp.micro_batches_before(steps) * ramp.start if ramp else steps * self.batch

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, values: dict) -> "Plan":
    values = dict(values)
    calibration = values.pop("calibration")
    calibration["windows"] = tuple(tuple(w) for w in calibration["windows"])
    return cls(calibration=Calibration(**calibration), **values)


def make_ramp(start: int, batch: int, tokens: float, seq: int):
  if not start:
    return None
  from bert_jax.runtime import batch_ramp
  return batch_ramp.BatchRamp(start=start, final=batch, tokens=tokens, seq_len=seq)


def make_plan(args, side: str, calibration: Calibration, seq: int) -> Plan:
  """The side's steps and cadences: BERT's recipe, or the modern one (the module docstring).
  `--max_steps` (tests) fixes the steps at that; a modern ramp then covers its share of the
  tokens those steps would train at the full batch."""
  budget = args.budget_minutes * 60.0
  multiple = args.log_every if common.FRAMEWORK[side] == "jax" else 1
  if common.RECIPE[side] == "bert":
    steps = args.max_steps or calibration.steps_for(budget)
    warmup, decay, start, ramp_tokens = int(round(args.warmup_proportion * steps)), 0, 0, 0.0
    seconds = budget - calibration.startup_seconds
  else:
    start = args.batch_warmup_start
    if start and (args.batch % start or start >= args.batch):
      raise ValueError(f"--batch_warmup_start={start}: the batch ramp rises to --batch="
                       f"{args.batch} in steps of its start, a smaller divisor of it (0: off)")
    compiles = (args.batch // start - 1) if start and common.FRAMEWORK[side] == "jax" else 0
    seconds = budget - calibration.startup_seconds * (1 + compiles)
    full_steps = args.max_steps or max(1, int(seconds * calibration.steps_per_sec))
    tokens = full_steps * args.batch * seq
    ramp_tokens = float(args.batch_warmup_fraction * tokens) if start else 0.0
    ramp = make_ramp(start, args.batch, ramp_tokens, seq)
    steps = args.max_steps or (ramp.steps_for_tokens(tokens) if ramp else full_steps)
    warmup_tokens = args.warmup_proportion * tokens
    warmup = (ramp.steps_for_tokens(warmup_tokens) if ramp
              else int(round(args.warmup_proportion * steps)))
    decay = int(round(args.decay_fraction * steps))
    warmup = min(warmup, steps - decay)
  rate = steps / max(seconds, 1e-9) if not args.max_steps else calibration.steps_per_sec
  return Plan(side=side, budget_seconds=budget, calibration=calibration, num_train_steps=steps,
              warmup_steps=warmup,
              eval_every_steps=min(steps, every(args.eval_every_minutes * 60, rate, multiple)),
              checkpoint_every_steps=min(steps, every(args.checkpoint_every_minutes * 60, rate,
                                                      multiple)),
              batch_warmup_start=start, batch_warmup_tokens=ramp_tokens, decay_steps=decay,
              batch=args.batch, seq=seq)


def load_or_make_plan(args, side: str, calibrate, seq: int) -> Plan:
  """The side's plan.json if a run started already (same schedule on resume), else a new one."""
  path = os.path.join(args.out, side, "plan.json")
  if os.path.exists(path):
    with open(path) as f:
      plan = Plan.from_json(json.load(f))
    print(f"[{side}] plan from {path}: {plan.num_train_steps} steps", flush=True)
    return plan
  if args.max_steps:   # a fixed step count (tests): no calibration needed
    calibration = Calibration(1.0, 0.0, ())
  else:
    calibration = calibrate()
  plan = make_plan(args, side, calibration, seq)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(plan.to_json(), f, indent=1)
  ramp = (f", batch {plan.batch_warmup_start} -> {plan.batch} over "
          f"{plan.batch_warmup_tokens / 1e6:.2f}M tokens" if plan.batch_warmup_start else "")
  decay = f", 1-sqrt decay over the last {plan.decay_steps}" if plan.decay_steps else ""
  print(f"[{side}] {calibration.steps_per_sec:.3f} steps/s, start-up "
        f"{calibration.startup_seconds:.0f} s -> {plan.num_train_steps} steps "
        f"(warm-up {plan.warmup_steps}{decay}{ramp}) in {plan.budget_seconds / 60:g} min",
        flush=True)
  return plan
