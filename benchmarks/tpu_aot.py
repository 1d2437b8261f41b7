r"""TPU slices from a CPU: compile the pre-training step for each (size, seq, packing, slice) with
the real TPU compiler (libtpu) and print one JSON line of `compile_report` each.

  pip install "jax[tpu]"
  python -m benchmarks.tpu_aot --sizes=base,large --seqs=128,512 --packing=off,on \
    --slices=v4-8,v5litepod-8,v5p-8 --batch=256 [--find_max_batch] [--fsdp] \
    [--model_parallelism=1] [--kernels="tuned;textbook"]

  python -m benchmarks.tpu_aot --sizes=base --seqs=128 --slices=v5litepod-8 --batch=256 \
    --variants='shipped=;bf16=model.dtype=bfloat16;splash=model.dtype=bfloat16,\
model.attention=splash,model.attention_probs_dropout_prob=0;fsdp=...,fsdp=true'

compiles one step per variant (config overrides on top of the shipped experiment, float32) and
prints each with `bytes_by_category`: the before/after table of a change to the step.

The paper's recipe (batch 256, 1M steps) is translated into wall-clock and chip-hours per slice
from the roofline step time (`estimated_days`, `chip_hours`): a lower bound, since the roofline
leaves out input feeding, host work, collectives' latency and XLA's real schedule.
"""
import argparse
import json
import os
import sys
import tempfile
from contextlib import redirect_stdout

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import bench_util  # noqa: E402
from bert_jax.tasks.tools import compile_report  # noqa: E402
from experiments import pretraining_defaults  # noqa: E402

PAPER_STEPS = 1_000_000


