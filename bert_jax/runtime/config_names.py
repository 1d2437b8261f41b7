"""One name per concept across every experiment config: old names are errors naming the new one.

Pre-training and fine-tuning once had `global_batch_size` and `train_batch_size` for the same
thing; `global_batch_size` (sequences or rows per optimizer step, all hosts together) is the one
kept. A renamed field stays in the defaults as a placeholder (0) so that an override such as
`--config.train_batch_size=32` parses and then fails here with the new name, instead of a
generic "no such field".
"""
import ml_collections

RENAMED = {"train_batch_size": "global_batch_size"}


def reserve(config: ml_collections.ConfigDict) -> None:
  """Adds the placeholders of the renamed fields to a defaults config."""
  for old in RENAMED:
    config[old] = 0


def check(config: ml_collections.ConfigDict) -> None:
  """Raises if a renamed field was set, naming the field to use."""
  for old, new in RENAMED.items():
    if config.get(old):
      raise ValueError(f"config.{old}={config[old]!r}: this field was renamed; use "
                       f"config.{new} (--config.{new}={config[old]}) instead.")
