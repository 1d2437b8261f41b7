r"""Check before you rent: compile an experiment's steps for a TPU slice, on a CPU.

  python -m bert_jax.main --config=experiments/pretrain_bert_large.py --workdir=DIR \
    --compile_for=v5litepod-16 [--find_max_batch]

The exact train step (and evaluation step) the experiment's job would run on that slice, for
any `config.task` with one job (`tasks.registry.job`, built without a workdir: nothing is
prepared or written): pre-training, a fine-tuning task (GLUE, SWAG, SQuAD, NER; its checkpoint
and data must be there, for the architecture and the feature shapes) or the feature-based tagger
(its first layer choice, on zero features of the training sentences' shapes). The same model,
dtype, remat, scan, kernels, optimizer, gradient accumulation, packing and global batch, over a
mesh of the slice's devices with the same `data` / `model` axes and the shardings a run gives
the job's state (`runtime.job.abstract_state_and_step`). It is lowered and compiled by the real
TPU compiler (`libtpu`, through `parallel.topologies`), never run. `DIR/compile_report.json`
and the printed summary hold:

  topology, device_kind, num_devices, num_hosts, global_batch_size, compile_seconds,
  memory_per_device {argument_bytes, output_bytes, temp_bytes, generated_code_bytes,
  total_bytes}, device_memory_bytes (HBM per chip), fits, over_by_bytes, flops_per_step (XLA's
  cost analysis, whole step, all devices), model_flops_per_step (`model.flops`, the count the
  GPU MFU benchmark uses), kernel_flops_per_step (the analytic FLOPs inside custom calls, i.e.
  the splash-attention kernels, which XLA counts as none: included in flops_per_step),
  bytes_accessed_per_device (XLA), peak_flops_per_device (bf16),
  hbm_bandwidth_per_device,
  roofline_step_seconds (max of compute and memory time per device), estimated_mfu,
  bytes_by_category (the train step's bytes per device by what moves them: matmul, attention,
  dropout_rng, layernorm_reduction, elementwise, optimizer_update, collective, copy_transpose;
  `parallel.hlo_profile`; they add up to bytes_accessed_per_device within a few percent),
  top_operations (the 10 largest operations: bytes, category, readable name),
  collectives (each all-gather, all-reduce, reduce-scatter, ... of the train step: kind, result
  shape and bytes per device, readable name, count; `hlo_profile.collectives`),
  vector_memory_bytes_per_device (of the re-counted bytes, those read from or written to
  buffers the compiler placed in the chip's on-chip vector memory, `S(1)` in a TPU layout: XLA's
  bytes accessed counts them like HBM traffic, so the roofline is a floor on the step's MFU
  ceiling, not a prediction; `hlo_profile.vector_memory_bytes`),
  eval_step {compile_seconds, memory_per_device, fits}

A step that does not fit is a report with `fits: false`, not a crash: `required_bytes` (the
temporaries the compiler's out-of-memory error names, plus the arguments), `available_bytes`
(the HBM the compiler calls usable, a little less than the chip's) and `over_by_bytes` (their
difference). `--find_max_batch` searches the largest global batch that fits (in multiples of
the data axis and `grad_accum_steps`), extrapolating the memory of the batches compiled so far
to the usable HBM and checking the boundary with real compiles.

With a batch warm-up (`config.batch_warmup.start_batch_size` > 0, pre-training) the step
compiled is the one after the ramp: the global batch as config.global_batch_size / start
micro-batches accumulated (`batch_warmup` in the report); every step of the ramp holds one such
micro-batch at once, so it needs no more memory. `--find_max_batch` then searches the plain step
(the warm-up off: the largest batch it finds is the largest micro-batch, start_batch_size /
grad_accum_steps rows at once, that fits) and says so.

With `model.scan_layers`, XLA's cost analysis counts the scanned layer once; the FLOPs and bytes
(and so the roofline) then come from the same step unrolled at 1 and 2 layers, extrapolated to
L (`cost_analysis` in the report says so); memory is always the real scanned step's. Gradient
caching's loop over chunks (the embedding job's `config.grad_cache_chunk`) is counted once as
well: its cost comes from the step at 1 and 2 chunks per device, the chunk loop unrolled,
extrapolated the same way.
"""
import contextlib
import dataclasses
import itertools
import json
import math
import re
import time
from typing import Any, Dict, Optional, Tuple