def config_for(size: str, seq: int, packing: bool, batch: int, model_parallelism: int,
               scan_layers: bool = False, remat: bool = False, fsdp: bool = False):
  c = pretraining_defaults.get_config(size)
  c.model.update(dtype="bfloat16", max_position_embeddings=max(512, seq),
                 scan_layers=scan_layers, remat=remat)
  c.max_seq_length, c.max_predictions_per_seq = seq, max(20, int(round(seq * 0.15)))
  c.global_batch_size, c.eval_batch_size = batch, 64
  c.model_parallelism, c.fsdp = model_parallelism, fsdp
  c.data.packing = packing
  c.data.max_pairs_per_row = max(1, seq // 32)
  return c


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes", default="base")
  parser.add_argument("--seqs", default="128")
  parser.add_argument("--packing", default="off")
  parser.add_argument("--slices", default="v5litepod-8")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--model_parallelism", type=int, default=1)
  parser.add_argument("--find_max_batch", action="store_true")
  parser.add_argument("--scan_layers", action="store_true",
                      help="compile one layer body scanned L times: the same step, compiled "
                      "about L times faster (BERT-large: 24)")
  parser.add_argument("--remat", action="store_true",
                      help="rematerialise each layer in the backward pass (less memory)")
  parser.add_argument("--fsdp", action="store_true",
                      help="config.fsdp: parameters, gradients and Adam moments split along the "
                      "data axis (less memory per chip, a larger batch)")
  parser.add_argument("--kernels", default="auto",
                      help="config.model.kernels, a comma list of variants to compare, e.g. "
                      "tuned,textbook (BertConfig.kernels values separated by ';')")
  parser.add_argument("--variants", default="",
                      help="instead of the grid: one compile per ';'-separated list of "
                      "config overrides (NAME=key=value,key=value, e.g. "
                      "'bf16=model.dtype=bfloat16;splash=model.dtype=bfloat16,"
                      "model.attention=splash,model.attention_probs_dropout_prob=0'), of the "
                      "first --sizes/--seqs/--slices cell, each printed with its "
                      "bytes_by_category: the before/after table of a change to the step")
  parser.add_argument("--table", default="",
                      help="instead of compiling: the markdown tables from JSON lines this "
                      "script printed (files, comma-separated; --find_max_batch lines fill the "
                      "'largest batch' column)")
  args = parser.parse_args()
  if args.table:
    print(markdown_tables([json.loads(line) for path in args.table.split(",")
                           for line in open(path, encoding="utf-8") if line.startswith("{")]))
    return
  if args.variants:
    size, seq = args.sizes.split(",")[0], int(args.seqs.split(",")[0])
    for variant in filter(None, args.variants.split(";")):
      name, _, overrides = variant.partition("=")
      config = config_for(size, seq, args.packing == "on", args.batch, args.model_parallelism,
                          args.scan_layers, args.remat)
      config.model.dtype = "float32"   # the shipped experiments' default; a variant sets it
      for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        _set(config, key, value)
      row = compiled(config, args.slices.split(",")[0], keys=VARIANT_KEYS)
      print(json.dumps(dict(variant=name, **row)), flush=True)
    return
  for size in args.sizes.split(","):
    for seq in map(int, args.seqs.split(",")):
      for packing in (p == "on" for p in args.packing.split(",")):
        for accelerator, kernel_choice in ((a, k) for a in args.slices.split(",")
                                           for k in args.kernels.split(";")):
          config = config_for(size, seq, packing, args.batch, args.model_parallelism,
                              args.scan_layers, args.remat, args.fsdp)
          config.model.kernels = kernel_choice
          row = {"size": size, "seq": seq, "packing": packing, "kernels": kernel_choice,
                 "scan_layers": args.scan_layers, "remat": args.remat, "fsdp": args.fsdp,
                 **compiled(config, accelerator, args.find_max_batch)}
          if row["roofline_step_seconds"]:
            seconds = row["roofline_step_seconds"] * PAPER_STEPS * 256 / row["global_batch_size"]
            row["estimated_days"] = round(seconds / 86400, 2)
            row["chip_hours"] = round(seconds / 3600 * row["num_devices"], 1)
          print(json.dumps(row), flush=True)


def _set(config, dotted: str, text: str) -> None:
  """config[a][b] = text parsed as the field's type (bool, int, float or str)."""
  *parents, last = dotted.split(".")
  for key in parents:
    config = config[key]
  old = config[last]
  config[last] = (text.lower() in ("1", "true") if isinstance(old, bool)
                  else type(old)(text) if old is not None else text)


# The report's fields a grid line prints, and a --variants line (with `bytes_by_category`).
GRID_KEYS = ("topology", "num_devices", "num_hosts", "global_batch_size", "fits", "over_by_bytes",
             "max_global_batch_size", "compile_seconds", "flops_per_step", "model_flops_per_step",
             "bytes_accessed_per_device", "roofline_step_seconds", "roofline_bound",
             "estimated_mfu")
VARIANT_KEYS = ("topology", "fits", "global_batch_size", "bytes_accessed_per_device",
                "bytes_by_category", "vector_memory_bytes_per_device", "flops_per_step",
                "model_flops_per_step", "roofline_step_seconds", "estimated_mfu")


def compiled(config, accelerator: str, find_max_batch: bool = False, keys=GRID_KEYS) -> dict:
  """`compile_report.run` for `accelerator`: the report's `keys` and the memory per chip. The
  report's summary and the batch search's progress go to stderr: stdout holds only JSON lines."""
  with redirect_stdout(sys.stderr):
    report = compile_report.run(config, tempfile.mkdtemp(), accelerator, find_max_batch)
  memory = report.get("memory_per_device") or {}
  return dict({k: report.get(k) for k in keys},
              gib_per_device=round(memory.get("total_bytes", 0) / 2 ** 30, 2) or None)


def markdown_tables(rows) -> str:
  """Per-chip memory, largest batch, roofline and MFU per cell; then the paper's recipe (90% of
  1M steps at seq 128, 10% at 512, batch 256) per slice from the seq 128 and 512 cells.

  A cell compiled both unrolled and with `scan_layers` has a row for each (`layers` column); the
  largest batch is that of the search's own layer form, named beside it."""
  layers = lambda r: ("scanned" if r.get("scan_layers") else "unrolled") + (
      " + remat" if r.get("remat") else "") + (" + fsdp" if r.get("fsdp") else "")
  cell = lambda r: (r["size"], r["seq"], r["packing"], r["topology"])
  largest = {cell(r) + (layers(r),): r["max_global_batch_size"] for r in rows
             if r.get("max_global_batch_size")}
  cells = {cell(r) + (layers(r),): r for r in rows if r["global_batch_size"] == 256
           and not r.get("max_global_batch_size")}
  chips = lambda r: f"{r['topology']} ({r['num_devices']})"
  grid = []
  for k, r in sorted(cells.items()):
    memory = (f"{r['gib_per_device']:.2f} GiB" if r["fits"] else
              f"does not fit (+{(r.get('over_by_bytes') or 0) / 2 ** 30:.1f} GiB)")
    ratio = (f"{r['flops_per_step'] / r['model_flops_per_step']:.3f}"
             if r.get("flops_per_step") else "-")
    roofline = (f"{1e3 * r['roofline_step_seconds']:.1f} ms ({r['roofline_bound']})"
                if r.get("roofline_step_seconds") else "-")
    mfu = f"{100 * r['estimated_mfu']:.1f}%" if r.get("estimated_mfu") else "-"
    grid.append([r["size"], r["seq"], "on" if r["packing"] else "off", chips(r), k[-1], memory,
                 ratio, roofline, mfu, largest.get(k, "-")])
  recipe, done = [], set()
  for (size, seq, packing, topology, form), r in sorted(cells.items()):
    # The seq-512 phase in this layer form if it fits, else in a form that does (remat).
    longs = sorted((c for c in cells.values() if cell(c) == (size, 512, packing, topology)),
                   key=lambda c: (not c.get("roofline_step_seconds"), layers(c) != form))
    long = longs[0] if longs else None
    if seq != 128 or long is None or (size, packing, topology) in done:
      continue
    done.add((size, packing, topology))
    if not (r.get("roofline_step_seconds") and long.get("roofline_step_seconds")):
      recipe.append([size, "on" if packing else "off", chips(r),
                     "batch 256 does not fit at seq 512", "-", "-"])
      continue
    seconds = PAPER_STEPS * (0.9 * r["roofline_step_seconds"]
                             + 0.1 * long["roofline_step_seconds"])
    recipe.append([size, "on" if packing else "off", chips(r), f"{seconds / 86400:.2f}",
                   f"{seconds / 3600 * r['num_devices']:.0f}", f"{form} / {layers(long)}"])
  return "\n".join(bench_util.markdown_table(
      ["model", "seq", "packing", "slice (chips)", "layers", "per chip at batch 256",
       "XLA / analytic FLOPs", "roofline step (bound)", "est. MFU (ceiling)",
       "largest global batch"], grid) + [""] + bench_util.markdown_table(
      ["model", "packing", "slice (chips)", "paper's recipe: roofline days", "chip-hours",
       "layers (seq 128 / seq 512)"], recipe))

if __name__ == "__main__":
  main()
