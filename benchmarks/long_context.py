r"""Long context, shown: does the extension phase make a model read evidence from past the length
it was pre-trained at? The far-evidence probe on time-to-quality's modern model (the ModernBERT
family at BERT-mini's size, an hour at 128 tokens with documents kept apart) before the extension
phase and after it, extended with documents kept apart (the recipe) or crossing.

  python -m benchmarks.time_to_quality --prepare --out=/tmp/ttq                  # its docstring
  python -m benchmarks.time_to_quality --side=bert_jax_modern --out=/tmp/ttq
  python -m benchmarks.long_context --ttq_out=/tmp/ttq --out=/tmp/long_context \
      --plot=benchmarks/long_context.png                                          # ~40 min

The models (`MODELS`):
  pretrain          time-to-quality's `bert_jax_modern` checkpoint (OUT/bert_jax_modern/workdir),
                    trained on rows of 128 tokens (its `seq`), both rotary bases 10,000
  extend_apart      pretrain, then `--extend_steps` at `--extend_length` tokens on documents as
                    sequences (each document its own sequence, attention and positions inside it:
                    the recipe's rows), as experiments/pretrain_modernbert.py's extend phase
                    does it: the global rotary base raised to 160,000, the rate ModernBERT's
                    extension rate in proportion (3e-4 / 8e-4 of the pretrain side's peak),
                    constant, no warm-up, the Adam moments carried (`init_optimizer_state`);
                    the pretrain side's tokens per step (rows = its batch x 128 / length)
  extend_crossing   the same on contiguous rows (RoBERTa's FULL-SENTENCES): documents joined by
                    [SEP], attention and positions running across them
Each extension is `registry.run_job` on its config (what `python -m bert_jax.main` runs), in a
normal workdir: a rerun resumes it, or skips it once OUT/<model>/summary.json exists. Its records
come from time-to-quality's training documents (OUT/data/train.txt), `--dupe_factor` passes.

The far-evidence probe (`probe_rows`), on held-out documents (time-to-quality's eval.txt): every
window of a document's tokens that fills a row of L tokens (in steps of D), split into its first
L - 2 - 2D tokens (far) and its last 2D (local). A target is a token of the window's last D
whose id is none of the `--frequent` most frequent ids of the training text (nor special), that
occurs once in the local part (its own position) and at least once in the far part: its only
evidence in the row sits more than D tokens away. Every target of a window is masked ([MASK]),
at most `--max_targets` a row. `full` is the window as it is; `control` replaces its far part by
the far part of another held-out document in which no target's id occurs: the same masked
tokens, the same local context, the same row length, the evidence gone. Per target: whether the
model's top prediction is the token, and its log-probability. `full - control` (accuracy, and
log-probability in nats) is what the model reads from more than D tokens away; each with a
paired standard error over the targets. Two probes (`probes`): `past` (L = the extension length,
D = the pre-training length: evidence past anything the pretrain model saw), and `within` (L =
the pre-training length, D = a quarter of it: evidence inside the pretrain model's rows) as the
check that the probe finds reading where a model has learned it.

Besides the probe, each model's held-out masked-LM loss and accuracy (15%, fixed masks, the job's
`eval_step`) on time-to-quality's `text` set (128 tokens) and on held-out documents as sequences
at the extension length.

Output: OUT/long_context.json and .md (the table for benchmarks/RESULTS.md), and the plot
(OUT/long_context.png unless `--plot` names one).
"""
import argparse
import dataclasses
import json
import os
import time
from typing import Dict, List, Optional, Sequence

from benchmarks import process_setup

process_setup.prepare(main=__name__ == "__main__")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from benchmarks import time_to_quality as ttq  # noqa: E402
from benchmarks.bench_util import read_json, write_json  # noqa: E402
from bert_jax import families  # noqa: E402
from bert_jax.io import checkpoints  # noqa: E402
from bert_jax.runtime.metric_writers import read_metrics  # noqa: E402
from bert_jax.tasks import registry  # noqa: E402
from bert_jax.text import tokenization  # noqa: E402
from data_pipelines import create_pretraining_data  # noqa: E402
from experiments import pretrain_modernbert  # noqa: E402

