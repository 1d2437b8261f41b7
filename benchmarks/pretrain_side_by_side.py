r"""Pre-training step for step: bert_jax vs `transformers` `BertForPreTraining`, same everything.

  python -m benchmarks.pretrain_side_by_side --size=mini --steps=300 --batch=32 --seq=128 \
    --dropout_seeds=3 --out=/tmp/pretrain_side_by_side

Why: a loss curve that merely "looks like" the reference's can hide a wrong loss weighting,
schedule, clipping or optimizer detail for a long time. Here both sides start from the same
weights and see the same batches, so with dropout off every step must agree to float32
rounding, and any difference in the recipe shows up within a few steps.

What both sides share:
  data       the first N training batches of bert_jax's own tf.data pipeline (dynamic masking)
             on the demo corpus (Python's documentation, experiments/pretrain_demo.py; built
             once into OUT/data), materialised as numpy and fed to both sides in the same order
  weights    bert_jax's initialisation (`create_train_state`, the init key `train_and_evaluate`
             uses), copied across with `checkpoints.export_huggingface` and loaded with
             `BertForPreTraining.from_pretrained` (eager attention; the decoder is tied to the
             word embeddings on both sides)
  loss       MLM = sum(w * nll) / (sum(w) + 1e-5) over masked_lm_positions, NSP = mean CE,
             total = MLM + NSP (bert_jax.tasks.jobs.pretraining); the PyTorch side writes it out
             (transformers' own `labels=` loss takes [B, S] labels, computes the vocabulary
             logits at every position and divides by the count without the 1e-5)
  optimizer  the original BERT AdamWeightDecayOptimizer: clip by global norm 1.0 first, then
             m, v without bias correction, update = m / (sqrt(v) + 1e-6) + 0.01 * param (not on
             biases and LayerNorm), param -= lr * update; written out on the PyTorch side
             because torch.optim.AdamW corrects the bias and clip_grad_norm_ adds 1e-6 to the
             norm. The learning rate of step t (0-based) is bert_jax's schedule(t): linear
             warm-up from 0, then the original linear decay.

bert_jax runs its real jitted `pretraining.train_step` with the optimizer of
`optim.create_optimizer`. Per-step losses (total, MLM, NSP) are compared, and at the end every
parameter (bert_jax's exported again with `export_huggingface`, by Hugging Face name).

`--dropout_seeds=K` (0 skips it): dropout 0.1 on both sides, K dropout seeds per side on the same
initial weights and batches; only the dropout streams differ (bert_jax: the dropout key
`train_and_evaluate` derives from config.seed=s, PyTorch: `torch.manual_seed(s)`). The two
sides' loss curves should then differ by no more than seeds differ from each other.
Results go to OUT/pretrain_side_by_side.md (tables to paste into benchmarks/RESULTS.md), .json,
and plots of the loss curves (PNG with matplotlib, else a plain SVG). A CI-sized version (tiny
model, 8 steps) is tests/test_pretrain_side_by_side.py.
"""
import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

if __name__ == "__main__":
  # As bert_jax.main does, before JAX, TensorFlow or PyTorch start threads (faster CPU steps);
  # not on import (the test), where other threads run already and it would only warn.
  from bert_jax.runtime import host_memory
  host_memory.keep_freed_memory()

import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402

LOSSES = ("loss", "mlm_loss", "nsp_loss")
CURVES = LOSSES + ("grad_norm",)     # compared step by step; grad_norm: before clipping
# Tensors whose gradient is zero in exact arithmetic: a key bias adds q . b_k to every logit of a
# query alike, which the softmax cancels. Both sides move them only by rounding noise (which Adam
# scales up to ~lr * noise / eps per step), so relative differences of them mean nothing; they
# count in the absolute difference only.
ZERO_GRADIENT = ("attention.self.key.bias",)
Batch = Dict[str, np.ndarray]


# ----------------------------------------------------------------------------------- setup


