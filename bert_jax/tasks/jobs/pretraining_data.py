"""WORKDIR/data of a pre-training run: the demo corpus (`config.data.prepare_demo_corpus`) or the
user's text files (`config.data.text_files`) built into the workdir once.

The one place where the run's config becomes the explicit arguments of `data_pipelines.workdir_data`
(`Settings`, `Vocabulary`, the corpus), and what was built becomes config changes again (the
records, and a learned vocabulary with its size).
"""
from typing import Any, Dict

import ml_collections

from bert_jax.io import filesystem
from bert_jax.runtime import config_names


def settings(config: ml_collections.ConfigDict):
  """(`workdir_data.Settings`, `workdir_data.Vocabulary`) of the run; fails naming the field when
  the instances do not suit the objective."""
  from data_pipelines import create_pretraining_data, workdir_data
  instances = config.data.instances
  if instances not in create_pretraining_data.INSTANCES:
    raise ValueError(f"config.data.instances={instances!r}: expected one of "
                     f"{create_pretraining_data.INSTANCES}")
  if instances in create_pretraining_data.WITHOUT_NSP and config.objective == "mlm_nsp":
    raise ValueError(f"config.data.instances={instances!r} writes records without NSP labels, but "
                     "config.objective='mlm_nsp' trains NSP: use --config.objective=mlm (or ltr), "
                     "or config.data.instances='pairs'")
  tokenizer = config.tokenizer
  return (workdir_data.Settings(
              max_seq_length=config.max_seq_length,
              max_predictions_per_seq=config.max_predictions_per_seq, seed=config.seed,
              dupe_factor=config.data.dupe_factor, holdout_every=config.data.holdout_every,
              instances=instances, learned_vocab_size=config.model.vocab_size),
          workdir_data.Vocabulary(vocab_file=tokenizer.vocab_file or "",
                                  spm_model_file=tokenizer.spm_model_file or "",
                                  tokenizer_file=tokenizer.tokenizer_file or "",
                                  do_lower_case=tokenizer.do_lower_case))


def corpus(config: ml_collections.ConfigDict):
  """The raw documents the config asks to build WORKDIR/data from (`workdir_data.Corpus`): the
  text files, else the demo corpus; None for neither (the config names its records)."""
  from data_pipelines import demo_corpus, workdir_data
  if config.data.text_files:
    return workdir_data.text_files(config.data.text_files)
  if config.data.prepare_demo_corpus:
    return demo_corpus.corpus(config.data.demo_max_documents)
  return None


def data_changes(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """WORKDIR/data built (once) from the corpus the config asks for; the config changes that
  read it ({"data.input_files": ..., "tokenizer.vocab_file": ..., "model.vocab_size": ...}: apply
  them with `config_names.replaced`). {} when the config asks for no corpus. `config` is not
  changed."""
  from data_pipelines import workdir_data
  documents = corpus(config)
  if documents is None:
    return {}
  record_settings, vocabulary = settings(config)
  try:
    prepared = workdir_data.prepare(workdir, documents, record_settings, vocabulary)
  except workdir_data.InstancesMismatch as error:
    raise ValueError(f"{error.records} holds {error.built} instances (built by an earlier run "
                     f"in this workdir), but config.data.instances={error.asked!r}: use a new "
                     f"workdir, or config.data.instances={error.built!r}") from None
  return _changes(config, prepared)


def _changes(config: ml_collections.ConfigDict, prepared) -> Dict[str, Any]:
  """The config changes that read `prepared` (`workdir_data.Prepared`)."""
  changes: Dict[str, Any] = {
      "data.input_files": prepared.train_records,
      # Evaluation on other held-out records (e.g. another corpus's) when the config names them.
      "data.eval_input_files": config.data.eval_input_files or prepared.eval_records,
      "data.masking": "dynamic"}
  if prepared.learned_vocab_file:
    changes.update({"tokenizer.vocab_file": prepared.learned_vocab_file,
                    "tokenizer.do_lower_case": True,
                    "model.vocab_size": prepared.learned_vocab_size})
  return changes


def prepare(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """The workdir made if needed (any filesystem) and the corpus the config asks for built into
  it; returns `config` (a copy) with the records (and a learned vocabulary) in WORKDIR/data
  filled in. Records named nowhere are an error."""
  filesystem.makedirs(workdir)
  config = config_names.replaced(config, data_changes(config, workdir))
  if not config.data.input_files:
    raise ValueError("config.data.input_files is empty: point it at pre-training TFRecords "
                     "(python -m data_pipelines.create_pretraining_data writes them)")
  return config
