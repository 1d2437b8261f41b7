r"""The command line of the pre-training data builder: `python -m data_pipelines.create_pretraining_data`
runs this module (the package's `__main__`; the package itself is the single-machine builder, a
library that imports neither this module nor the Beam builder, so no module imports back).

Its absl flags are the builder's options (`create_pretraining_data.Options`) and inputs; with
`--runner=...` the run is handed to the Beam builder (`data_pipelines/beam_pipeline.py`, imported
only then) and the flags not defined here are Beam's pipeline options. Both builders are libraries
that take explicit arguments; only this module reads flags, and only this module knows both.
"""
import dataclasses
import json
from typing import List

from bert_jax.io import filesystem
from data_pipelines import create_pretraining_data as cpd


def define_flags():
  from absl import flags
  flags.DEFINE_string("input_file", None, "Input text: comma-separated paths and/or globs "
                      "(one sentence per line, blank line between documents).")
  flags.DEFINE_string("output_file", None, "Output TFRecords: comma list, or PATH@N shards.")
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt.")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of --vocab_file).")
  flags.DEFINE_string("tokenizer_file", None, "Hugging Face tokenizer.json, e.g. a ModernBERT "
                      "checkpoint's byte-level BPE (instead of --vocab_file; its own normalizer "
                      "decides the casing, --do_lower_case does not apply).")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (match the vocabulary).")
  flags.DEFINE_bool("do_whole_word_mask", False, "Mask whole words rather than single pieces.")
  flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
  flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked LM predictions per seq.")
  flags.DEFINE_integer("random_seed", 12345, "Random seed.")
  flags.DEFINE_integer("dupe_factor", 10, "Passes over the input (each with fresh masks).")
  flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
  flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter-than-maximum sequence.")
  flags.DEFINE_enum("masking", "static", ["static", "dynamic"],
                    "static: masks stored in the records (the original); dynamic: unmasked "
                    "records, masked by the training pipeline on every read.")
  flags.DEFINE_enum("instances", "pairs", ["pairs", "contiguous", "documents"],
                    "pairs: [CLS] A [SEP] B [SEP] with next_sentence_labels (the original); "
                    "contiguous: the documents' token stream (each document followed by [SEP]) "
                    "cut into [CLS] + max_seq_length-2 tokens + [SEP], attention across "
                    "documents (RoBERTa's FULL-SENTENCES); documents: each document (cut at "
                    "max_seq_length-2 tokens) a [CLS] ... [SEP] sequence of its own, packed "
                    "into rows with sequence_ids and position_ids, attention and positions "
                    "inside the document (ModernBERT's packing). The last two: no NSP labels "
                    "(the 'mlm' and 'ltr' objectives; --short_seq_prob does not apply).")
  flags.DEFINE_string("mask_mixture", "80/10/10", "MASK/SAME/RND percentages (appendix C.2).")
  flags.DEFINE_enum("mask_selection", "count", ["count", "bernoulli"],
                    "count: round(length * masked_lm_prob) positions per sequence (the original); "
                    "bernoulli: each position chosen on its own with probability masked_lm_prob "
                    "(ModernBERT's; whole words with --do_whole_word_mask), at most "
                    "--max_predictions_per_seq kept. [CLS], [SEP] and padding never.")
  flags.DEFINE_enum("random_token_ids", "vocabulary", ["vocabulary", "in_use"],
                    "What a random replacement is drawn from: every id of the vocabulary (the "
                    "original), or the ids in use (no special tokens, no [unusedN] entries).")
  flags.DEFINE_integer("num_workers", 1, "Processes creating instances.")
  flags.DEFINE_integer("documents_per_block", 2000, "Documents per unit of work; a random-next "
                       "B comes from the same block.")
  flags.DEFINE_integer("shuffle_bucket_mb", 256, "Records shuffled together in memory (MB).")
  flags.DEFINE_integer("max_line_bytes", 1_000_000, "Longer lines are cut (and counted).")
  flags.DEFINE_string("tfds_name", "", "Read a tensorflow-datasets text dataset instead of "
                      "--input_file, e.g. wikipedia/20230601.en.")
  flags.DEFINE_string("tfds_split", "train", "TFDS split.")
  flags.DEFINE_string("tfds_text_field", "text", "TFDS feature holding a document's text.")
  flags.DEFINE_string("tfds_data_dir", None, "TFDS data directory.")
  flags.DEFINE_bool("progress", True, "Show progress bars and the final statistics.")
  flags.DEFINE_string("stats_file", "", "Also write the statistics as JSON here.")
  flags.DEFINE_string("runner", "", "Run as an Apache Beam pipeline on this runner "
                      "(DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, ...; needs "
                      "`pip install bert_jax[beam]`). Flags not defined here are then Beam "
                      "pipeline options (--project, --temp_location, --direct_num_workers, ...) "
                      "and --num_workers is Beam's. Empty: the single-machine builder.")


