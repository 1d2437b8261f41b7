r"""Retrieval and similarity scores of a sentence-embedding model:
`python -m bert_jax.evaluate_retrieval`.

  python -m bert_jax.evaluate_retrieval --model=DIR --beir_dir=scifact --output=scores.json
  python -m bert_jax.evaluate_retrieval --model=DIR --sts_file=glue/STS-B/dev.tsv

`--model`: any folder `bert_jax.embed` takes (its pooling and normalisation; a plain checkpoint:
mean pooling, not normalised). `--beir_dir`: a BEIR folder (corpus.jsonl, queries.jsonl,
qrels/SPLIT.tsv): the judged queries of `--split` against the whole corpus (documents as
`title + " " + text`), exact search by dot product (cosine for a normalised model), the corpus
sharded over the devices; nDCG@10, MRR@10 and Recall@100 by trec_eval (pip install
'bert_jax[retrieval]'). `--sts_file`: a GLUE STS-B TSV: Spearman and Pearson correlations of
the pairs' cosine similarities with the gold scores. Each score is printed as a line
`nDCG@10: 0.7525` (fractions) and, with `--output`, written as JSON. Details:
bert_jax/tasks/datasets/beir.py, bert_jax/tasks/datasets/sts.py.
"""
import json

from bert_jax.runtime import host_memory

host_memory.keep_freed_memory()

from bert_jax.io import remote_storage  # noqa: E402

# gs:// timeouts and retries, STORAGE_EMULATOR_HOST if set; before TensorFlow loads.
remote_storage.configure(leave_at_once_after_error=True)

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "A sentence-transformers folder, a fine-tuned "
                             "embedding model (embedding.json) or any pre-trained checkpoint.")
_BEIR_DIR = flags.DEFINE_string("beir_dir", None, "A BEIR folder: corpus.jsonl, queries.jsonl, "
                                "qrels/SPLIT.tsv.")
_SPLIT = flags.DEFINE_string("split", "test", "The qrels file of --beir_dir: qrels/SPLIT.tsv.")
_STS_FILE = flags.DEFINE_string("sts_file", None, "A GLUE-format STS-B TSV (dev.tsv).")
_OUTPUT = flags.DEFINE_string("output", None, "Where the scores go as JSON (optional).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Texts per forward pass.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", None, "Tokens per text with [CLS] and "
                                       "[SEP]; default: the model's.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Compute dtype (bfloat16 is faster on TPU).")
flags.mark_flags_as_required(["model"])

# The scores printed, by their key in each evaluation's results, with their printed name.
PRINTED = {"nDCG@10": "nDCG@10", "MRR@10": "MRR@10", "Recall@100": "Recall@100",
           "spearman_cosine": "STS Spearman (cosine)", "pearson_cosine": "STS Pearson (cosine)"}


def main(argv):
  del argv
  if not (_BEIR_DIR.value or _STS_FILE.value):
    raise app.UsageError("give --beir_dir, --sts_file or both")
  remote_storage.check_paths({"--model": _MODEL.value, "--beir_dir": _BEIR_DIR.value,
                              "--sts_file": _STS_FILE.value, "--output": _OUTPUT.value},
                             written=["--output"])
  from bert_jax.tasks.datasets import beir, sts
  from bert_jax.tasks.tools import embedding
  if _BEIR_DIR.value:
    beir.pytrec_eval()   # missing: said before the model loads
  model = embedding.load(_MODEL.value, max_seq_length=_MAX_SEQ_LENGTH.value, dtype=_DTYPE.value)
  encode = embedding.Embedder(model, _BATCH_SIZE.value, mesh=embedding.default_mesh())
  results = {"model": _MODEL.value, "pooling": model.settings.pooling,
             "normalize": model.settings.normalize,
             "max_seq_length": model.settings.max_seq_length}
  if _BEIR_DIR.value:
    results["beir"] = dict(beir.evaluate_beir(encode, _BEIR_DIR.value, _SPLIT.value),
                           beir_dir=_BEIR_DIR.value, split=_SPLIT.value)
  if _STS_FILE.value:
    results["sts"] = dict(sts.evaluate_sts(encode, _STS_FILE.value), sts_file=_STS_FILE.value)
  for part in ("beir", "sts"):
    for key, value in results.get(part, {}).items():
      if key in PRINTED:
        print(f"{PRINTED[key]}: {value:.4f}", flush=True)
  if _OUTPUT.value:
    from bert_jax.io import filesystem
    filesystem.makedirs(filesystem.dirname(filesystem.absolute(_OUTPUT.value)))
    filesystem.write_text(_OUTPUT.value, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
