r"""Pre-training step for step: bert_jax against `transformers` from the same weights and batches.

  python -m benchmarks.pretrain_side_by_side --size=mini --steps=300 --batch=32 --seq=128 --out=DIR
  python -m benchmarks.pretrain_side_by_side --family=modernbert --size=mini --steps=300 \
    --batch=32 --seq=128 [--optimizer=stable_adamw] --out=DIR

With dropout off both sides start from the same weights (bert_jax's `init_state`, exported by
`checkpoints.export_huggingface`) and train on the same batches (the first N of bert_jax's own
pipeline), so every step must agree to float32 rounding: a wrong loss weighting, schedule,
clipping or optimizer detail shows within a few steps. bert_jax runs its real step and optimizer;
the PyTorch side (`TORCH_SIDES`: BertForPreTraining with BERT's original AdamWeightDecayOptimizer,
or ModernBertForMaskedLM with torch.optim.AdamW or optimi's StableAdamW) applies bert_jax's
learning rate of each step (`learning_rates`). Per-step losses (and the gradient norm before
clipping) are compared, then every parameter by Hugging Face name. OUT gets
pretrain_side_by_side.md, .json and parity_loss.png. CI-sized runs:
tests/test_pretrain_side_by_side.py, tests/test_modern_side_by_side.py.
"""
import argparse
import dataclasses
import functools
import math
import os
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

from benchmarks import process_setup

process_setup.prepare(main=__name__ == "__main__")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax import parallel  # noqa: E402
from bert_jax.io import checkpoints  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402
from bert_jax.runtime import job as jobs  # noqa: E402
from bert_jax.runtime import optim  # noqa: E402
from bert_jax.tasks import registry  # noqa: E402
from bert_jax.tasks.jobs import pretraining, pretraining_data  # noqa: E402
from experiments import pretrain_demo, pretrain_modernbert  # noqa: E402

FAMILIES = ("bert", "modernbert")
OPTIMIZERS = ("adamw", "stable_adamw")   # --family=modernbert's PyTorch sides
LOSSES = ("loss", "mlm_loss", "nsp_loss")   # BERT's; `losses_of(config)` for either family
# Tensors whose gradient is zero in exact arithmetic: a key bias adds q . b_k to every logit of a
# query alike, which the softmax cancels. Both sides move them only by rounding noise (which Adam
# scales up to ~lr * noise / eps per step), so relative differences of them mean nothing; they
# count in the absolute difference only.
ZERO_GRADIENT = ("attention.self.key.bias",)
Batch = Dict[str, np.ndarray]


# ----------------------------------------------------------------------------------- setup


def demo_config(size: str = "mini", steps: int = 300, batch: int = 32, seq: int = 128,
                lr: float = 5e-4, warmup: int = 30, seed: int = 0):
  """The demo experiment (its corpus, vocabulary, predictions per sequence, optimizer), at
  `size`, dropout off, the schedule over exactly `steps` steps (the last step's rate near 0)."""
  c = pretrain_demo.get_config()
  shape = BertConfig.named(size)
  c.model.update(num_hidden_layers=shape.num_hidden_layers, hidden_size=shape.hidden_size,
                 num_attention_heads=shape.num_attention_heads,
                 intermediate_size=shape.intermediate_size,
                 max_position_embeddings=max(seq, c.model.max_position_embeddings), dtype="float32")
  c.max_seq_length, c.global_batch_size, c.seed = seq, batch, seed
  c.num_train_steps, c.warmup_steps, c.learning_rate = steps, warmup, lr
  set_dropout(c, 0.0)
  return c


# ModernBERT shapes of this comparison: (layers, hidden, heads, GLU width). Four layers are global,
# local, local, global (every third global, as released); head dim 64 (tiny: 32) and a GLU width
# of 1.5 H, as modernbert-base's. tiny is experiments/pretrain_modernbert.py:quick's model.
MODERN_SHAPES = {"tiny": (4, 64, 2, 96), "mini": (4, 128, 2, 192), "small": (4, 256, 4, 384)}


