"""Each side's step count from its own measured speed, so its schedule ends at the budget."""
import dataclasses
import json
import os
from typing import Sequence, Tuple


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
  eval_every_steps: int        # bert_jax only (the transformers side evaluates by its clock)
  checkpoint_every_steps: int

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, values: dict) -> "Plan":
    values = dict(values)
    calibration = values.pop("calibration")
    calibration["windows"] = tuple(tuple(w) for w in calibration["windows"])
    return cls(calibration=Calibration(**calibration), **values)


def make_plan(args, side: str, calibration: Calibration) -> Plan:
  budget = args.budget_minutes * 60.0
  steps = args.max_steps or calibration.steps_for(budget)
  rate = calibration.steps_per_sec
  multiple = args.log_every if side == "bert_jax" else 1
  return Plan(side=side, budget_seconds=budget, calibration=calibration, num_train_steps=steps,
              warmup_steps=int(round(args.warmup_proportion * steps)),
              eval_every_steps=min(steps, every(args.eval_every_minutes * 60, rate, multiple)),
              checkpoint_every_steps=min(steps, every(args.checkpoint_every_minutes * 60, rate,
                                                      multiple)))


def load_or_make_plan(args, side: str, calibrate) -> Plan:
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
  plan = make_plan(args, side, calibration)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(plan.to_json(), f, indent=1)
  print(f"[{side}] {calibration.steps_per_sec:.3f} steps/s, start-up "
        f"{calibration.startup_seconds:.0f} s -> {plan.num_train_steps} steps "
        f"(warm-up {plan.warmup_steps}) in {plan.budget_seconds / 60:g} min", flush=True)
  return plan