import jax
import numpy as np

from bert_jax import parallel
from bert_jax.io import filesystem, training_checkpoints
from bert_jax.model import kernels
from bert_jax.parallel import hlo_profile, sharding, topologies
from bert_jax.runtime import batch_ramp, config_names, grad_cache, outputs
from bert_jax.runtime import job as jobs
from bert_jax.runtime.job import Job
from bert_jax.tasks import registry

REPORT_FILE = "compile_report.json"
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40, "P": 2 ** 50}


def _memory(compiled) -> Dict[str, int]:
  stats = compiled.memory_analysis()
  memory = {"argument_bytes": stats.argument_size_in_bytes,
            "output_bytes": stats.output_size_in_bytes,
            "temp_bytes": stats.temp_size_in_bytes,
            "generated_code_bytes": stats.generated_code_size_in_bytes}
  peak = getattr(stats, "peak_memory_in_bytes", 0)
  memory["total_bytes"] = int(peak or (sum(memory.values()) - stats.alias_size_in_bytes))
  return {k: int(v) for k, v in memory.items()}


def _bytes_in(message: str, pattern: str) -> Optional[int]:
  """A size such as '(21.30G)' that follows `pattern` in a compiler message, in bytes."""
  match = re.search(pattern + r"\s*\(([\d.]+)([KMGTP]?)\)", message)
  return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def _argument_bytes(args) -> int:
  """Per-device bytes of abstract, sharded arguments (state, batch, rng): one shard of each."""
  return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
                 for x in jax.tree_util.tree_leaves(args)))


def _out_of_memory(message: str, args) -> Dict[str, Any]:
  """The verdict of an out-of-memory compile. The compiler's message ('the total memory
  required for HLO temporaries (21.30G) exceeds available HBM (15.75G)') counts temporaries
  only, so the arguments' bytes are added to compare with a compiled step's `total_bytes`; the
  HBM it calls available (less than the chip's, e.g. 15.75 of 16 GiB on v5e) is what a step
  must fit in."""
  temporaries = _bytes_in(message, r"required[^(]*")
  return {"fits": False, "error": message.splitlines()[0][:500],
          "required_bytes": temporaries and temporaries + _argument_bytes(args),
          "available_bytes": _bytes_in(message, r"available HBM")}


def _compile(function, args) -> Dict[str, Any]:
  """Lowers and compiles `function` for `args` (abstract, sharded); memory, cost and time, or
  the compiler's out-of-memory verdict."""
  start = time.time()
  try:
    compiled = function.lower(*args).compile()
  except Exception as e:  # pylint: disable=broad-except
    message = str(e)
    if "RESOURCE_EXHAUSTED" not in message and "HBM" not in message:
      raise
    return {"compile_seconds": round(time.time() - start, 2), **_out_of_memory(message, args)}
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  text = compiled.as_text()
  by_category, largest = hlo_profile.profile(text, top=10)
  return {"compile_seconds": round(time.time() - start, 2), "memory_per_device": _memory(compiled),
          "flops_per_device": float(cost.get("flops", 0.0)),
          "bytes_accessed_per_device": float(cost.get("bytes accessed", 0.0)),
          "bytes_by_category": by_category, "top_operations": largest,
          "collectives": hlo_profile.collectives(text),
          "vector_memory_bytes_per_device": hlo_profile.vector_memory_bytes(text)}


@dataclasses.dataclass
class _Target:
  """A slice and the mesh strategy over its devices."""
  accelerator_type: str
  spec: topologies.Slice
  par: Any


def build_job(config, layers: Optional[int] = None) -> Job:
  """The experiment's own job from the registry (`registry.job`: what trains is what compiles),
  built without a workdir (nothing prepared: the shapes only; fine-tuning reads the checkpoint's
  architecture and a few training examples), unrolled at `layers` layers if given (the cost of
  a scanned step)."""
  return registry.job(config, layers=layers)


def _layers(job: Job) -> Tuple[int, int]:
  """(layers, scanned layers) of the job's encoder: its layer count, and the same when it is a
  scan over layers (0 when unrolled); (0, 0) when the step has none (the feature-based tagger
  trains on the encoder's features)."""
  encoder = training_checkpoints.model_config_of(job.model)
  if encoder is None:
    return 0, 0
  layers = int(encoder.num_hidden_layers)
  return layers, layers if encoder.scan_layers else 0