def modern_config(size: str = "mini", steps: int = 300, batch: int = 32, seq: int = 128,
                  lr: float = 5e-4, warmup: int = 30, seed: int = 0, local_attention: int = 32,
                  vocab_size: int = 4000, optimizer: str = "adamw"):
  """experiments/pretrain_modernbert.py:quick's data as contiguous demo-corpus rows masked at 30%
  on the whole corpus, the model at MODERN_SHAPES[size] in float32 (rotary bases 160,000 and
  10,000, so a layer that took the other kind's table would show), dropout off, AdamW with bias
  correction, and the schedule over exactly `steps` steps."""
  if size not in MODERN_SHAPES:
    raise ValueError(f"--size={size!r} with --family=modernbert: expected one of "
                     f"{sorted(MODERN_SHAPES)}")
  if not 0 < local_attention < seq:
    raise ValueError(f"--local_attention={local_attention}: the window must be narrower than "
                     f"the row ({seq}), or the local layers attend as the global ones")
  c = pretrain_modernbert.get_config("quick")
  layers, hidden, heads, glu_width = MODERN_SHAPES[size]
  c.model.update(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                 intermediate_size=glu_width, vocab_size=vocab_size,
                 local_attention=local_attention, global_rope_theta=160_000.0,
                 max_position_embeddings=max(seq, c.model.max_position_embeddings), dtype="float32")
  # 30% of a row's positions (as the experiment's phases), in slots of 8.
  c.max_seq_length = seq
  c.max_predictions_per_seq = 8 * math.ceil(c.data.masked_lm_prob * seq / 8)
  c.global_batch_size, c.seed = batch, seed
  c.batch_warmup.start_batch_size = 0   # every step `batch` rows, as the torch side's
  c.num_train_steps, c.warmup_steps, c.learning_rate = steps, warmup, lr
  # Set whole, not inherited: a change of the experiment must not silently change this comparison.
  # Weight decay 0.01 (and 1e-4 for StableAdamW), not the recipe's 1e-5: that moves a weight by
  # ~1e-6 over 300 steps, below what the comparison resolves, so a decay on the wrong tensors
  # would pass unseen.
  c.optimizer.update(name="adamw", b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01,
                     clip_grad_norm=1.0, bias_correction=True,
                     fully_decoupled_weight_decay=False)
  c.schedule.update(name="bert", decay_steps=0, decay_fraction=0.0, decay_shape="linear",
                    final_fraction=0.0)
  if optimizer == "stable_adamw":    # the experiment's optimizer and schedule, no clipping
    c.optimizer.update(name="stable_adamw", weight_decay=1e-4, clip_grad_norm=0.0,
                       fully_decoupled_weight_decay=True)
    c.schedule.update(name="wsd", decay_fraction=0.2, decay_shape="1-sqrt")
  elif optimizer != "adamw":
    raise ValueError(f"--optimizer={optimizer!r}: expected one of {list(OPTIMIZERS)}")
  c.data.demo_max_documents = 0                    # the whole corpus: 300 steps x 32 rows
  c.data.shuffle_buffer_size = 1000
  # One sequence a row, as transformers' model reads a row (documents kept apart need its
  # varlen attention, which is GPU-only): the comparison is of the model and the optimizer.
  c.data.instances = "contiguous"
  set_dropout(c, 0.0)
  return c


def family_of(config) -> str:
  """`config.model`'s family, as the job reads it (a BERT model block need not name one)."""
  return pretraining.bert_config_from(config).architecture


def losses_of(config) -> tuple:
  """The losses compared step by step: total and MLM, and NSP where the objective has it."""
  return ("loss", "mlm_loss") + (("nsp_loss",) if config.objective == "mlm_nsp" else ())


def curves_of(config) -> tuple:
  return losses_of(config) + ("grad_norm",)


def set_dropout(config, rate: float) -> None:
  """Every dropout of the model at `rate` (transformers' ModernBERT has one attention rate for
  the probabilities and the attention output)."""
  config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = rate
  if "attention_output_dropout_prob" in config.model:
    config.model.attention_output_dropout_prob = rate


def take_batches(config, count: int) -> List[Batch]:
  """The first `count` training batches of bert_jax's pipeline, as numpy (what both sides see)."""
  batches = bench_util.pipeline_batches(config, count, training=True)
  if len(batches) != count:
    raise ValueError(f"the pipeline gave {len(batches)} batches, {count} asked for")
  return batches


def exported(config, params, directory: str) -> Dict[str, np.ndarray]:
  """`params` as the family's Hugging Face pre-training class (config.json + safetensors in
  `directory`), and the tensors written, by Hugging Face name (what is compared)."""
  checkpoints.export_huggingface(pretraining.bert_config_from(config), params, directory)
  return checkpoints.load_safetensors(os.path.join(directory, "model.safetensors"))


