"""Where a compiled step's memory traffic goes: the bytes each operation of the optimized HLO
reads and writes, grouped into categories a person can act on.

XLA's cost analysis gives one number, `bytes accessed`, for a whole compiled module: the sum over
the module's top-level operations (a fusion counts its operands and its results once; a loop
body once) of the bytes they move. This module reads the same operations from the module's text
(`compiled.as_text()`), counts them the same way, and files each under one category by what it
is (its opcode, the operations fused into it) and where it came from (the JAX name stack in its
`op_name` metadata, e.g. `.../bert/encoder/layer_3/attention/self/Dropout_0/...`):

  matmul          fusions and operations that contain a dot or convolution (dense layers, the
                  MLM decoder; the attention products are `attention`)
  attention       inside self-attention, after the q/k/v projections: logits, softmax,
                  probabilities x values (a fused attention kernel is one custom call here)
  dropout_rng     dropout masks and the random bits they are drawn from
  layernorm_reduction  LayerNorm and other reductions (losses, norms)
  elementwise     other fusions (bias, GELU, residual adds, casts)
  optimizer_update  the optimizer's update of parameters and moments (the step's
                  `optimizer_update` name scope, bert_jax/runtime/step.py)
  collective      all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute (one
                  fused into a matmul, as libtpu does, is the matmul's)
  copy_transpose  copies, transposes and layout changes

`profile(text)` returns the totals per category and the largest operations; `collectives(text)`
each collective's kind, result shape and bytes (what a step sends between chips);
`vector_memory_bytes(text)` the part of the same bytes that reads or writes buffers in the
chip's on-chip vector memory (memory space 1 in TPU layouts), which XLA counts like HBM traffic.

How close the re-count comes to XLA's total (libtpu's cost model is not public): BERT-base phase
1 on v5litepod-8, 2 and 4 layers, 94.8% of XLA's bytes; a tiny data-parallel step 91.7%; a tiny
step with tensor parallelism 81% (tests/test_compile_report.py). The report keeps XLA's total as
`bytes_accessed_per_device` and the categories as counted here.
"""
import collections
import dataclasses
import functools
import re
from typing import Dict, List, Optional, Tuple

CATEGORIES = ("matmul", "attention", "dropout_rng", "layernorm_reduction", "elementwise",
              "optimizer_update", "collective", "copy_transpose")

_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
                "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
                "f64": 8, "c64": 8, "c128": 16}
# Operations that move no data of their own (XLA's cost analysis gives them no bytes).
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency", "iota"}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                "collective-broadcast", "ragged-all-to-all")
_COPIES = ("copy", "transpose", "copy-start", "copy-done", "slice-start", "slice-done",
           "dynamic-update-slice", "dynamic-slice", "slice", "concatenate", "pad", "reshape",
           "broadcast")
_RANDOM = ("rng", "rng-bit-generator", "rng-get-and-update-state")

_SLICES = ("slice", "slice-start", "dynamic-slice")
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e\w+)\[([\d,]*)\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
VECTOR_MEMORY = 1   # a TPU layout's S(1): the chip's on-chip vector memory (XLA's alternate memory)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_CALLS = re.compile(r"\b(?:calls|body|condition|to_apply|branch_computations|"
                    r"true_computation|false_computation)=\{?%?([\w.\-]+(?:,\s*%[\w.\-]+)*)\}?")


def shape_bytes(shape: str, memory_space: Optional[int] = None) -> float:
  """Bytes of every array in an HLO shape string (a tuple's elements summed); with
  `memory_space`, of the arrays whose layout puts them there only (`S(n)`; none is space 0)."""
  total = 0.0
  for dtype, dims, layout in _SHAPE.findall(shape):
    if memory_space is not None:
      space = _MEMORY_SPACE.search(layout)
      if (int(space.group(1)) if space else 0) != memory_space:
        continue
    size = _DTYPE_BYTES.get(dtype, 1)
    for d in filter(None, dims.split(",")):
      size *= int(d)
    total += size
  return total


@dataclasses.dataclass
class Operation:
  name: str
  opcode: str
  shape: str
  operands: List[str]
  op_name: str
  calls: List[str]
  target: str = ""     # a custom call's custom_call_target


@dataclasses.dataclass
class Computation:
  name: str
  is_entry: bool
  operations: List[Operation]