class _Compiler:
  """Compiles one experiment's steps on one slice, for any global batch."""

  def __init__(self, config, target: _Target):
    self.config, self.target = config.copy_and_resolve_references(), target
    # The encoder's layers, and the same when scanned (0 when unrolled); read from the first
    # job built (its model's encoder).
    self.num_layers: Optional[int] = None
    self.scanned_layers: Optional[int] = None
    self._eval = None   # the eval step's verdict: its batch does not change with the train batch

  def _train_and_eval(self, global_batch: int, layers: Optional[int] = None,
                      with_eval: bool = True):
    config = config_names.replaced(self.config, {"global_batch_size": global_batch})
    par = self.target.par
    job = build_job(config, layers)
    if layers is None and self.scanned_layers is None:
      self.num_layers, self.scanned_layers = _layers(job)
    # The job's state as a run places it and the strategy's own compiled steps: the shardings
    # a run would use.
    state, train_step = jobs.abstract_state_and_step(job, par)
    eval_step = par.compile_eval(job.eval_step)
    rng = par.abstract_replicated(jax.random.PRNGKey(0))
    with kernels.compiling_for("tpu"):
      train = _compile(train_step, (state, par.abstract_batch(job.example_batch(global_batch)),
                                    rng))
      evaluation = (_compile(eval_step, (state.params, par.abstract_batch(
          job.example_eval_batch(config.eval_batch_size)))) if with_eval else None)
    if "flops_per_device" in train:   # what runs inside custom calls, added to XLA's count
      train["flops_per_device"] += job.kernel_flops(global_batch) / len(par.mesh.devices.flat)
    return job, train, evaluation

  def loops_counted_once(self, global_batch: int) -> Dict[str, int]:
    """The loops of the train step that XLA's cost analysis counts once, with their trip
    counts: the layers of a scanned encoder, the chunks of gradient caching (each device's rows
    / config.grad_cache_chunk, `runtime.grad_cache`)."""
    loops = {"layers": self.scanned_layers} if self.scanned_layers else {}
    chunk = self.config.get("grad_cache_chunk", 0)   # the embedding job's; no other has it
    if chunk:
      chunks = global_batch // (self.target.par.mesh.shape[sharding.DATA_AXIS] * chunk)
      if chunks > 1:
        loops["chunks"] = chunks
    return loops

  def _loop_cost(self, global_batch: int, loops: Dict[str, int]) -> Dict[str, float]:
    """Per-device FLOPs and bytes of a step with `loops` (`loops_counted_once`). XLA's cost
    analysis counts a loop body once, so the cost comes from the same step unrolled at 1 and 2
    layers, whose difference is one layer's: cost(L) = cost(1) + (L - 1) * (cost(2) - cost(1)).
    With gradient caching, each of those at a batch of 1 and 2 chunks per device, the chunk loop
    traced unrolled (`grad_cache.unrolled_for_cost`), extrapolated the same way to n chunks (4
    small compiles; the cost is linear in the batch but for the loss's similarity matrix,
    quadratic and a small part)."""
    targets = {"layers": self.num_layers, **loops}
    names = ["layers"] + (["chunks"] if "chunks" in loops else [])
    per_chunk = global_batch // loops["chunks"] if "chunks" in loops else global_batch
    unrolled = grad_cache.unrolled_for_cost if "chunks" in loops else contextlib.nullcontext
    keys = ("flops_per_device", "bytes_accessed_per_device", "vector_memory_bytes_per_device")
    cost: Dict[str, Any] = dict({k: 0.0 for k in keys}, bytes_by_category={})
    for corner in itertools.product((1, 2), repeat=len(names)):
      at = dict(zip(names, corner))
      with unrolled():
        measured = self._train_and_eval(per_chunk * at.get("chunks", 1), at["layers"],
                                        with_eval=False)[1]
      if "flops_per_device" not in measured:
        return {}
      # This corner's weight on the line through 1 and 2, at each loop's trip count.
      weight = math.prod((2 - targets[n]) if at[n] == 1 else (targets[n] - 1) for n in names)
      for k in keys:
        cost[k] += weight * measured[k]
      for k, value in measured["bytes_by_category"].items():
        cost["bytes_by_category"][k] = cost["bytes_by_category"].get(k, 0.0) + weight * value
    return cost

  def report(self, global_batch: int, scanned_cost: bool = True) -> Dict[str, Any]:
    """The report for one global batch size (see the module docstring). `scanned_cost=False`
    leaves out the roofline of a scanned step (its two extra compiles; `add_scanned_cost`)."""
    job, train, evaluation = self._train_and_eval(global_batch, with_eval=self._eval is None)
    spec, generation = self.target.spec, self.target.spec.generation
    if evaluation is not None:
      self._eval = _verdict(evaluation, generation)
    mesh = self.target.par.mesh
    devices = len(mesh.devices.flat)
    report = {"topology": self.target.accelerator_type, "topology_name": spec.topology_name,
              "device_kind": generation.device_kind, "num_devices": devices,
              "num_hosts": spec.num_hosts, "mesh": dict(mesh.shape),
              "global_batch_size": global_batch, "device_memory_bytes": generation.hbm_bytes,
              "peak_flops_per_device": generation.peak_bf16_flops,
              "hbm_bandwidth_per_device": generation.hbm_bandwidth,
              "model_flops_per_step": job.model_flops(global_batch),
              "kernel_flops_per_step": job.kernel_flops(global_batch)}
    report.update(_verdict(train, generation))
    if "flops_per_device" in train:
      if not self.loops_counted_once(global_batch):
        report.update(_roofline(train, devices, generation, report["model_flops_per_step"]))
      elif scanned_cost:
        self.add_scanned_cost(report)
    report["eval_step"] = self._eval
    return report

  def add_scanned_cost(self, report: Dict[str, Any]):
    """Adds the roofline of a step with loops XLA counts once (a scan over layers, gradient
    caching's chunks) to its report, from `_loop_cost`."""
    loops = self.loops_counted_once(report["global_batch_size"])
    cost = self._loop_cost(report["global_batch_size"], loops)
    if cost:
      counted = ", ".join(f"{n} {name}" for name, n in sorted(loops.items()))
      report["cost_analysis"] = (
          f"loops counted once by XLA ({counted}): the step unrolled at 1 and 2 layers"
          + (" and 1 and 2 gradient-caching chunks per device" if "chunks" in loops else "")
          + f", extrapolated to {self.num_layers} layers"
          + (f" and {loops['chunks']} chunks" if "chunks" in loops else ""))
      report.update(_roofline(cost, report["num_devices"], self.target.spec.generation,
                              report["model_flops_per_step"]))


