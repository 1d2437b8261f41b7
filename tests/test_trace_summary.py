"""benchmarks/trace_summary.py on a small synthetic Perfetto trace."""
import gzip
import json

import pytest

from benchmarks import trace_summary


def _trace(path):
  meta = lambda pid, tid, what, name: {"ph": "M", "pid": pid, "tid": tid, "name": what,
                                       "args": {"name": name}}
  kernel = lambda name, ts, dur, tid=7: {"ph": "X", "pid": 1, "tid": tid, "name": name,
                                         "ts": ts, "dur": dur}
  events = [meta(1, 0, "process_name", "/device:GPU:0"), meta(1, 7, "thread_name", "Stream #7"),
            meta(1, 8, "thread_name", "XLA Ops"), meta(2, 0, "process_name", "/host:CPU"),
            kernel("nvjet_sm90_tst_128x128", 0, 600), kernel("loop_multiply_fusion_2", 600, 300),
            kernel("input_reduce_fusion_1", 900, 100), kernel("nvjet_sm90_tst_128x128", 1000, 600),
            kernel("fusion_3", 1600, 400), kernel("op-level row, not a kernel", 0, 5000, tid=8),
            {"ph": "X", "pid": 2, "tid": 0, "name": "host work", "ts": 0, "dur": 9000}]
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)


def test_summary_counts_device_stream_kernels_per_step_by_kind(tmp_path):
  _trace(tmp_path / "perfetto_trace.json.gz")
  kernels = trace_summary.device_kernels(trace_summary.load_trace(str(tmp_path)))
  assert len(kernels) == 5                    # not the op-level row, not the host
  text = trace_summary.summarize(kernels, steps=2, top=3)
  assert "kernel time 1.00 ms/step, span 1.00 ms/step" in text
  assert "matmul           0.60 ms/step   60.0%" in text
  assert "elementwise      0.35 ms/step   35.0%" in text
  assert "reduction        0.05 ms/step    5.0%" in text
  assert text.splitlines()[-3].split() == ["0.600", "1.0", "matmul", "nvjet_sm90_tst_128x128"]


@pytest.mark.parametrize("name, kind", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
    ("void cudnn::fusion::fmha_dbias<true>(void const*)", "attention"),
    ("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT", "matmul"),
    ("loop_add_fusion_43", "elementwise")])
def test_cudnn_attention_kernels_are_attention_not_matmul(name, kind):
  assert trace_summary.kind_of(name) == kind


def test_a_trace_without_device_kernels_names_its_threads(tmp_path):
  path = tmp_path / "t.json"
  path.write_text(json.dumps({"traceEvents": [
      {"ph": "M", "pid": 2, "tid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
      {"ph": "M", "pid": 2, "tid": 1, "name": "thread_name", "args": {"name": "python"}}]}))
  with pytest.raises(ValueError, match="/host:CPU/python"):
    trace_summary.device_kernels(trace_summary.load_trace(str(path)))