def demo_config(size: str = "mini", steps: int = 300, batch: int = 32, seq: int = 128,
                lr: float = 5e-4, warmup: int = 30, dropout: float = 0.0, seed: int = 0,
                kernels: str = "auto"):
  """The demo experiment (its corpus, vocabulary, predictions per sequence, optimizer), at
  `size` and with the schedule over exactly `steps` steps, so the last step's rate is near 0."""
  from bert_jax.model.config import BertConfig
  from experiments import pretrain_demo
  c = pretrain_demo.get_config()
  shape = BertConfig.named(size)
  c.model.update(num_hidden_layers=shape.num_hidden_layers, hidden_size=shape.hidden_size,
                 num_attention_heads=shape.num_attention_heads,
                 intermediate_size=shape.intermediate_size,
                 max_position_embeddings=max(seq, c.model.max_position_embeddings),
                 dtype="float32", kernels=kernels)
  c.max_seq_length, c.global_batch_size, c.seed = seq, batch, seed
  c.num_train_steps, c.warmup_steps, c.learning_rate = steps, warmup, lr
  set_dropout(c, dropout)
  return c


def set_dropout(config, rate: float) -> None:
  config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = rate


def prepare_data(config, workdir: str) -> None:
  """Builds the demo corpus into WORKDIR/data once (later runs reuse it) and points config at it."""
  if config.data.prepare_demo_corpus:
    from data_pipelines import demo_corpus
    os.makedirs(workdir, exist_ok=True)
    config.update_from_flattened_dict(demo_corpus.prepare(config, workdir))


def take_batches(config, count: int) -> List[Batch]:
  """The first `count` training batches of bert_jax's pipeline, as numpy (what both sides see)."""
  from bert_jax.tasks.jobs import pretraining
  dataset = pretraining.input_pipeline_for(config, training=True, process_index=0,
                                           process_count=1)
  batches = [dict(b) for b in dataset.take(count).as_numpy_iterator()]
  if len(batches) != count:
    raise ValueError(f"the pipeline gave {len(batches)} batches, {count} asked for")
  return batches


def initial_params(config):
  """bert_jax's initial parameters: `create_train_state` with train_and_evaluate's init key."""
  import jax
  from bert_jax.runtime import optim
  from bert_jax.tasks.jobs import pretraining
  init_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  tx, _ = optim.create_optimizer(config, config.num_train_steps)
  state = pretraining.create_train_state(config, pretraining.build_model(config), tx, init_rng)
  return jax.device_get(state.params)


def jax_dropout_rng(seed: int):
  """The dropout key `train_and_evaluate` uses with config.seed=seed."""
  import jax
  return jax.random.split(jax.random.PRNGKey(seed))[1]


def export(config, params, directory: str) -> str:
  """`params` as a Hugging Face BertForPreTraining directory (config.json + safetensors)."""
  from bert_jax.io import checkpoints
  from bert_jax.tasks.jobs import pretraining
  checkpoints.export_huggingface(pretraining.bert_config_from(config), params, directory)
  return directory


def exported(config, params, directory: str) -> Dict[str, np.ndarray]:
  """`export`, then the tensors it wrote by Hugging Face name (what is compared)."""
  from bert_jax.io import checkpoints
  export(config, params, directory)
  return checkpoints.load_safetensors(os.path.join(directory, "model.safetensors"))


def learning_rates(config, steps: int) -> np.ndarray:
  """schedule(t) for t = 0..steps-1, float32: the rate bert_jax's step t applies.

  Jitted as in the train step: XLA's arithmetic can differ from eager's by an ulp (it did at
  1e-3 * 9 / 10), and the PyTorch side should apply the very same float32 values.
  """
  import jax
  from bert_jax.runtime import optim
  _, schedule = optim.create_optimizer(config, config.num_train_steps)
  schedule = jax.jit(schedule)
  return np.array([schedule(t) for t in range(steps)], np.float32)


