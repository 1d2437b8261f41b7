r"""RoBERTa pre-training (Liu et al. 2019), and XLM-RoBERTa's architecture (Conneau et al. 2020).

  python -m bert_jax.main --config=experiments/pretrain_roberta.py:size=roberta-base \
    --workdir=gs://b/roberta --config.tokenizer.tokenizer_file=gs://b/tokenizer.json \
    --config.data.input_files='gs://b/data/c512/*.tfrecord' --config.model.pad_token_id=1 \
    --config.model.vocab_size=50265

The records are full sentences packed across document boundaries without NSP (RoBERTa's
FULL-SENTENCES: `python -m data_pipelines.create_pretraining_data --instances=contiguous
--masking=dynamic --max_seq_length=512`, or `config.data.text_files` built into WORKDIR/data),
masked while reading (dynamic masking: 15%, 80/10/10). The vocabulary is a byte-level BPE
`tokenizer.json` (`python -m data_pipelines.build_vocab --model_type=bpe`) or an existing
RoBERTa tokenizer; `config.model.pad_token_id` must be its padding id (RoBERTa's positions are
numbered from pad_token_id + 1) and `vocab_size` its size (the run checks both).

The recipe (section 4.1 and table 9): AdamW with bias correction, betas (0.9, 0.98), epsilon
1e-6, weight decay 0.01, gradient clipping at 0 (none); 8,192 sequences of 512 tokens per step,
500,000 steps, a linear warm-up (24,000 steps base, 30,000 large) to 6e-4 (base) or 4e-4
(large), then a linear decay to 0. Sizes: `roberta-base` (12 x 768), `roberta-large`
(24 x 1,024); `xlm-roberta-base` / `xlm-roberta-large` are the same encoders with XLM-R's
250,002-token SentencePiece vocabulary. `:quick` is a tiny RoBERTa on full-sentence records
built from Python's documentation (no download) with a learned WordPiece vocabulary: what the
tests run. To continue pre-training a released RoBERTa or XLM-R (its own vocabulary, e.g. XLM-R
on one language), use experiments/continue_pretraining.py with its directory as
`--config.init_checkpoint`.
"""
from bert_jax.model.config import BertConfig
from experiments import pretraining_defaults

SIZES = ("roberta-base", "roberta-large", "xlm-roberta-base", "xlm-roberta-large")
# Per size: (peak learning rate, warm-up steps): RoBERTa's table 9.
RECIPES = {"base": (6e-4, 24_000), "large": (4e-4, 30_000)}


def get_config(arg=None):
  args = pretraining_defaults.parse_arg(arg, size="roberta-base", quick=False)
  if args["size"] not in SIZES:
    raise ValueError(f"size={args['size']!r}: expected one of {SIZES}")
  c = pretraining_defaults.get_config("base")
  c.model = BertConfig.named(args["size"]).to_dict()
  c.objective = "mlm"                   # no NSP
  c.data.instances = "contiguous"       # FULL-SENTENCES: rows run across documents
  c.data.masked_lm_prob = 0.15
  c.max_seq_length = 512
  c.max_predictions_per_seq = 80        # 15% of 512 = 76.8
  c.global_batch_size = 8192
  c.num_train_steps = 500_000
  c.learning_rate, c.warmup_steps = RECIPES[args["size"].rsplit("-", 1)[1]]
  c.optimizer.update(name="adamw", b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01,
                     clip_grad_norm=0.0, bias_correction=True)
  c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 100, 10_000, 5_000
  if args["quick"]:
    quick(c)
  return c


def quick(c):
  """A tiny RoBERTa (2 x 64) on full-sentence records of Python's documentation, a few steps."""
  c.model.dtype = "float32"
  c.model.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                 intermediate_size=128, vocab_size=832, max_position_embeddings=130,
                 pad_token_id=0)   # the learned vocabulary's [PAD]
  c.max_seq_length, c.max_predictions_per_seq = 128, 20
  c.global_batch_size, c.eval_batch_size = 8, 8
  c.num_train_steps, c.warmup_steps = 4, 2
  c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps, c.eval_steps = 2, 2, 4, 2
  c.data.shuffle_buffer_size = 100
  c.data.prepare_demo_corpus = True
  c.data.demo_max_documents = 300
  c.data.dupe_factor = 1