def _operand_names(arguments: str) -> List[str]:
  """The `%name` operands of an instruction: the text up to its closing parenthesis."""
  depth, end = 1, len(arguments)
  for i, ch in enumerate(arguments):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      end = i
      break
  return re.findall(r"%([\w.\-]+)", arguments[:end])


def parse(text: str) -> Dict[str, Computation]:
  """The computations of an HLO module's text, by name."""
  computations: Dict[str, Computation] = {}
  current: Optional[Computation] = None
  for line in text.splitlines():
    if current is None:
      header = _HEADER.match(line)
      if header:
        current = Computation(header.group(2), bool(header.group(1)), [])
      continue
    if line.rstrip() == "}":   # a custom call's backend config may span lines starting with "}"
      computations[current.name] = current
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, opcode, rest = match.groups()
    op_name = _OP_NAME.search(rest)
    calls = [c.strip().lstrip("%") for group in _CALLS.findall(rest) for c in group.split(",")]
    target = _TARGET.search(rest)
    current.operations.append(Operation(name, opcode, shape, _operand_names(rest),
                                        op_name.group(1) if op_name else "", calls,
                                        target.group(1) if target else ""))
  return computations


def _fused_opcodes(computations: Dict[str, Computation], names: List[str]) -> set:
  """Every opcode inside the called (fused) computations, recursively."""
  seen, opcodes, stack = set(), set(), list(names)
  while stack:
    name = stack.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for op in computations[name].operations:
      opcodes.add(op.opcode)
      stack.extend(op.calls)
  return opcodes


def collective_kind(op: Operation, fused: set) -> Optional[str]:
  """The collective an operation is or holds fused inside it (all-gather, all-reduce, ...), or
  None."""
  base = op.opcode.replace("-start", "").replace("-done", "")
  if base in _COLLECTIVES:
    return base
  return next((c for c in _COLLECTIVES if c in fused), None)


def categorize(op: Operation, fused: set) -> str:
  """The category of one top-level operation (see the module docstring). A fusion holding both a
  collective and a dot is a matmul: libtpu fuses an all-gather into the matmul that reads it (a
  collective matmul), and such a fusion's bytes are the matmul's operands and result; its
  collective is still one of `collectives`."""
  opcodes = fused | {op.opcode}
  base = op.opcode.replace("-start", "").replace("-done", "")
  path = op.op_name
  matmul = "dot" in opcodes or "convolution" in opcodes
  if collective_kind(op, fused) and not matmul:
    return "collective"
  if "optimizer_update" in path:
    return "optimizer_update"
  if "Dropout" in path or "threefry" in path or any(r in opcodes for r in _RANDOM):
    return "dropout_rng"
  if re.search(r"/attention/self/(?!query|key|value)", path):
    return "attention"
  if matmul:
    return "matmul"
  if "LayerNorm" in path or "reduce" in opcodes or "reduce-window" in opcodes:
    return "layernorm_reduction"
  if base in _COPIES or (op.opcode == "fusion" and fused and fused <= set(_COPIES) | _FREE):
    return "copy_transpose"
  return "elementwise"


def readable_name(op: Operation) -> str:
  """The meaningful part of an op_name: the module path without the jit/jvp wrappers, e.g.
  'bert/encoder/layer_3/attention/self/dot_general (backward)'."""
  path = op.op_name
  backward = "transpose(" in path
  path = re.sub(r"\b(?:jit|jvp|transpose|remat|checkpoint|vmap)\(([^()]*)\)", r"\1", path)
  path = re.sub(r"\b(?:jit|jvp|transpose|remat|checkpoint|vmap)\(([^()]*)\)", r"\1", path)
  parts = [p for p in path.split("/") if p and p not in ("train_step", "BertForPreTraining")]
  name = "/".join(parts[-6:]) or op.name
  return f"{name} ({op.opcode}{', backward' if backward else ''})"


@functools.lru_cache(maxsize=1)   # `profile` and `vector_memory_bytes` of one module parse it once
def _counted(text: str) -> List[Tuple[Operation, List[str], Dict[str, Operation], set]]:
  """The operations XLA's cost analysis counts, each with the names of the values it reads, the
  operations of its computation by name, and the opcodes fused into it."""
  return _walked(text)[0]


