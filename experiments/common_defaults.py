"""The fields every job has (each documented once, here): the run, the tokenizer, the devices and
the loop. `pretraining_defaults.py` and `finetuning_defaults.py` start from `get_config()` and add
their own fields; experiments override values, and every field a job reads is declared in these
files or in the experiment (`--config.x` of an undeclared x is an error).
"""
import ml_collections

from bert_jax.runtime import config_names
from bert_jax.runtime.optim import default_optimizer_config, default_schedule_config


def parse_arg(arg, **defaults):
  """'a=1,quick' -> {'a': '1', 'quick': True} over `defaults` (values keep the default's type)."""
  values = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in values:
      raise ValueError(f"Unknown experiment argument {key!r}; expected one of {sorted(values)}")
    if not value:
      values[key] = True
    elif isinstance(values[key], bool):
      values[key] = value.lower() in ("1", "true", "yes")
    else:
      values[key] = type(values[key])(value)
  return values


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = ""                        # what runs: a task of bert_jax/tasks/registry.py
  c.init_checkpoint = ""             # HF dir, TF checkpoint, save_pretrained dir or workdir
  c.seed = 0
  # jax_default_prng_impl for initialisation and dropout: "" keeps JAX's default (threefry2x32,
  # the same bits under any sharding). "rbg" compiles BERT-base initialisation in 15 s instead of
  # 4 minutes on an H100 (benchmarks/history/2026-11-23.md); its streams differ from threefry's.
  c.prng_impl = ""

  # The tokenizer of every job: at most one of the three files. Pre-training: the records'
  # vocabulary (dynamic masking reads its special-token ids); empty with
  # data.prepare_demo_corpus or data.text_files, which learn one. Fine-tuning and continued
  # pre-training: empty = the vocab.txt, else spm.model, else tokenizer.json beside
  # init_checkpoint (checkpoints.find_vocab).
  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.vocab_file = ""        # WordPiece vocab.txt
  c.tokenizer.spm_model_file = ""    # SentencePiece model instead of a WordPiece vocab
  # A Hugging Face tokenizer.json instead (ModernBERT's byte-level BPE, or WordPiece, ...): its
  # own normalizer decides the casing, do_lower_case does not apply to it.
  c.tokenizer.tokenizer_file = ""
  c.tokenizer.do_lower_case = True   # uncased vocabulary (checked against the checkpoint's)

  c.max_seq_length = 128
  c.global_batch_size = 32           # sequences (rows) per optimizer step, all hosts together
  c.eval_batch_size = 64
  c.learning_rate = 1e-4             # the peak rate of the schedule
  # The optimizer (bert_jax/runtime/optim.py; docs/runtime.md#optimizers-and-schedules):
  #   name: adamw (the original's AdamW) | lamb | stable_adamw (StableAdamW: bias-corrected AdamW
  #     whose step is divided per tensor by max(1, RMS of g / sqrt(v)); ModernBERT's optimizer)
  #   b1, b2, eps: Adam's betas and epsilon (0.9, 0.999, 1e-6: the original's)
  #   weight_decay: decoupled weight decay, on every parameter but norms and biases (decay_mask)
  #   clip_grad_norm: clip the gradients to this global norm first; 0 = no clipping
  #   bias_correction: adamw only. False = the original's Adam, without bias correction; True =
  #     the usual Adam (what PyTorch's AdamW does). LAMB and StableAdamW always correct.
  #   fully_decoupled_weight_decay: adamw and stable_adamw. False: a step decays the weights by
  #     lr_t * weight_decay (PyTorch's and optax's AdamW). True: by (lr_t / learning_rate) *
  #     weight_decay, the schedule's shape only (optimi's decouple_lr, Composer's decoupled
  #     decay: ModernBERT's 1e-5 is such a value).
  c.optimizer = default_optimizer_config()
  # The learning-rate schedule over the steps (rate of step t, 0-based; every job's, fine-tuning's
  # warm-up being warmup_proportion of its steps):
  #   name: bert = the original: linear warm-up from 0 over warmup_steps, then a linear decay to
  #       the final rate computed over *all* steps |
  #     wsd = warmup-stable-decay: the same warm-up, then learning_rate constant, then a decay
  #       over the last steps (set warmup_steps=0 and decay_fraction=1.0 for a run that is only
  #       the decay, e.g. ModernBERT's decay phase started from a checkpoint) |
  #     linear = transformers' linear schedule (sentence-transformers' trainer's): the same
  #       warm-up, then a linear decay to the final rate over every other step
  #   decay_steps: wsd: the decay's length in steps (0: decay_fraction decides)
  #   decay_fraction: wsd: the decay's length as a fraction of the run's steps (rounded); set
  #     decay_steps or decay_fraction, not both; both 0 = no decay (warm-up, then constant)
  #   decay_shape: wsd: linear | cosine | 1-sqrt (rate = final + (peak - final) * (1 - sqrt(x)),
  #     x the fraction of the decay done); bert is linear only
  #   final_fraction: the rate at the end of the decay, as a fraction of learning_rate (bert and
  #     wsd; 0.0 = decay to 0, the original's)
  c.schedule = default_schedule_config()
  c.grad_accum_steps = 1             # micro-batches per update (same update as the batch)

  c.parallelism = "jit"              # jit over the device mesh | pmap
  # Tensor parallelism (jit only): devices along the mesh's `model` axis; the `data` axis gets
  # device_count / model_parallelism (global_batch_size must divide by it). Attention heads, FFN
  # and vocabulary are split Megatron-style.
  c.model_parallelism = 1
  # Fully sharded data parallelism (jit only; ZeRO-3): parameter matrices, their gradients and
  # the optimizer moments split along `data` as well, gathered layer by layer inside the step.
  # Each chip keeps 1/data of the state; the math is the same (bert_jax/parallel/sharding.py).
  c.fsdp = False
  # ZeRO-1: only the optimizer moments split along `data`; the parameters stay whole on every
  # chip, each chip updates its 1/data and the new parameters are all-gathered. Cheaper than
  # fsdp where the step has few activations per chip (docs/tpu.md). Implied by fsdp.
  c.shard_optimizer_state = False
  # Override of bert_jax.parallel.sharding.DEFAULT_RULES: pairs (logical axis name, mesh axis or
  # None), e.g. (("vocab", None), ("joined_kv", "model"), ("mlp", "model")); () = the defaults.
  c.logical_axis_rules = ()

  c.log_every_steps = 100
  c.eval_every_steps = 0
  c.checkpoint_every_steps = 0
  c.max_consecutive_skips = 10       # abort after this many non-finite steps in a row
  # Seconds between a preemption notice (SIGTERM, the metadata server) and the kill (GCE: 30);
  # the preemption save is logged against it, with a warning when it does not fit.
  c.preemption_grace_seconds = 30.0
  # A step (or the wait for its batch) longer than this dumps every thread's stack to stderr and
  # WORKDIR/watchdog_stacks.process_<i>.txt and exits with status 124; from the second step of a
  # run on (compilation does not count). 0 = off. The default is far above any healthy step
  # (seconds on an accelerator, minutes for BERT-large on a CPU): it ends only a hang.
  c.step_timeout_seconds = 3600.0
  # The same for an evaluation or a checkpoint save (a whole SQuAD dev set on a CPU is well
  # under an hour; a save on a store that never answers is not). 0 = off.
  c.pause_timeout_seconds = 21600.0
  # "START,COUNT": a jax.profiler trace of steps START+1..START+COUNT in WORKDIR/profile
  # (TensorBoard's profile plugin, Perfetto); "" for none.
  c.profile_steps = ""

  c.data = ml_collections.ConfigDict()
  # Placeholders of the renamed fields (train_batch_size, vocab_file, data.vocab_file, ...): set,
  # they are errors naming the field to use (bert_jax/runtime/config_names.py).
  config_names.reserve(c)
  return c
