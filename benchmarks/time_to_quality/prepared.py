"""`--prepare`: the vocabulary, the records, the held-out batches every side is scored on.

Two parts, each built once: BERT's (NSP-pair records, the held-out pairs set) and the modern
recipe's (contiguous-text records, the held-out text set), the second added to an OUT/data that
has only the first when `--prepare` runs again."""
import json
import math
import os
import time
from typing import Dict, List, Sequence

import numpy as np
from benchmarks.time_to_quality import common, corpus



def data_paths(out: str) -> Dict[str, str]:
  data = os.path.join(out, "data")
  names = ("train.txt", "eval.txt", "vocab.txt", "train.tfrecord", "eval.tfrecord",
           "eval_batches.npz", "train_instances.npz", common.DATA_DONE,
           # the contiguous-text part (the modern recipe's data, the held-out text set)
           "train_contiguous.tfrecord", "eval_contiguous.tfrecord", "eval_text_batches.npz",
           "train_contiguous_instances.npz")
  return {name: os.path.join(data, name) for name in names}


def read_data_info(out: str) -> dict:
  path = data_paths(out)[common.DATA_DONE]
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: run --prepare first")
  with open(path) as f:
    return json.load(f)


def contiguous_info(out: str) -> dict:
  """The contiguous-text part of OUT/data (DONE.json's `contiguous`), or an error saying how to
  add it."""
  info = read_data_info(out)
  if "contiguous" not in info:
    raise FileNotFoundError(f"{data_paths(out)[common.DATA_DONE]} has no contiguous-text part "
                            "(prepared before the modern sides existed): run --prepare again, "
                            "it adds that part and keeps the rest")
  return info["contiguous"]


def load_eval_sets(out: str) -> Dict[str, List[common.Batch]]:
  """The fixed held-out sets every side is scored on: {"pairs": batches, "text": batches}."""
  contiguous_info(out)
  paths = data_paths(out)
  return {"pairs": load_batches(paths["eval_batches.npz"]),
          "text": load_batches(paths["eval_text_batches.npz"])}


