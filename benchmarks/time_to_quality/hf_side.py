"""`--side=transformers` and `--side=hf_modern`: transformers' models under its `Trainer`.

`transformers`: `BertForPreTraining` on the NSP-pair instances, BERT's recipe (its usual AdamW
and linear schedule). `hf_modern`: `ModernBertForMaskedLM` on the contiguous-text instances with
the modern recipe as the Trainer offers it: `optim="stable_adamw"` (torch-optimi's StableAdamW,
ModernBERT's own, with `decouple_lr`: weight decay fully decoupled from the rate),
`lr_scheduler_type="warmup_stable_decay"` with a 1-sqrt decay, no gradient clipping,
`DataCollatorForLanguageModeling` at 30%; the batch warm-up, which the Trainer has no setting
for, by its training dataloader (`ramp_trainer`: each step's batch of the ramp's size, as
bert_jax's). Every side is scored on the fixed held-out sets of OUT/data.
"""
import json
import os
import shutil
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from benchmarks import bench_util
from benchmarks.time_to_quality import clocks, common, modern, prepared, schedule


def hf_tokenizer(vocab_file: str):
  """transformers' WordPiece tokenizer of the benchmark's vocabulary: the ids its collator
  masks with ([MASK]), draws random replacements from (len) and keeps unmasked ([CLS], [SEP])
  must be the records' ids. The vocabulary goes in by position: transformers 4 names the
  argument `vocab_file`, 5 names it `vocab`, and 5 silently ignores `vocab_file=` (a tokenizer
  of its 5 special tokens, [MASK] = 4: what trained the transformers sides before 2026-11-26)."""
  import transformers
  from bert_jax.text import tokenization
  tokenizer = transformers.BertTokenizerFast(vocab_file, do_lower_case=True)
  vocab = tokenization.load_vocab(vocab_file)
  expected = {token: vocab[token] for token in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
  got = {token: tokenizer.convert_tokens_to_ids(token) for token in expected}
  if len(tokenizer) != len(vocab) or got != expected:
    raise ValueError(f"transformers' tokenizer of {vocab_file} has {len(tokenizer)} entries and "
                     f"special ids {got}; the file has {len(vocab)} and {expected}")
  return tokenizer


def hf_model(args, info: dict, seed: int, side: str = "transformers"):
  """A fresh model of the side (transformers' own initialisation): `BertForPreTraining` of the
  benchmark's shape, or the modern recipe's `ModernBertForMaskedLM` (`modern.hf_model`)."""
  if common.RECIPE[side] == "modern":
    return modern.hf_model(args, info, seed)
  import transformers
  from bert_jax.model.config import BertConfig
  shape = BertConfig.named(args.size)
  transformers.set_seed(seed)
  config = transformers.BertConfig(
      vocab_size=info["vocab_size"], hidden_size=shape.hidden_size,
      num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
      intermediate_size=shape.intermediate_size, max_position_embeddings=max(args.seq, 512),
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2)
  return transformers.BertForPreTraining(config)


class InstanceDataset:
  """The unmasked training instances, one dict per example as the collator expects them (NSP
  pairs with their segments and label; contiguous rows with neither)."""

  def __init__(self, path: str, cls_id: int, sep_id: int):
    with np.load(path) as data:
      self.arrays = {k: data[k] for k in data.files}
    self.cls_id, self.sep_id = cls_id, sep_id
    self.pairs = "next_sentence_labels" in self.arrays

  def __len__(self) -> int:
    return len(self.arrays["lengths"])

  def __getitem__(self, i: int) -> dict:
    n = int(self.arrays["lengths"][i])
    ids = self.arrays["input_ids"][i, :n]
    special = (ids == self.cls_id) | (ids == self.sep_id)
    example = {"input_ids": ids.tolist(), "attention_mask": [1] * n,
               "special_tokens_mask": special.astype(np.int64).tolist()}
    if self.pairs:
      example.update(token_type_ids=self.arrays["segment_ids"][i, :n].tolist(),
                     next_sentence_label=int(self.arrays["next_sentence_labels"][i]))
    return example


def _gather(sequence, positions):
  import torch
  return torch.gather(sequence, 1, positions[..., None].expand(-1, -1, sequence.shape[-1]))


def score_torch(model, batches: Sequence[common.Batch]) -> Dict[str, float]:
  """bert_jax's evaluation metrics for a `BertForPreTraining` or a `ModernBertForMaskedLM` on
  fixed eval batches, the logits at the masked positions only.

  MLM: sum(w * nll) / sum(w) over masked_lm_positions, accuracy = argmax hits; NSP (BERT, on
  batches with NSP labels): mean over real rows (example_weight), as
  `bert_jax.tasks.jobs.pretraining.loss_from_terms`.
  """
  import torch
  import torch.nn.functional as F
  was_training = model.training
  model.eval()
  sums = dict(mlm_nll=0.0, mlm_correct=0.0, mlm_weight=0.0, nsp_nll=0.0, nsp_correct=0.0,
              nsp_weight=0.0)
  tensor = lambda b, name: torch.from_numpy(np.asarray(b[name]).astype(np.int64))
  modern_model = hasattr(model, "decoder")      # ModernBertForMaskedLM; BertForPreTraining: cls
  nsp = not modern_model and "next_sentence_labels" in batches[0]
  with torch.no_grad():
    for b in batches:
      positions = tensor(b, "masked_lm_positions")
      if modern_model:
        out = model.model(input_ids=tensor(b, "input_ids"),
                          attention_mask=tensor(b, "input_mask"), return_dict=True)
        mlm_logits = model.decoder(model.head(_gather(out.last_hidden_state, positions)))
      else:
        out = model.bert(input_ids=tensor(b, "input_ids"),
                         attention_mask=tensor(b, "input_mask"),
                         token_type_ids=tensor(b, "segment_ids"), return_dict=True)
        mlm_logits, nsp_logits = model.cls(_gather(out.last_hidden_state, positions),
                                           out.pooler_output)
      labels = tensor(b, "masked_lm_ids")
      weights = torch.from_numpy(np.asarray(b["masked_lm_weights"], np.float32))
      nll = F.cross_entropy(mlm_logits.flatten(0, 1), labels.flatten(), reduction="none")
      hits = (mlm_logits.argmax(-1) == labels).float().flatten()
      sums["mlm_nll"] += float((nll * weights.flatten()).sum())
      sums["mlm_correct"] += float((hits * weights.flatten()).sum())
      sums["mlm_weight"] += float(weights.sum())
      if not nsp:
        continue
      rows = torch.from_numpy(np.asarray(b["example_weight"], np.float32))
      nsp_labels = tensor(b, "next_sentence_labels").reshape(-1)
      nsp_nll = F.cross_entropy(nsp_logits, nsp_labels, reduction="none")
      sums["nsp_nll"] += float((nsp_nll * rows).sum())
      sums["nsp_correct"] += float(((nsp_logits.argmax(-1) == nsp_labels).float() * rows).sum())
      sums["nsp_weight"] += float(rows.sum())
  model.train(was_training)
  mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
  metrics = dict(mlm_loss=mlm_loss,
                 mlm_accuracy=sums["mlm_correct"] / (sums["mlm_weight"] + 1e-5), loss=mlm_loss)
  if nsp:
    nsp_loss = sums["nsp_nll"] / max(sums["nsp_weight"], 1e-5)
    metrics.update(nsp_loss=nsp_loss, loss=mlm_loss + nsp_loss,
                   nsp_accuracy=sums["nsp_correct"] / max(sums["nsp_weight"], 1e-5))
  return metrics


def score_sets(model, eval_sets: Dict[str, Sequence[common.Batch]]) -> Dict[str, float]:
  metrics = {}
  for name, batches in eval_sets.items():
    metrics.update(common.prefixed(name, score_torch(model, batches)))
  return metrics


def _callback_base():
  import transformers
  return transformers.TrainerCallback


def make_step_times():
  """A TrainerCallback (calibration) noting the time at the start and at every step's end."""
  base = _callback_base()

  class StepTimes(base):
    def __init__(self):
      self.start, self.ends = None, []

    def on_train_begin(self, args, state, control, **kwargs):
      self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
      self.ends.append(time.perf_counter())

  return StepTimes()


def make_wall_clock(curve_path: str, eval_sets: Dict[str, Sequence[common.Batch]],
                    eval_every_seconds: float, prior_seconds: float = 0.0,
                    next_eval: Optional[float] = None, last_eval_step: int = -1,
                    side: str = "transformers"):
  """A TrainerCallback keeping training time (without its evaluations and Trainer's saves),
  scoring the model on `eval_sets` every `eval_every_seconds` of it and at the end, and saving
  its state with every checkpoint (`clock.json` in the checkpoint folder) for a resumed run.
  """
  base = _callback_base()

  class WallClock(base):
    def __init__(self):
      self.clock = clocks.Clock(prior_seconds)
      self.at_step_end = prior_seconds
      self.next_eval = eval_every_seconds if next_eval is None else next_eval
      self.last_eval_step = last_eval_step

    @property
    def seconds(self) -> float:
      return self.clock.seconds

    def _evaluate(self, state, model, seconds):
      metrics = score_sets(model, eval_sets)
      common.append_jsonl(curve_path, dict(seconds=seconds, step=state.global_step, **metrics))
      print(f"[{side}] eval step {state.global_step} ({seconds / 60:.1f} min): " + ", ".join(
          f"{name} mlm_loss={metrics[f'{name}_mlm_loss']:.4f} "
          f"mlm_accuracy={metrics[f'{name}_mlm_accuracy']:.4f}" for name in eval_sets),
            flush=True)
      self.last_eval_step = state.global_step

    def on_train_begin(self, args, state, control, **kwargs):
      self.clock.start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
      self.at_step_end = seconds = self.clock.read()
      if seconds >= self.next_eval:
        self.clock.stop()
        self._evaluate(state, model, seconds)
        while self.next_eval <= seconds:
          self.next_eval += eval_every_seconds
        self.clock.start()

    def on_save(self, args, state, control, **kwargs):
      # Trainer logs and saves after on_step_end, then calls this: that time is not counted.
      self.clock = clocks.Clock(self.at_step_end)
      folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
      common.write_json(os.path.join(folder, "clock.json"),
                 dict(seconds=self.seconds, next_eval=self.next_eval, step=state.global_step))
      self.clock.start()

    def on_train_end(self, args, state, control, model=None, **kwargs):
      self.clock = clocks.Clock(self.at_step_end)
      if self.last_eval_step != state.global_step:
        self._evaluate(state, model, self.seconds)

  return WallClock()


def recipe_arguments(args, side: str, decay_steps: int) -> dict:
  """The recipe's TrainingArguments: BERT's (torch AdamW, linear schedule, clipping at 1.0) or
  the modern one (optimi's StableAdamW with decouple_lr, warmup-stable-decay with a 1-sqrt
  decay to 0 over `decay_steps`, no clipping: experiments/pretrain_modernbert.py's values)."""
  if common.RECIPE[side] == "bert":
    return dict(learning_rate=args.lr, lr_scheduler_type="linear", weight_decay=0.01,
                adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6, max_grad_norm=1.0)
  return dict(learning_rate=args.modern_lr, lr_scheduler_type="warmup_stable_decay",
              lr_scheduler_kwargs=dict(num_decay_steps=decay_steps, decay_type="1-sqrt",
                                       min_lr_ratio=0.0),
              optim="stable_adamw", optim_args=f"decouple_lr=True,max_lr={args.modern_lr!r}",
              weight_decay=1e-5, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6,
              max_grad_norm=0.0)


def hf_training_args(args, output_dir: str, plan: Optional[schedule.Plan], max_steps: int,
                     warmup_steps: int, side: str = "transformers", decay_steps: int = 0):
  import transformers
  save = dict(save_strategy="no") if plan is None else dict(
      save_strategy="steps", save_steps=plan.checkpoint_every_steps, save_total_limit=2)
  return transformers.TrainingArguments(
      output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=args.batch,
      warmup_steps=warmup_steps, logging_steps=args.log_every, report_to=[], use_cpu=True,
      dataloader_num_workers=0, seed=args.seed, disable_tqdm=True, remove_unused_columns=False,
      **recipe_arguments(args, side, decay_steps), **save)


class RampBatchSampler:
  """Step s's batch: `rows_per_step[s]` indices, read in order from seeded permutations of the
  dataset (a fresh one each time it is used up). Its length is the run's steps, so the Trainer
  sees one epoch and its resume (`skip_first_batches`) skips exactly the steps trained."""

  def __init__(self, size: int, rows_per_step: Sequence[int], seed: int):
    self.size, self.rows_per_step, self.seed = size, list(rows_per_step), seed

  def __len__(self) -> int:
    return len(self.rows_per_step)

  def __iter__(self):
    rng = np.random.default_rng(self.seed)
    order, position = rng.permutation(self.size), 0
    for rows in self.rows_per_step:
      batch: List[int] = []
      while len(batch) < rows:
        if position == self.size:
          order, position = rng.permutation(self.size), 0
        take = min(rows - len(batch), self.size - position)
        batch += order[position:position + take].tolist()
        position += take
      yield batch


def ramp_trainer(rows_per_step: Sequence[int], **kwargs):
  """A `transformers.Trainer` whose training batches follow `rows_per_step` (the batch warm-up;
  the Trainer's documented way to change its data: its `get_train_dataloader` overridden)."""
  import torch
  import transformers

  class RampTrainer(transformers.Trainer):
    def get_train_dataloader(self):
      sampler = RampBatchSampler(len(self.train_dataset), rows_per_step, self.args.seed)
      loader = torch.utils.data.DataLoader(self.train_dataset, batch_sampler=sampler,
                                           collate_fn=self.data_collator, num_workers=0)
      return self.accelerator.prepare(loader)

  return RampTrainer(**kwargs)


def mlm_collator(tokenizer, probability: float):
  """transformers' masking: each token not [CLS] or [SEP] (the dataset's special_tokens_mask)
  chosen with `probability`, then 80% [MASK], 10% a random id of the vocabulary, 10% kept."""
  import transformers
  return transformers.DataCollatorForLanguageModeling(
      tokenizer, mlm=True, mlm_probability=probability, mask_replace_prob=0.8,
      random_replace_prob=0.1)


def hf_trainer(args, info: dict, training_args, callbacks, side: str = "transformers",
               rows_per_step: Optional[Sequence[int]] = None):
  """The side's Trainer: BERT's NSP-pair instances masked at 15%, or the contiguous rows masked
  at `--modern_masking` with each step's batch from `rows_per_step` (the modern recipe)."""
  import transformers
  paths = prepared.data_paths(args.out)
  tokenizer = hf_tokenizer(paths["vocab.txt"])
  modern_side = common.RECIPE[side] == "modern"
  dataset = InstanceDataset(
      paths["train_contiguous_instances.npz" if modern_side else "train_instances.npz"],
      tokenizer.cls_token_id, tokenizer.sep_token_id)
  collator = mlm_collator(tokenizer, args.modern_masking if modern_side else 0.15)
  model = hf_model(args, info, args.seed, side)
  kwargs = dict(model=model, args=training_args, train_dataset=dataset, data_collator=collator,
                callbacks=callbacks)
  if modern_side:
    trainer = ramp_trainer(rows_per_step or [args.batch] * training_args.max_steps, **kwargs)
  else:
    trainer = transformers.Trainer(**kwargs)
  return trainer, tokenizer


def quiet_transformers():
  import transformers
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()


def calibrate_hf(args, info: dict, side: str = "transformers") -> schedule.Calibration:
  """The Trainer's speed: 3 windows of `calibration_steps` steps of the same setup (the full
  batch: no ramp)."""
  k = args.calibration_steps
  directory = os.path.join(args.out, side, "calibration")
  shutil.rmtree(directory, ignore_errors=True)
  times = make_step_times()
  trainer, _ = hf_trainer(args, info, hf_training_args(args, directory, None, 3 * k, k, side),
                          [times], side)
  trainer.train()
  marks = [times.start] + [times.ends[i * k - 1] for i in (1, 2, 3)]
  shutil.rmtree(directory, ignore_errors=True)
  return schedule.Calibration.from_windows([(k, b - a) for a, b in zip(marks, marks[1:])])


def run_hf(args, side: str = "transformers") -> dict:
  """Pre-trains the side's model with `transformers.Trainer` (resuming its checkpoints)."""
  import torch
  from transformers.trainer_utils import get_last_checkpoint
  quiet_transformers()
  torch.set_num_threads(args.threads)
  info = prepared.read_data_info(args.out)
  side_dir = os.path.join(args.out, side)
  final_dir = os.path.join(side_dir, "final")
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[{side}] {side_dir}/summary.json exists: done", flush=True)
    with open(os.path.join(side_dir, "summary.json")) as f:
      return json.load(f)
  eval_sets = prepared.load_eval_sets(args.out)
  plan = schedule.load_or_make_plan(args, side, lambda: calibrate_hf(args, info, side),
                                    info["seq"])
  output_dir = os.path.join(side_dir, "trainer")
  os.makedirs(output_dir, exist_ok=True)
  curve_path = os.path.join(side_dir, "curve.jsonl")
  resume = get_last_checkpoint(output_dir)
  prior = dict(seconds=0.0, next_eval=None, step=0)
  if resume:
    with open(os.path.join(resume, "clock.json")) as f:
      prior = json.load(f)
    print(f"[{side}] resuming from {resume} ({prior['seconds'] / 60:.1f} min trained)",
          flush=True)
  # The curve keeps the rows of the steps the resumed state has (as bert_jax's metrics.jsonl).
  kept = [r for r in common.read_jsonl(curve_path) if r["step"] <= prior["step"]]
  common.write_jsonl(curve_path, kept)
  clock = make_wall_clock(curve_path, eval_sets, args.eval_every_minutes * 60, prior["seconds"],
                          prior["next_eval"], kept[-1]["step"] if kept else -1, side)
  training_args = hf_training_args(args, output_dir, plan, plan.num_train_steps,
                                   plan.warmup_steps, side, plan.decay_steps)
  rows = [plan.rows(step) for step in range(plan.num_train_steps)] if plan.batch else None
  trainer, tokenizer = hf_trainer(args, info, training_args, [clock], side, rows)
  start = time.time()
  trainer.train(resume_from_checkpoint=resume)
  trainer.save_model(final_dir)
  tokenizer.save_pretrained(final_dir)
  # transformers 5 writes tokenizer.json only; bert_jax's fine-tuning reads vocab.txt.
  shutil.copy(prepared.data_paths(args.out)["vocab.txt"], os.path.join(final_dir, "vocab.txt"))
  curve = common.read_jsonl(curve_path)
  summary = dict(side=side, recipe=common.RECIPE[side],
                 settings=common.recipe_settings(args, side), plan=plan.to_json(),
                 steps=plan.num_train_steps,
                 sequences=plan.sequences() if plan.batch else plan.num_train_steps * args.batch,
                 train_seconds=clock.seconds,
                 final=curve[-1] if curve else None, checkpoint=final_dir,
                 wall_seconds_this_call=time.time() - start, torch_threads=torch.get_num_threads(),
                 machine=bench_util.machine_line())
  common.write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary
