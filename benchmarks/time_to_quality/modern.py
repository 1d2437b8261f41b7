"""The modern recipe at this benchmark's scale: the model, bert_jax's config, transformers' model.

One definition for both modern sides, so that they train the same model with the same recipe:
`model_config` is the architecture (a bert_jax `BertConfig`, written to transformers'
`ModernBertConfig` by the same translation `bert_jax.export` uses), `jax_config` bert_jax's
pre-training config (experiments/pretrain_demo.py's `modern_twin`, the modern recipe at the
demo's scale, at this benchmark's model, batch, data and schedule), and `hf_model` transformers'
model. The schedule's numbers (steps, warm-up, decay, batch ramp) are the side's plan
(schedule.py), made from its own calibrated speed.
"""
import math

from benchmarks.time_to_quality import common, prepared


def model_config(args, info: dict):
  """The ModernBERT-family model of about BERT-`--size`'s size (`modern_counterpart`: its
  layers, width and heads, the GLU width that keeps the MLP's weights, every third layer global
  (layers 0 and 3 of 4) and the others in a `--local_attention`-token window), both rotary bases
  10,000 (ModernBERT's pretrain phase), no dropout, the vocabulary's [PAD]. BERT-mini's: 5.34M
  parameters against BertForPreTraining's 5.48M (encoder layers 3.21M against 3.16M)."""
  from bert_jax.families.modernbert.config import modern_counterpart
  from bert_jax.model.config import BertConfig
  return modern_counterpart(
      BertConfig.named(args.size), vocab_size=info["vocab_size"],
      local_attention=args.local_attention, global_rope_theta=10_000.0,
      local_rope_theta=10_000.0, pad_token_id=prepared.contiguous_info(args.out)["special"]["pad"],
      dtype="float32")


def max_predictions(masked_lm_prob: float, seq: int) -> int:
  """Masked-LM slots a row: `masked_lm_prob` of its seq - 2 text positions, in slots of 8
  (0.30 at 128: 37.8 -> 40, as the demo's twin)."""
  return 8 * math.ceil(masked_lm_prob * (seq - 2) / 8)


def jax_config(args, info: dict):
  """bert_jax's pre-training config of the modern side (steps, cadences, ramp and schedule
  lengths set by the caller from the plan).

  `pretrain_demo.modern_twin`: objective mlm (no NSP), masking 30% 80/10/10 while reading,
  StableAdamW (betas 0.9/0.98, eps 1e-6, weight decay 1e-5 fully decoupled, off biases and
  norms, no gradient clipping), warmup-stable-decay with a 1-sqrt decay to 0; here with
  `model_config`'s model, the contiguous-text records of OUT/data, batch `--batch`, peak rate
  `--modern_lr` and masking `--modern_masking`.
  """
  from experiments import pretrain_demo
  paths = prepared.data_paths(args.out)
  c = pretrain_demo.modern_twin(quick=False)
  c.model.update(model_config(args, info).to_dict())
  c.max_seq_length = info["seq"]
  c.data.masked_lm_prob = args.modern_masking
  c.max_predictions_per_seq = max_predictions(args.modern_masking, info["seq"])
  c.global_batch_size, c.eval_batch_size = args.batch, common.EVAL_BATCH
  c.learning_rate, c.seed = args.modern_lr, args.seed
  c.batch_warmup.start_batch_size, c.batch_warmup.tokens = 0, 0.0   # the plan's
  c.schedule.update(name="wsd", decay_steps=0, decay_fraction=0.0, decay_shape="1-sqrt",
                    final_fraction=0.0)
  c.data.prepare_demo_corpus = False
  c.data.input_files = paths["train_contiguous.tfrecord"]
  c.data.eval_input_files = paths["eval_contiguous.tfrecord"]
  c.tokenizer.vocab_file, c.tokenizer.do_lower_case = paths["vocab.txt"], True
  c.data.masking = "dynamic"
  c.data.shuffle_buffer_size = 10_000
  c.eval_steps = 0
  c.log_every_steps = args.log_every
  c.keep_checkpoints = 2
  return c


def hf_config(args, info: dict):
  """`model_config` as transformers' `ModernBertConfig` (bert_jax's export translation), with the
  vocabulary's special tokens and sparse prediction (the MLM head and decoder at the masked
  positions only, as ModernBERT's own training and bert_jax compute them)."""
  import transformers
  from bert_jax.families.modernbert import convert
  special = prepared.contiguous_info(args.out)["special"]
  values = convert.huggingface_config(model_config(args, info), "ModernBertForMaskedLM")
  values.update(cls_token_id=special["cls"], sep_token_id=special["sep"],
                bos_token_id=special["cls"], eos_token_id=special["sep"],
                sparse_prediction=True)
  return transformers.ModernBertConfig.from_dict(values)


def hf_model(args, info: dict, seed: int):
  """A fresh `ModernBertForMaskedLM` of `model_config`'s shape (transformers' own
  initialisation, its default attention: sdpa on CPU)."""
  import transformers
  transformers.set_seed(seed)
  return transformers.ModernBertForMaskedLM(hf_config(args, info))