def parse_flags(argv: List[str]) -> List[str]:
  """absl's flags, with room for Beam's: with --runner, the flags this tool does not define
  are returned for Beam; without it, an unknown flag fails as it always has."""
  from absl import app, flags
  try:
    rest = flags.FLAGS(argv, known_only=True)
  except flags.Error:
    rest = None
  if rest is None or not flags.FLAGS.runner:
    # Parsed (again) as absl always does: an unknown flag or a bad value is the usual message.
    return app.parse_flags_with_usage(argv)
  return rest


def main(argv):
  from absl import app, flags
  FLAGS = flags.FLAGS
  if len(argv) > 1 and not FLAGS.runner:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.input_file and not FLAGS.tfds_name:
    raise app.UsageError("Give --input_file or --tfds_name")
  import tensorflow as tf
  tf.config.set_visible_devices([], "GPU")
  from bert_jax.text import tokenization
  tokenizer = tokenization.create_tokenizer(vocab_file=FLAGS.vocab_file,
                                            spm_model_file=FLAGS.spm_model_file,
                                            tokenizer_file=FLAGS.tokenizer_file,
                                            do_lower_case=FLAGS.do_lower_case)
  build = cpd.create_pretraining_data
  builder_args = dict(num_workers=FLAGS.num_workers)
  if FLAGS.runner:
    # Imported only here: apache-beam is an optional dependency (the `beam` extra).
    try:
      from data_pipelines import beam_pipeline
    except ImportError as e:
      raise app.UsageError(f"--runner={FLAGS.runner} needs Apache Beam ({e}); install it with "
                           "`pip install 'bert_jax[beam]'`") from None
    build = beam_pipeline.create_pretraining_data
    # On Beam, --num_workers means Beam's own option (Dataflow: the initial worker count).
    beam_args = [f"--runner={FLAGS.runner}"] + argv[1:] + (
        [f"--num_workers={FLAGS.num_workers}"] if FLAGS["num_workers"].present else [])
    try:
      beam_pipeline.pipeline_options(beam_args)  # a misspelt option fails before any work
    except ValueError as e:
      raise app.UsageError(str(e)) from None
    builder_args = dict(pipeline_args=beam_args)
  stats = build(
      (FLAGS.input_file or "").split(","), cpd.expand_output_files(FLAGS.output_file), tokenizer,
      progress=FLAGS.progress, tfds_name=FLAGS.tfds_name,
      tfds_split=FLAGS.tfds_split, tfds_text_field=FLAGS.tfds_text_field,
      tfds_data_dir=FLAGS.tfds_data_dir, max_seq_length=FLAGS.max_seq_length,
      max_predictions_per_seq=FLAGS.max_predictions_per_seq, random_seed=FLAGS.random_seed,
      dupe_factor=FLAGS.dupe_factor, masked_lm_prob=FLAGS.masked_lm_prob,
      short_seq_prob=FLAGS.short_seq_prob, masking=FLAGS.masking, instances=FLAGS.instances,
      mask_mixture=FLAGS.mask_mixture, do_whole_word_mask=FLAGS.do_whole_word_mask,
      mask_selection=FLAGS.mask_selection, random_token_ids=FLAGS.random_token_ids,
      documents_per_block=FLAGS.documents_per_block, shuffle_bucket_mb=FLAGS.shuffle_bucket_mb,
      max_line_bytes=FLAGS.max_line_bytes, **builder_args)
  if FLAGS.stats_file:
    filesystem.write_text(FLAGS.stats_file, json.dumps(dataclasses.asdict(stats), indent=1))


def run() -> None:
  """The command: flags defined, parsed (with room for Beam's) and `main` run by absl."""
  from absl import app
  define_flags()
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
