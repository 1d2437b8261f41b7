"""A fine-tuned model as a run left it in `WORKDIR/best/`, loaded back for use.

`best/` holds the encoder (`save_pretrained`), `head.safetensors`, the vocabulary and
`task_config.json` (the experiment config of the run). `load(path)` rebuilds from them exactly
what the run predicted with: the task definition (features, head, post-processing), the model,
its parameters and the tokenizer. `bert_jax.predict` and `bert_jax.export` start here.
"""
import dataclasses
import json
from typing import Any, Dict

import ml_collections

from bert_jax.io import checkpoints, filesystem
from bert_jax.model.config import BertConfig
from bert_jax.tasks import registry
from bert_jax.tasks.framework import best_model, finetuning, output_kinds
from bert_jax.runtime import config_names


@dataclasses.dataclass
class FineTuned:
  directory: str                           # the best/ directory
  config: ml_collections.ConfigDict        # the run's experiment config
  task: finetuning.Task
  bert_config: BertConfig
  model: finetuning.FineTuningModel
  params: Dict[str, Any]                   # {"bert": ..., "head": ...}, host numpy
  tokenizer: Any

  @property
  def output_kind(self) -> output_kinds.OutputKind:
    """What the head's outputs mean: predict's records, the exports' outputs and classes."""
    return output_kinds.resolve(self.task.output_kind)

  @property
  def kind(self) -> str:
    """The output kind's name (signature.json's "kind")."""
    return self.output_kind.name

  @property
  def labels(self):
    return self.task.labels


def best_directory(path: str) -> str:
  """`path` itself if it is a best/ directory, else `path/best` (a fine-tuning workdir); for a
  save that stopped between its renames, the complete one beside it (`best_model.best_location`)."""
  for candidate in (path, filesystem.join(path, best_model.BEST_DIR)):
    found = best_model.best_location(candidate)
    if found:
      return found
  raise FileNotFoundError(
      f"{path}: not a fine-tuned model (no {best_model.BEST_INFO} in it or in "
      f"{filesystem.join(path, best_model.BEST_DIR)}); give WORKDIR/best of a fine-tuning run")


def read_task_config(directory: str) -> ml_collections.ConfigDict:
  path = filesystem.join(directory, best_model.TASK_CONFIG)
  if not filesystem.exists(path):
    raise FileNotFoundError(
        f"{path} is missing: this best/ was written before task_config.json was recorded; "
        "fine-tune it again (or rerun with num_train_epochs=0 from it) to record the task")
  # Older runs saved the tokenizer fields under their old names (vocab_file, do_lower_case).
  config = ml_collections.ConfigDict(config_names.upgraded(json.loads(filesystem.read_text(path))))
  if config.get("task") not in registry.finetuning_tasks():
    raise ValueError(f"{path}: task={config.get('task')!r} cannot be loaded for prediction "
                     f"(expected one of {list(registry.finetuning_tasks())})")
  return config


def load(path: str, **model_overrides) -> FineTuned:
  """The fine-tuned model in `path` (a best/ directory or its workdir).

  model_overrides: runtime fields of `config.model` (e.g. dtype="bfloat16")."""
  directory = best_directory(path)
  best_model.check_best(directory)
  # Everything comes from best/ now, whatever paths the run had (they may not exist here).
  vocab_file, spm_model_file, tokenizer_file = (p or "" for p in checkpoints.find_vocab(directory))
  config = config_names.replaced(read_task_config(directory), dict(
      {"init_checkpoint": directory, "tokenizer.vocab_file": vocab_file,
       "tokenizer.spm_model_file": spm_model_file, "tokenizer.tokenizer_file": tokenizer_file},
      **{f"model.{k}": v for k, v in model_overrides.items()}))
  task = registry.make_task(config)
  if not task.output_kind:
    raise ValueError(f"Task {task.name} declares no output_kind; predict cannot read its outputs")
  output_kinds.resolve(task.output_kind)   # an unknown one: said now, before the model loads
  loaded_config, encoder = checkpoints.load_pretrained(directory)
  bert_config = finetuning.bert_config_for(config, loaded_config)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  params = {"bert": checkpoints.to_model_layout(encoder, bert_config)["bert"],
            "head": best_model.read_head(directory)}
  model = finetuning.FineTuningModel(bert_config, task.make_head(), task.output_hidden_states,
                                     task.freeze_encoder)
  return FineTuned(directory, config, task, bert_config, model, params, tokenizer)
