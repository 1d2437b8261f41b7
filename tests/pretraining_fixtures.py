"""Small pre-training inputs the tests generate: a vocabulary and unmasked (dynamic) records.

The text is learnable: segment A repeats one word and B repeats the same word (IsNext) or another
random word (NotNext), so a masked token is predictable from the rest of its segment and MLM
accuracy can rise far above chance (1/VOCAB).
"""
import contextlib
import os

import numpy as np
import tensorflow as tf

from data_pipelines import features

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(40)]
VOCAB = SPECIALS + WORDS
SEQ = 32


@contextlib.contextmanager
def _atomically(path: str):
  """Yields a temporary name for `path` and renames it into place when written.

  Every process of a multi-process run loads the experiment, and `tiny_config` (re)writes the
  data: a file truncated in place under a process already reading it was a corrupted record
  (and a hung partner). A rename swaps whole files; readers keep the one they opened. The
  temporary name starts with a dot so that no data pattern (`train-*.tfrecord`) matches it.
  """
  directory, name = os.path.split(path)
  temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
  yield temporary
  os.replace(temporary, path)


def write_vocab(directory) -> str:
  path = os.path.join(directory, "vocab.txt")
  with _atomically(path) as temporary, open(temporary, "w") as f:
    f.write("\n".join(VOCAB) + "\n")
  return path


def _instance(rng):
  first = len(SPECIALS)
  len_a, len_b = rng.randint(4, 12), rng.randint(4, 12)
  topic = rng.randint(len(WORDS))
  a = [first + topic] * len_a
  is_random = rng.rand() < 0.5
  b_topic = rng.randint(len(WORDS)) if is_random else topic
  b = [first + b_topic] * len_b
  ids = [VOCAB.index("[CLS]")] + a + [VOCAB.index("[SEP]")] + b + [VOCAB.index("[SEP]")]
  segments = [0] * (len_a + 2) + [1] * (len_b + 1)
  pad = SEQ - len(ids)
  as_feature = lambda xs: tf.train.Feature(int64_list=tf.train.Int64List(value=xs))
  return tf.train.Example(features=tf.train.Features(feature={
      features.INPUT_IDS: as_feature(ids + [0] * pad),
      features.INPUT_MASK: as_feature([1] * len(ids) + [0] * pad),
      features.SEGMENT_IDS: as_feature(segments + [0] * pad),
      features.NEXT_SENTENCE_LABELS: as_feature([int(is_random)]),
      features.IS_WORD_CONTINUATION: as_feature([0] * SEQ),
  }))


def write_records(path: str, count: int, seed: int) -> str:
  rng = np.random.RandomState(seed)
  with _atomically(path) as temporary, tf.io.TFRecordWriter(temporary) as writer:
    for _ in range(count):
      writer.write(_instance(rng).SerializeToString())
  return path


def make_data(directory, train_count=512, eval_count=64):
  """(vocab_file, train_pattern, eval_file) in `directory`."""
  os.makedirs(directory, exist_ok=True)
  vocab = write_vocab(directory)
  write_records(os.path.join(directory, "train-0.tfrecord"), train_count // 2, seed=1)
  write_records(os.path.join(directory, "train-1.tfrecord"), train_count // 2, seed=2)
  eval_file = write_records(os.path.join(directory, "eval.tfrecord"), eval_count, seed=3)
  return vocab, os.path.join(directory, "train-*.tfrecord"), eval_file


def tiny_config(data_dir, **overrides):
  """A real pre-training config (the defaults every experiment uses), shrunk."""
  from experiments import pretraining_defaults
  vocab, train, eval_file = make_data(data_dir)
  c = pretraining_defaults.get_config("tiny")
  c.model.update(vocab_size=len(VOCAB), hidden_size=32, num_attention_heads=2,
                 intermediate_size=64, num_hidden_layers=2, max_position_embeddings=SEQ)
  c.max_seq_length, c.max_predictions_per_seq = SEQ, 5
  c.global_batch_size, c.eval_batch_size = 8, 16
  c.num_train_steps, c.warmup_steps, c.learning_rate = 12, 2, 5e-3
  c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps, c.eval_steps = 1, 4, 6, 0
  c.data.input_files, c.data.eval_input_files, c.tokenizer.vocab_file = train, eval_file, vocab
  c.tokenizer.do_lower_case = False
  c.data.shuffle_buffer_size = 64
  for key, value in overrides.items():
    target = c
    *path, last = key.split(".")
    for part in path:
      target = target[part]
    target[last] = value
  return c


def write_experiment(directory, data_dir, **overrides) -> str:
  """An experiment file returning `tiny_config(data_dir, **overrides)`, for subprocess runs."""
  path = os.path.join(directory, "tiny_experiment.py")
  with open(path, "w") as f:
    f.write("from tests.pretraining_fixtures import tiny_config\n\n\n"
            f"def get_config():\n  return tiny_config({str(data_dir)!r}, **{overrides!r})\n")
  return path
