"""Defaults shared by every pre-training experiment (each field documented once, here).

Experiments import `get_config()` from this file and override what differs; the argument after
the colon (`--config=experiments/pretrain_bert_base.py:phase=2,quick`) is parsed by `parse_arg`.
"""
import ml_collections

from bert_jax.model.config import BertConfig
from bert_jax.runtime import config_names
from bert_jax.runtime.optim import default_optimizer_config


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


def get_config(size: str = "base") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = "pretraining"
  # The BertConfig fields (bert_config.json names) plus how to compute them: dtype, scan_layers,
  # remat, float32_attention_logits (bert_jax/model/config.py).
  c.model = BertConfig.named(size).to_dict()
  c.objective = "mlm_nsp"            # mlm_nsp | mlm (No NSP) | ltr (left-to-right, No NSP)
  c.init_checkpoint = ""             # HF dir, TF checkpoint, save_pretrained dir or workdir
  # Continued pre-training: config.model's architecture, the vocabulary and casing come from
  # init_checkpoint (experiments/continue_pretraining.py).
  c.model_from_checkpoint = False
  c.eval_before_training = False     # log held-out metrics at step 0 (where training starts)
  c.seed = 0
  # jax_default_prng_impl for initialisation and dropout: "" keeps JAX's default (threefry2x32,
  # the same bits under any sharding). "rbg" compiles BERT-base initialisation in 15 s instead of
  # 4 minutes on an H100 (benchmarks/RESULTS.md); its streams differ from threefry's.
  c.prng_impl = ""

  c.global_batch_size = 256          # sequences per step, all hosts together
  c.eval_batch_size = 64
  c.max_seq_length = 128
  c.max_predictions_per_seq = 20
  c.num_train_steps = 1_000_000
  c.warmup_steps = 10_000
  c.learning_rate = 1e-4
  c.optimizer = default_optimizer_config()   # AdamW as the original (no bias correction)
  c.parallelism = "jit"                      # jit over the device mesh | pmap
  # Tensor parallelism (jit only): devices along the mesh's `model` axis; the `data` axis gets
  # device_count / model_parallelism. Attention heads, FFN and vocabulary are split Megatron-style.
  c.model_parallelism = 1
  # Fully sharded data parallelism (jit only; ZeRO-3): parameter matrices, their gradients and
  # the optimizer moments split along `data` as well, gathered layer by layer inside the step.
  # Each chip keeps 1/data of the state; the math is the same (bert_jax/parallel/sharding.py).
  c.fsdp = False
  # Override of bert_jax.parallel.sharding.DEFAULT_RULES: pairs (logical axis name, mesh axis or None),
  # e.g. (("vocab", None), ("joined_kv", "model"), ("mlp", "model")); () = the defaults.
  c.logical_axis_rules = ()
  c.grad_accum_steps = 1                     # micro-batches per update (same update as the batch)
  c.max_consecutive_skips = 10               # abort after this many non-finite steps in a row
  # "START,COUNT": a jax.profiler trace of steps START+1..START+COUNT in WORKDIR/profile
  # (TensorBoard's profile plugin, Perfetto); "" for none.
  c.profile_steps = ""
  config_names.reserve(c)                    # train_batch_size: an error naming global_batch_size

  c.log_every_steps = 100
  c.eval_every_steps = 10_000
  c.eval_steps = 100                 # 0 = the whole eval set
  c.checkpoint_every_steps = 10_000
  c.keep_checkpoints = 3
  c.async_checkpointing = True

  c.data = ml_collections.ConfigDict()
  c.data.input_files = ""            # comma list or glob of TFRecords (create_pretraining_data)
  c.data.eval_input_files = ""
  c.data.masking = "dynamic"         # dynamic: mask while reading | static: records are masked
  c.data.mask_mixture = "80/10/10"   # MASK/SAME/RND, appendix C.2
  c.data.masked_lm_prob = 0.15
  c.data.whole_word_mask = False
  c.data.vocab_file = ""             # needed for dynamic masking (special-token ids)
  c.data.spm_model_file = ""
  c.data.do_lower_case = True
  c.data.shuffle_buffer_size = 10_000
  # Sequence packing (training only; evaluation stays unpacked): several NSP pairs share a row with
  # block-diagonal attention and restarted positions, so global_batch_size counts *rows*. A row
  # has max_predictions_per_seq masked-LM slots, as an unpacked sequence: each pair is masked as
  # it would be alone and joins a row only if all its predictions still fit (none is dropped).
  c.data.packing = False
  # NSP slots per row, K. Choose about max_seq_length / (length of a typical short pair), e.g. 4
  # at 128 and 8 at 512; beyond what fits, more only adds cheap empty slots (weight 0), fewer
  # leaves row space unused. Not the objective 'ltr' (its targets would cross pairs).
  c.data.max_pairs_per_row = 4
  # Instances packed together (first-fit decreasing within each window): larger packs tighter
  # but costs more host CPU per window; keep it several times the per-host rows per batch.
  c.data.packing_window = 256
  c.data.prepare_demo_corpus = False
  # Raw text in BERT's input format (a sentence per line, blank lines between documents; comma
  # list or globs): records are built into WORKDIR/data with the run's vocabulary, once, every
  # holdout_every-th document held out for evaluation (data_pipelines/workdir_data.py).
  c.data.text_files = ""
  c.data.holdout_every = 20
  return c
