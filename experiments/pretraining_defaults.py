"""Defaults shared by every pre-training experiment (each field documented once, here).

Experiments import `get_config()` from this file and override what differs; the argument after
the colon (`--config=experiments/pretrain_bert_base.py:phase=2,quick`) is parsed by `parse_arg`.
"""
import ml_collections

from bert_jax.model.config import BertConfig
from experiments import common_defaults
from experiments.common_defaults import parse_arg  # noqa: F401  (re-exported for experiments)


def get_config(size: str = "base") -> ml_collections.ConfigDict:
  c = common_defaults.get_config()   # the run, tokenizer, devices and loop fields
  c.task = "pretraining"
  # The BertConfig fields (bert_config.json names) plus how to compute them: dtype, scan_layers,
  # remat, float32_attention_logits, kernels, attention (bert_jax/model/config.py).
  c.model = BertConfig.named(size).to_dict()
  # mlm_nsp | mlm (No NSP) | ltr (left-to-right, No NSP) | "" (the model family's own: mlm_nsp
  # for BERT, mlm for ModernBERT and RoBERTa; what continued pre-training of any checkpoint uses)
  c.objective = "mlm_nsp"
  # Continued pre-training: config.model's architecture, the vocabulary and casing come from
  # init_checkpoint (experiments/continue_pretraining.py).
  c.model_from_checkpoint = False
  # Growth: init_checkpoint is a smaller model of the same family and vocabulary, and every
  # parameter of config.model is grown from it (bert_jax/model/growth.py; ModernBERT-large was
  # initialised from base by "tile_from_middle"): "" (off) | tile_from_middle | tile_from_edge |
  # center. The optimizer and step start afresh.
  c.init_tiling = ""
  # A later phase of a recipe (ModernBERT's extend and decay): init_checkpoint is a training
  # workdir, and its newest checkpoint's optimizer state (the moments, and the count of their
  # bias correction) is taken with its parameters; this run's step, learning-rate schedule and
  # input still start at 0. Its optimizer, objective, layout and model size must be this run's.
  # False: the parameters alone, the optimizer starts afresh (continued pre-training). No effect
  # without init_checkpoint (bert_jax/tasks/jobs/init_checkpoint.py: carry_training_state).
  c.init_optimizer_state = False
  c.eval_before_training = False     # log held-out metrics at step 0 (where training starts)

  c.global_batch_size = 256          # sequences per step, all hosts together
  # Batch-size warm-up by tokens (bert_jax/runtime/batch_ramp.py): the global batch rises from
  # start_batch_size to global_batch_size (a whole multiple of it) in equal steps of
  # start_batch_size rows, evenly spaced over the first `tokens` tokens (rows x max_seq_length).
  # The input yields batches of start_batch_size, a step takes k of them and accumulates the
  # gradient over them (k x grad_accum_steps micro-batches: a step's memory stays the first
  # step's). One compile per k. The learning-rate schedule still counts steps. 0 = off.
  c.batch_warmup = ml_collections.ConfigDict()
  c.batch_warmup.start_batch_size = 0
  c.batch_warmup.tokens = 0.0
  c.max_predictions_per_seq = 20
  c.num_train_steps = 1_000_000
  c.warmup_steps = 10_000

  c.log_every_steps = 100
  c.eval_every_steps = 10_000
  c.eval_steps = 100                 # 0 = the whole eval set
  c.checkpoint_every_steps = 10_000
  c.keep_checkpoints = 3
  c.async_checkpointing = True

  c.data.input_files = ""            # comma list or glob of TFRecords (create_pretraining_data)
  c.data.eval_input_files = ""
  c.data.masking = "dynamic"         # dynamic: mask while reading | static: records are masked
  c.data.mask_mixture = "80/10/10"   # MASK/SAME/RND, appendix C.2
  c.data.masked_lm_prob = 0.15
  # The held-out records' masking rate (dynamic masking): a recipe that trains at another rate
  # (ModernBERT's 0.30) is still scored at BERT's, on the positions the seed picks.
  c.data.eval_masked_lm_prob = 0.15
  c.data.whole_word_mask = False
  # Dynamic masking's choice of positions: "count" (BERT's: round(length x masked_lm_prob) per
  # row) or "bernoulli" (ModernBERT's: each position alone with probability masked_lm_prob, at
  # most max_predictions_per_seq kept); and what a random replacement is drawn from: the whole
  # "vocabulary" (BERT's) or the ids "in_use" (no special tokens, no [unusedN] entries). The
  # held-out records are masked by "count" whatever the recipe, so all are scored alike.
  c.data.mask_selection = "count"
  c.data.random_token_ids = "vocabulary"
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
  # Python's documentation as the corpus (data_pipelines/demo_corpus.py), built into WORKDIR/data
  # with a learned vocabulary (or tokenizer.vocab_file), as data.text_files is.
  c.data.prepare_demo_corpus = False
  c.data.demo_max_documents = 0      # >0: the first N documents only (quick runs)
  # Raw text in BERT's input format (a sentence per line, blank lines between documents; comma
  # list or globs): records are built into WORKDIR/data with the run's vocabulary, once, every
  # holdout_every-th document held out for evaluation (data_pipelines/workdir_data.py).
  c.data.text_files = ""
  c.data.holdout_every = 20
  c.data.dupe_factor = 5             # maskings of each training document (create_pretraining_data)
  # What the records built into WORKDIR/data (demo corpus, data.text_files) hold:
  # "pairs": [CLS] A [SEP] B [SEP] with NSP labels (the paper); "contiguous": the documents' token
  # stream (each document followed by [SEP]) cut into full-length [CLS] ... [SEP] rows, no NSP
  # labels (RoBERTa/ModernBERT-style; objective 'mlm' or 'ltr'; not with data.packing). Records
  # given in data.input_files say themselves which they are.
  c.data.instances = "pairs"
  return c