def learning_rates(config, steps: int) -> np.ndarray:
  """schedule(t) for t = 0..steps-1, float32: the rate bert_jax's step t applies.

  Jitted as in the train step: XLA's arithmetic can differ from eager's by an ulp (it did at
  1e-3 * 9 / 10), and the PyTorch side should apply the very same float32 values.
  """
  _, schedule = optim.create_optimizer(config, config.num_train_steps)
  schedule = jax.jit(schedule)
  return np.array([schedule(t) for t in range(steps)], np.float32)


@dataclasses.dataclass
class Run:
  """One side's training run: per-step losses and learning rates, and the final parameters."""
  losses: Dict[str, np.ndarray]      # `curves_of` name -> [steps]
  learning_rates: np.ndarray         # [steps]
  seconds: float                     # wall clock of the steps (compilation included for jax)
  final: object = None               # jax params tree, or the torch model
  clipped: Optional[Dict[str, int]] = None   # StableAdamW: clipped (tensor, step) pairs, of all


def _progress(side: str, step: int, loss: float, start: float, every: int = 50) -> None:
  if step % every == 0:
    print(f"    {side} step {step}: loss {loss:.4f} ({time.perf_counter() - start:.0f} s)",
          flush=True)


# ----------------------------------------------------------------------------------- bert_jax


def run_jax(config, params, batches: Sequence[Batch]) -> Run:
  """bert_jax's real train step and optimizer (the pre-training job's, placed and compiled as a
  run does: `runtime.job.state_and_step`) over `batches`, from `params`."""
  if config.grad_accum_steps != 1:
    raise ValueError("the PyTorch side takes one update per batch: grad_accum_steps=1")
  par = parallel.create(config)
  state, step = jobs.state_and_step(registry.job(config), par)
  # The given weights where the fresh ones are (the optimizer's fresh state holds no weights).
  state = state.replace(params=jax.tree_util.tree_map(
      lambda value, fresh: jax.device_put(value, fresh.sharding), params, state.params))
  rng = jax.random.split(jax.random.PRNGKey(0))[1]   # a run's dropout key (dropout is off)
  curves = curves_of(config)
  history = {name: [] for name in curves + ("learning_rate", "skipped")}
  start = time.perf_counter()
  for batch in batches:
    state, metrics = step(state, par.put_batch(batch), rng)
    metrics = jax.device_get(metrics)
    for name in history:
      history[name].append(float(metrics[name]))
    _progress("bert_jax", len(history["loss"]), history["loss"][-1], start)
  seconds = time.perf_counter() - start
  if any(history["skipped"]):
    raise RuntimeError(f"bert_jax skipped non-finite steps: {np.nonzero(history['skipped'])[0]}")
  return Run({name: np.array(history[name]) for name in curves},
             np.array(history["learning_rate"], np.float32), seconds,
             jax.device_get(state.params))


# ----------------------------------------------------------------------------------- PyTorch


def _quiet_transformers():
  import transformers
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  return transformers


def load_torch_model(directory: str, train: bool):
  """`BertForPreTraining.from_pretrained` (offline, eager attention), in train or eval mode."""
  transformers = _quiet_transformers()
  model = transformers.BertForPreTraining.from_pretrained(directory, attn_implementation="eager")
  if model.cls.predictions.decoder.weight is not model.bert.embeddings.word_embeddings.weight:
    raise RuntimeError("the MLM decoder is not tied to the word embeddings")
  return model.train(train)


def torch_losses(model, batch: Batch):
  """(total, mlm, nsp) as bert_jax computes them; MLM logits only at the masked positions."""
  import torch
  import torch.nn.functional as F
  tensor = lambda name: torch.from_numpy(np.asarray(batch[name]).astype(np.int64))
  out = model.bert(input_ids=tensor("input_ids"), attention_mask=tensor("input_mask"),
                   token_type_ids=tensor("segment_ids"), return_dict=True)
  sequence = out.last_hidden_state                                      # [B, S, H]
  positions = tensor("masked_lm_positions")                             # [B, P]
  gathered = torch.gather(sequence, 1, positions[..., None].expand(-1, -1, sequence.shape[-1]))
  mlm_logits, nsp_logits = model.cls(gathered, out.pooler_output)       # [B, P, V], [B, 2]
  weights = torch.from_numpy(np.array(batch["masked_lm_weights"], np.float32))     # [B, P]
  nll = F.cross_entropy(mlm_logits.flatten(0, 1), tensor("masked_lm_ids").flatten(),
                        reduction="none")                               # [B * P]
  mlm = (nll * weights.flatten()).sum() / (weights.sum() + 1e-5)
  nsp = F.cross_entropy(nsp_logits, tensor("next_sentence_labels").reshape(-1))
  return mlm + nsp, mlm, nsp


