"""README and docs/families.md list the model families and what each runs: the table is the
registry's (`bert_jax.families`), checked here row by row."""
import os

from bert_jax import families
from bert_jax.families import base
from bert_jax.model.config import BertConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A representative config of each family, for its transformers classes.
EXAMPLES = {"bert": ["base"], "modernbert": ["modernbert-base"],
            "roberta": ["roberta-base", "xlm-roberta-base"]}
HEAD_NAMES = {"encoder": "encoder", "masked_lm": "masked LM", "pretraining": "MLM + NSP",
              "sequence_classification": "sequence classification",
              "multiple_choice": "multiple choice", "token_classification": "token classification",
              "question_answering": "question answering"}


def family_table() -> str:
  """The families table of README.md and docs/families.md, from the registry."""
  rows = ["| family | transformers `model_type` | sizes | pre-training objectives | "
          "transformers classes (export and import) |",
          "|---|---|---|---|---|"]
  for name, family in families.FAMILIES.items():
    configs = [BertConfig.named(size) for size in EXAMPLES[name]]
    sizes = sorted(size for size in type(configs[0]).SIZES)
    classes = []
    for config in configs:
      found = family.huggingface_classes_of(config)
      classes.append(", ".join(f"`{found[h]}`" for h in base.HEADS if h in found))
    rows.append(f"| `{name}` | {', '.join(f'`{t}`' for t in family.huggingface_model_types)} | "
                f"{', '.join(f'`{s}`' for s in sizes)} | "
                f"{', '.join(f'`{o}`' for o in family.objectives)} | {'; '.join(classes)} |")
  return "\n".join(rows)


def test_readme_and_the_families_guide_carry_the_registrys_table():
  table = family_table()
  for page in ("README.md", os.path.join("docs", "families.md")):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
      assert table in f.read(), f"{page}: the families table is not the registry's:\n{table}"


def test_every_head_has_a_class_or_a_named_error():
  for name, family in families.FAMILIES.items():
    config = BertConfig.named(EXAMPLES[name][0])
    for head in base.HEADS:
      try:
        assert family.huggingface_class(config, head)
      except ValueError as e:
        assert name in str(e) and head.replace("_", " ") in str(e)
