"""`--prepare`: the vocabulary, the records, the held-out batches both sides are scored on."""
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
           "eval_batches.npz", "train_instances.npz", common.DATA_DONE)
  return {name: os.path.join(data, name) for name in names}


def read_data_info(out: str) -> dict:
  path = data_paths(out)[common.DATA_DONE]
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: run --prepare first")
  with open(path) as f:
    return json.load(f)


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
  """The unmasked training instances as compact numpy arrays (what the Trainer's dataset holds)."""
  import tensorflow as tf
  from data_pipelines import features as F
  spec = F.dynamic_feature_spec(seq)
  parts: Dict[str, List[np.ndarray]] = {"input_ids": [], "segment_ids": [], "lengths": [],
                                        "next_sentence_labels": []}
  for batch in tf.data.TFRecordDataset(record_path).batch(4096).map(
      lambda s: tf.io.parse_example(s, spec)).as_numpy_iterator():
    parts["input_ids"].append(batch[F.INPUT_IDS].astype(np.int32))
    parts["segment_ids"].append(batch[F.SEGMENT_IDS].astype(np.int8))
    parts["lengths"].append(batch[F.INPUT_MASK].sum(axis=1).astype(np.int32))
    parts["next_sentence_labels"].append(batch[F.NEXT_SENTENCE_LABELS][:, 0].astype(np.int8))
  return {k: np.concatenate(v) for k, v in parts.items()}


def prepare(args) -> dict:
  """OUT/data: corpus, vocabulary, records, fixed eval batches, training instances (once)."""
  from bert_jax.text import tokenization
  from data_pipelines import build_vocab, create_pretraining_data
  paths = data_paths(args.out)
  if os.path.exists(paths[common.DATA_DONE]):
    print(f"{paths[common.DATA_DONE]} exists: the data is prepared", flush=True)
    return read_data_info(args.out)
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
  info.update(eval_batches=len(batches),
              eval_sequences=int(sum(b["example_weight"].sum() for b in batches)),
              eval_masked_tokens=int(sum(b["masked_lm_weights"].sum() for b in batches)),
              documents=counts, instances=instances,
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
  return info
