"""Defaults shared by every fine-tuning experiment (each field documented once, here).

The paper's grid (spec section 5): batch {16, 32}, lr {5e-5, 4e-5, 3e-5, 2e-5}, epochs {2, 3, 4},
warm-up over the first 10% of steps, dropout 0.1. Experiments override what differs.
"""
import ml_collections

from bert_jax.runtime import config_names
from bert_jax.runtime.optim import default_optimizer_config
from experiments.pretraining_defaults import parse_arg  # noqa: F401  (re-exported for experiments)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = ""                        # the runner in bert_jax/tasks/__init__.py: glue | glue_all | swag
  c.init_checkpoint = ""             # HF dir, TF checkpoint, save_pretrained dir or workdir
  c.vocab_file = ""                  # default: vocab.txt beside the checkpoint
  c.spm_model_file = ""              # SentencePiece model instead of a WordPiece vocab
  c.do_lower_case = True
  c.seed = 0
  # jax_default_prng_impl for initialisation and dropout: "" keeps JAX's default (threefry2x32,
  # the same bits under any sharding). "rbg" compiles BERT-base initialisation in 15 s instead of
  # 4 minutes on an H100 (benchmarks/RESULTS.md); its streams differ from threefry's.
  c.prng_impl = ""
  c.seeds = 1                        # restarts (seed, seed+1, ...): mean / std / best

  c.max_seq_length = 128
  # 0: every batch padded to max_seq_length (fixed shapes: one compilation, the original's way).
  # N > 0: each batch cut to the smallest multiple of N holding its longest row, evaluation rows
  # run shortest first (at most max_seq_length / N shapes compiled per step function): the same
  # evaluation outputs with less padding computed; training draws other dropout masks.
  c.length_bucket = 0
  c.global_batch_size = 32           # examples per step, all hosts together
  c.eval_batch_size = 64
  c.learning_rate = 2e-5
  c.num_train_epochs = 3.0
  c.warmup_proportion = 0.1          # linear warm-up over this fraction of the steps
  c.head_dropout = 0.1               # dropout on the pooled output before the new classifier
  c.optimizer = default_optimizer_config()   # AdamW as the original (no bias correction)
  c.parallelism = "jit"              # jit over the device mesh | pmap
  # Tensor parallelism (jit only), as in pre-training: the encoder and its Adam moments are split
  # along the mesh's `model` axis (global_batch_size must divide by device_count / this).
  c.model_parallelism = 1
  # Fully sharded data parallelism (jit only; ZeRO-3): parameter matrices, their gradients and
  # the optimizer moments split along `data` as well, gathered layer by layer inside the step.
  # Each chip keeps 1/data of the state; the math is the same (bert_jax/parallel/sharding.py).
  c.fsdp = False
  c.logical_axis_rules = ()          # () = bert_jax.parallel.sharding.DEFAULT_RULES
  # Compute settings; the architecture comes from the checkpoint. causal_attention=True fine-tunes
  # the left-to-right ablation (pre-trained with --config.objective=ltr) left to right.
  # kernels: "auto" picks the hand-tuned or textbook building blocks per backend (BertConfig).
  # attention: auto | xla | splash | cudnn (BertConfig.attention; the fused kernels have no
  # attention dropout, so in training "auto" keeps xla unless the checkpoint's dropout is 0).
  c.model = ml_collections.ConfigDict(dict(dtype="float32", scan_layers=False, remat=False,
                                           remat_policy="nothing_saveable",
                                           causal_attention=False, float32_attention_logits=True,
                                           kernels="auto", attention="auto"))

  c.log_every_steps = 50
  c.eval_every_steps = 0             # 0: evaluate on the whole dev set after every epoch
  c.checkpoint_every_steps = 0       # resume points between evaluations (0: at evaluations)
  c.do_predict = True                # predict the test splits (submission files) at the end

  c.grad_accum_steps = 1             # micro-batches per update (same update as the batch)
  c.max_consecutive_skips = 10       # abort after this many non-finite steps in a row
  # "START,COUNT": a jax.profiler trace of steps START+1..START+COUNT in WORKDIR/profile
  # (TensorBoard's profile plugin, Perfetto); "" for none.
  c.profile_steps = ""
  config_names.reserve(c)            # train_batch_size: an error naming global_batch_size

  c.data = ml_collections.ConfigDict()
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