def compile_steps(config, target: _Target, global_batch: int) -> Dict[str, Any]:
  """The report for one global batch size (see the module docstring)."""
  return _Compiler(config, target).report(global_batch)


def _roofline(cost: Dict[str, float], devices: int, generation, model_flops: float) -> Dict:
  compute = cost["flops_per_device"] / generation.peak_bf16_flops
  memory_time = cost["bytes_accessed_per_device"] / generation.hbm_bandwidth
  step = max(compute, memory_time)
  return {"flops_per_step": cost["flops_per_device"] * devices,
          "bytes_accessed_per_device": cost["bytes_accessed_per_device"],
          "bytes_by_category": cost["bytes_by_category"],
          "vector_memory_bytes_per_device": cost["vector_memory_bytes_per_device"],
          "roofline_step_seconds": step,
          "roofline_bound": "compute" if compute >= memory_time else "memory",
          "estimated_mfu": model_flops / (devices * generation.peak_bf16_flops * step)}


def _verdict(result: Dict[str, Any], generation) -> Dict[str, Any]:
  """compile_seconds, memory_per_device, fits and over_by_bytes of one compiled step."""
  verdict = {k: v for k, v in result.items()
             if k not in ("flops_per_device", "bytes_accessed_per_device", "bytes_by_category",
                          "vector_memory_bytes_per_device")}
  total = _total_bytes(result)
  if "fits" not in verdict:
    verdict["fits"] = total <= generation.hbm_bytes
  capacity = result.get("available_bytes") or generation.hbm_bytes
  verdict["over_by_bytes"] = max(0, (total or 0) - capacity) if total else None
  return verdict


def _total_bytes(result: Dict[str, Any]) -> Optional[int]:
  """Per-device bytes of a compiled step, or what an out-of-memory error said it needed (plus
  the arguments)."""
  return (result["memory_per_device"]["total_bytes"] if "memory_per_device" in result
          else result.get("required_bytes"))