@dataclasses.dataclass
class Run:
  """One side's training run: per-step losses and learning rates, and the final parameters."""
  losses: Dict[str, np.ndarray]      # CURVES name -> [steps]
  learning_rates: np.ndarray         # [steps]
  seconds: float                     # wall clock of the steps (compilation included for jax)
  final: object = None               # jax params tree, or the torch model


def _progress(side: str, step: int, loss: float, start: float, every: int = 50) -> None:
  if step % every == 0:
    print(f"    {side} step {step}: loss {loss:.4f} ({time.perf_counter() - start:.0f} s)",
          flush=True)


# ----------------------------------------------------------------------------------- bert_jax


def run_jax(config, params, batches: Sequence[Batch], dropout_seed: int = 0) -> Run:
  """bert_jax's real jitted train step and optimizer over `batches`, from `params`."""
  import jax
  from bert_jax.runtime import optim
  from bert_jax.runtime.state import TrainState
  from bert_jax.tasks.jobs import pretraining
  model = pretraining.build_model(config)
  tx, schedule = optim.create_optimizer(config, config.num_train_steps)
  step = jax.jit(functools.partial(
      pretraining.train_step, model=model, tx=tx, objective=config.objective, schedule=schedule,
      grad_accum_steps=1))
  state = TrainState.create(jax.tree_util.tree_map(jax.numpy.asarray, params), tx)
  rng = jax_dropout_rng(dropout_seed)
  history = {name: [] for name in CURVES + ("learning_rate", "skipped")}
  start = time.perf_counter()
  for batch in batches:
    state, metrics = step(state, batch, rng)
    metrics = jax.device_get(metrics)
    for name in history:
      history[name].append(float(metrics[name]))
    _progress("bert_jax", len(history["loss"]), history["loss"][-1], start)
  seconds = time.perf_counter() - start
  if any(history["skipped"]):
    raise RuntimeError(f"bert_jax skipped non-finite steps: {np.nonzero(history['skipped'])[0]}")
  return Run({name: np.array(history[name]) for name in CURVES},
             np.array(history["learning_rate"], np.float32), seconds,
             jax.device_get(state.params))


# ----------------------------------------------------------------------------------- PyTorch


def load_torch_model(directory: str, train: bool):
  """`BertForPreTraining.from_pretrained` (offline, eager attention), in train or eval mode."""
  import transformers
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
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


class OriginalAdamW:
  """BERT's AdamWeightDecayOptimizer after tf.clip_by_global_norm, as bert_jax's chain orders it.

  g *= clip / max(|g|, clip) over all gradients (torch's clip_grad_norm_ divides by |g| + 1e-6
  instead); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (no bias correction);
  param -= lr * (m / (sqrt(v) + eps) + wd * param), wd only where bert_jax's `decay_mask` has it
  (not on biases, `cls.predictions.bias` included, nor LayerNorm).
  """

  def __init__(self, model, opt_config):
    self.opt = opt_config
    self.named = list(model.named_parameters())       # the tied decoder weight appears once
    self.decay = [not (name.endswith("bias") or "LayerNorm" in name) for name, _ in self.named]
    self.m = [p.detach().new_zeros(p.shape) for _, p in self.named]
    self.v = [p.detach().new_zeros(p.shape) for _, p in self.named]

  def step(self, lr: float) -> float:
    """Applies one update from the current .grad fields; returns the global gradient norm."""
    import torch
    o = self.opt
    grads = [p.grad for _, p in self.named]
    with torch.no_grad():
      norm = torch.sqrt(sum(torch.sum(g * g) for g in grads))
      clip = o.clip_grad_norm
      for (_, p), g, m, v, decay in zip(self.named, grads, self.m, self.v, self.decay):
        if clip and norm >= clip:
          g = g / norm * clip
        m.mul_(o.b1).add_(g, alpha=1 - o.b1)
        v.mul_(o.b2).add_(g * g, alpha=1 - o.b2)
        update = m / (torch.sqrt(v) + o.eps)
        if decay:
          update = update + o.weight_decay * p
        p.sub_(lr * update)
        p.grad = None
    return float(norm)