def clip_by_global_norm(grads: list, clip: float):
  """(grads, |g|): optax.clip_by_global_norm as bert_jax's chain applies it, g / |g| * clip
  when |g| >= clip (torch's clip_grad_norm_ divides by |g| + 1e-6 instead); clip 0: none."""
  import torch
  norm = torch.sqrt(sum(torch.sum(g * g) for g in grads))
  if clip and norm >= clip:
    grads = [g / norm * clip for g in grads]
  return grads, norm


class OriginalAdamW:
  """BERT's AdamWeightDecayOptimizer after tf.clip_by_global_norm, as bert_jax's chain orders it.

  g *= clip / max(|g|, clip) over all gradients (`clip_by_global_norm`);
  m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (no bias correction);
  param -= lr * (m / (sqrt(v) + eps) + wd * param), wd only where bert_jax's `decay_mask` has it
  (not on biases, `cls.predictions.bias` included, nor LayerNorm).
  """

  def __init__(self, model, opt_config):
    if (opt_config.name != "adamw" or opt_config.bias_correction
        or opt_config.fully_decoupled_weight_decay):
      raise ValueError("the PyTorch side of BERT writes out the original AdamW (no bias "
                       "correction) only")
    self.opt = opt_config
    self.named = list(model.named_parameters())       # the tied decoder weight appears once
    self.decay = [not (name.endswith("bias") or "LayerNorm" in name) for name, _ in self.named]
    self.m = [p.detach().new_zeros(p.shape) for _, p in self.named]
    self.v = [p.detach().new_zeros(p.shape) for _, p in self.named]

  def step(self, lr: float) -> float:
    """Applies one update from the current .grad fields; returns the global gradient norm."""
    import torch
    o = self.opt
    with torch.no_grad():
      grads, norm = clip_by_global_norm([p.grad for _, p in self.named], o.clip_grad_norm)
      for (_, p), g, m, v, decay in zip(self.named, grads, self.m, self.v, self.decay):
        m.mul_(o.b1).add_(g, alpha=1 - o.b1)
        v.mul_(o.b2).add_(g * g, alpha=1 - o.b2)
        update = m / (torch.sqrt(v) + o.eps)
        if decay:
          update = update + o.weight_decay * p
        p.sub_(lr * update)
        p.grad = None
    return float(norm)


def load_modern_torch_model(directory: str, train: bool):
  """`ModernBertForMaskedLM.from_pretrained` (offline, eager attention, sparse_prediction), in
  train or eval mode (its token embedding's padding_idx as transformers sets it: `pad_inputs`)."""
  transformers = _quiet_transformers()
  model = transformers.ModernBertForMaskedLM.from_pretrained(
      directory, attn_implementation="eager", sparse_prediction=True)
  embedding = model.model.embeddings.tok_embeddings
  if model.decoder.weight is not embedding.weight:
    raise RuntimeError("the MLM decoder is not tied to the token embeddings")
  if embedding.padding_idx != model.config.pad_token_id:
    raise RuntimeError("transformers' token embedding has no padding_idx at [PAD]")
  return model.train(train)


def modern_torch_losses(model, batch: Batch):
  """(total, mlm): transformers' own masked-LM loss (the mean over the labelled positions) times
  n / (n + 1e-5), bert_jax's sum(w * nll) / (sum(w) + 1e-5)."""
  inputs = bench_util.torch_inputs(batch, token_types=False, labels=True)
  count = float((inputs["labels"] != -100).sum())
  mlm = model(**inputs).loss * (count / (count + 1e-5))
  return mlm, mlm


def pad_inputs(config, batches: Sequence[Batch]) -> int:
  """How many real (input_mask 1) positions of `batches` hold [PAD] (the model's pad_token_id;
  BERT's config records none: its vocabularies put [PAD] at 0). Only masking's random
  replacement puts it there; transformers' ModernBERT embedding (padding_idx) and bert_jax's give
  its row no lookup gradient, and a side without that fails the comparison
  (tests/test_modern_side_by_side.py)."""
  pad = getattr(pretraining.bert_config_from(config), "pad_token_id", 0)
  return int(sum(np.sum((b["input_ids"] == pad) & (b["input_mask"] == 1)) for b in batches))