PRETRAINED_SIDE = "bert_jax_modern"
# The extension runs: model name -> the rows it trains on (create_pretraining_data's instances).
EXTENSIONS = {"extend_apart": "documents", "extend_crossing": "contiguous"}
MODELS = ("pretrain",) + tuple(EXTENSIONS)
COLORS = {"pretrain": "tab:gray", "extend_apart": "tab:green", "extend_crossing": "tab:orange"}
# ModernBERT's extension: its rate in proportion to the pretrain rate (3e-4 / 8e-4), its global
# rotary base (experiments/pretrain_modernbert.py).
EXTEND_RATE_RATIO = pretrain_modernbert.EXTEND_LEARNING_RATE / pretrain_modernbert.SIZES["base"][0]
EXTENDED_GLOBAL_THETA = pretrain_modernbert.PHASES["extend"][1]
CONDITIONS = ("full", "control")


@dataclasses.dataclass(frozen=True)
class Probe:
  """Rows of `length` tokens; the targets' evidence more than `distance` tokens away."""
  name: str
  length: int
  distance: int


def probes(pretrain_length: int, extend_length: int) -> List[Probe]:
  return [Probe("within", pretrain_length, pretrain_length // 4),
          Probe("past", extend_length, pretrain_length)]


# --- The probe's rows ----------------------------------------------------------------------------

def windows_of(documents: Sequence[np.ndarray], body: int, step: int) -> List[tuple]:
  """(document, start) of every window of `body` tokens, in steps of `step`."""
  return [(d, start) for d, tokens in enumerate(documents)
          for start in range(0, len(tokens) - body + 1, step)]


def control_window(windows: Sequence[tuple], i: int) -> Optional[tuple]:
  """The window whose far part replaces window i's in the control: the first of another
  document from half the list away on (wrapping round), or None if all are of one document."""
  half = len(windows) // 2
  return next((windows[j % len(windows)] for j in range(i + half, i + half + len(windows))
               if windows[j % len(windows)][0] != windows[i][0]), None)


def targets_of(window: np.ndarray, far: int, distance: int, excluded: np.ndarray,
               replacement: np.ndarray) -> List[int]:
  """Positions in the window's last `distance` tokens whose id is not `excluded`, occurs once in
  the local part (window[far:]), at least once in the far part, and not in `replacement`."""
  local, far_part = window[far:], set(window[:far].tolist())
  gone = set(replacement.tolist())
  return [t for t in range(len(window) - distance, len(window))
          if not excluded[window[t]] and window[t] in far_part and window[t] not in gone
          and np.count_nonzero(local == window[t]) == 1]


def probe_rows(documents: Sequence[np.ndarray], probe: Probe, excluded: np.ndarray,
               special: Dict[str, int], max_targets: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """The probe's rows (module docstring): {"full", "control": input_ids [R, L],
  "positions", "ids", "weights": [R, max_targets]} (positions in the row, the masked tokens'
  ids, 1 for a target and 0 for padding); rows without targets left out."""
  body = probe.length - 2                       # [CLS] window [SEP]
  far = body - 2 * probe.distance
  if far < 1:
    raise ValueError(f"probe {probe.name}: rows of {probe.length} tokens leave no far part "
                     f"beyond 2 x {probe.distance}")
  windows = windows_of(documents, body, probe.distance)
  rng = np.random.default_rng(seed)
  rows = {c: [] for c in CONDITIONS}
  positions, ids = [], []
  for i, (d, start) in enumerate(windows):
    window = documents[d][start:start + body]
    other = control_window(windows, i)
    if other is None:
      raise ValueError(f"probe {probe.name}: the control needs windows of 2 documents or more")
    replacement = documents[other[0]][other[1]:other[1] + far]
    targets = targets_of(window, far, probe.distance, excluded, replacement)
    if not targets:
      continue
    if len(targets) > max_targets:
      targets = sorted(rng.choice(targets, max_targets, replace=False).tolist())
    masked = window.copy()
    masked[targets] = special["mask"]
    for condition, head in (("full", masked[:far]), ("control", replacement)):
      rows[condition].append(np.concatenate([[special["cls"]], head, masked[far:],
                                             [special["sep"]]]))
    pad = max_targets - len(targets)
    positions.append(np.array([1 + t for t in targets] + [0] * pad))
    ids.append(np.concatenate([window[targets], np.zeros(pad, window.dtype)]))
  if not positions:
    raise ValueError(f"probe {probe.name}: no target in {len(windows)} windows of "
                     f"{len(documents)} documents")
  weights = np.stack([np.arange(max_targets) < np.count_nonzero(p) for p in positions])
  return dict({c: np.stack(r).astype(np.int32) for c, r in rows.items()},
              positions=np.stack(positions).astype(np.int32),
              ids=np.stack(ids).astype(np.int32), weights=weights.astype(np.float32))


def excluded_ids(train_documents: Sequence[np.ndarray], vocab_size: int, frequent: int,
                 special_ids: Sequence[int]) -> np.ndarray:
  """[V] bool: the `frequent` most frequent ids of the training documents, and the special ids."""
  counts = np.bincount(np.concatenate(train_documents), minlength=vocab_size)
  excluded = np.zeros(vocab_size, bool)
  excluded[np.argsort(-counts, kind="stable")[:frequent]] = True
  excluded[list(special_ids)] = True
  return excluded


# --- Scoring -------------------------------------------------------------------------------------

def target_scores(model, params, rows: Dict[str, np.ndarray], batch: int) -> Dict[str, dict]:
  """Per condition, per target (weights 1, in row order): {"correct": [n] bool,
  "log_prob": [n] float}."""
  @jax.jit
  def predict(ids, positions, truth):                                       # [B, L], [B, P]
    logits = model.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids),
                         masked_lm_positions=positions, deterministic=True)["mlm_logits"]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)     # [B, P, V]
    truth_log_prob = jnp.take_along_axis(log_probs, truth[..., None], axis=-1)[..., 0]
    return jnp.argmax(log_probs, axis=-1) == truth, truth_log_prob          # [B, P] each

  count = len(rows["positions"])
  keep = rows["weights"].reshape(-1) > 0
  out = {}
  for condition in CONDITIONS:
    correct, log_prob = [], []
    for start in range(0, count, batch):
      part = slice(start, start + batch)
      pad = batch - len(rows["positions"][part])     # one shape: the last batch padded
      take = lambda x: np.concatenate([x[part], np.repeat(x[part][-1:], pad, 0)])[:batch]
      c, lp = predict(take(rows[condition]), take(rows["positions"]), take(rows["ids"]))
      correct.append(np.asarray(c)[:batch - pad])
      log_prob.append(np.asarray(lp)[:batch - pad])
    out[condition] = dict(correct=np.concatenate(correct).reshape(-1)[keep],
                          log_prob=np.concatenate(log_prob).reshape(-1)[keep])
  return out


