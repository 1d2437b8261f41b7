"""One name per concept across every experiment config: old names are errors naming the new one.

Pre-training and fine-tuning once had `global_batch_size` and `train_batch_size` for the same
thing; `global_batch_size` (sequences or rows per optimizer step, all hosts together) is the one
kept. The vocabulary and casing were `config.data.vocab_file` in pre-training and
`config.vocab_file` in fine-tuning; both are `config.tokenizer.*` now. A renamed field stays in
the defaults as a typed placeholder (None) so that an override such as
`--config.train_batch_size=32` parses under a locked config and then fails here with the new
name, instead of a generic "no such field".

Also here: `replaced`, the one way a job derives values (a checkpoint's architecture, the
records built into WORKDIR/data) from its config without changing the config it was given.
"""
from typing import Any, Dict, Mapping

import ml_collections

# old dotted path -> new dotted path
RENAMED = {
    "train_batch_size": "global_batch_size",
    "vocab_file": "tokenizer.vocab_file",
    "spm_model_file": "tokenizer.spm_model_file",
    "do_lower_case": "tokenizer.do_lower_case",
    "data.vocab_file": "tokenizer.vocab_file",
    "data.spm_model_file": "tokenizer.spm_model_file",
    "data.do_lower_case": "tokenizer.do_lower_case",
}


def _parent(config: ml_collections.ConfigDict, path: str):
  """(the block holding `path`, its last name), or (None, name) if a block on the way is absent."""
  *blocks, name = path.split(".")
  for block in blocks:
    if block not in config:
      return None, name
    config = config[block]
  return config, name


def _value(config, path: str):
  parent, name = _parent(config, path)
  return parent[name] if parent is not None and name in parent else None


def reserve(config: ml_collections.ConfigDict) -> None:
  """Adds the placeholders of the renamed fields to a defaults config (after its new fields:
  each placeholder takes the type of the field that replaced it)."""
  for old, new in RENAMED.items():
    parent, name = _parent(config, old)
    current = _value(config, new)
    if parent is not None and current is not None:
      parent[name] = ml_collections.FieldReference(None, field_type=type(current))


def check(config: ml_collections.ConfigDict) -> None:
  """Raises if a renamed field was set, naming the field to use."""
  for old, new in RENAMED.items():
    value = _value(config, old)
    if value is not None and value != "":
      raise ValueError(f"config.{old}={value!r}: this field was renamed; use "
                       f"config.{new} (--config.{new}={value}) instead.")


def upgraded(values: Dict[str, Any]) -> Dict[str, Any]:
  """A config saved under the old names (e.g. an older best/task_config.json) under the new ones:
  what a run wrote is data, read as it was meant; only what a user sets must use the new names."""
  config = ml_collections.ConfigDict(values)
  for old, new in RENAMED.items():
    parent, name = _parent(config, old)
    if parent is None or name not in parent:
      continue
    value = parent[name]
    del parent[name]
    if value is None or _value(config, new) is not None:
      continue   # a placeholder, or already saved under the new name
    *blocks, last = new.split(".")
    target = config
    for block in blocks:
      if block not in target:
        target[block] = ml_collections.ConfigDict()
      target = target[block]
    target[last] = value
  return config.to_dict()


def replaced(config: ml_collections.ConfigDict,
             changes: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `config` with `changes` ({"model.vocab_size": 800, ...}: declared fields only; a
  dict value replaces a whole block, {"model": {...}}: another model family's fields);
  `config` itself is never changed."""
  copy = config.copy_and_resolve_references()
  fields = {}
  for name, value in changes.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      parent, last = _parent(copy, name)
      parent[last] = ml_collections.ConfigDict(dict(value))
    else:
      fields[name] = value
  copy.update_from_flattened_dict(fields)
  return copy
