"""`--side=transformers`: `BertForPreTraining` with `transformers.Trainer`, same instances."""
import json
import os
import shutil
import time
from typing import Dict, Optional, Sequence

import numpy as np

from benchmarks import bench_util
from benchmarks.time_to_quality import clocks, common, prepared, schedule


def hf_tokenizer(vocab_file: str):
  import transformers
  return transformers.BertTokenizerFast(vocab_file=vocab_file, do_lower_case=True)


def hf_model(args, info: dict, seed: int):
  """A fresh `BertForPreTraining` of the benchmark's shape (transformers' own initialisation)."""
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
  """The unmasked training instances, one dict per example as the collator expects them."""

  def __init__(self, path: str, cls_id: int, sep_id: int):
    with np.load(path) as data:
      self.arrays = {k: data[k] for k in data.files}
    self.cls_id, self.sep_id = cls_id, sep_id

  def __len__(self) -> int:
    return len(self.arrays["lengths"])

  def __getitem__(self, i: int) -> dict:
    n = int(self.arrays["lengths"][i])
    ids = self.arrays["input_ids"][i, :n]
    special = (ids == self.cls_id) | (ids == self.sep_id)
    return {"input_ids": ids.tolist(), "token_type_ids": self.arrays["segment_ids"][i, :n].tolist(),
            "attention_mask": [1] * n, "special_tokens_mask": special.astype(np.int64).tolist(),
            "next_sentence_label": int(self.arrays["next_sentence_labels"][i])}


def score_torch(model, batches: Sequence[common.Batch]) -> Dict[str, float]:
  """bert_jax's evaluation metrics for a `BertForPreTraining` on the fixed eval batches.

  MLM: sum(w * nll) / sum(w) over masked_lm_positions, accuracy = argmax hits; NSP: mean over
  real rows (example_weight), as `bert_jax.tasks.jobs.pretraining.loss_from_terms`.
  """
  import torch
  import torch.nn.functional as F
  was_training = model.training
  model.eval()
  sums = dict(mlm_nll=0.0, mlm_correct=0.0, mlm_weight=0.0, nsp_nll=0.0, nsp_correct=0.0,
              nsp_weight=0.0)
  tensor = lambda b, name: torch.from_numpy(np.asarray(b[name]).astype(np.int64))
  with torch.no_grad():
    for b in batches:
      out = model.bert(input_ids=tensor(b, "input_ids"), attention_mask=tensor(b, "input_mask"),
                       token_type_ids=tensor(b, "segment_ids"), return_dict=True)
      sequence = out.last_hidden_state
      positions = tensor(b, "masked_lm_positions")
      gathered = torch.gather(sequence, 1,
                              positions[..., None].expand(-1, -1, sequence.shape[-1]))
      mlm_logits, nsp_logits = model.cls(gathered, out.pooler_output)
      labels = tensor(b, "masked_lm_ids")
      weights = torch.from_numpy(np.asarray(b["masked_lm_weights"], np.float32))
      nll = F.cross_entropy(mlm_logits.flatten(0, 1), labels.flatten(), reduction="none")
      hits = (mlm_logits.argmax(-1) == labels).float().flatten()
      sums["mlm_nll"] += float((nll * weights.flatten()).sum())
      sums["mlm_correct"] += float((hits * weights.flatten()).sum())
      sums["mlm_weight"] += float(weights.sum())
      rows = torch.from_numpy(np.asarray(b["example_weight"], np.float32))
      nsp_labels = tensor(b, "next_sentence_labels").reshape(-1)
      nsp_nll = F.cross_entropy(nsp_logits, nsp_labels, reduction="none")
      sums["nsp_nll"] += float((nsp_nll * rows).sum())
      sums["nsp_correct"] += float(((nsp_logits.argmax(-1) == nsp_labels).float() * rows).sum())
      sums["nsp_weight"] += float(rows.sum())
  model.train(was_training)
  mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
  nsp_loss = sums["nsp_nll"] / max(sums["nsp_weight"], 1e-5)
  return dict(mlm_loss=mlm_loss, mlm_accuracy=sums["mlm_correct"] / (sums["mlm_weight"] + 1e-5),
              nsp_loss=nsp_loss, nsp_accuracy=sums["nsp_correct"] / max(sums["nsp_weight"], 1e-5),
              loss=mlm_loss + nsp_loss)


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


