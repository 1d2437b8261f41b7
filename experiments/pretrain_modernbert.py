r"""ModernBERT-class pre-training (Warner et al. 2024), in its three phases.

Phase pretrain, 1,024 tokens, both rotary bases 10,000:
  python -m bert_jax.main --config=experiments/pretrain_modernbert.py:size=base,phase=pretrain \
    --workdir=gs://b/mb_pretrain --config.data.input_files='gs://b/data/c1024/*.tfrecord' \
    --config.tokenizer.tokenizer_file=gs://b/tokenizer.json
Phase extend, 8,192 tokens with the global rotary base raised to 160,000, from the pretrain
workdir:
  python -m bert_jax.main --config=experiments/pretrain_modernbert.py:size=base,phase=extend \
    --workdir=gs://b/mb_extend --config.init_checkpoint=gs://b/mb_pretrain \
    --config.data.input_files='gs://b/data/c8192/*.tfrecord' --config.tokenizer.tokenizer_file=...
Phase decay, 8,192 tokens, the learning rate decayed to 0, from the extend workdir:
  ... :size=base,phase=decay --config.init_checkpoint=gs://b/mb_extend ...

ModernBERT-large from a trained base, as the paper did (section 2.2.4: base's weights tiled into
large's, layers by Gopher's mapping; bert_jax/model/growth.py):
  ... :size=large,phase=pretrain --workdir=gs://b/mbl_pretrain \
    --config.init_checkpoint=gs://b/mb_pretrain --config.init_tiling=tile_from_middle

The records hold documents as sequences without NSP (`python -m
data_pipelines.create_pretraining_data --instances=documents --masking=dynamic
--max_seq_length=1024` or 8192): each document its own `[CLS] ... [SEP]` sequence, several
packed in a row, attention and rotary positions inside each (ModernBERT's sequence packer;
`--config.data.instances=contiguous` and such records give RoBERTa's FULL-SENTENCES instead, the
documents attending across each other), masked while reading at 30%. The model is
`modernbert-base` (22 x 768, GeGLU 1,152, 12 heads) or `modernbert-large`
(28 x 1,024, 2,624, 16 heads), every third layer global and the others in a 128-token window.

The recipe (Warner et al. 2024, section 2.2 and appendix; the values per phase below, each with
its source): StableAdamW with fully decoupled weight decay and no gradient clipping, a
warmup-stable-decay schedule (warm-up then constant through pretrain and extend, then a 1-sqrt
decay as its own phase), and in the pretrain phase the batch-size warm-up: the global batch rises
from 768 to 4,608 sequences over the first 50B tokens (base; large: 448 -> 4,928 over 10B), in
increments of the start batch that each last the same number of steps, switching where
ModernBERT's own scheduler switches (`config.batch_warmup`, bert_jax/runtime/batch_ramp.py). The
pretrain phase's steps and learning-rate warm-up steps are counted through that ramp, so they
train the recipe's tokens. The extend and decay phases carry the previous phase's optimizer
state with its parameters (`config.init_optimizer_state`: the Adam moments and their
bias-correction count, from init_checkpoint's newest checkpoint), while their step, schedule and
input start at 0; `--config.init_optimizer_state=False` starts the moments afresh. As ModernBERT's
phases did: its context-extension and decay yamls (AnswerDotAI/ModernBERT, branch
pretraining_documentation, 00220af2, yamls/modernbert/) load the previous phase with `load_path`,
`reset_time: true`, `restart_override: true` and no `load_weights_only`, whose default (False,
Composer 0.24.1) restores the optimizer state; `reset_time` restarts only the schedule's time.
`:quick` is a tiny model on documents-as-sequences records built from Python's documentation
(no download): what the tests run, every phase; its pretrain phase ramps its batch 2, 4, 6, 8
over its 4 steps.
"""
from experiments import pretraining_defaults
from bert_jax.model.config import BertConfig
from bert_jax.runtime import batch_ramp