def run_torch(config, directory: str, batches: Sequence[Batch], lrs: np.ndarray,
              dropout_seed: Optional[int] = None, threads: int = 1) -> Run:
  """transformers' BertForPreTraining from `directory`, bert_jax's loss and optimizer by hand.

  dropout_seed None: eval mode (no dropout). Otherwise train mode with torch.manual_seed(seed).
  """
  import torch
  if config.optimizer.name != "adamw" or config.optimizer.bias_correction:
    raise ValueError("the PyTorch side writes out the original AdamW (no bias correction) only")
  torch.set_num_threads(threads)
  if dropout_seed is not None:
    torch.manual_seed(dropout_seed)
  model = load_torch_model(directory, train=dropout_seed is not None)
  optimizer = OriginalAdamW(model, config.optimizer)
  history = {name: [] for name in CURVES}
  start = time.perf_counter()
  for batch, lr in zip(batches, lrs):
    values = torch_losses(model, batch)
    values[0].backward()
    history["grad_norm"].append(optimizer.step(float(lr)))
    for name, value in zip(LOSSES, values):
      history[name].append(float(value.detach()))
    _progress("torch", len(history["loss"]), history["loss"][-1], start)
  seconds = time.perf_counter() - start
  return Run({name: np.array(v) for name, v in history.items()}, np.asarray(lrs), seconds, model)


# ----------------------------------------------------------------------------------- comparing


def loss_diffs(a: Run, b: Run) -> Dict[str, Dict[str, float]]:
  """Per curve: max |a - b| and max |a - b| / |b| over the steps, and the step of the latter."""
  result = {}
  for name in CURVES:
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
  params = initial_params(config)
  init_dir = os.path.join(workdir, "hf_initial")
  initial = exported(config, params, init_dir)
  lrs = learning_rates(config, len(batches))
  ours = run_jax(config, params, batches)
  if not np.allclose(ours.learning_rates, lrs, rtol=1e-6, atol=0):
    raise AssertionError("bert_jax's step applied other rates than schedule(step)")
  theirs = run_torch(config, init_dir, batches, lrs, dropout_seed=None, threads=threads)
  result = dict(steps=len(batches), losses=loss_diffs(ours, theirs),
                params=param_diffs(exported(config, ours.final,
                                            os.path.join(workdir, "hf_final_bert_jax")),
                                   theirs.final, initial),
                seconds=dict(bert_jax=ours.seconds, torch=theirs.seconds),
                curves=dict(bert_jax={k: v.tolist() for k, v in ours.losses.items()},
                            torch={k: v.tolist() for k, v in theirs.losses.items()},
                            learning_rate=lrs.tolist()))
  return result


def seed_stats(curves: Dict[str, List[np.ndarray]], windows: Sequence[int],
               width: int) -> Dict[str, object]:
  """Per side: loss averaged over the `width` steps ending at each window end, across seeds.

  `within_2se`: |mean_jax - mean_torch| <= 2 * sqrt(sd_jax^2 / n_jax + sd_torch^2 / n_torch)
  (sample standard deviations over seeds); `ranges_overlap`: the sides' [min, max] over seeds
  intersect. `per_step_within_2se`: the fraction of single steps where the two sides' seed means
  are within 2 standard errors (0.95 if the sides draw from one normal distribution and the
  standard deviations were known; with 3 seeds per side they are estimated, and the criterion
  covers less, ~0.88). `per_step_seed_std`: per side, a single step's standard deviation over
  seeds, averaged over the steps: the size of the dropout noise itself (0 if a side ignored
  dropout, larger with a larger rate).
  """
  stacked = {side: np.stack(runs) for side, runs in curves.items()}          # [seeds, steps]
  rows = []
  for end in windows:
    start = max(0, end - width)
    row = dict(steps=f"{start + 1}-{end}", start=start, end=end)
    for side, runs in stacked.items():
      values = runs[:, start:end].mean(axis=1)                               # [seeds]
      row[side] = dict(bench_util.seed_spread(values), values=values.tolist())
    a, b = row["bert_jax"], row["torch"]
    se = np.sqrt(a["std"] ** 2 / len(a["values"]) + b["std"] ** 2 / len(b["values"]))
    row.update(diff=a["mean"] - b["mean"], two_se=float(2 * se),
               within_2se=bool(abs(a["mean"] - b["mean"]) <= 2 * se),
               ranges_overlap=bool(a["min"] <= b["max"] and b["min"] <= a["max"]))
    rows.append(row)
  a, b = stacked["bert_jax"], stacked["torch"]
  per_step_se = np.sqrt(a.var(axis=0, ddof=1) / len(a) + b.var(axis=0, ddof=1) / len(b))
  within = np.abs(a.mean(axis=0) - b.mean(axis=0)) <= 2 * per_step_se
  return dict(windows=rows, per_step_within_2se=float(within.mean()),
              per_step_seed_std={side: float(runs.std(axis=0, ddof=1).mean())
                                 for side, runs in stacked.items()})