@functools.lru_cache(maxsize=1)
def _walked(text: str):
  """(`_counted`'s operations, the names of the operations inside a loop body)."""
  in_loops: set = set()
  computations = parse(text)
  entry = [c for c in computations.values() if c.is_entry]
  if not entry:
    raise ValueError("no ENTRY computation in the HLO text")
  # The entry's operations, and those of the computations that control flow runs (loop bodies
  # and conditions, conditional branches, calls), once each.
  walked, queue, counted = set(), [(entry[0].name, False)], []
  while queue:
    name, looped = queue.pop()
    if name in walked or name not in computations:
      continue
    walked.add(name)
    if looped:
      in_loops.add(name)
    by_name = {op.name: op for op in computations[name].operations}
    for op in computations[name].operations:
      if op.opcode in ("while", "conditional", "call"):
        queue.extend((called, looped or op.opcode == "while") for called in op.calls)
        continue
      if op.opcode in _FREE or op.opcode.endswith("-start"):
        continue
      operands = op.operands
      if op.opcode.endswith("-done") and operands and operands[0] in by_name:
        # An async pair moves its bytes once: the start's operands in, the done's result out
        # (the start's own result is a tuple holding both, plus a context).
        start = by_name[operands[0]]
        operands, op = start.operands, dataclasses.replace(start, shape=op.shape)
      fused = _fused_opcodes(computations, op.calls) if op.opcode in ("fusion", "async-start",
                                                                       "custom-call") else set()
      counted.append((op, operands, by_name, fused))
  return counted, {op.name for name in in_loops for op in computations[name].operations}


def _moved(op: Operation, operands: List[str], by_name: Dict[str, Operation],
           memory_space: Optional[int] = None) -> float:
  """Bytes an operation reads and writes (in `memory_space` only, if given)."""
  if op.opcode in _SLICES:   # reads only the slice it writes, not its whole operand
    written = shape_bytes(op.shape, memory_space)
    if memory_space is None:
      return 2 * written
    source = by_name.get(operands[0]) if operands else None   # the read is where the source is
    read_here = source is not None and shape_bytes(source.shape, memory_space) > 0
    return written + (shape_bytes(op.shape) if read_here else 0.0)
  return shape_bytes(op.shape, memory_space) + sum(
      shape_bytes(by_name[o].shape, memory_space) for o in operands if o in by_name)


def profile(text: str, top: int = 10) -> Tuple[Dict[str, float], List[Dict]]:
  """(bytes per category, the `top` largest operations) of an optimized HLO module's text."""
  counted = [(_moved(op, operands, by_name), categorize(op, fused), op)
             for op, operands, by_name, fused in _counted(text)]
  totals = collections.OrderedDict((c, 0.0) for c in CATEGORIES)
  for moved, category, _ in counted:
    totals[category] += moved
  largest = sorted(counted, key=lambda item: -item[0])[:top]
  return dict(totals), [{"bytes": moved, "category": category, "name": readable_name(op)}
                        for moved, category, op in largest]


def collectives(text: str) -> List[Dict]:
  """The collectives of an optimized HLO module: {"kind" (all-gather, all-reduce, ...),
  "shape" (the result, per device), "result_bytes", "name" (`readable_name`), "count",
  "in_loop" (inside a loop body, which runs it once per trip: a scan over layers or chunks)},
  alike ones counted together, largest first. A loop body's are listed once, as `profile`
  counts them."""
  found: Dict[Tuple[str, str, str, bool], Dict] = {}
  counted, in_loops = _walked(text)
  for op, _, _, fused in counted:
    kind = collective_kind(op, fused)
    if kind is None:
      continue
    shape = " ".join(dtype + "[" + dims + "]" for dtype, dims, _ in _SHAPE.findall(op.shape))
    # An async pair is counted at its done, which holds the start's name.
    looped = op.name in in_loops
    key = (kind, shape, readable_name(op), looped)
    entry = found.setdefault(key, {"kind": kind, "shape": shape, "name": key[2], "count": 0,
                                   "result_bytes": shape_bytes(op.shape), "in_loop": looped})
    entry["count"] += 1
  return sorted(found.values(), key=lambda e: (-e["result_bytes"] * e["count"], e["name"]))


def vector_memory_bytes(text: str) -> float:
  """Of the bytes `profile` counts, those read from or written to buffers the compiler placed in
  the chip's vector memory (a TPU layout's `S(1)`: XLA's alternate memory, at most 128 MiB on a
  chip). XLA's `bytes accessed` counts them like HBM traffic, so a roofline from it charges them
  at HBM bandwidth: the part of the step's bytes that is not HBM traffic."""
  return sum(_moved(op, operands, by_name, VECTOR_MEMORY)
             for op, operands, by_name, _ in _counted(text))