# Per phase: (max_seq_length, global_rope_theta, max_predictions_per_seq). ModernBERT section
# 2.2.3: 1,024 tokens with RoPE theta 10,000, then 8,192 with the global theta 160,000. The
# masked-LM slots hold 30% of a row (0.30 * 1,022 = 307, 0.30 * 8,190 = 2,457).
PHASES = {
    "pretrain": (1024, 10_000.0, 320),
    "extend": (8192, 160_000.0, 2464),
    "decay": (8192, 160_000.0, 2464),
}
# Per size: peak learning rate (section 2.2.4 / appendix: 8e-4 base, 5e-4 large) and the
# global batch in sequences of 1,024 tokens at the end of the recipe's batch warm-up (4,608 and
# 4,928).
SIZES = {"base": (8e-4, 4608), "large": (5e-4, 4928)}
# Tokens per phase (section 2.2.3): 1.7T at 1,024, 250B at 8,192, then a 50B decay.
PHASE_TOKENS = {"pretrain": 1.7e12, "extend": 250e9, "decay": 50e9}
# Warm-up: 3B tokens (base), 2B (large); the later phases start from a trained model.
WARMUP_TOKENS = {"base": 3e9, "large": 2e9}
# The pretrain phase's batch warm-up (section 2.2.4): (start batch, tokens) of each size; the
# batch rises to SIZES' final batch.
BATCH_WARMUP = {"base": (768, 50e9), "large": (448, 10e9)}
EXTEND_LEARNING_RATE = 3e-4    # the context extension's (section 2.2.3)


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, size="base", phase="pretrain", quick=False)
  if args["size"] not in SIZES:
    raise ValueError(f"size={args['size']!r}: expected one of {sorted(SIZES)}")
  if args["phase"] not in PHASES:
    raise ValueError(f"phase={args['phase']!r}: expected one of {sorted(PHASES)}")
  c = pretraining_defaults.get_config("base")
  c.model = BertConfig.named(f"modernbert-{args['size']}").to_dict()
  c.objective = "mlm"                   # no NSP
  seq_len, global_theta, predictions = PHASES[args["phase"]]
  c.max_seq_length, c.max_predictions_per_seq = seq_len, predictions
  c.model.update(global_rope_theta=global_theta, local_rope_theta=10_000.0,
                 max_position_embeddings=8192)
  c.model.dtype = "bfloat16"
  # Documents kept apart, as ModernBERT's sequence packer does: each document a [CLS] ... [SEP]
  # sequence of its own in a packed row, attention and rotary positions inside it.
  c.data.instances = "documents"
  c.data.masked_lm_prob = 0.30          # section 2.2.1: 30% masking, 80/10/10
  # As ModernBERT's sequence packer masks: each token chosen with probability 0.30 (not an exact
  # count), random replacements among the ids the tokenizer uses. Unlike it, [CLS] and [SEP]
  # are never masked (data_pipelines/masking.py).
  c.data.mask_selection, c.data.random_token_ids = "bernoulli", "in_use"
  # ModernBERT's training configs: dropout on the attention output only (attn_out_dropout_prob
  # 0.1; attention probabilities, embeddings and MLP 0.0).
  c.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 attention_output_dropout_prob=0.1)
  learning_rate, batch_1024 = SIZES[args["size"]]
  # The same tokens per step in every phase: 4,608 x 1,024 = 576 x 8,192.
  c.global_batch_size = batch_1024 * 1024 // seq_len
  tokens_per_step = c.global_batch_size * seq_len
  c.num_train_steps = int(PHASE_TOKENS[args["phase"]] // tokens_per_step)
  # Warmup-stable-decay: a warm-up (pretrain only), the rate constant through pretrain and
  # extend, and the decay phase a 1-sqrt decay to 0 over all its steps (section 2.2.3).
  c.schedule.name = "wsd"
  if args["phase"] == "pretrain":
    c.batch_warmup.start_batch_size, c.batch_warmup.tokens = BATCH_WARMUP[args["size"]]
    # Steps counted through the ramp: the phase's tokens, and the rate's warm-up tokens.
    ramp = batch_ramp.from_config(c)
    c.num_train_steps = ramp.steps_for_tokens(PHASE_TOKENS["pretrain"])
    c.learning_rate = learning_rate
    c.warmup_steps = ramp.steps_for_tokens(WARMUP_TOKENS[args["size"]])
  else:   # started from the previous phase's workdir (--config.init_checkpoint)
    c.learning_rate = EXTEND_LEARNING_RATE
    c.warmup_steps = 0
    c.init_optimizer_state = True   # its Adam moments too, as ModernBERT's phases (docstring)
  if args["phase"] == "decay":
    c.schedule.update(decay_fraction=1.0, decay_shape="1-sqrt", final_fraction=0.0)
  # Section 2.2.4 and ModernBERT's training configs: StableAdamW (optimi's, "decoupled"),
  # betas (0.9, 0.98), epsilon 1e-6, weight decay 1e-5 fully decoupled (scaled by the
  # schedule's shape, not by the rate; norms and biases excluded), no gradient clipping.
  c.optimizer.update(name="stable_adamw", b1=0.9, b2=0.98, eps=1e-6, weight_decay=1e-5,
                     clip_grad_norm=0.0, fully_decoupled_weight_decay=True)
  c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 100, 5000, 2000
  # The optimizer moments split over the chips (ZeRO-1; the same updates): on a v5litepod-8 at
  # 16 x 1,024 tokens a chip the optimizer is a large share of the memory-bound step's bytes
  # (est. MFU 51.3% -> 53.2%, 0.9 GiB less a chip; benchmarks/RESULTS.md). Set it False for
  # --config.parallelism=pmap, which keeps a whole copy on every device.
  c.shard_optimizer_state = True
  if args["quick"]:
    quick(c, args["phase"])
  return c


def quick(c, phase: str):
  """A tiny ModernBERT (4 layers: global, local, local, global; a 32-token window) on records of
  documents as sequences built from Python's documentation, a few steps; the extend and decay phases run at
  twice the pretrain length."""
  c.model.dtype = "float32"
  c.model.update(num_hidden_layers=4, hidden_size=64, num_attention_heads=2,
                 intermediate_size=96, vocab_size=832, local_attention=32,
                 pad_token_id=0)   # the learned WordPiece vocabulary's [PAD]
  c.max_seq_length = 128 if phase == "pretrain" else 256
  c.max_predictions_per_seq = 40 if phase == "pretrain" else 80
  c.global_batch_size, c.eval_batch_size = 8, 8
  c.num_train_steps, c.warmup_steps = 4, 2 if phase == "pretrain" else 0
  if phase == "pretrain":   # the batch of the 4 steps: 2, 4, 6, 8 rows (1,024 tokens of ramp)
    c.batch_warmup.start_batch_size, c.batch_warmup.tokens = 2, 1024.0
  c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps, c.eval_steps = 2, 2, 4, 2
  c.data.shuffle_buffer_size = 100
  c.data.prepare_demo_corpus = True
  c.data.demo_max_documents = 300
  c.data.dupe_factor = 1
