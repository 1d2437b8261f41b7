"""Defaults shared by every fine-tuning experiment (each field documented once, here).

The paper's grid (spec section 5): batch {16, 32}, lr {5e-5, 4e-5, 3e-5, 2e-5}, epochs {2, 3, 4},
warm-up over the first 10% of steps, dropout 0.1. Experiments override what differs.
"""
import ml_collections

from bert_jax.model.config import BertConfig
from experiments import common_defaults
from experiments.common_defaults import parse_arg  # noqa: F401  (re-exported for experiments)


def get_config() -> ml_collections.ConfigDict:
  c = common_defaults.get_config()   # the run, tokenizer, devices and loop fields
  c.seeds = 1                        # restarts (seed, seed+1, ...): mean / std / best

  # 0: every batch padded to max_seq_length (fixed shapes: one compilation, the original's way).
  # N > 0: each batch cut to the smallest multiple of N holding its longest row, evaluation rows
  # run shortest first (at most max_seq_length / N shapes compiled per step function): the same
  # evaluation outputs with less padding computed; training draws other dropout masks.
  c.length_bucket = 0
  c.global_batch_size = 32           # examples per step, all hosts together
  c.learning_rate = 2e-5
  c.num_train_epochs = 3.0
  c.warmup_proportion = 0.1          # linear warm-up over this fraction of the steps
  # Dropout before the task's new output layer; None: the model family's (transformers' default
  # for it: 0.1 for BERT and RoBERTa, ModernBERT's classifier_dropout 0.0).
  c.head_dropout = ml_collections.config_dict.placeholder(float)
  # Compute settings (BertConfig.RUNTIME_FIELDS); the architecture comes from the checkpoint.
  # causal_attention=True fine-tunes the left-to-right ablation (pre-trained with
  # --config.objective=ltr) left to right. kernels: "auto" picks the hand-tuned or textbook
  # building blocks per backend, for the encoder and the task's head alike. attention: auto | xla
  # | splash | cudnn (the fused kernels have no attention dropout, so in training "auto" keeps
  # xla unless the checkpoint's dropout is 0).
  defaults = BertConfig()
  c.model = ml_collections.ConfigDict(
      {name: getattr(defaults, name) for name in BertConfig.RUNTIME_FIELDS})

  c.log_every_steps = 50
  c.eval_every_steps = 0             # 0: evaluate on the whole dev set after every epoch
  c.checkpoint_every_steps = 0       # resume points between evaluations (0: at evaluations)
  c.do_predict = True                # predict the test splits (submission files) at the end

  c.data.max_train_examples = 0      # >0: the first N training examples only (quick runs)
  c.data.max_eval_examples = 0       # >0: the first N examples of each eval split
  return c


def quick(c: ml_collections.ConfigDict) -> None:
  """A few steps on a few examples: what the tests run, with the real code paths."""
  c.max_seq_length = 32
  c.global_batch_size, c.eval_batch_size = 4, 8
  c.num_train_epochs = 2.0
  c.learning_rate = 1e-4
  c.log_every_steps = 2
  c.data.max_train_examples = 16
  c.data.max_eval_examples = 0
