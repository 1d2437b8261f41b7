r"""Contextual features from a pretrained BERT, in the original `extract_features.py` format.

  python -m bert_jax.extract_features --input_file=input.txt --output_file=features.jsonl \
    --init_checkpoint=PATH --vocab_file=vocab.txt --layers=-1,-2,-3,-4 --max_seq_length=128

Each input line is a text, or a pair written `text_a ||| text_b`. Output: one JSON line per input
line, `{"linex_index": i, "features": [{"token": t, "layers": [{"index": -1, "values": [...]},
...]}, ...]}` over every token including [CLS] and [SEP] (values rounded to 6 decimals, as the
original). Layer -1 is the last encoder layer; -(L+1) is the embedding output.

With `--pooling=cls|mean` the output is one sentence vector per line instead:
`{"linex_index": i, "pooling": "mean", "layer": -1, "values": [...]}` (mean over the real tokens,
or the [CLS] hidden state, of the first layer in --layers).

`--length_bucket=N` runs each batch at the smallest multiple of N holding its longest line instead
of --max_seq_length (the same features, less padding computed; at most max_seq_length / N shapes
compiled).
"""
import json
import re
from typing import Iterator, Optional, Sequence, Tuple

import jax
import numpy as np
from absl import app, flags

from bert_jax import families
from bert_jax.io import checkpoints, filesystem
from bert_jax.model import layers
from bert_jax.runtime import inference
from bert_jax.text.pairs import join_pair, truncate_seq_pair

_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


def read_examples(path: str) -> Iterator[Tuple[int, str, Optional[str]]]:
  """(line index, text_a, text_b or None) for every line; streamed, never all in memory."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"Input file not found: {path}")
  with filesystem.open(path, encoding="utf-8", errors="replace") as f:
    for index, line in enumerate(f):
      line = line.rstrip("\n")
      match = _PAIR.match(line)
      if match:
        yield index, match.group(1), match.group(2)
      else:
        yield index, line, None


def encode(tokenizer, text_a: str, text_b: Optional[str], max_seq_length: int):
  """[CLS] A [SEP] (B [SEP]) -> (tokens, ids, segment ids), truncated as the original; a
  tokenizer whose pairs take two separators (RoBERTa's `<s> A </s></s> B </s>`) joins them so."""
  separators = getattr(tokenizer, "pair_separators", 1)
  tokens_a = tokenizer.tokenize(text_a)
  tokens_b = tokenizer.tokenize(text_b) if text_b is not None else None
  if tokens_b is not None:
    truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 2 - separators)
  else:
    tokens_a = tokens_a[:max_seq_length - 2]
  cls, sep = tokenizer.convert_ids_to_tokens([tokenizer.cls_id, tokenizer.sep_id])  # [CLS], <s>
  tokens, segments = join_pair(tokens_a, tokens_b, cls, sep, separators)
  ids = tokenizer.convert_tokens_to_ids(tokens)
  return tokens, ids, segments


