"""The encoder families and the one registry of them: a family is a folder here and a line in
`FAMILIES`. Everything else asks `of(config)` (or `for_huggingface(values)`) for the family and
calls it (`bert_jax.families.base.Family`); no code outside these folders switches on a name.

| family       | folder        | transformers `model_type` |
|--------------|---------------|---------------------------|
| `bert`       | `bert/`       | bert                      |
| `modernbert` | `modernbert/` | modernbert                |
| `roberta`    | `roberta/`    | roberta, xlm-roberta      |
"""
from typing import Any, Dict

from bert_jax.families import base, bert, modernbert, roberta
from bert_jax.model.config import BertConfig

FAMILIES: Dict[str, base.Family] = {
    "bert": bert.FAMILY,
    "modernbert": modernbert.FAMILY,
    "roberta": roberta.FAMILY,
}


def of(config: BertConfig) -> base.Family:
  """The family of a config (`config.architecture`)."""
  return named(config.architecture)


def named(name: str) -> base.Family:
  if name not in FAMILIES:
    raise ValueError(f"config.model.architecture={name!r}: expected one of {sorted(FAMILIES)}")
  return FAMILIES[name]


def for_huggingface(values: Dict[str, Any], source: str) -> base.Family:
  """The family whose transformers `config.json` this is (by `model_type`; none: BERT's fields)."""
  model_type = values.get("model_type", "bert")
  for family in FAMILIES.values():
    if model_type in family.huggingface_model_types:
      return family
  known = sorted(t for f in FAMILIES.values() for t in f.huggingface_model_types)
  raise ValueError(f"{source}: model_type {model_type!r} is not a family bert_jax has "
                   f"(model types: {known})")