def _next_guess(measured: Dict[int, int], low: int, high: Optional[int], capacity: int) -> int:
  """The next batch (in units) to compile: where a line through two measured batches reaches
  `capacity`; doubling or bisection when there is no line yet. Memory grows about linearly with
  the batch (activations), so this usually lands on the boundary in one or two compiles. The
  line goes through the two largest batches that fitted (their figures are the compiler's
  memory analysis; an out-of-memory error's is an estimate), or the two nearest the boundary
  while fewer fitted. Bisection when the line says the failed batch `high` fits: `capacity` is
  then wrong, and the line would creep down the bracket one unit a compile (as on v4 before the
  usable HBM was read from the error)."""
  fitted = sorted(n for n in measured if n <= low)[-2:]
  points = fitted if len(fitted) == 2 else sorted(
      sorted(measured, key=lambda n: (abs(n - low), n))[:2])
  guess = None
  if len(points) == 2:
    (n0, m0), (n1, m1) = ((n, measured[n]) for n in points)
    slope = (m1 - m0) / (n1 - n0)
    if slope > 0 and (high is None or m0 + (high - n0) * slope > capacity):
      guess = int(n0 + (capacity - m0) // slope)
  ceiling = high - 1 if high is not None else max(2 * low, 1) * 8
  if guess is None:
    guess = 2 * low if high is None else (low + high) // 2
  return max(low + 1, min(guess, ceiling))


def find_max_batch(config, target: _Target) -> Dict[str, Any]:
  """The report of the largest global batch that fits, in steps of the data axis times
  `grad_accum_steps`: from the configured batch, each next try is where the memory measured so
  far extrapolates to the chip's HBM (`_next_guess`), until a fitting batch and one more unit
  that does not fit bracket it. The evaluation step (whose batch is fixed) is compiled once."""
  unit = target.par.mesh.shape[sharding.DATA_AXIS] * config.grad_accum_steps
  compiler = _Compiler(config, target)
  capacity = target.spec.generation.hbm_bytes   # lowered to what the compiler says is usable
  measured: Dict[int, int] = {}   # units -> bytes per device (compiled, or the OOM's figure)
  low, high, best = 0, None, None
  units = max(1, config.global_batch_size // unit)
  while True:
    report = compiler.report(units * unit, scanned_cost=False)
    if not report["eval_step"]["fits"]:
      raise ValueError(f"The evaluation step (eval_batch_size={config.eval_batch_size}) does "
                       f"not fit on {target.accelerator_type}; lower it")
    total = _total_bytes(report)
    if total:
      measured[units] = total
    capacity = min(capacity, report.get("available_bytes") or capacity)
    print(f"  global batch {units * unit}: {'fits' if report['fits'] else 'does not fit'}"
          + (f" ({total / 2 ** 30:.2f} GiB per device)" if total
             else f": {report.get('error', '')}"), flush=True)
    if report["fits"]:
      low, best = units, report
    else:
      high = units
    if high is not None and high - low <= 1:
      break
    units = _next_guess(measured, low, high, capacity)
  if best is None:
    raise ValueError(f"Not even a global batch of {unit} fits on {target.accelerator_type}")
  if compiler.loops_counted_once(best["global_batch_size"]) and "memory_per_device" in best:
    compiler.add_scanned_cost(best)
  best["max_global_batch_size"] = low * unit
  return best


def batch_warmup_rows(config) -> int:
  """The batch warm-up's micro-batch (config.batch_warmup.start_batch_size; 0 when off or when
  the task has no warm-up), checked against the global batch as a run checks it
  (`batch_ramp.from_config`: an error that names the fields)."""
  warmup = config.get("batch_warmup")
  if warmup is None or not warmup.start_batch_size:
    return 0
  batch_ramp.from_config(config)
  return int(warmup.start_batch_size)


def summary(report: Dict[str, Any]) -> str:
  gib = lambda b: f"{b / 2 ** 30:.2f} GiB" if b is not None else "?"
  lines = [f"{report['topology']} ({report['topology_name']}, {report['num_devices']} x "
           f"{report['device_kind']}, {report['num_hosts']} host(s), mesh {report['mesh']}), "
           f"global batch {report['global_batch_size']}"]
  memory = report.get("memory_per_device")
  if memory:
    lines.append(f"  train step: {gib(memory['total_bytes'])} per device of "
                 f"{gib(report['device_memory_bytes'])} HBM "
                 f"(arguments {gib(memory['argument_bytes'])}, temporaries "
                 f"{gib(memory['temp_bytes'])}) -> {'fits' if report['fits'] else 'DOES NOT FIT'}")
  else:
    usable = report.get("available_bytes") or report["device_memory_bytes"]
    lines.append(f"  train step DOES NOT FIT: needs {gib(report.get('required_bytes'))} per "
                 f"device of {gib(usable)} usable ({report.get('error', '')})")
  if "roofline_step_seconds" in report:
    lines.append(f"  {report['flops_per_step']:.3g} FLOPs per step (XLA; analytic "
                 f"{report['model_flops_per_step']:.3g}); roofline "
                 f"{report['roofline_step_seconds'] * 1e3:.1f} ms per step "
                 f"({report['roofline_bound']}-bound), estimated MFU "
                 f"{100 * report['estimated_mfu']:.1f}% at best")
  if report.get("vector_memory_bytes_per_device"):
    lines.append(f"  of the bytes, {report['vector_memory_bytes_per_device'] / 1e9:.2f} GB per "
                 f"device are reads and writes of on-chip vector memory (layouts' S(1), "
                 f"re-counted), which the roofline charges at HBM bandwidth")
  categories = report.get("bytes_by_category")
  if categories:
    total = sum(categories.values()) or 1.0
    lines.append("  bytes per device by category: " + ", ".join(
        f"{name} {value / 1e9:.2f} GB ({100 * value / total:.0f}%)"
        for name, value in sorted(categories.items(), key=lambda kv: -kv[1]) if value))
  for op in report.get("top_operations", [])[:5]:
    lines.append(f"    {op['bytes'] / 1e9:6.3f} GB  {op['category']:<19} {op['name']}")
  if report.get("collectives"):
    lines.append("  largest collectives (result per device):")
  for c in report.get("collectives", [])[:5]:
    shape = c["shape"] if len(c["shape"]) <= 40 else c["shape"][:37] + "..."   # a tuple's
    lines.append(f"    {c['result_bytes'] / 1e6:9.3f} MB x {c['count']:<3} {c['kind']:<14} "
                 f"{shape}  {c['name']}")
  lines.append(f"  eval step: {'fits' if report['eval_step']['fits'] else 'DOES NOT FIT'}; "
               f"compiled in {report['compile_seconds']} + "
               f"{report['eval_step']['compile_seconds']} s")
  if "max_global_batch_size" in report:
    lines.append(f"  largest global batch that fits: {report['max_global_batch_size']}")
  if "batch_warmup" in report:
    lines.append(f"  batch warm-up: {report['batch_warmup']}")
  return "\n".join(lines)


def run(config, workdir: str, accelerator_type: str, search_batch: bool = False) -> Dict:
  """Compiles the experiment's steps for `accelerator_type`; writes and returns the report."""
  registry.job_builder(config.task)   # at once: a config.task with no single job says why
  if config.parallelism != "jit":
    raise ValueError("--compile_for compiles config.parallelism='jit' (the mesh strategy)")
  spec = topologies.parse(accelerator_type)
  devices = topologies.slice_devices(accelerator_type)
  warmup_rows, warmup_note = batch_warmup_rows(config), None
  if warmup_rows and search_batch:
    config = config_names.replaced(config, {"batch_warmup.start_batch_size": 0})
    warmup_note = (f"off for the search: a step of the warm-up holds start_batch_size / "
                   f"grad_accum_steps = {warmup_rows} / {config.grad_accum_steps} rows at once, "
                   f"which must not exceed the largest batch found")
  elif warmup_rows:
    warmup_note = (f"the step after the ramp: {config.global_batch_size // warmup_rows} "
                   f"micro-batches of {warmup_rows} rows (start_batch_size) accumulated; every "
                   f"step holds start_batch_size / grad_accum_steps = "
                   f"{warmup_rows // config.grad_accum_steps} rows at once")
  target = _Target(accelerator_type, spec, parallel.JitParallel(config, devices))
  report = (find_max_batch(config, target) if search_batch
            else compile_steps(config, target, config.global_batch_size))
  if warmup_note:
    report["batch_warmup"] = warmup_note
  print(summary(report), flush=True)
  if outputs.is_writer():
    workdir = filesystem.absolute(workdir)
    filesystem.makedirs(workdir)
    filesystem.write_text(filesystem.join(workdir, REPORT_FILE),
                          json.dumps(report, indent=2, sort_keys=True))
  return report