def paired(full: np.ndarray, control: np.ndarray) -> dict:
  """Mean of full - control over the targets, and its standard error."""
  diff = full.astype(np.float64) - control.astype(np.float64)
  return dict(mean=float(diff.mean()),
              stderr=float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0)


def summarize(scores: Dict[str, dict]) -> dict:
  return dict(
      targets=int(len(scores["full"]["correct"])),
      **{f"{c}_accuracy": float(scores[c]["correct"].mean()) for c in CONDITIONS},
      **{f"{c}_log_prob": float(scores[c]["log_prob"].mean()) for c in CONDITIONS},
      accuracy_gain=paired(scores["full"]["correct"], scores["control"]["correct"]),
      log_prob_gain=paired(scores["full"]["log_prob"], scores["control"]["log_prob"]))


# --- The extension runs --------------------------------------------------------------------------

def ttq_args(args) -> argparse.Namespace:
  """time-to-quality's settings for its modern side, as its run recorded them."""
  summary = read_json(os.path.join(args.ttq_out, PRETRAINED_SIDE, "summary.json"), None)
  if not summary:
    raise FileNotFoundError(f"{args.ttq_out}/{PRETRAINED_SIDE}/summary.json not found: run "
                            f"python -m benchmarks.time_to_quality --side={PRETRAINED_SIDE} "
                            f"--out={args.ttq_out} first")
  settings = [f"--{k}={v}" for k, v in summary["settings"].items()]
  return ttq.parse_args([f"--out={args.ttq_out}", f"--side={PRETRAINED_SIDE}"] + settings)


