r"""Predictions of a fine-tuned model on raw text: `python -m bert_jax.predict`.

  python -m bert_jax.predict --model=WORKDIR/best --input=sentences.txt --output=predictions.jsonl

`--model` is the `best/` directory a fine-tuning run wrote (or its workdir); the task, labels,
vocabulary, casing and max_seq_length come from what `best/` recorded. Input: plain text or TSV
(one example per line, pairs tab-separated), JSON lines, or a SQuAD JSON file; output: one JSON
line per example (labels with probabilities, scores, entity tags, or answers with scores). The
formats per task are in bert_jax/tasks/tools/prediction.py. Lines that cannot be read are reported
with their line number and skipped; the summary at the end counts them.
"""
import sys

from bert_jax.runtime import host_memory

host_memory.keep_freed_memory()

from bert_jax.io import remote_storage  # noqa: E402

# gs:// timeouts and retries, STORAGE_EMULATOR_HOST if set; before TensorFlow loads.
remote_storage.configure(leave_at_once_after_error=True)

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "WORKDIR/best of a fine-tuning run (or WORKDIR).")
_INPUT = flags.DEFINE_string("input", None, "Input file (local or gs://).")
_OUTPUT = flags.DEFINE_string("output", None, "Output JSON lines (local or gs://).")
_FORMAT = flags.DEFINE_enum("format", "", ["", "lines", "jsonl", "squad_json"],
                            "Input format; default from the extension (.jsonl: jsonl, .json for "
                            "a SQuAD model: squad_json, else lines).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Rows per forward pass.")
_CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 1024, "Examples read, featurised and predicted "
                                   "at a time (memory is bounded by this, not the input).")
_LENGTH_BUCKET = flags.DEFINE_integer("length_bucket", 16, "Each batch runs at the smallest "
                                      "multiple of N tokens holding its longest row (0: always "
                                      "the model's max_seq_length).")
_DTYPE = flags.DEFINE_string("dtype", "", "Compute dtype override (e.g. bfloat16); default: the "
                             "run's.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")
flags.mark_flags_as_required(["model", "input", "output"])


def main(argv):
  del argv
  # A bucket name Cloud Storage rejects: said now, not after the model is loaded.
  remote_storage.check_paths({"--model": _MODEL.value, "--input": _INPUT.value,
                              "--output": _OUTPUT.value}, written=["--output"])
  from bert_jax.tasks.tools import fine_tuned, prediction
  overrides = {"dtype": _DTYPE.value} if _DTYPE.value else {}
  model = fine_tuned.load(_MODEL.value, **overrides)
  print(f"{model.task.name} ({model.kind}) from {model.directory}", file=sys.stderr, flush=True)
  counts = prediction.predict_file(
      model, _INPUT.value, _OUTPUT.value, fmt=_FORMAT.value, batch_size=_BATCH_SIZE.value,
      chunk_size=_CHUNK_SIZE.value, length_bucket=_LENGTH_BUCKET.value,
      progress=_PROGRESS.value)
  print(f"{counts.lines} examples read: {counts.predicted} predicted into {_OUTPUT.value}, "
        f"{counts.bad} skipped (bad lines reported above)", flush=True)


if __name__ == "__main__":
  app.run(main)
