r"""Sentence embeddings of a text file: `python -m bert_jax.embed`.

  python -m bert_jax.embed --model=DIR --input=texts.txt --output=vectors.npy

`--model` is a sentence-transformers folder, a fine-tuned embedding model (a folder with
`embedding.json`, or its workdir) or any pre-trained checkpoint (then mean pooling, not
normalised). One text per line in, a float32 `.npy` of [lines, hidden] out, row i the vector of
line i; an empty line is embedded as the empty text, as sentence-transformers does. The pooling,
normalisation and max_seq_length are the model's unless given. A progress line goes to stderr
every `--progress_every` batches. Details: bert_jax/tasks/tools/embedding.py.
"""
import json

from bert_jax.runtime import host_memory

host_memory.keep_freed_memory()

from bert_jax.io import remote_storage  # noqa: E402

# gs:// timeouts and retries, STORAGE_EMULATOR_HOST if set; before TensorFlow loads.
remote_storage.configure(leave_at_once_after_error=True)

from absl import app, flags  # noqa: E402

from bert_jax.model.pooling import POOLINGS  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "A sentence-transformers folder, a fine-tuned "
                             "embedding model (embedding.json) or any pre-trained checkpoint.")
_INPUT = flags.DEFINE_string("input", None, "UTF-8 text, one text per line (local or gs://).")
_OUTPUT = flags.DEFINE_string("output", None, "The .npy written: [lines, hidden] float32.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Texts per forward pass.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", None, "Tokens per text with [CLS] and "
                                       "[SEP] (longer texts are cut); default: the model's.")
_POOLING = flags.DEFINE_enum("pooling", None, list(POOLINGS), "Token states -> one vector; "
                             "default: the model's (a plain checkpoint's: mean).")
_NORMALIZE = flags.DEFINE_bool("normalize", None, "Unit-length vectors (--nonormalize: raw); "
                               "default: the model's (a plain checkpoint's: not normalised).")
_LENGTH_BUCKET = flags.DEFINE_integer("length_bucket", 32, "Each batch runs at the smallest "
                                      "multiple of N tokens holding its longest text (0: always "
                                      "max_seq_length).")
_PROGRESS_EVERY = flags.DEFINE_integer("progress_every", 100, "Batches between progress lines.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Compute dtype (bfloat16 is faster on TPU).")
flags.mark_flags_as_required(["model", "input", "output"])


def main(argv):
  del argv
  # A bucket name Cloud Storage rejects: said now, not after the model is loaded.
  remote_storage.check_paths({"--model": _MODEL.value, "--input": _INPUT.value,
                              "--output": _OUTPUT.value}, written=["--output"])
  from bert_jax.tasks.tools import embedding
  model = embedding.load(_MODEL.value, pooling=_POOLING.value, normalize=_NORMALIZE.value,
                         max_seq_length=_MAX_SEQ_LENGTH.value, dtype=_DTYPE.value)
  embedder = embedding.Embedder(model, _BATCH_SIZE.value, _LENGTH_BUCKET.value,
                                mesh=embedding.default_mesh())
  written = embedding.embed_file(embedder, _INPUT.value, _OUTPUT.value,
                                 every=_PROGRESS_EVERY.value)
  print(json.dumps(dict(written, **{"pooling": model.settings.pooling,
                                    "normalize": model.settings.normalize,
                                    "max_seq_length": model.settings.max_seq_length})),
        flush=True)


if __name__ == "__main__":
  app.run(main)