def make_wall_clock(curve_path: str, batches: Sequence[common.Batch], eval_every_seconds: float,
                    prior_seconds: float = 0.0, next_eval: Optional[float] = None,
                    last_eval_step: int = -1):
  """A TrainerCallback keeping training time (without its evaluations and Trainer's saves),
  scoring the model on `batches` every `eval_every_seconds` of it and at the end, and saving its
  state with every checkpoint (`clock.json` in the checkpoint folder) for a resumed run.
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
      metrics = score_torch(model, batches)
      common.append_jsonl(curve_path, dict(seconds=seconds, step=state.global_step, **metrics))
      print(f"[transformers] eval step {state.global_step} ({seconds / 60:.1f} min): "
            f"mlm_loss={metrics['mlm_loss']:.4f} mlm_accuracy={metrics['mlm_accuracy']:.4f}",
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


def hf_training_args(args, output_dir: str, plan: Optional[schedule.Plan], max_steps: int,
                     warmup_steps: int):
  import transformers
  save = dict(save_strategy="no") if plan is None else dict(
      save_strategy="steps", save_steps=plan.checkpoint_every_steps, save_total_limit=2)
  return transformers.TrainingArguments(
      output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=args.batch,
      learning_rate=args.lr, warmup_steps=warmup_steps, lr_scheduler_type="linear",
      weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6, max_grad_norm=1.0,
      logging_steps=args.log_every, report_to=[], use_cpu=True, dataloader_num_workers=0,
      seed=args.seed, disable_tqdm=True, remove_unused_columns=False, **save)


def hf_trainer(args, info: dict, training_args, callbacks):
  import transformers
  paths = prepared.data_paths(args.out)
  tokenizer = hf_tokenizer(paths["vocab.txt"])
  dataset = InstanceDataset(paths["train_instances.npz"], tokenizer.cls_token_id,
                            tokenizer.sep_token_id)
  collator = transformers.DataCollatorForLanguageModeling(
      tokenizer, mlm=True, mlm_probability=0.15, mask_replace_prob=0.8, random_replace_prob=0.1)
  model = hf_model(args, info, args.seed)
  trainer = transformers.Trainer(model=model, args=training_args, train_dataset=dataset,
                                 data_collator=collator, callbacks=callbacks)
  return trainer, tokenizer


def quiet_transformers():
  import transformers
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()


def calibrate_hf(args, info: dict) -> schedule.Calibration:
  """The Trainer's speed: 3 windows of `calibration_steps` steps of the same setup."""
  k = args.calibration_steps
  directory = os.path.join(args.out, "transformers", "calibration")
  shutil.rmtree(directory, ignore_errors=True)
  times = make_step_times()
  trainer, _ = hf_trainer(args, info, hf_training_args(args, directory, None, 3 * k, k), [times])
  trainer.train()
  marks = [times.start] + [times.ends[i * k - 1] for i in (1, 2, 3)]
  shutil.rmtree(directory, ignore_errors=True)
  return schedule.Calibration.from_windows([(k, b - a) for a, b in zip(marks, marks[1:])])


def run_hf(args) -> dict:
  """Pre-trains `BertForPreTraining` with `transformers.Trainer` (resuming its checkpoints)."""
  import torch
  from transformers.trainer_utils import get_last_checkpoint
  quiet_transformers()
  torch.set_num_threads(args.threads)
  info = prepared.read_data_info(args.out)
  side_dir = os.path.join(args.out, "transformers")
  final_dir = os.path.join(side_dir, "final")
  if os.path.exists(os.path.join(side_dir, "summary.json")):
    print(f"[transformers] {side_dir}/summary.json exists: done", flush=True)
    with open(os.path.join(side_dir, "summary.json")) as f:
      return json.load(f)
  plan = schedule.load_or_make_plan(args, "transformers", lambda: calibrate_hf(args, info))
  output_dir = os.path.join(side_dir, "trainer")
  os.makedirs(output_dir, exist_ok=True)
  curve_path = os.path.join(side_dir, "curve.jsonl")
  resume = get_last_checkpoint(output_dir)
  prior = dict(seconds=0.0, next_eval=None, step=0)
  if resume:
    with open(os.path.join(resume, "clock.json")) as f:
      prior = json.load(f)
    print(f"[transformers] resuming from {resume} ({prior['seconds'] / 60:.1f} min trained)",
          flush=True)
  # The curve keeps the rows of the steps the resumed state has (as bert_jax's metrics.jsonl).
  kept = [r for r in common.read_jsonl(curve_path) if r["step"] <= prior["step"]]
  common.write_jsonl(curve_path, kept)
  batches = prepared.load_batches(prepared.data_paths(args.out)["eval_batches.npz"])
  clock = make_wall_clock(curve_path, batches, args.eval_every_minutes * 60, prior["seconds"],
                          prior["next_eval"], kept[-1]["step"] if kept else -1)
  training_args = hf_training_args(args, output_dir, plan, plan.num_train_steps,
                                   plan.warmup_steps)
  trainer, tokenizer = hf_trainer(args, info, training_args, [clock])
  start = time.time()
  trainer.train(resume_from_checkpoint=resume)
  trainer.save_model(final_dir)
  tokenizer.save_pretrained(final_dir)
  # transformers 5 writes tokenizer.json only; bert_jax's fine-tuning reads vocab.txt.
  shutil.copy(prepared.data_paths(args.out)["vocab.txt"], os.path.join(final_dir, "vocab.txt"))
  curve = common.read_jsonl(curve_path)
  summary = dict(side="transformers", plan=plan.to_json(), steps=plan.num_train_steps,
                 sequences=plan.num_train_steps * args.batch, train_seconds=clock.seconds,
                 final=curve[-1] if curve else None, checkpoint=final_dir,
                 wall_seconds_this_call=time.time() - start, torch_threads=torch.get_num_threads(),
                 machine=bench_util.machine_line())
  common.write_json(os.path.join(side_dir, "summary.json"), summary)
  print(json.dumps(summary, indent=1), flush=True)
  return summary