def pretrained_workdir(args) -> str:
  return os.path.join(args.ttq_out, PRETRAINED_SIDE, "workdir")


def records(args, tokenizer, split: str, instances: str) -> str:
  """OUT/data/{split}_{instances}_{length}.tfrecord from time-to-quality's {split}.txt, unmasked
  (masked while reading), once."""
  path = os.path.join(args.out, "data", f"{split}_{instances}_{args.extend_length}.tfrecord")
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    create_pretraining_data.create_pretraining_data(
        [ttq.data_path(args.ttq_out, f"{split}.txt")], [path], tokenizer,
        max_seq_length=args.extend_length, max_predictions_per_seq=20, random_seed=args.seed,
        dupe_factor=args.dupe_factor if split == "train" else 1, masking="dynamic",
        instances=instances, num_workers=2, progress=False)
  return path


def extension_config(args, side_args, info: dict, instances: str, train: str, held_out: str):
  """The pretrain side's config (model, objective, masking, optimizer) as the extend phase."""
  c = ttq.modern_config(side_args, info)
  length = args.extend_length
  c.max_seq_length = length
  c.max_predictions_per_seq = ttq.modern_max_predictions(side_args.modern_masking, length)
  c.global_batch_size = max(1, side_args.batch * info["seq"] // length)
  c.eval_batch_size = c.global_batch_size
  c.model.global_rope_theta = EXTENDED_GLOBAL_THETA
  c.learning_rate = side_args.modern_lr * EXTEND_RATE_RATIO
  c.warmup_steps, c.num_train_steps = 0, args.extend_steps
  c.batch_warmup.start_batch_size, c.batch_warmup.tokens = 0, 0.0
  c.schedule.update(decay_steps=0, decay_fraction=0.0)          # constant, as the extend phase
  c.init_checkpoint, c.init_optimizer_state = pretrained_workdir(args), True
  c.data.instances, c.data.input_files, c.data.eval_input_files = instances, train, held_out
  c.eval_every_steps, c.eval_steps = 0, 0
  c.checkpoint_every_steps, c.keep_checkpoints = max(1, args.extend_steps // 4), 1
  c.log_every_steps = max(1, min(20, args.extend_steps))
  return c


def extend(args, side_args, info: dict, tokenizer, name: str) -> dict:
  """Runs (or resumes) one extension; OUT/<name>/summary.json."""
  path = os.path.join(args.out, name, "summary.json")
  if os.path.exists(path):
    return read_json(path)
  instances = EXTENSIONS[name]
  config = extension_config(args, side_args, info, instances,
                            records(args, tokenizer, "train", instances),
                            records(args, tokenizer, "eval", "documents"))
  workdir = os.path.join(args.out, name, "workdir")
  start = time.time()
  registry.run_job(config, workdir)
  train = read_metrics(workdir, "train")
  summary = dict(model=name, instances=instances, steps=config.num_train_steps,
                 rows=config.global_batch_size, length=config.max_seq_length,
                 learning_rate=config.learning_rate,
                 global_rope_theta=config.model.global_rope_theta,
                 train_seconds=train[-1]["train_seconds"], wall_seconds=time.time() - start)
  write_json(path, summary)
  print(json.dumps(summary), flush=True)
  return summary


def loss_ends(workdir: str) -> Dict[str, float]:
  """The mean training loss of the first and of the last quarter of a run's logged steps (one
  logged batch's loss is too noisy to compare)."""
  losses = [r["loss"] for r in read_metrics(workdir, "train")]
  quarter = max(1, len(losses) // 4)
  return dict(loss_first_quarter=float(np.mean(losses[:quarter])),
              loss_last_quarter=float(np.mean(losses[-quarter:])))


def model_workdir(args, name: str) -> str:
  return pretrained_workdir(args) if name == "pretrain" else os.path.join(args.out, name,
                                                                         "workdir")


def documents_of(path: str, tokenizer) -> List[np.ndarray]:
  """The documents of a file in BERT's input format (sentences a line, a blank line between
  documents), each as its tokens' ids."""
  with open(path, encoding="utf-8") as f:
    texts = [" ".join(d.split("\n")) for d in f.read().split("\n\n") if d.strip()]
  return [np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(texts) if ids]


def held_out_batches(config) -> List[dict]:
  """Every batch of the evaluation pipeline over `config.data.eval_input_files` (one pass, the
  fixed masks)."""
  return bench_util.pipeline_batches(config, 1 << 30, training=False)


# --- The report ----------------------------------------------------------------------------------

def gain(value: dict) -> str:
  return f"{value['mean']:+.3f} +- {value['stderr']:.3f}"


def markdown(result: dict) -> str:
  lines = [f"Far-evidence probe ({result['probe_settings']}); `full - control` with its paired "
           "standard error over the targets:", ""]
  header = ["model", "trained"]
  for p in result["probes"]:
    header += [f"{p['name']} ({p['length']} tokens, evidence > {p['distance']} away): targets, "
               "accuracy full / control", "accuracy gain", "log-prob gain (nats)"]
  header += [f"held-out MLM loss / acc, {n}" for n in result["held_out_lengths"]]
  rows = []
  for name in MODELS:
    cells = [name, result["trained"][name]]
    for p in result["probes"]:
      s = result["scores"][name][p["name"]]
      cells += [f"{s['targets']}: {s['full_accuracy']:.3f} / {s['control_accuracy']:.3f}",
                gain(s["accuracy_gain"]), gain(s["log_prob_gain"])]
    cells += [f"{m['mlm_loss']:.3f} / {m['mlm_accuracy']:.3f}"
              for m in result["held_out"][name].values()]
    rows.append(cells)
  lines += bench_util.markdown_table(header, rows)
  lines += ["", "Extensions: " + "; ".join(
      f"{name} {s['steps']} steps of {s['rows']} x {s['length']} ({s['instances']}), lr "
      f"{s['learning_rate']:.2e}, training loss {s['loss_first_quarter']:.3f} -> "
      f"{s['loss_last_quarter']:.3f} (mean of the first and last quarter of the logged steps), "
      f"{s['train_seconds']:.0f} s" for name, s in result["extensions"].items()) + ".",
            "", f"Machine: {result['machine']}."]
  return "\n".join(lines)


def plot(result: dict, path: str) -> str:
  """Per probe, each model's gain from the far evidence (accuracy and log-probability), with
  2-standard-error bars."""
  plt = bench_util.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  names = [p["name"] for p in result["probes"]]
  width = 0.8 / len(MODELS)
  for ax, metric, label in zip(axes, ("accuracy_gain", "log_prob_gain"),
                               ("accuracy: full - control", "log-probability: full - control "
                                "(nats)")):
    for k, model in enumerate(MODELS):
      values = [result["scores"][model][n][metric] for n in names]
      ax.bar(np.arange(len(names)) + (k - (len(MODELS) - 1) / 2) * width,
             [v["mean"] for v in values], width, yerr=[2 * v["stderr"] for v in values],
             capsize=3, color=COLORS[model], label=model)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels([f"{p['name']}: rows of {p['length']},\nevidence > {p['distance']} away"
                        for p in result["probes"]])
    ax.set_ylabel(label)
  axes[0].legend()
  fig.suptitle("What each model reads from far evidence (masked repeated tokens)")
  return bench_util.save_figure(fig, path)


# --- The command line ----------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m benchmarks.long_context",
                              description=__doc__.split("\n")[0])
  p.add_argument("--ttq_out", required=True,
                 help="time-to-quality's OUT: its data and its finished modern side")
  p.add_argument("--out", default="/tmp/long_context")
  p.add_argument("--plot", default="", help="the plot's path (default OUT/long_context.png)")
  p.add_argument("--extend_length", type=int, default=512)
  p.add_argument("--extend_steps", type=int, default=300)
  p.add_argument("--dupe_factor", type=int, default=2,
                 help="passes over the training documents for the extension's records")
  p.add_argument("--frequent", type=int, default=500,
                 help="the most frequent ids of the training text are never targets")
  p.add_argument("--max_targets", type=int, default=16, help="targets a probe row (at most)")
  p.add_argument("--batch", type=int, default=16, help="rows a scoring batch")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  args.plot = args.plot or os.path.join(args.out, "long_context.png")
  return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  info = ttq.read_data_info(args.ttq_out)
  side_args = ttq_args(args)
  tokenizer = tokenization.FullTokenizer(ttq.data_path(args.ttq_out, "vocab.txt"),
                                         do_lower_case=True)
  extensions = {name: dict(extend(args, side_args, info, tokenizer, name),
                          **loss_ends(os.path.join(args.out, name, "workdir")))
                for name in EXTENSIONS}

  special = dict(cls=tokenizer.cls_id, sep=tokenizer.sep_id, mask=tokenizer.mask_id)
  excluded = excluded_ids(documents_of(ttq.data_path(args.ttq_out, "train.txt"), tokenizer),
                          tokenizer.vocab_size, args.frequent, tokenizer.special_ids)
  documents = documents_of(ttq.data_path(args.ttq_out, "eval.txt"), tokenizer)
  probe_list = probes(info["seq"], args.extend_length)
  rows = {p.name: probe_rows(documents, p, excluded, special, args.max_targets, args.seed)
          for p in probe_list}
  # The held-out masked-LM sets: time-to-quality's text set (its rows' length) and documents as
  # sequences at the extension length (the evaluation pipeline's fixed masks at 15%).
  long_config = extension_config(args, side_args, info, "documents", "",
                                 records(args, tokenizer, "eval", "documents"))
  held_out_sets = {str(info["seq"]): ttq.load_eval_sets(args.ttq_out)["text"],
                   str(args.extend_length): held_out_batches(long_config)}
  result = dict(args=vars(args), machine=bench_util.machine_line(), extensions=extensions,
                probes=[dataclasses.asdict(p) for p in probe_list],
                probe_settings=f"held-out documents of time-to-quality, the {args.frequent} most "
                f"frequent ids never targets, at most {args.max_targets} targets a row",
                held_out_lengths=list(held_out_sets), trained={}, scores={}, held_out={})
  for name in MODELS:
    model_config, params = checkpoints.load_params_from_workdir(model_workdir(args, name))
    params = checkpoints.to_model_layout(params, model_config)
    model = families.of(model_config).pretraining_model(model_config, use_nsp=False)
    result["trained"][name] = (f"{info['seq']} tokens" if name == "pretrain" else
                               f"+ {extensions[name]['length']} tokens, "
                               f"{extensions[name]['instances']}")
    result["scores"][name] = {p.name: summarize(target_scores(model, params, rows[p.name],
                                                              args.batch)) for p in probe_list}
    score = ttq.scorer(model, "mlm")
    result["held_out"][name] = {length: score(params, batches)
                                for length, batches in held_out_sets.items()}
    print(f"{name}: {json.dumps(result['scores'][name])}", flush=True)
  plot(result, args.plot)
  bench_util.write_report(args.out, "long_context", result, markdown(result))
  return result


if __name__ == "__main__":
  main()
