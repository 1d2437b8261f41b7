r"""Fine-tune a checkpoint on SWAG (multiple choice over 4 endings; spec section 5).

  python -m bert_jax.main --config=experiments/swag.py --workdir=/tmp/swag \
    --config.init_checkpoint=PATH --config.data.swag_dir=SWAGAF_DATA_DIR

SWAG_DIR holds the swagaf CSV files train.csv, val.csv, test.csv. The paper's recipe: batch 16,
lr 2e-5, 3 epochs (BERT-base: 81.6 dev accuracy, BERT-large 86.6). Writes dev_predictions.tsv,
test_predictions.tsv and results.json. `:seeds=N` restarts; `:quick` is the tests' variant.
"""
from experiments import finetuning_defaults


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, seeds=1, quick=False)
  c = finetuning_defaults.get_config()
  c.task = "swag"
  c.seeds = args["seeds"]
  c.global_batch_size = 16
  c.learning_rate = 2e-5
  c.num_train_epochs = 3.0
  c.data.swag_dir = ""                 # train.csv / val.csv / test.csv in the swagaf format
  if args["quick"]:
    finetuning_defaults.quick(c)
  return c