class TorchAdamW:
  """torch.optim.AdamW (bias-corrected) after bert_jax's clipping (`clip_by_global_norm`), in the
  param groups of `decay_groups`; the learning rate of each step is set, the very float32 value
  bert_jax's step applied."""

  def __init__(self, model, opt_config, decay_names: Optional[Callable] = None):
    import torch
    if (opt_config.name != "adamw" or not opt_config.bias_correction
        or opt_config.fully_decoupled_weight_decay):
      raise ValueError("the PyTorch side of ModernBERT is torch.optim.AdamW: config.optimizer "
                       "name='adamw', bias_correction=True, fully_decoupled_weight_decay=False")
    self.opt = opt_config
    self.named, groups = decay_groups(model, opt_config.weight_decay, decay_names)
    self.optimizer = torch.optim.AdamW(groups, lr=0.0, betas=(opt_config.b1, opt_config.b2),
                                       eps=opt_config.eps)

  def step(self, lr: float) -> float:
    """Applies one update from the current .grad fields; returns the global gradient norm."""
    import torch
    with torch.no_grad():
      grads, norm = clip_by_global_norm([p.grad for _, p in self.named],
                                        self.opt.clip_grad_norm)
      for (_, p), g in zip(self.named, grads):
        p.grad = g
    for group in self.optimizer.param_groups:
      group["lr"] = lr
    self.optimizer.step()
    self.optimizer.zero_grad(set_to_none=True)
    return float(norm)


def decay_groups(model, weight_decay: float, decay_names: Optional[Callable] = None) -> list:
  """(named parameters, two param groups): weight decay by transformers' own rule (`Trainer.
  get_decay_parameter_names`: not on biases and norms, as bert_jax's `decay_mask`), or by
  `decay_names` (model -> names; the tests' changed recipes). The tied decoder weight appears
  once."""
  transformers = _quiet_transformers()
  if decay_names is None:   # an unbound method that reads nothing of its Trainer
    decay_names = functools.partial(transformers.Trainer.get_decay_parameter_names, None)
  decayed = set(decay_names(model))
  named = list(model.named_parameters())
  return named, [dict(params=[p for name, p in named if name in decayed],
                      weight_decay=weight_decay),
                 dict(params=[p for name, p in named if name not in decayed], weight_decay=0.0)]


class TorchStableAdamW:
  """`optimi.StableAdamW` (torch-optimi: ModernBERT's own optimizer) in the param groups of
  `decay_groups`, fully decoupled weight decay against the peak rate, the rate of each step set
  to bert_jax's schedule(t). `clipped` counts the (tensor, step) pairs whose update StableAdamW
  clipped (RMS_t > 1, recomputed from the gradient and optimi's second moment)."""

  def __init__(self, model, opt_config, peak_learning_rate: float,
               decay_names: Optional[Callable] = None):
    try:
      import optimi
    except ImportError as e:
      raise ImportError("--optimizer=stable_adamw compares with optimi.StableAdamW: "
                        "pip install torch-optimi (a test extra)") from e
    if (opt_config.name != "stable_adamw" or opt_config.clip_grad_norm
        or not opt_config.fully_decoupled_weight_decay):
      raise ValueError("the PyTorch side is optimi.StableAdamW with decouple_lr: config.optimizer"
                       " name='stable_adamw', clip_grad_norm=0, fully_decoupled_weight_decay=True")
    self.opt = opt_config
    self.named, groups = decay_groups(model, opt_config.weight_decay, decay_names)
    # foreach and triton off: the one-tensor-at-a-time update, every operation in float32.
    self.optimizer = optimi.StableAdamW(
        groups, lr=peak_learning_rate, betas=(opt_config.b1, opt_config.b2), eps=opt_config.eps,
        decouple_lr=True, max_lr=peak_learning_rate, kahan_sum=False, foreach=False,
        triton=False)
    self.clipped = 0          # RMS_t > 1
    self.clipped_5pct = 0     # RMS_t > 1.05: the rate cut by more than 5%
    self.updates = 0

  def step(self, lr: float) -> float:
    """Applies one update from the current .grad fields; returns the global gradient norm."""
    import torch
    grads = [p.grad.detach().clone() for _, p in self.named]
    norm = float(torch.sqrt(sum(torch.sum(g * g) for g in grads)))
    for group in self.optimizer.param_groups:
      group["lr"] = lr
    self.optimizer.step()
    self.optimizer.zero_grad(set_to_none=True)
    eps_sq = self.opt.eps ** 2
    with torch.no_grad():
      for (_, p), g in zip(self.named, grads):
        v = self.optimizer.state[p]["exp_avg_sq"]     # optimi keeps it bias-corrected
        rms = torch.sqrt(torch.mean(g * g / torch.clamp(v, min=eps_sq)))
        self.clipped += int(rms > 1.0)
        self.clipped_5pct += int(rms > 1.05)
    self.updates += len(self.named)
    return norm