class FeatureExtractor:
  """The encoder on `runtime.inference`: fixed shapes (one compilation for the whole file), or
  with `length_bucket` N > 0 each batch cut to a multiple of N (`length_buckets.bucket_length`)."""

  def __init__(self, init_checkpoint: str, max_seq_length: int = 128, batch_size: int = 32,
               dtype: str = "float32", length_bucket: int = 0):
    self.config, params = checkpoints.load_pretrained(init_checkpoint)
    self.config = self.config.replace(dtype=dtype)
    self.family = families.of(self.config)
    self.family.check_length(self.config, max_seq_length, init_checkpoint)
    self.params = jax.device_put(params["bert"])
    self.max_seq_length, self.batch_size = max_seq_length, batch_size
    self.length_bucket = length_bucket
    self._encoder = inference.BatchedInference(inference.encoder_hidden_states(self.config),
                                               batch_size, length_bucket=length_bucket)

  def hidden_states(self, ids: np.ndarray, mask: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """[B, S] numpy inputs (B <= batch_size, S <= max_seq_length) -> [L+1, B, S', H] float32
    numpy: S' is max_seq_length, or the bucket holding the longest row."""
    # Clear errors before any compilation; a family without token types ignores the segments.
    layers.check_inputs(self.config, ids, segments if self.family.token_types else None,
                        self.family.max_positions(self.config))
    arrays = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
    out = self._encoder.batch(self.params, arrays, np.arange(ids.shape[0]), self.max_seq_length)
    return np.asarray(out["hidden_states"], np.float32).swapaxes(0, 1)     # [L+1, B, S', H]


def _batches(examples, tokenizer, max_seq_length: int, batch_size: int):
  batch = []
  for index, text_a, text_b in examples:
    batch.append((index,) + encode(tokenizer, text_a, text_b, max_seq_length))
    if len(batch) == batch_size:
      yield batch
      batch = []
  if batch:
    yield batch


def extract(input_file: str, output_file: str, init_checkpoint: str, tokenizer,
            layers: Sequence[int] = (-1, -2, -3, -4), max_seq_length: int = 128,
            batch_size: int = 32, pooling: Optional[str] = None, length_bucket: int = 0) -> int:
  """Writes the features of every line of `input_file`; returns the number of lines."""
  if pooling not in (None, "", "cls", "mean"):
    raise ValueError(f"--pooling={pooling!r}: expected cls or mean")
  if not filesystem.exists(input_file):  # fail before loading the checkpoint
    raise FileNotFoundError(f"Input file not found: {input_file}")
  if length_bucket < 0:
    raise ValueError(f"--length_bucket={length_bucket}: must be >= 0 (0: pad to --max_seq_length)")
  extractor = FeatureExtractor(init_checkpoint, max_seq_length, batch_size,
                               length_bucket=length_bucket)
  num_states = extractor.config.num_hidden_layers + 1
  for layer in layers:
    if not -num_states <= layer < num_states:
      raise ValueError(f"--layers: {layer} is out of range for {num_states - 1} layers "
                       f"(use -1..-{num_states})")
  if tokenizer.vocab_size > extractor.config.vocab_size:
    raise ValueError(f"The vocabulary has {tokenizer.vocab_size} entries but the checkpoint "
                     f"{init_checkpoint} has vocab_size={extractor.config.vocab_size}")
  filesystem.makedirs(filesystem.dirname(filesystem.absolute(output_file)))
  count = 0
  with filesystem.open(output_file, "w") as out:
    for batch in _batches(read_examples(input_file), tokenizer, max_seq_length, batch_size):
      length = max(len(b[2]) for b in batch)
      ids = np.full((len(batch), length), tokenizer.pad_id, np.int32)   # as transformers pads
      segments, mask = np.zeros_like(ids), np.zeros_like(ids)
      for row, (_, _, token_ids, segment_ids) in enumerate(batch):
        ids[row, :len(token_ids)] = token_ids
        segments[row, :len(token_ids)] = segment_ids
        mask[row, :len(token_ids)] = 1
      states = extractor.hidden_states(ids, mask, segments)   # [L+1, B, S, H]
      for row, (index, tokens, _, _) in enumerate(batch):
        if pooling:
          layer_states = states[layers[0], row, :len(tokens)]  # [T, H]
          vector = layer_states[0] if pooling == "cls" else layer_states.mean(axis=0)
          record = {"linex_index": index, "pooling": pooling, "layer": layers[0],
                    "values": [round(float(x), 6) for x in vector]}
        else:
          record = {"linex_index": index, "features": [
              {"token": token, "layers": [
                  {"index": layer, "values": [round(float(x), 6) for x in states[layer, row, t]]}
                  for layer in layers]}
              for t, token in enumerate(tokens)]}
        out.write(json.dumps(record) + "\n")
        count += 1
  return count


FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("input_file", None, "Text, one example per line; pairs as 'a ||| b'.")
  flags.DEFINE_string("output_file", None, "Where the JSON lines go.")
  flags.DEFINE_string("init_checkpoint", None, "Any checkpoint load_pretrained accepts.")
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: the vocab.txt, spm.model "
                      "or tokenizer.json beside the checkpoint).")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model instead of --vocab_file.")
  flags.DEFINE_string("tokenizer_file", None, "Hugging Face tokenizer.json instead of "
                      "--vocab_file (its own normalizer decides the casing).")
  flags.DEFINE_string("layers", "-1,-2,-3,-4", "Layer indices to output.")
  flags.DEFINE_integer("max_seq_length", 128, "Longer inputs are truncated.")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case (uncased models).")
  flags.DEFINE_integer("batch_size", 32, "Sequences per forward pass.")
  flags.DEFINE_enum("pooling", "", ["", "cls", "mean"],
                    "Write one pooled sentence vector per line instead of per-token features.")
  flags.DEFINE_integer("length_bucket", 0, "0: every batch padded to --max_seq_length. N > 0: "
                       "each batch to the smallest multiple of N holding its longest line.")
  flags.DEFINE_bool("allow_pickle", False, "Read a PyTorch pickle checkpoint "
                    "(pytorch_model.bin) as --init_checkpoint: a pickle can run code when "
                    "loaded, so only for a source you trust.")
  flags.mark_flags_as_required(["input_file", "output_file", "init_checkpoint"])


def main(argv):
  del argv
  from bert_jax.io import remote_storage
  from bert_jax.text import tokenization
  # A bucket name Cloud Storage rejects: said now, not after the checkpoint is loaded.
  remote_storage.check_paths(
      {f"--{name}": FLAGS[name].value for name in ("input_file", "output_file",
                                                  "init_checkpoint", "vocab_file",
                                                  "spm_model_file", "tokenizer_file")},
      written=["--output_file"])
  if FLAGS.allow_pickle:
    checkpoints.trust_pickle_files()
  files = (FLAGS.vocab_file, FLAGS.spm_model_file, FLAGS.tokenizer_file)
  if not any(files):   # the vocab.txt, spm.model or tokenizer.json beside the checkpoint
    files = checkpoints.find_vocab(FLAGS.init_checkpoint)
  vocab_file, spm_model_file, tokenizer_file = files
  tokenizer = tokenization.create_tokenizer(vocab_file=vocab_file or None,
                                            spm_model_file=spm_model_file or None,
                                            tokenizer_file=tokenizer_file or None,
                                            do_lower_case=FLAGS.do_lower_case)
  layers = [int(x) for x in FLAGS.layers.split(",") if x.strip()]
  count = extract(FLAGS.input_file, FLAGS.output_file, FLAGS.init_checkpoint, tokenizer, layers,
                  FLAGS.max_seq_length, FLAGS.batch_size, FLAGS.pooling or None,
                  FLAGS.length_bucket)
  print(f"Wrote features of {count} lines to {FLAGS.output_file}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
