r"""Serving exports of a fine-tuned model: `python -m bert_jax.export`.

  python -m bert_jax.export --model=WORKDIR/best --format=saved_model --output=DIR
  python -m bert_jax.export --model=WORKDIR/best --format=huggingface --output=DIR
  python -m bert_jax.export --model=EMBEDDING_MODEL --format=sentence_transformers --output=DIR

`--model` is the `best/` directory a fine-tuning run wrote (or its workdir), or any pre-trained
checkpoint (Hugging Face directory, Google TF checkpoint, `save_pretrained` directory, training
workdir): then the encoder is exported (outputs `sequence_output`, `pooled_output`).
`saved_model`: a TensorFlow SavedModel (jax2tf), signature `serving_default` on int32
`input_ids`, `input_mask`, `segment_ids` of any batch size and length; `huggingface`: the
model family's transformers class of the task (BertForSequenceClassification,
ModernBertForSequenceClassification, RobertaForTokenClassification, ...) with its tokenizer
files; a pre-trained checkpoint with its masked-LM head as the family's pre-training class
(BertForPreTraining, ModernBertForMaskedLM, RobertaForMaskedLM), or its encoder class with
`--encoder_only`.
`sentence_transformers`: a folder `SentenceTransformer(DIR)` loads with the same vectors, from a
sentence-embedding model (a folder with `embedding.json` or its workdir, a sentence-transformers
folder) or any pre-trained checkpoint (mean pooling, not normalised); a sentence-embedding model's
SavedModel adds the output `sentence_embedding`.
Each writes `DIR/signature.json`: inputs, outputs, labels and how to tokenize. Details:
bert_jax/tasks/tools/serving.py.
"""
import json
import sys

from bert_jax.runtime import host_memory

host_memory.keep_freed_memory()

from bert_jax.io import remote_storage  # noqa: E402

# gs:// timeouts and retries, STORAGE_EMULATOR_HOST if set; before TensorFlow loads.
remote_storage.configure(leave_at_once_after_error=True)

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "WORKDIR/best of a fine-tuning run (or WORKDIR), or "
                             "a pre-trained checkpoint (exports the encoder).")
_FORMAT = flags.DEFINE_enum("format", "saved_model",
                            ["saved_model", "huggingface", "sentence_transformers"],
                            "TensorFlow SavedModel (jax2tf), a transformers directory, or a "
                            "sentence-transformers folder (the encoder with its pooling).")
_OUTPUT = flags.DEFINE_string("output", None, "Export directory (local or gs://).")
_DTYPE = flags.DEFINE_string("dtype", "", "Compute dtype override for the SavedModel (e.g. "
                             "float32); default: the run's.")
_PLATFORMS = flags.DEFINE_list("platforms", ["cpu", "cuda", "tpu"],
                               "Platforms the SavedModel is lowered for (saved_model only).")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", None, "Casing of a pre-trained checkpoint "
                                   "(default: its tokenizer_config.json, else true); a fine-tuned "
                                   "model's is the run's.")
_ALLOW_PICKLE = flags.DEFINE_bool("allow_pickle", False, "Read a PyTorch pickle checkpoint "
                                  "(pytorch_model.bin) as --model: a pickle can run code when "
                                  "loaded, so only for a source you trust.")
_ENCODER_ONLY = flags.DEFINE_bool("encoder_only", False, "huggingface: a pre-trained "
                                  "checkpoint's encoder class (BertModel, ...) without its "
                                  "masked-LM head.")
flags.mark_flags_as_required(["model", "output"])


def main(argv):
  del argv
  # A bucket name Cloud Storage rejects: said now, not after the model is built.
  remote_storage.check_paths({"--model": _MODEL.value, "--output": _OUTPUT.value},
                             written=["--output"])
  if _ALLOW_PICKLE.value:
    from bert_jax.io import checkpoints
    checkpoints.trust_pickle_files()
  from bert_jax.tasks.tools import serving
  description = serving.export(_MODEL.value, _FORMAT.value, _OUTPUT.value, dtype=_DTYPE.value,
                               do_lower_case=_DO_LOWER_CASE.value, platforms=_PLATFORMS.value,
                               encoder_only=_ENCODER_ONLY.value)
  what = description["task"] or description["kind"]
  print(f"{what} ({description['kind']}) from {description['source']} -> {_OUTPUT.value} "
        f"({_FORMAT.value}); outputs: {', '.join(description['outputs'])}", file=sys.stderr,
        flush=True)
  print(json.dumps({"output": _OUTPUT.value, "format": _FORMAT.value,
                    "kind": description["kind"], "outputs": list(description["outputs"])}),
        flush=True)


if __name__ == "__main__":
  app.run(main)