def jax_config(args, info: dict):
  """bert_jax's pre-training config of this benchmark (steps and cadences set by the caller)."""
  from bert_jax.model.config import BertConfig
  from experiments import pretraining_defaults
  paths = data_paths(args.out)
  c = pretraining_defaults.get_config(args.size)
  shape = BertConfig.named(args.size)
  c.model.update(vocab_size=info["vocab_size"], num_hidden_layers=shape.num_hidden_layers,
                 hidden_size=shape.hidden_size, num_attention_heads=shape.num_attention_heads,
                 intermediate_size=shape.intermediate_size,
                 max_position_embeddings=max(args.seq, 512), dtype="float32",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  c.max_seq_length, c.max_predictions_per_seq = info["seq"], info["max_predictions"]
  c.global_batch_size, c.eval_batch_size = args.batch, common.EVAL_BATCH
  c.learning_rate, c.seed = args.lr, args.seed
  c.data.input_files, c.data.eval_input_files = paths["train.tfrecord"], paths["eval.tfrecord"]
  c.tokenizer.vocab_file, c.tokenizer.do_lower_case = paths["vocab.txt"], True
  c.data.masking = "dynamic"
  c.data.shuffle_buffer_size = 10_000
  c.eval_steps = info["eval_batches"]
  c.log_every_steps = args.log_every
  c.keep_checkpoints = 2
  return c


def eval_batches_from_pipeline(config, max_sequences: int) -> List[common.Batch]:
  """The first batches of bert_jax's evaluation pipeline (fixed masks), as numpy."""
  from bert_jax.tasks.jobs import pretraining
  dataset = pretraining.input_pipeline_for(config, training=False, process_index=0,
                                           process_count=1)
  count = max(1, math.ceil(max_sequences / config.eval_batch_size))
  return [dict(b) for b in dataset.take(count).as_numpy_iterator()]


def save_batches(path: str, batches: Sequence[common.Batch]) -> None:
  np.savez(path, **{k: np.stack([b[k] for b in batches]) for k in batches[0]})


def load_batches(path: str) -> List[common.Batch]:
  with np.load(path) as data:
    stacked = {k: data[k] for k in data.files}
  return [{k: v[i] for k, v in stacked.items()} for i in range(len(stacked["input_ids"]))]


def read_instances(record_path: str, seq: int) -> Dict[str, np.ndarray]:
  """The unmasked training instances as compact numpy arrays (what the Trainer's dataset holds):
  input_ids and lengths, and for NSP pairs segment_ids and next_sentence_labels."""
  import tensorflow as tf
  from data_pipelines import features as F
  from data_pipelines import input_pipeline
  form = input_pipeline.instance_form(record_path)
  nsp = form == "pairs"
  spec = F.dynamic_feature_spec(seq, next_sentence_labels=nsp, packed=form == "documents")
  names = ("input_ids", "lengths") + (("segment_ids", "next_sentence_labels") if nsp else ())
  parts: Dict[str, List[np.ndarray]] = {name: [] for name in names}
  for batch in tf.data.TFRecordDataset(record_path).batch(4096).map(
      lambda s: tf.io.parse_example(s, spec)).as_numpy_iterator():
    parts["input_ids"].append(batch[F.INPUT_IDS].astype(np.int32))
    parts["lengths"].append(batch[F.INPUT_MASK].sum(axis=1).astype(np.int32))
    if nsp:
      parts["segment_ids"].append(batch[F.SEGMENT_IDS].astype(np.int8))
      parts["next_sentence_labels"].append(batch[F.NEXT_SENTENCE_LABELS][:, 0].astype(np.int8))
  return {k: np.concatenate(v) for k, v in parts.items()}


def _batch_counts(batches: Sequence[common.Batch]) -> dict:
  return dict(eval_batches=len(batches),
              eval_sequences=int(sum(b["example_weight"].sum() for b in batches)),
              eval_masked_tokens=int(sum(b["masked_lm_weights"].sum() for b in batches)))


def prepare_contiguous(args, info: dict) -> dict:
  """OUT/data's contiguous-text part: the same training and held-out documents and vocabulary as
  the pairs, as `create_pretraining_data --instances=contiguous` rows (each document followed by
  [SEP], the stream cut into [CLS] + seq - 2 tokens + [SEP]; `--dupe_factor` passes over the
  training documents, each in a fresh order, so each pass cuts the rows elsewhere; the held-out
  documents once); the held-out rows masked once at 15% by bert_jax's evaluation pipeline (the
  text set, OUT/data/eval_text_batches.npz); the training rows as numpy for transformers."""
  from bert_jax.text import tokenization
  from data_pipelines import create_pretraining_data
  paths = data_paths(args.out)
  tokenizer = tokenization.FullTokenizer(paths["vocab.txt"], do_lower_case=True)
  start = time.time()
  instances = {}
  for split in ("train", "eval"):
    stats = create_pretraining_data.create_pretraining_data(
        [paths[f"{split}.txt"]], [paths[f"{split}_contiguous.tfrecord"]], tokenizer,
        max_seq_length=info["seq"], max_predictions_per_seq=info["max_predictions"],
        random_seed=info["seed"], dupe_factor=args.dupe_factor if split == "train" else 1,
        masking="dynamic", instances="contiguous", num_workers=args.data_workers,
        progress=False)
    instances[split] = stats.instances
  seconds = dict(records=time.time() - start)
  print(f"contiguous records: {instances} ({seconds['records']:.0f} s)", flush=True)
  start = time.time()
  # BERT's evaluation config read over the contiguous rows: the same 15%, 80/10/10, cap and seed
  # as the pairs set (objective mlm: these rows have no NSP labels).
  config = jax_config(args, dict(info, eval_batches=0))
  config.objective = "mlm"
  config.data.eval_input_files = paths["eval_contiguous.tfrecord"]
  batches = eval_batches_from_pipeline(config, args.eval_sequences)
  save_batches(paths["eval_text_batches.npz"], batches)
  arrays = read_instances(paths["train_contiguous.tfrecord"], info["seq"])
  np.savez(paths["train_contiguous_instances.npz"], **arrays)
  seconds["numpy"] = time.time() - start
  part = dict(_batch_counts(batches), instances=instances,
              mean_train_length=float(arrays["lengths"].mean()), dupe_factor=args.dupe_factor,
              special=dict(pad=tokenizer.pad_id, cls=tokenizer.cls_id, sep=tokenizer.sep_id,
                           mask=tokenizer.mask_id),
              seconds=seconds)
  info = dict(info, contiguous=part)
  common.write_json(paths[common.DATA_DONE], info)
  print(json.dumps(part, indent=1), flush=True)
  return info


def prepare(args) -> dict:
  """OUT/data: corpus, vocabulary, records, fixed eval batches, training instances (once)."""
  from bert_jax.text import tokenization
  from data_pipelines import build_vocab, create_pretraining_data
  paths = data_paths(args.out)
  if os.path.exists(paths[common.DATA_DONE]):
    info = read_data_info(args.out)
    if "contiguous" in info:
      print(f"{paths[common.DATA_DONE]} exists: the data is prepared", flush=True)
      return info
    print(f"{paths[common.DATA_DONE]} exists without the contiguous-text part: adding it",
          flush=True)
    return prepare_contiguous(args, info)
  os.makedirs(os.path.dirname(paths[common.DATA_DONE]), exist_ok=True)
  seconds = {}
  start = time.time()
  docs = corpus.corpus_documents(args.text_dir, args.demo_documents, args.sentences_per_document)
  counts = corpus.write_corpus(docs, paths["train.txt"], paths["eval.txt"], args.holdout_every,
                        args.seed)
  seconds["corpus"] = time.time() - start
  print(f"corpus: {counts} ({seconds['corpus']:.0f} s)", flush=True)
  start = time.time()
  build_vocab.train_wordpiece([paths["train.txt"]], paths["vocab.txt"],
                              vocab_size=args.vocab_size, do_lower_case=True)
  tokenizer = tokenization.FullTokenizer(paths["vocab.txt"], do_lower_case=True)
  seconds["vocab"] = time.time() - start
  start = time.time()
  instances = {}
  for split in ("train", "eval"):
    stats = create_pretraining_data.create_pretraining_data(
        [paths[f"{split}.txt"]], [paths[f"{split}.tfrecord"]], tokenizer,
        max_seq_length=args.seq, max_predictions_per_seq=args.max_predictions,
        random_seed=args.seed, dupe_factor=args.dupe_factor if split == "train" else 1,
        masking="dynamic", num_workers=args.data_workers, progress=False)
    instances[split] = stats.instances
  seconds["records"] = time.time() - start
  print(f"records: {instances} ({seconds['records']:.0f} s)", flush=True)
  start = time.time()
  info = dict(vocab_size=tokenizer.vocab_size, seq=args.seq, max_predictions=args.max_predictions,
              seed=args.seed, eval_batches=0)
  batches = eval_batches_from_pipeline(jax_config(args, info), args.eval_sequences)
  save_batches(paths["eval_batches.npz"], batches)
  arrays = read_instances(paths["train.tfrecord"], args.seq)
  np.savez(paths["train_instances.npz"], **arrays)
  seconds["numpy"] = time.time() - start
  info.update(_batch_counts(batches), documents=counts, instances=instances,
              mean_train_length=float(arrays["lengths"].mean()),
              settings=dict(vocab_size=args.vocab_size, dupe_factor=args.dupe_factor,
                            holdout_every=args.holdout_every,
                            sentences_per_document=args.sentences_per_document,
                            demo_documents=args.demo_documents,
                            text_dir=os.path.abspath(args.text_dir)),
              seconds=seconds)
  with open(paths[common.DATA_DONE], "w") as f:
    json.dump(info, f, indent=1)
  print(json.dumps(info, indent=1), flush=True)
  return prepare_contiguous(args, info)
