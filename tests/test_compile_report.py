"""`--compile_for`: the pre-training steps compiled by the real TPU compiler for TPU slices,
without a TPU (libtpu, a test dependency through `jax[tpu]`)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.parallel import topologies
from experiments import pretraining_defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_accelerator_types_map_to_cloud_tpu_slices():
  table = {"v4-8": ("v4:2x2x1", 4, 1), "v4-32": ("v4:2x2x4", 16, 4),
           "v4-128": ("v4:4x4x4", 64, 16), "v5p-8": ("v5:2x2x1", 4, 1),
           "v5litepod-4": ("v5e:2x2", 4, 1), "v5litepod-8": ("v5e:2x4", 8, 1),
           "v5e-16": ("v5e:4x4", 16, 4), "v5litepod-256": ("v5e:16x16", 256, 64),
           "v6e-8": ("v6e:2x4", 8, 1)}
  for name, (topology, chips, hosts) in table.items():
    spec = topologies.parse(name)
    assert (spec.topology_name, spec.chips, spec.num_hosts) == (topology, chips, hosts), name
  with pytest.raises(ValueError, match="Unknown accelerator type 'v9-8'"):
    topologies.parse("v9-8")
  with pytest.raises(ValueError, match="TensorCores"):
    topologies.parse("v4-5")


def _tiny(**overrides):
  c = pretraining_defaults.get_config("tiny")
  # Wide enough for the matmuls to dominate, as the analytic count assumes (at H=64 the
  # elementwise work XLA counts is 16% on top; at H=256, 4-7%).
  c.model.update(vocab_size=1024, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                 num_hidden_layers=2, max_position_embeddings=128, dtype="bfloat16")
  c.max_seq_length, c.max_predictions_per_seq = 128, 20
  c.global_batch_size, c.eval_batch_size = 32, 16
  for key, value in overrides.items():
    c[key] = value
  return c


@pytest.fixture(scope="module")
def compile_report():
  pytest.importorskip("libtpu", reason="the TPU compiler comes with pip install 'jax[tpu]'")
  from bert_jax.tasks.tools import compile_report as module
  return module


@pytest.mark.parametrize("accelerator, model_parallelism, hosts",
                         [("v5litepod-4", 2, 1), ("v4-32", 2, 4)])
@pytest.mark.slow
def test_tiny_pretraining_step_compiles_for_a_slice(compile_report, tmp_path, accelerator,
                                                    model_parallelism, hosts):
  config = _tiny(model_parallelism=model_parallelism,
                 global_batch_size=8 * topologies.parse(accelerator).chips // model_parallelism)
  report = compile_report.run(config, str(tmp_path), accelerator)
  assert report["num_hosts"] == hosts and report["num_devices"] == topologies.parse(
      accelerator).chips
  assert report["mesh"] == {"data": report["num_devices"] // model_parallelism,
                            "model": model_parallelism}
  assert report["fits"] and report["eval_step"]["fits"]
  memory = report["memory_per_device"]
  assert 0 < memory["argument_bytes"] <= memory["total_bytes"] < report["device_memory_bytes"]
  # XLA's count of the whole step against the analytic one (within 10%).
  assert report["flops_per_step"] == pytest.approx(report["model_flops_per_step"], rel=0.10)
  assert 0 < report["estimated_mfu"] <= 1 and report["roofline_step_seconds"] > 0
  written = json.load(open(tmp_path / "compile_report.json", encoding="utf-8"))
  assert written["topology"] == accelerator and written["fits"]
  # Where the bytes go: the categories add up to XLA's own count (within 5%), and each part of
  # the step shows where it should.
  categories = report["bytes_by_category"]
  # The re-count of the operations is not XLA's cost model: with tensor parallelism it finds ~81%
  # of XLA's bytes on this tiny step (data parallelism alone: 92-95%, the test below).
  assert sum(categories.values()) == pytest.approx(report["bytes_accessed_per_device"], rel=0.25)
  for name in ("matmul", "attention", "dropout_rng", "optimizer_update", "collective"):
    assert categories[name] > 0, name
  top = report["top_operations"]
  assert len(top) == 10 and [op["bytes"] for op in top] == sorted(
      (op["bytes"] for op in top), reverse=True)
  assert all(op["category"] in categories and op["name"] for op in top)


@pytest.mark.slow
def test_without_dropout_the_random_bits_leave_the_profile(compile_report, tmp_path):
  config = _tiny(global_batch_size=32)
  config.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  report = compile_report.run(config, str(tmp_path), "v5litepod-4")
  categories = report["bytes_by_category"]
  assert categories["dropout_rng"] < 0.01 * sum(categories.values())
  assert sum(categories.values()) == pytest.approx(report["bytes_accessed_per_device"], rel=0.10)


def test_a_packed_pretraining_step_compiles_with_an_unpacked_evaluation(compile_report, tmp_path):
  # Packing changes the training batch (K NSP slots per row); evaluation stays unpacked.
  config = _tiny(global_batch_size=16)
  config.model.update(hidden_size=64, intermediate_size=128)
  config.data.packing, config.data.max_pairs_per_row = True, 4
  report = compile_report.run(config, str(tmp_path), "v5litepod-4")
  assert report["fits"] and report["eval_step"]["fits"]
  # Some of the step's buffers live in on-chip vector memory: a part of the re-counted bytes.
  vector_memory = report["vector_memory_bytes_per_device"]
  assert 0 < vector_memory < sum(report["bytes_by_category"].values())


@pytest.mark.slow
def test_an_oversized_batch_reports_fits_false(compile_report, tmp_path):
  config = pretraining_defaults.get_config("large")
  config.model.update(dtype="bfloat16", scan_layers=True)
  config.max_seq_length, config.max_predictions_per_seq = 512, 80
  config.global_batch_size, config.eval_batch_size = 4096, 8
  report = compile_report.run(config, str(tmp_path), "v5litepod-4")
  assert report["fits"] is False
  assert report["over_by_bytes"] > 0
  assert "memory_per_device" not in report or report["memory_per_device"]["total_bytes"] > (
      report["device_memory_bytes"])


def test_compile_for_from_the_command_line(compile_report, tmp_path):
  workdir = str(tmp_path / "aot")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.main",
       f"--config={os.path.join(ROOT, 'experiments/pretrain_demo.py')}:quick",
       f"--workdir={workdir}", "--compile_for=v5litepod-4", "--config.model.dtype=bfloat16"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "v5litepod-4 (v5e:2x2, 4 x TPU v5 lite" in result.stdout
  report = json.load(open(os.path.join(workdir, "compile_report.json"), encoding="utf-8"))
  assert report["fits"] and report["num_devices"] == 4
  assert not os.path.exists(os.path.join(workdir, "checkpoints")), "compiled, never trained"


@pytest.mark.parametrize("accelerator, hosts", [("v5litepod-4", 1), ("v4-32", 4)])
def test_fine_tuning_step_compiles_for_a_slice(compile_report, tmp_path, accelerator, hosts):
  """GLUE MRPC from a (tiny) checkpoint, model_parallelism=2: the step fine-tuning would run."""
  from experiments import glue as glue_experiment
  from tests import finetuning_fixtures as ftx
  config = glue_experiment.get_config("task=mrpc,quick")
  config.init_checkpoint = ftx.write_checkpoint(str(tmp_path / "ckpt"))
  config.data.glue_dir = ftx.write_glue_dir(str(tmp_path / "glue"))
  config.max_seq_length, config.model_parallelism = 16, 2
  config.global_batch_size = config.eval_batch_size = 4 * topologies.parse(accelerator).chips
  report = compile_report.run(config, str(tmp_path / "aot"), accelerator)
  assert report["num_hosts"] == hosts and report["mesh"]["model"] == 2
  assert report["fits"] and report["eval_step"]["fits"]
  assert report["flops_per_step"] > 0 and report["model_flops_per_step"] > 0


def test_compile_for_the_feature_based_job(compile_report, tmp_path):
  """config.task=ner_feature_based: the BiLSTM tagger's step of the first layer choice, from the
  registry's job like every other, on zero features of the training sentences' shapes (the
  frozen encoder is not run: nothing extracted, nothing trained)."""
  from experiments import ner_feature_based
  from tests import finetuning_fixtures as ftx
  config = ner_feature_based.get_config("quick")
  config.init_checkpoint = ftx.write_checkpoint(str(tmp_path / "ckpt"), num_hidden_layers=4)
  config.layer_choices = ("concat_last_four", "last")
  workdir = tmp_path / "aot"
  report = compile_report.run(config, str(workdir), "v5litepod-4")
  assert report["num_devices"] == 4 and report["global_batch_size"] == 4
  assert report["fits"] and report["eval_step"]["fits"]
  assert report["flops_per_step"] > 0 and report["bytes_by_category"]["matmul"] > 0
  assert json.load(open(workdir / "compile_report.json", encoding="utf-8"))["fits"]
  assert sorted(os.listdir(workdir)) == ["compile_report.json"]


def test_a_task_of_several_jobs_is_refused_at_once(compile_report, tmp_path):
  config = _tiny()
  config.task = "glue_all"
  with pytest.raises(ValueError, match="config.task='glue_all' has no single job"):
    compile_report.run(config, str(tmp_path), "v5litepod-4")


@pytest.mark.slow
def test_scanned_layers_cost_is_the_unrolled_steps(compile_report, tmp_path):
  """XLA counts a scanned layer once; the report's FLOPs for a scan over 4 layers come from the
  step unrolled at 1 and 2 layers and match the 4-layer step compiled unrolled."""
  reports = {}
  for scan in (False, True):
    config = _tiny(global_batch_size=16)
    config.model.update(num_hidden_layers=4, scan_layers=scan)
    reports[scan] = compile_report.run(config, str(tmp_path / str(scan)), "v5litepod-4")
  assert "cost_analysis" in reports[True] and "cost_analysis" not in reports[False]
  assert reports[True]["flops_per_step"] == pytest.approx(reports[False]["flops_per_step"],
                                                          rel=0.01)
  assert reports[True]["bytes_accessed_per_device"] == pytest.approx(
      reports[False]["bytes_accessed_per_device"], rel=0.10)


def _search(compile_report, monkeypatch, memory, usable, missed_by_the_error=0,
            says_usable=True):
  """find_max_batch against a stand-in compiler: a batch fits when memory(batch) <= usable; a
  failure reports what the compiler's error gives (required bytes, less `missed_by_the_error`,
  and the usable bytes unless not `says_usable`; no memory analysis). Returns (the largest batch
  found, the largest that fits, the batches compiled)."""
  unit = 4
  compiled = []

  def report(self, global_batch, scanned_cost=True):
    del self, scanned_cost
    compiled.append(global_batch)
    total = memory(global_batch)
    if total <= usable:
      return {"fits": True, "memory_per_device": {"total_bytes": total},
              "eval_step": {"fits": True}, "global_batch_size": global_batch}
    return {"fits": False, "required_bytes": total - missed_by_the_error,
            "available_bytes": usable if says_usable else None,
            "eval_step": {"fits": True}, "global_batch_size": global_batch}

  monkeypatch.setattr(compile_report._Compiler, "report", report)
  target = compile_report._Target(
      "v5litepod-4", topologies.parse("v5litepod-4"),
      type("Par", (), {"mesh": type("Mesh", (), {"shape": {"data": unit, "model": 1}})()})())
  best = compile_report.find_max_batch(_tiny(global_batch_size=32), target)
  largest = max(b for b in range(unit, 8192, unit) if memory(b) <= usable)
  return best["max_global_batch_size"], largest, compiled


def test_max_batch_search_lands_on_the_boundary(compile_report, monkeypatch):
  """Memory affine in the batch with a step (as when XLA changes a layout): the largest
  fitting batch, in a few compiles."""
  memory = lambda batch: 2 ** 30 + batch * 37_000_000 + (2 ** 29 if batch > 900 else 0)
  found, largest, compiled = _search(compile_report, monkeypatch, memory, 16 * 2 ** 30)
  assert found == largest
  assert len(compiled) <= 8, compiled          # doubling then bisection would take ~14


def test_max_batch_search_uses_the_hbm_the_compiler_calls_usable(compile_report, monkeypatch):
  """As on v4: the compiler's usable HBM is below the chip's 16 GiB (here 15.75), so a line to
  the chip's capacity overshoots; the search reads the usable figure from the first failure
  (it used to step down one unit a compile: 18 compiles here). When a failure's figure
  understates what it needed (below the usable HBM though it did not fit), it bisects."""
  memory = lambda batch: 2 ** 30 + batch * 5_000_000
  found, largest, compiled = _search(compile_report, monkeypatch, memory, int(15.75 * 2 ** 30))
  assert found == largest and len(compiled) <= 6, compiled
  found, largest, compiled = _search(compile_report, monkeypatch, memory, int(15.75 * 2 ** 30),
                                     missed_by_the_error=2 ** 29)
  assert found == largest and len(compiled) <= 6, compiled
  # No usable figure: the line to the chip's 16 GiB says the failed batch fits, so it bisects
  # (4 + log2 of the bracket's 549 units; stepping down one unit a compile took 18).
  found, largest, compiled = _search(compile_report, monkeypatch, memory, int(15.75 * 2 ** 30),
                                     says_usable=False)
  assert found == largest and len(compiled) <= 14, compiled


def test_a_batch_warm_up_compiles_the_step_after_the_ramp_and_searches_the_plain_step(
    compile_report, monkeypatch, tmp_path):
  """With config.batch_warmup on, --compile_for compiles the step of the final batch (its
  micro-batches accumulated) and says so; --find_max_batch searches with the warm-up off (its
  steps hold one micro-batch at once) and says so; a global batch that is not a whole number
  of micro-batches is refused by name before anything compiles (it used to die in the trace)."""
  seen = []

  def report(self, global_batch, scanned_cost=True):
    del scanned_cost
    seen.append((global_batch, self.config.batch_warmup.start_batch_size))
    memory = {"total_bytes": global_batch, "argument_bytes": 0, "temp_bytes": global_batch}
    return {"fits": global_batch <= 64, "memory_per_device": memory, "compile_seconds": 0,
            "eval_step": {"fits": True, "compile_seconds": 0}, "global_batch_size": global_batch,
            "topology": "v5litepod-4", "topology_name": "v5e:2x2", "num_devices": 4,
            "device_kind": "TPU v5 lite", "num_hosts": 1, "mesh": {"data": 4},
            "device_memory_bytes": 2 ** 34}

  monkeypatch.setattr(compile_report._Compiler, "report", report)
  config = _tiny(global_batch_size=32)
  config.batch_warmup.update(start_batch_size=8, tokens=1e6)
  one = compile_report.run(config, str(tmp_path / "one"), "v5litepod-4")
  assert seen == [(32, 8)]
  assert one["batch_warmup"].startswith("the step after the ramp: 4 micro-batches of 8 rows")
  seen.clear()
  searched = compile_report.run(config, str(tmp_path / "search"), "v5litepod-4",
                                search_batch=True)
  assert searched["max_global_batch_size"] == 64
  assert {start for _, start in seen} == {0}
  assert searched["batch_warmup"].startswith("off for the search")
  config.global_batch_size = 36
  seen.clear()
  with pytest.raises(ValueError, match=r"start_batch_size=8, config.global_batch_size=36"):
    compile_report.run(config, str(tmp_path / "bad"), "v5litepod-4")
  assert not seen


def test_an_out_of_memory_error_gives_required_and_usable_bytes(compile_report):
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
             "temporaries (21.30G) exceeds available HBM (15.75G).\nmore")
  args = jax.ShapeDtypeStruct((4, 1024), np.float32,
                              sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  verdict = compile_report._out_of_memory(message, (args, {"b": args}))
  assert verdict["required_bytes"] == int(21.30 * 2 ** 30) + 2 * 4 * 1024 * 4
  assert verdict["available_bytes"] == int(15.75 * 2 ** 30)
  assert verdict["error"].endswith("(15.75G).") and not verdict["fits"]


def test_the_benchmark_table_pairs_each_search_and_phase_with_its_layer_form():
  from benchmarks import tpu_aot

  def row(seq, scan, remat, fits, batch=256, largest=None, step=0.1):
    return dict(size="large", seq=seq, packing=False, topology="v5litepod-8", num_devices=8,
                scan_layers=scan, remat=remat, global_batch_size=batch, fits=fits,
                max_global_batch_size=largest, over_by_bytes=0 if fits else 2 ** 31,
                gib_per_device=7.5 if fits else None, flops_per_step=1.0,
                model_flops_per_step=1.0, roofline_step_seconds=step if fits else None,
                roofline_bound="memory", estimated_mfu=0.3 if fits else None)
  rows = [row(128, True, False, True, step=0.1), row(512, True, False, False),
          row(512, True, True, True, step=0.5),
          row(512, True, False, True, batch=48, largest=48)]
  table = tpu_aot.markdown_tables(rows)
  lines = {line.split(" | ")[4]: line for line in table.splitlines()
           if line.startswith("| large | 512")}
  assert lines["scanned"].endswith("| 48 |")              # the search ran without remat
  assert lines["scanned + remat"].endswith("| - |")
  # The recipe takes the seq-512 phase in the form that fits: 1M x (0.9 x 0.1 s + 0.1 x 0.5 s).
  recipe = [line for line in table.splitlines() if line.startswith("| large | off")]
  assert recipe == ["| large | off | v5litepod-8 (8) | 1.62 | 311 | scanned / scanned + remat |"]