def modern_torch_optimizer(model, config, decay_names: Optional[Callable] = None):
  """ModernBERT's PyTorch optimizer for `config.optimizer.name`: torch.optim.AdamW or
  optimi.StableAdamW (`--optimizer`)."""
  if config.optimizer.name == "stable_adamw":
    return TorchStableAdamW(model, config.optimizer, config.learning_rate, decay_names)
  return TorchAdamW(model, config.optimizer, decay_names)


class TorchSide(NamedTuple):
  """One family's PyTorch side: the transformers model, bert_jax's losses on it (in
  `losses_of` order), the optimizer (`step(lr)` -> gradient norm before clipping)."""
  load: Callable
  losses: Callable
  optimizer: Callable


TORCH_SIDES = {"bert": TorchSide(load_torch_model, torch_losses,
                                 lambda model, config: OriginalAdamW(model, config.optimizer)),
               "modernbert": TorchSide(load_modern_torch_model, modern_torch_losses,
                                       modern_torch_optimizer)}


def run_torch(config, directory: str, batches: Sequence[Batch], lrs: np.ndarray,
              threads: int = 1) -> Run:
  """transformers' model of the family (BertForPreTraining, ModernBertForMaskedLM) from
  `directory` in eval mode (no dropout), with bert_jax's loss and optimizer (`TORCH_SIDES`)."""
  import torch
  torch.set_num_threads(threads)
  side = TORCH_SIDES[family_of(config)]
  model = side.load(directory, train=False)
  optimizer = side.optimizer(model, config)
  losses = losses_of(config)
  history = {name: [] for name in losses + ("grad_norm",)}
  start = time.perf_counter()
  for batch, lr in zip(batches, lrs):
    values = side.losses(model, batch)
    values[0].backward()
    history["grad_norm"].append(optimizer.step(float(lr)))
    for name, value in zip(losses, values):
      history[name].append(float(value.detach()))
    _progress("torch", len(history["loss"]), history["loss"][-1], start)
  seconds = time.perf_counter() - start
  clipped = (dict(clipped=optimizer.clipped, clipped_5pct=optimizer.clipped_5pct,
                  updates=optimizer.updates)
             if hasattr(optimizer, "clipped") else None)
  return Run({name: np.array(v) for name, v in history.items()}, np.asarray(lrs), seconds, model,
             clipped)


# ----------------------------------------------------------------------------------- comparing


def loss_diffs(a: Run, b: Run) -> Dict[str, Dict[str, float]]:
  """Per curve: max |a - b| and max |a - b| / |b| over the steps, and the step of the latter."""
  result = {}
  for name in a.losses:
    diff = np.abs(a.losses[name] - b.losses[name])
    rel = diff / np.maximum(np.abs(b.losses[name]), 1e-12)
    result[name] = dict(max_abs=float(diff.max()), max_rel=float(rel.max()),
                        worst_step=int(rel.argmax()), final_abs=float(diff[-1]))
  return result


def param_diffs(ours: Dict[str, np.ndarray], torch_model,
                initial: Dict[str, np.ndarray]) -> Dict[str, object]:
  """Every parameter by Hugging Face name: bert_jax's (`ours`, as `export` wrote them) vs the
  PyTorch model's; `initial` (exported the same way) is where both started.

  Relative figures are per tensor: the largest difference over the tensor's largest magnitude
  (`max_rel`), and over the largest change training made to it (`max_rel_to_change`: how much
  of the training trajectory the two sides disagree on); both leave out ZERO_GRADIENT tensors.
  """
  theirs = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
  if set(ours) - set(theirs):
    raise KeyError(f"exported names transformers lacks: {sorted(set(ours) - set(theirs))}")
  rows = []
  for name in sorted(ours):
    a, b = ours[name], theirs[name]
    diff = float(np.max(np.abs(a - b)))
    change = float(np.max(np.abs(b - initial[name])))
    rows.append(dict(name=name, max_abs=diff, max_rel=diff / max(float(np.max(np.abs(b))), 1e-12),
                     max_rel_to_change=diff / max(change, 1e-12), change=change))
  learnt = [r for r in rows if not r["name"].endswith(ZERO_GRADIENT)]
  worst = lambda key, among: max(among, key=lambda r: r[key])
  return dict(tensors=len(rows), max_abs=worst("max_abs", rows)["max_abs"],
              max_abs_name=worst("max_abs", rows)["name"],
              max_rel=worst("max_rel", learnt)["max_rel"],
              max_rel_name=worst("max_rel", learnt)["name"],
              max_rel_to_change=worst("max_rel_to_change", learnt)["max_rel_to_change"],
              max_rel_to_change_name=worst("max_rel_to_change", learnt)["name"],
              zero_gradient_max_abs=max([r["max_abs"] for r in rows if r not in learnt],
                                        default=0.0),
              per_tensor=rows)


