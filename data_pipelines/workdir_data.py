"""Raw documents -> what a pre-training run reads, built once into WORKDIR/data.

Used by the demo (Python's documentation) and by continued pre-training on a user's text files
(`config.data.text_files`). Every `holdout_every`-th document goes to the held-out split; the
vocabulary is the run's (`config.tokenizer.vocab_file` / `spm_model_file` / `tokenizer_file`, e.g.
a checkpoint's) or, if none is given, a WordPiece vocabulary of `config.model.vocab_size` learned
on the training documents. Records use dynamic masking and hold sentence pairs with NSP labels,
or, with `config.data.instances="contiguous"`, contiguous full-length instances without them. A
later run (a resume) finds WORKDIR/data/DONE and reuses the files, so the data never changes under
a running experiment (asking for the other kind of instances then is an error).
"""
from typing import Any, Callable, Dict, Iterable, List, Tuple

from bert_jax.io import filesystem
from bert_jax.text import tokenization

DONE = "DONE"


def write_corpus(documents: Iterable[List[str]], train_path: str, eval_path: str,
                 holdout_every: int = 20) -> Tuple[int, int]:
  """Documents in BERT's input format (a sentence per line, a blank line between documents);
  every `holdout_every`-th to `eval_path`. Returns (train documents, eval documents)."""
  counts = [0, 0]
  with filesystem.open(train_path, "w") as train, filesystem.open(eval_path, "w") as held_out:
    for i, sentences in enumerate(documents):
      is_eval = i % holdout_every == 0
      (held_out if is_eval else train).write("\n".join(sentences) + "\n\n")
      counts[is_eval] += 1
  if not counts[0] or not counts[1]:
    raise ValueError(f"{counts[0]} training and {counts[1]} held-out documents: need at least "
                     f"one of each (every {holdout_every}th document is held out)")
  return counts[0], counts[1]


def prepare(config, workdir: str, documents: Callable[[], Iterable[List[str]]],
            description: str) -> Dict[str, Any]:
  """Builds WORKDIR/data once; returns the config changes that point a run at it
  ({"data.input_files": ..., "tokenizer.vocab_file": ..., "model.vocab_size": ...}: apply them
  with `config.update_from_flattened_dict` or `config_names.replaced`). `config` is not changed.

  documents: called only when the data is built (a resume never reads the corpus again).
  """
  from data_pipelines import build_vocab, create_pretraining_data
  data_dir = filesystem.join(workdir, "data")
  paths = {name: filesystem.join(data_dir, name)
           for name in ("train.txt", "eval.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord")}
  given_vocab = (config.tokenizer.vocab_file or config.tokenizer.spm_model_file
                 or config.tokenizer.tokenizer_file)
  instances = config.data.instances
  if instances not in create_pretraining_data.INSTANCES:
    raise ValueError(f"config.data.instances={instances!r}: expected one of "
                     f"{create_pretraining_data.INSTANCES}")
  if instances == "contiguous" and config.objective == "mlm_nsp":
    raise ValueError("config.data.instances='contiguous' writes records without NSP labels, but "
                     "config.objective='mlm_nsp' trains NSP: use --config.objective=mlm (or ltr), "
                     "or config.data.instances='pairs'")
  if filesystem.exists(filesystem.join(data_dir, DONE)):
    _check_instances(paths["train.tfrecord"], instances)
  else:
    filesystem.makedirs(data_dir)
    print(f"Building pre-training records from {description} in {data_dir} ...", flush=True)
    train_docs, eval_docs = write_corpus(documents(), paths["train.txt"], paths["eval.txt"],
                                         config.data.holdout_every)
    if not given_vocab:
      build_vocab.train_wordpiece([paths["train.txt"]], paths["vocab.txt"],
                                  vocab_size=config.model.vocab_size, do_lower_case=True)
    tokenizer = _tokenizer(config, paths["vocab.txt"])
    for split in ("train", "eval"):
      create_pretraining_data.create_pretraining_data(
          [paths[f"{split}.txt"]], [paths[f"{split}.tfrecord"]], tokenizer,
          max_seq_length=config.max_seq_length,
          max_predictions_per_seq=config.max_predictions_per_seq, random_seed=config.seed,
          dupe_factor=config.data.dupe_factor if split == "train" else 1,
          masking="dynamic", instances=instances, progress=False)
    filesystem.write_text(filesystem.join(data_dir, DONE),
                          f"{train_docs} train documents, {eval_docs} eval documents\n")
  changes: Dict[str, Any] = {
      "data.input_files": paths["train.tfrecord"],
      # Evaluation on other held-out records (e.g. another corpus's) when the config names them.
      "data.eval_input_files": config.data.eval_input_files or paths["eval.tfrecord"],
      "data.masking": "dynamic"}
  if not given_vocab:
    changes.update({"tokenizer.vocab_file": paths["vocab.txt"], "tokenizer.do_lower_case": True,
                    "model.vocab_size": _tokenizer(config, paths["vocab.txt"]).vocab_size})
  else:  # a copy in WORKDIR/data: fine-tuning from this workdir finds its vocabulary there
    name = ("vocab.txt" if config.tokenizer.vocab_file else
            "spm.model" if config.tokenizer.spm_model_file else "tokenizer.json")
    copy = filesystem.join(data_dir, name)
    if not filesystem.exists(copy):
      filesystem.copy(given_vocab, copy)
  return changes


def _check_instances(records: str, instances: str) -> None:
  """Reused records must be the kind of instances the run asks for (NSP labels or none)."""
  from data_pipelines import input_pipeline
  built = "pairs" if input_pipeline.has_nsp_labels(records) else "contiguous"
  if built != instances:
    raise ValueError(f"{records} holds {built} instances (built by an earlier run in this "
                     f"workdir), but config.data.instances={instances!r}: use a new workdir, or "
                     f"config.data.instances={built!r}")


def _tokenizer(config, learned_vocab: str):
  if (config.tokenizer.vocab_file or config.tokenizer.spm_model_file
      or config.tokenizer.tokenizer_file):
    return tokenization.create_tokenizer(vocab_file=config.tokenizer.vocab_file or None,
                                         spm_model_file=config.tokenizer.spm_model_file or None,
                                         tokenizer_file=config.tokenizer.tokenizer_file or None,
                                         do_lower_case=config.tokenizer.do_lower_case)
  return tokenization.FullTokenizer(learned_vocab, do_lower_case=True)
