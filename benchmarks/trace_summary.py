r"""Per-kernel breakdown of a `jax.profiler` trace (the Perfetto JSON that `--profile=DIR` writes).

  python -m benchmarks.trace_summary DIR [--steps=3] [--top=40]

Sums device-kernel time by kernel name (one name per XLA fusion, cuBLAS/cuDNN kernel or Triton
GEMM), groups the names into kinds (matmul, attention, reduction, elementwise, copy, ...), and
prints both per step, with the span from the first kernel's start to the last one's end (kernel
time well under the span means the device sat idle between kernels). Read the fusion names
against an HLO dump (`XLA_FLAGS=--xla_dump_to=...`) to see what each one computes.
"""
import argparse
import collections
import glob
import gzip
import json
import os

# Substrings of kernel names, checked in order; the first match names the kind. Attention comes
# first: cuDNN's fused attention kernels carry matmul-like names too
# (`cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_...`).
KINDS = (
    ("attention", ("fmha", "flash", "cudnn", "sdpa", "attention")),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "sm80_", "ampere_", "cublas", "dot")),
    ("copy", ("memcpy", "memset", "copy", "transpose")),
    ("random", ("rng", "random", "philox", "threefry")),
    ("reduction", ("reduce", "scatter")),
    ("elementwise", ("fusion", "loop", "elementwise", "convert", "multiply", "add")),
)


def kind_of(name: str) -> str:
  lower = name.lower()
  return next((kind for kind, keys in KINDS if any(k in lower for k in keys)), "other")


def load_trace(path: str) -> dict:
  if os.path.isdir(path):
    found = sorted(glob.glob(os.path.join(path, "**", "*.trace.json.gz"), recursive=True) +
                   glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True))
    if not found:
      raise FileNotFoundError(f"no *.trace.json.gz or perfetto_trace.json.gz under {path}")
    path = found[-1]
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return json.load(f)


def device_kernels(trace: dict):
  """(name, start_us, duration_us) of every complete event on a GPU/TPU device stream."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  process = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
  thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"}
  on_device = lambda e: ("/device:" in process.get(e["pid"], "")
                         and "stream" in thread.get((e["pid"], e.get("tid")), "").lower())
  kernels = [(e["name"], float(e["ts"]), float(e.get("dur", 0))) for e in events
             if e.get("ph") == "X" and on_device(e)]
  if not kernels:
    raise ValueError("no device-stream kernels in the trace; its threads: " + ", ".join(
        sorted({f"{process.get(p, p)}/{name}" for (p, _), name in thread.items()})))
  return kernels


def summarize(kernels, steps: int, top: int) -> str:
  by_name = collections.defaultdict(lambda: [0.0, 0])
  by_kind = collections.Counter()
  for name, _, dur in kernels:
    by_name[name][0] += dur
    by_name[name][1] += 1
    by_kind[kind_of(name)] += dur
  busy = sum(d for _, _, d in kernels)
  span = max(t + d for _, t, d in kernels) - min(t for _, t, _ in kernels)
  lines = [f"{len(kernels)} kernels over {steps} steps: kernel time {busy / steps / 1e3:.2f} "
           f"ms/step, span {span / steps / 1e3:.2f} ms/step (kernels may overlap on streams)"]
  lines += [f"  {kind:12s} {t / steps / 1e3:8.2f} ms/step  {100 * t / busy:5.1f}%"
            for kind, t in by_kind.most_common()]
  lines.append(f"top {top} kernels (ms/step, launches/step, kind, name):")
  ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
  lines += [f"  {t / steps / 1e3:7.3f} {n / steps:6.1f}  {kind_of(name):11s} {name[:110]}"
            for name, (t, n) in ranked]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("trace", help="profile directory or a trace .json(.gz) file")
  parser.add_argument("--steps", type=int, default=3, help="steps the trace covers")
  parser.add_argument("--top", type=int, default=40)
  args = parser.parse_args()
  print(summarize(device_kernels(load_trace(args.trace)), args.steps, args.top))


if __name__ == "__main__":
  main()