def parity(config, batches: Sequence[Batch], workdir: str, threads: int = 1) -> Dict[str, object]:
  """Dropout off, same weights and batches: both runs, the loss and parameter differences.

  Writes WORKDIR/hf_initial (the shared initial weights) and WORKDIR/hf_final_bert_jax.
  """
  if config.model.hidden_dropout_prob or config.model.attention_probs_dropout_prob:
    raise ValueError("parity needs dropout off (hidden and attention dropout 0)")
  # bert_jax's initial parameters: the pre-training job's `init_state` (a run's init key).
  params = jax.device_get(registry.job(config).init_state().params)
  init_dir = os.path.join(workdir, "hf_initial")
  initial = exported(config, params, init_dir)
  lrs = learning_rates(config, len(batches))
  ours = run_jax(config, params, batches)
  if not np.allclose(ours.learning_rates, lrs, rtol=1e-6, atol=0):
    raise AssertionError("bert_jax's step applied other rates than schedule(step)")
  theirs = run_torch(config, init_dir, batches, lrs, threads=threads)
  final = exported(config, ours.final, os.path.join(workdir, "hf_final_bert_jax"))
  return dict(steps=len(batches), pad_inputs=pad_inputs(config, batches),
              losses=loss_diffs(ours, theirs), params=param_diffs(final, theirs.final, initial),
              seconds=dict(bert_jax=ours.seconds, torch=theirs.seconds),
              stable_adamw_clipped=theirs.clipped,
              curves=dict(bert_jax={k: v.tolist() for k, v in ours.losses.items()},
                          torch={k: v.tolist() for k, v in theirs.losses.items()},
                          learning_rate=lrs.tolist()))


# ----------------------------------------------------------------------------------- output


def plot(result, path: str, ylabel: str) -> str:
  """Both sides' per-step loss and, below, bert_jax's minus transformers' (the two differ far
  less than the loss moves from batch to batch, so the curves look identical)."""
  curves = result["parity"]["curves"]
  ours, theirs = (np.asarray(curves[side]["loss"]) for side in ("bert_jax", "torch"))
  steps = np.arange(1, len(ours) + 1)
  fig, (top, bottom) = bench_util.pyplot().subplots(2, 1, figsize=(8, 7), sharex=True)
  top.plot(steps, ours, color="tab:blue", label="bert_jax", linewidth=0.8)
  top.plot(steps, theirs, color="tab:orange", label="transformers", linewidth=0.8)
  top.set(ylabel=ylabel, title="Dropout off: per-step loss")
  top.legend()
  bottom.plot(steps, ours - theirs, color="tab:blue", linewidth=0.6)
  bottom.set(ylabel="minus transformers", xlabel="step")
  return bench_util.save_figure(fig, path)


def setup_line(args, config) -> str:
  """The model, optimizer and schedule in one line (the whole config: the .json)."""
  m, o = config.model, config.optimizer
  return (f"{family_of(config)} {args.size} (L={m.num_hidden_layers}, H={m.hidden_size}, "
          f"A={m.num_attention_heads}, vocab {m.vocab_size}), {o.name} (betas {o.b1:g}/{o.b2:g}, "
          f"eps {o.eps:g}, weight decay {o.weight_decay:g}, clipping {o.clip_grad_norm:g}), "
          f"{config.schedule.name} schedule: warm-up {args.warmup} of {args.steps} steps")


