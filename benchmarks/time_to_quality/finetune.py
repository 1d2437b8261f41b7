"""`--finetune`: every pre-trained side's checkpoint fine-tuned on GLUE with one recipe, a few
seeds each (a side not yet pre-trained is skipped and named)."""
import json
import os
import sys
import time
from typing import Dict, List
from benchmarks.time_to_quality import common, prepared



def parse_subsets(spec: str) -> Dict[str, int]:
  """'sst2=20000,cola=0' -> {'sst2': 20000, 'cola': 0} (0 or absent: the whole training set)."""
  out = {}
  for item in filter(None, (spec or "").split(",")):
    name, _, value = item.partition("=")
    out[name.strip()] = int(value)
  return out


def checkpoint_of(args, side: str) -> str:
  """The side's final checkpoint: bert_jax's pre-training workdir, or transformers'
  save_pretrained directory (BertForPreTraining or ModernBertForMaskedLM); fine-tuning reads
  either (`bert_jax.io.checkpoints.load_pretrained`: the architecture is the checkpoint's)."""
  if common.FRAMEWORK[side] == "jax":
    return os.path.join(args.out, side, "workdir")
  return os.path.join(args.out, side, "final")


def pretrained_sides(args) -> List[str]:
  """The sides to fine-tune: `--ft_sides`, or every side whose pre-training has finished."""
  finished = [s for s in common.SIDES
              if os.path.exists(os.path.join(args.out, s, "summary.json"))]
  if not args.ft_sides:
    missing = [s for s in common.SIDES if s not in finished]
    if missing:
      print(f"not pre-trained yet (skipped): {', '.join(missing)}", flush=True)
    return finished
  wanted = [s.strip() for s in args.ft_sides.split(",") if s.strip()]
  unknown = [s for s in wanted if s not in common.SIDES]
  if unknown:
    raise ValueError(f"--ft_sides: {unknown} are not sides ({', '.join(common.SIDES)})")
  for side in wanted:
    if side not in finished:
      raise FileNotFoundError(f"{os.path.join(args.out, side, 'summary.json')} not found: run "
                              f"--side={side} first")
  return wanted


def glue_config(args, side: str, task: str, train_examples: int):
  """One recipe for every checkpoint: bert_jax's GLUE fine-tuning."""
  from experiments import glue as glue_experiment
  c = glue_experiment.get_config(f"task={task},seeds={args.seeds}")
  c.init_checkpoint = checkpoint_of(args, side)
  c.tokenizer.vocab_file = prepared.data_paths(args.out)["vocab.txt"]
  c.tokenizer.do_lower_case = True
  c.data.glue_dir = args.glue_dir
  c.max_seq_length, c.length_bucket = args.ft_max_seq, args.ft_length_bucket
  c.global_batch_size, c.eval_batch_size = args.ft_batch, 64
  c.learning_rate, c.num_train_epochs = args.ft_lr, float(args.ft_epochs)
  c.data.max_train_examples, c.data.max_eval_examples = train_examples, 0
  c.do_predict = False
  c.log_every_steps = 100
  c.seed = args.seed
  return c


def seed_devs(result: dict) -> List[Dict[str, float]]:
  """The dev metrics of each seed of a `glue.run` result (one run when seeds=1)."""
  if "seeds" not in result:
    return [result["dev"]]
  return [r["dev"] for _, r in sorted(result["seeds"].items(), key=lambda kv: int(kv[0]))]


def finetune(args) -> dict:
  """Every task for every pre-trained side (`pretrained_sides`); a finished task (its ttq.json)
  is not run again."""
  from bert_jax.tasks.datasets import glue
  subsets = parse_subsets(args.ft_train_examples)
  results = {}
  sides = pretrained_sides(args)
  if not sides:
    print("no side has finished pre-training: nothing to fine-tune", flush=True)
  # Task by task, every side each: a stage cut short still leaves whole rows of the table.
  for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
    for side in sides:
      workdir = os.path.join(args.out, "finetune", side, task)
      done = os.path.join(workdir, "ttq.json")
      if os.path.exists(done):
        with open(done) as f:
          results.setdefault(side, {})[task] = json.load(f)
        continue
      start = time.time()
      result = glue.run(glue_config(args, side, task, subsets.get(task, 0)), workdir)
      if result.get("preempted"):
        sys.exit(f"[{side} {task}] preempted: run the same command again to resume")
      spec = glue.spec_for(task)
      devs = seed_devs(result)
      entry = dict(scores=[glue.task_score(dev, spec) for dev in devs],
                   metrics=list(spec.metrics),
                   dev={m: [dev[m] for dev in devs] for m in spec.metrics},
                   train_examples=subsets.get(task, 0), seconds=time.time() - start)
      common.write_json(done, entry)
      results.setdefault(side, {})[task] = entry
      print(f"[{side} {task}] scores {entry['scores']} ({entry['seconds']:.0f} s)", flush=True)
  return results


def collect_finetune(args) -> Dict[str, Dict[str, dict]]:
  results: Dict[str, Dict[str, dict]] = {}
  for side in common.SIDES:
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
      path = os.path.join(args.out, "finetune", side, task, "ttq.json")
      if os.path.exists(path):
        with open(path) as f:
          results.setdefault(side, {})[task] = json.load(f)
  return results