def dropout_study(config, batches: Sequence[Batch], workdir: str, seeds: int,
                  threads: int = 1, width: int = 50) -> Dict[str, object]:
  """Dropout 0.1 on both sides, `seeds` dropout seeds each; same initial weights and batches."""
  config = config.copy_and_resolve_references()
  set_dropout(config, 0.1)
  params = initial_params(config)
  directory = export(config, params, os.path.join(workdir, "hf_initial_dropout"))
  lrs = learning_rates(config, len(batches))
  curves = {"bert_jax": [], "torch": []}
  seconds = {"bert_jax": [], "torch": []}
  for seed in range(seeds):
    for side in curves:
      if side == "bert_jax":
        run = run_jax(config, params, batches, dropout_seed=seed)
      else:
        run = run_torch(config, directory, batches, lrs, dropout_seed=seed, threads=threads)
      curves[side].append(run.losses["loss"])
      seconds[side].append(run.seconds)
      print(f"  dropout seed {seed} {side}: last-{width} mean loss "
            f"{run.losses['loss'][-width:].mean():.4f} ({run.seconds:.0f} s)", flush=True)
  steps = len(batches)
  ends = sorted({max(1, steps // 3), max(1, 2 * steps // 3), steps})
  stats = seed_stats(curves, ends, min(width, steps))
  return dict(seeds=seeds, window=min(width, steps), seconds=seconds, **stats,
              curves={side: [c.tolist() for c in runs] for side, runs in curves.items()})


# ----------------------------------------------------------------------------------- output


def plot(series: Sequence[tuple], path: str, title: str,
         reference: Optional[Sequence[float]] = None, reference_label: str = "") -> str:
  """Loss curves [(label, color, values)] to PNG with matplotlib, else to a dependency-free SVG.

  With `reference` (one value per step) a second panel shows each curve minus it: the curves
  themselves differ far less than the loss moves from batch to batch, so they look identical.
  """
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return _svg_plot(series, os.path.splitext(path)[0] + ".svg", title)
  panels = 1 if reference is None else 2
  fig, axes = plt.subplots(panels, 1, figsize=(8, 3.5 * panels), sharex=True, squeeze=False)
  for label, color, values in series:
    steps = np.arange(1, len(values) + 1)
    axes[0, 0].plot(steps, values, color=color, label=label, linewidth=0.8)
    if reference is not None:
      axes[1, 0].plot(steps, np.asarray(values) - np.asarray(reference), color=color,
                      linewidth=0.6)
  axes[0, 0].set(ylabel="loss (MLM + NSP)", title=title)
  if reference is not None:
    axes[1, 0].set(ylabel=f"minus {reference_label}")
  axes[-1, 0].set(xlabel="step")
  handles, labels = axes[0, 0].get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  axes[0, 0].legend(unique.values(), unique.keys())
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _svg_plot(series: Sequence[tuple], path: str, title: str) -> str:
  width, height, pad = 800, 450, 50
  values = np.concatenate([np.asarray(v) for _, _, v in series])
  low, high = float(values.min()), float(values.max())
  steps = max(len(v) for _, _, v in series)
  x = lambda i: pad + (width - 2 * pad) * i / max(steps - 1, 1)
  y = lambda v: height - pad - (height - 2 * pad) * (v - low) / max(high - low, 1e-12)
  parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="25" text-anchor="middle">{title}</text>',
           f'<text x="{pad}" y="{height - 15}">step 1</text>',
           f'<text x="{width - pad}" y="{height - 15}" text-anchor="end">step {steps}</text>',
           f'<text x="5" y="{pad}">{high:.2f}</text>',
           f'<text x="5" y="{height - pad}">{low:.2f}</text>']
  labels = {}
  for label, color, values in series:
    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1" points="{points}"/>')
    labels.setdefault(label, color)
  for i, (label, color) in enumerate(labels.items()):
    parts.append(f'<text x="{width - pad}" y="{pad + 18 * i}" text-anchor="end" '
                 f'fill="{color}">{label}</text>')
  with open(path, "w") as f:
    f.write("\n".join(parts + ["</svg>"]) + "\n")
  return path


def markdown(args, config, result) -> str:
  p = result["parity"]
  lines = [f"BERT-{args.size} (L={config.model.num_hidden_layers}, H={config.model.hidden_size}, "
           f"A={config.model.num_attention_heads}, vocab {config.model.vocab_size}), batch "
           f"{args.batch} x seq {args.seq}, {config.max_predictions_per_seq} predictions, "
           f"lr {args.lr:g} (warm-up {args.warmup}, linear decay to 0 at step {args.steps}), "
           f"float32, kernels={config.model.kernels}. {result['machine']}.", "",
           f"Dropout off, {p['steps']} steps (wall clock: bert_jax {p['seconds']['bert_jax']:.0f} "
           f"s, PyTorch {p['seconds']['torch']:.0f} s):", "",
           "| per step | max abs diff | max rel diff (step) | diff at last step |",
           "|---|---|---|---|"]
  for name in CURVES:
    d = p["losses"][name]
    lines.append(f"| {name} | {d['max_abs']:.2e} | {d['max_rel']:.2e} ({d['worst_step'] + 1}) | "
                 f"{d['final_abs']:.2e} |")
  q = p["params"]
  lines += ["", f"Final parameters ({q['tensors']} tensors): max abs diff {q['max_abs']:.2e} "
            f"(`{q['max_abs_name']}`), max per-tensor rel diff {q['max_rel']:.2e} "
            f"(`{q['max_rel_name']}`), max diff / training's change of the tensor "
            f"{q['max_rel_to_change']:.2e} (`{q['max_rel_to_change_name']}`); the attention key "
            f"biases (zero gradient in exact arithmetic, moved by rounding noise only) differ by "
            f"at most {q['zero_gradient_max_abs']:.1e}."]
  lines.append(f"Asserted: per-step loss rel <= {args.loss_rtol:g}, parameters abs <= "
               f"{args.param_atol:g}: **{'pass' if result['pass'] else 'FAIL'}**.")
  d = result.get("dropout")
  if d:
    off = np.asarray(p["curves"]["bert_jax"]["loss"])
    lines += ["", f"Dropout 0.1, {d['seeds']} dropout seeds per side (same initial weights and "
              f"batches), loss averaged over a window of {d['window']} steps, mean +- std over "
              "seeds (dropout off: the run above):", "",
              "| steps | bert_jax | PyTorch | diff | 2 SE | within 2 SE | seed ranges overlap "
              "| dropout off |", "|---|---|---|---|---|---|---|---|"]
    for row in d["windows"]:
      a, b = row["bert_jax"], row["torch"]
      lines.append(f"| {row['steps']} | {a['mean']:.4f} +- {a['std']:.4f} | {b['mean']:.4f} +- "
                   f"{b['std']:.4f} | {row['diff']:+.4f} | {row['two_se']:.4f} | "
                   f"{'yes' if row['within_2se'] else 'no'} | "
                   f"{'yes' if row['ranges_overlap'] else 'no'} | "
                   f"{off[row['start']:row['end']].mean():.4f} |")
    std = d["per_step_seed_std"]
    lines += ["", f"Single steps where the two sides' seed means are within 2 SE: "
              f"{100 * d['per_step_within_2se']:.1f}%. A single step's loss varies from seed to "
              f"seed by {std['bert_jax']:.4f} (bert_jax) and {std['torch']:.4f} (PyTorch), "
              "standard deviation averaged over the steps."]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", default="mini")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--lr", type=float, default=5e-4)
  parser.add_argument("--warmup", type=int, default=30)
  parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
  parser.add_argument("--kernels", default="auto", help="config.model.kernels of bert_jax")
  parser.add_argument("--dropout_seeds", type=int, default=3, help="0: parity run only")
  parser.add_argument("--window", type=int, default=50, help="steps averaged (dropout study)")
  parser.add_argument("--loss_rtol", type=float, default=1e-4)
  parser.add_argument("--param_atol", type=float, default=1e-4)
  # One: on the shared 2-core machine, two spinning OpenMP threads made BERT-mini steps 2-3x
  # slower than one (14-16 vs 5-7 s per step at a load average of 10).
  parser.add_argument("--threads", type=int, default=1, help="PyTorch threads")
  parser.add_argument("--out", default="/tmp/pretrain_side_by_side")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  config = demo_config(args.size, args.steps, args.batch, args.seq, args.lr, args.warmup,
                       seed=args.seed, kernels=args.kernels)
  prepare_data(config, args.out)
  batches = take_batches(config, args.steps)
  print(f"{len(batches)} batches of {args.batch} x {args.seq}; vocab {config.model.vocab_size}",
        flush=True)
  result = dict(args=vars(args), machine=bench_util.machine_line())
  result["parity"] = parity(config, batches, args.out, args.threads)
  p = result["parity"]
  result["pass"] = bool(max(p["losses"][n]["max_rel"] for n in LOSSES) <= args.loss_rtol and
                        p["params"]["max_abs"] <= args.param_atol)
  write_results(args, config, result)        # the parity results survive a failed dropout study
  if args.dropout_seeds:
    result["dropout"] = dropout_study(config, batches, args.out, args.dropout_seeds,
                                      args.threads, args.window)
  print(write_results(args, config, result))
  print("plots: " + ", ".join(write_plots(result, args.out)))
  if not result["pass"]:
    sys.exit(1)


def write_plots(result, out: str) -> List[str]:
  """OUT/parity_loss and, after a dropout study, OUT/dropout_loss (.png, or .svg)."""
  curves = result["parity"]["curves"]
  paths = [plot([("bert_jax", "tab:blue", curves["bert_jax"]["loss"]),
                 ("transformers", "tab:orange", curves["torch"]["loss"])],
                os.path.join(out, "parity_loss.png"), "Dropout off: per-step loss",
                reference=curves["torch"]["loss"], reference_label="transformers")]
  if "dropout" in result:
    runs = result["dropout"]["curves"]
    paths.append(plot([("bert_jax", "tab:blue", c) for c in runs["bert_jax"]] +
                      [("transformers", "tab:orange", c) for c in runs["torch"]],
                      os.path.join(out, "dropout_loss.png"),
                      f"Dropout 0.1: per-step loss, {len(runs['torch'])} seeds per side",
                      reference=np.mean(runs["bert_jax"] + runs["torch"], axis=0),
                      reference_label="mean of all runs"))
  return paths


def write_results(args, config, result) -> str:
  """OUT/pretrain_side_by_side.md and .json; returns the markdown."""
  table = markdown(args, config, result)
  with open(os.path.join(args.out, "pretrain_side_by_side.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(args.out, "pretrain_side_by_side.json"), "w") as f:
    json.dump(result, f, indent=1)
  return table


if __name__ == "__main__":
  main()