def markdown(args, config, result) -> str:
  p = result["parity"]
  lines = [f"{setup_line(args, config)}, batch {args.batch} x seq {args.seq}, "
           f"{config.max_predictions_per_seq} predictions, lr {args.lr:g}, float32, "
           f"kernels={config.model.kernels}. {result['machine']}.", "",
           f"Dropout off, {p['steps']} steps (wall clock: bert_jax {p['seconds']['bert_jax']:.0f} "
           f"s, PyTorch {p['seconds']['torch']:.0f} s):", ""] + bench_util.markdown_table(
               ("per step", "max abs diff", "max rel diff (step)", "diff at last step"),
               ([name, f"{d['max_abs']:.2e}", f"{d['max_rel']:.2e} ({d['worst_step'] + 1})",
                 f"{d['final_abs']:.2e}"] for name, d in p["losses"].items()))
  q = p["params"]
  lines += ["", f"Final parameters ({q['tensors']} tensors): max abs diff {q['max_abs']:.2e} "
            f"(`{q['max_abs_name']}`), max per-tensor rel diff {q['max_rel']:.2e} "
            f"(`{q['max_rel_name']}`), max diff / training's change of the tensor "
            f"{q['max_rel_to_change']:.2e} (`{q['max_rel_to_change_name']}`)" +
            (f"; the attention key biases (zero gradient in exact arithmetic, moved by rounding "
             f"noise only) differ by at most {q['zero_gradient_max_abs']:.1e}."
             if family_of(config) == "bert" else
             f". [PAD] as an input at a real position (masking's random replacement): "
             f"{p['pad_inputs']} times (no lookup gradient into its row on either side).")]
  if p.get("stable_adamw_clipped"):
    c = p["stable_adamw_clipped"]
    lines.append(f"StableAdamW (optimi.StableAdamW on the PyTorch side) clipped {c['clipped']} of "
                 f"{c['updates']} tensor updates (RMS_t > 1), {c['clipped_5pct']} by more than 5% "
                 f"(RMS_t > 1.05).")
  lines.append(f"Asserted: per-step loss rel <= {args.loss_rtol:g}, parameters abs <= "
               f"{args.param_atol:g}: **{'pass' if result['pass'] else 'FAIL'}**.")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--family", default="bert", choices=FAMILIES,
                      help="bert: BertForPreTraining, experiments/pretrain_demo.py; modernbert: "
                           "ModernBertForMaskedLM, experiments/pretrain_modernbert.py")
  parser.add_argument("--size", default="mini",
                      help="BertConfig.named (bert) or MODERN_SHAPES (modernbert)")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--lr", type=float, default=5e-4)
  parser.add_argument("--warmup", type=int, default=30)
  parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
  parser.add_argument("--local_attention", type=int, default=32,
                      help="modernbert: the local layers' window, in tokens (total width)")
  parser.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                      help="modernbert: torch.optim.AdamW (clipped, bert schedule) or the "
                           "experiment's StableAdamW and warmup-stable-decay (optimi's)")
  parser.add_argument("--loss_rtol", type=float, default=1e-4)
  parser.add_argument("--param_atol", type=float, default=1e-4)
  # One: on the shared 2-core machine, two spinning OpenMP threads made BERT-mini steps 2-3x
  # slower than one (14-16 vs 5-7 s per step at a load average of 10).
  parser.add_argument("--threads", type=int, default=1, help="PyTorch threads")
  parser.add_argument("--out", required=True,
                      help="results, the exported weights and OUT/data (one family's: its rows "
                           "differ from the other's)")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  modern = dict(local_attention=args.local_attention, optimizer=args.optimizer)
  config = (demo_config if args.family == "bert" else modern_config)(
      args.size, args.steps, args.batch, args.seq, args.lr, args.warmup, seed=args.seed,
      **(modern if args.family == "modernbert" else {}))
  if config.data.prepare_demo_corpus:   # the demo corpus built into OUT/data once, then reused
    config.update_from_flattened_dict(pretraining_data.data_changes(config, args.out))
  batches = take_batches(config, args.steps)
  print(f"{len(batches)} batches of {args.batch} x {args.seq}; vocab {config.model.vocab_size}",
        flush=True)
  result = dict(args=vars(args), machine=bench_util.machine_line())
  result["parity"] = parity(config, batches, args.out, args.threads)
  p = result["parity"]
  result["pass"] = bool(max(p["losses"][n]["max_rel"] for n in losses_of(config)) <=
                        args.loss_rtol and p["params"]["max_abs"] <= args.param_atol)
  bench_util.write_report(args.out, "pretrain_side_by_side", result,
                          markdown(args, config, result))
  print("plot: " + plot(result, os.path.join(args.out, "parity_loss.png"),
                        "loss (MLM + NSP)" if "nsp_loss" in losses_of(config) else "loss (MLM)"))
  if not result["pass"]:
    sys.exit(1)


if __name__ == "__main__":
  main()
