"""benchmarks/time_to_quality end to end at toy scale: prepare, both sides, fine-tune, report.

The real benchmark pre-trains BERT-mini (and a ModernBERT-family model of its size) for an hour
per side on ../shared/data; here a few generated documents (written to tmp_path: the shared data
is not on a user's machine), BERT-tiny's shape at seq 32, and one GLUE task of the fixtures with
one seed check that every stage's outputs exist and fit together: each side leaves a held-out
curve on both fixed sets and a checkpoint that bert_jax loads and fine-tunes, and the table and
plot are written, naming the side not run. BERT's side runs a fixed few steps; the modern side
runs on a budget of seconds with its calibration, and resumes exactly from a checkpoint on the
batch ramp (all three the slow tier). The pieces with logic of their own (documents from the two
text formats, the step count from a calibration, the modern plan through the ramp, the sides to
fine-tune) are checked directly, in the fast tier.
"""
import argparse
import json
import os
import shutil

import numpy as np
import pytest

from benchmarks import time_to_quality as ttq
from bert_jax.io import checkpoints
from bert_jax.families.modernbert import config as modern_config
from tests import ttq_fixtures
from tests.ttq_fixtures import FINETUNE, FLAGS, MODERN

def test_documents_from_both_formats(tmp_path):
  text_dir = ttq_fixtures.write_texts(tmp_path / "text")
  docs = list(ttq.text_documents(text_dir, sentences_per_document=8))
  book = [d for d in docs if not d[0][0].isupper()]
  play = [d for d in docs if d[0][0].isupper()]
  # 12 chapters of 12 sentences: each chapter heading ends a document (8 + 4 sentences).
  assert sorted({len(d) for d in book}) == [4, 8] and len(book) == 24
  assert not any(s.startswith("[") or s.startswith("Chapter") for d in docs for s in d)
  assert not any(s.startswith("Speaker") for d in play for s in d)   # speaker lines dropped
  assert sum(len(d) for d in play) == 120


def test_calibration_sets_the_steps_that_fill_the_budget():
  calibration = ttq.Calibration.from_windows([(10, 25.0), (10, 20.0), (10, 20.0)])
  assert calibration.steps_per_sec == pytest.approx(0.5)
  assert calibration.startup_seconds == pytest.approx(5.0)
  assert calibration.steps_for(3600.0) == int((3600 - 5) * 0.5)


def test_modern_plan_trains_the_budgets_tokens_through_the_ramp():
  args = argparse.Namespace(budget_minutes=60.0, max_steps=0, batch=64, batch_warmup_start=16,
                            batch_warmup_fraction=0.1, warmup_proportion=0.05,
                            decay_fraction=0.2, log_every=20, eval_every_minutes=3.0,
                            checkpoint_every_minutes=5.0)
  calibration = ttq.Calibration(0.5, 30.0, ())
  plan = ttq.make_plan(args, "bert_jax_modern", calibration, seq=128)
  # 4 batch sizes on the ramp: the step compiles 3 more times, each charged the start-up.
  full = int((3600 - 4 * 30) * 0.5)                   # steps of 64 rows that fill the budget
  assert plan.sequences() >= full * 64 > plan.sequences(plan.num_train_steps - 1)
  ramp = plan.ramp()
  assert ramp.tokens == pytest.approx(0.1 * full * 64 * 128)
  assert [ramp.rows(0), ramp.rows(plan.num_train_steps - 1)] == [16, 64]
  assert plan.sequences(plan.warmup_steps) >= 0.05 * full * 64 > plan.sequences(
      plan.warmup_steps - 1)
  assert plan.decay_steps == round(0.2 * plan.num_train_steps)
  # Evaluations and checkpoints about every 3 and 5 minutes, at training lines.
  assert plan.eval_every_steps % 20 == 0 and plan.checkpoint_every_steps % 20 == 0
  bert = ttq.make_plan(args, "bert_jax", calibration, seq=128)
  assert bert.num_train_steps == int((3600 - 30) * 0.5) and bert.ramp() is None
  assert bert.decay_steps == 0 and bert.warmup_steps == round(0.05 * bert.num_train_steps)
  assert bert.eval_every_steps == 80 and bert.checkpoint_every_steps == 160   # 4.5, 7.5 lines
  with pytest.raises(ValueError, match="batch_warmup_start"):
    ttq.make_plan(argparse.Namespace(**dict(vars(args), batch_warmup_start=24)),
                  "bert_jax_modern", calibration, seq=128)


def test_modern_shape_matches_berts_mlp_weights():
  assert modern_config.glu_width(1024) == 704 and modern_config.glu_width(512) == 320
  assert ttq.modern_max_predictions(0.30, 128) == 40
  assert ttq.modern_max_predictions(0.30, 32) == 16


def test_a_model_with_the_nsp_head_scores_rows_without_nsp_labels():
  """BERT's model on the text set, or on the demo twin's documents as sequences (demo_pair's
  cross scores): the masked-LM metrics alone, the same as on the rows with their NSP labels."""
  from benchmarks import bench_util
  from bert_jax.tasks import registry
  from experiments import pretrain_demo
  config = pretrain_demo.get_config("quick")
  job = registry.job(config)   # the shapes only: nothing is built
  params = job.init_state().params
  score = ttq.scorer(job.model, config.objective)
  labelled = bench_util.mlm_batch(4, 64, 10, config.model.vocab_size, pairs=True)
  plain = {k: v for k, v in labelled.items() if k != "next_sentence_labels"}
  # One document a row: attention and positions as in the plain row.
  packed = dict(plain, sequence_ids=np.ones((4, 64), np.int32),
                position_ids=np.tile(np.arange(64, dtype=np.int32), (4, 1)))
  expected = score(params, [labelled])
  assert {"nsp_loss", "nsp_accuracy"} < set(expected) and expected["mlm_loss"] > 0
  for batch in (plain, packed):
    metrics = score(params, [batch])
    assert set(metrics) == {"loss", "mlm_loss", "mlm_accuracy"}
    assert metrics["mlm_loss"] == pytest.approx(expected["mlm_loss"], rel=1e-5)
    assert metrics["mlm_accuracy"] == pytest.approx(expected["mlm_accuracy"])


def test_last_within_picks_the_last_evaluation_inside_the_budget():
  curve = [dict(seconds=s, pairs_mlm_loss=10.0 - s / 100) for s in (100.0, 3500.0, 3600.0,
                                                                    3700.0)]
  assert ttq.last_within(curve, 3600.0)["seconds"] == 3600.0
  assert ttq.last_within(curve, 3599.0)["seconds"] == 3500.0
  assert ttq.last_within(curve, 50.0) is None


def test_finetune_takes_the_sides_that_finished_pretraining(tmp_path):
  ttq.write_json(str(tmp_path / "bert_jax" / "summary.json"), {})
  os.makedirs(tmp_path / "bert_jax_modern" / "workdir")      # started, not finished
  args = ttq.parse_args(["--finetune", f"--out={tmp_path}"])
  assert ttq.pretrained_sides(args) == ["bert_jax"]
  args.ft_sides = "bert_jax_modern"
  with pytest.raises(ValueError, match="--side=bert_jax_modern"):
    ttq.pretrained_sides(args)
  args.ft_sides = "hf_modern"   # the Trainer sides' code left the tree
  with pytest.raises(ValueError, match="the sides: bert_jax, bert_jax_modern"):
    ttq.pretrained_sides(args)


def test_the_plot_goes_to_out_unless_named(tmp_path):
  # A stage run on one side must not overwrite the committed plot of both.
  args = ttq.parse_args(["--finetune", f"--out={tmp_path}"])
  assert args.plot == str(tmp_path / "time_to_quality.png")
  args = ttq.parse_args(["--report", f"--out={tmp_path}", "--plot=elsewhere.png"])
  assert args.plot == "elsewhere.png"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
  return ttq_fixtures.prepare_tiny(tmp_path_factory.mktemp("ttq_data"))


def _out_with_data(tiny_data, tmp_path) -> str:
  out = str(tmp_path / "out")
  shutil.copytree(tiny_data["data"], os.path.join(out, "data"))
  return out


def _curve(out: str, side: str):
  return ttq.read_json(os.path.join(out, side, "curve.jsonl"))


def _check_side(out: str, side: str, summary: dict) -> None:
  """Both held-out sets scored all along (NSP on the pairs for BERT's model alone); the saved
  checkpoint scores as the loop's last evaluation and loads as a pre-trained model."""
  curve = _curve(out, side)
  assert curve[-1]["step"] == summary["steps"] and curve[-1] == summary["final"], side
  assert [r["seconds"] for r in curve] == sorted(r["seconds"] for r in curve) and all(
      r["seconds"] > 0 for r in curve), side
  for eval_set in ttq.EVAL_SETS:
    assert all(np.isfinite(r[f"{eval_set}_mlm_loss"]) for r in curve), side
  assert all(("pairs_nsp_accuracy" in r) == (side == "bert_jax") and "text_nsp_accuracy" not in r
             for r in curve), side
  for name, value in summary["checkpoint_check"].items():
    assert value == pytest.approx(summary["final"][name], rel=1e-5, abs=1e-6), (side, name)
  config, params = checkpoints.load_pretrained(os.path.join(out, side, "workdir"))
  assert config.vocab_size == ttq.read_data_info(out)["vocab_size"] and "cls" in params, side


@pytest.mark.slow
def test_end_to_end_tiny(tiny_data, tmp_path):
  out = _out_with_data(tiny_data, tmp_path)
  plot = str(tmp_path / "curve.png")
  flags = FLAGS + [f"--out={out}", f"--plot={plot}"]
  info = ttq.read_data_info(out)
  assert info["instances"]["train"] > 8 and info["eval_batches"] == 1
  assert info["documents"]["train"].get("python_docs", 0) + info["documents"]["eval"].get(
      "python_docs", 0) == 3
  # The contiguous-text part: the same documents as full rows, no NSP labels, the held-out rows
  # masked at 15% as the pairs are.
  part = info["contiguous"]
  assert part["instances"]["train"] > 8 and part["eval_batches"] >= 1
  assert part["mean_train_length"] > 0.8 * 32                 # full rows but each pass's last
  # The modern side trains on documents as sequences unless told contiguous.
  from data_pipelines import input_pipeline
  assert info["documents_rows"]["instances"]["train"] > 8
  for instances in ("documents", "contiguous"):
    given = [f"--modern_instances={instances}"] if instances == "contiguous" else []
    config = ttq.modern_config(ttq.parse_args(flags + ["--side=bert_jax_modern"] + given), info)
    assert config.data.instances == instances
    assert input_pipeline.instance_form(config.data.input_files) == instances
  with pytest.raises(SystemExit):
    ttq.parse_args(flags + ["--side=bert_jax_modern", "--modern_instances=pairs"])
  sets = ttq.load_eval_sets(out)
  assert "next_sentence_labels" not in sets["text"][0]
  masked = sum(b["masked_lm_weights"].sum() for b in sets["text"])
  assert masked / sum(b["input_mask"].sum() for b in sets["text"]) == pytest.approx(0.15, abs=0.04)

  # A fixed few steps (1 step/s assumed): evaluations every 2 steps (a multiple of --log_every),
  # checkpoints every 2.
  done = ttq.main(flags + ["--side=bert_jax", "--max_steps=4", "--eval_every_minutes=0.0001",
                           "--checkpoint_every_minutes=0.034"])
  assert [r["step"] for r in _curve(out, "bert_jax")] == [2, 4]
  _check_side(out, "bert_jax", done["bert_jax"])

  result = ttq.main(flags + ["--finetune", f"--glue_dir={tiny_data['glue_dir']}"]
                    + FINETUNE)["report"]
  assert set(result["finetune"]) == set(result["average"]) == {"bert_jax"}
  with open(os.path.join(out, "time_to_quality.md")) as f:
    table = f.read()
  assert "| RTE | accuracy |" in table and "**average**" in table
  assert "| bert_jax_modern | modern | not run |" in table
  assert "Not fine-tuned yet: bert_jax_modern." in table and "not yet measured" in table
  with open(os.path.join(out, "time_to_quality.json")) as f:
    assert json.load(f)["pretraining"]["bert_jax"]["steps"] == 4
  assert os.path.getsize(plot) > 0


@pytest.mark.slow
def test_modern_side_on_a_budget_of_seconds(tiny_data, tmp_path):
  """The modern side as the benchmark runs it (calibration, plan, training on the ramp,
  evaluation on both sets, the final checkpoint), then fine-tuned, then the report."""
  out = _out_with_data(tiny_data, tmp_path)
  flags = FLAGS + MODERN + [f"--out={out}"]
  done = ttq.main(flags + ["--side=bert_jax_modern", "--budget_minutes=0.4",
                           "--calibration_steps=2", "--eval_every_minutes=0.05",
                           "--checkpoint_every_minutes=0.1"])
  summary = done["bert_jax_modern"]
  plan = ttq.Plan.from_json(summary["plan"])
  assert plan.calibration.steps_per_sec > 0 and len(plan.calibration.windows) == 3
  assert plan.batch_warmup_start == 2 and plan.decay_steps >= 0
  assert summary["sequences"] == plan.sequences() <= 8 * plan.num_train_steps
  _check_side(out, "bert_jax_modern", summary)
  config, _ = checkpoints.load_pretrained(os.path.join(out, "bert_jax_modern", "workdir"))
  assert config.architecture == "modernbert" and config.local_attention == 16
  # BERT-tiny's I: 512
  assert config.intermediate_size == modern_config.glu_width(512) == 320
  assert config.classifier_pooling == "mean"

  result = ttq.main(flags + ["--finetune", f"--glue_dir={tiny_data['glue_dir']}"]
                    + FINETUNE)["report"]
  assert set(result["average"]) == {"bert_jax_modern"}
  with open(os.path.join(out, "time_to_quality.md")) as f:
    table = f.read()
  assert "| bert_jax | bert | not run |" in table and "| RTE | accuracy |" in table
  assert os.path.getsize(os.path.join(out, "time_to_quality.png")) > 0


@pytest.mark.slow
def test_modern_side_resumes_on_the_ramp(tiny_data, tmp_path):
  """Killed after its checkpoint at step 4 (ModernBERT's ramp, the batch still rising: 2, 2, 4,
  6 | 6, 8, 8, 8 rows) and run again, the modern side ends exactly as the uninterrupted run (the
  same held-out curve)."""
  out = _out_with_data(tiny_data, tmp_path)
  side = "bert_jax_modern"
  command = FLAGS + MODERN + [f"--out={out}", f"--side={side}", "--max_steps=8",
                              "--eval_every_minutes=0.0001", "--checkpoint_every_minutes=0.067"]
  ttq.main(command)   # 1 step/s assumed: checkpoints every 4 steps
  plan = ttq.Plan.from_json(ttq.read_json(os.path.join(out, side, "plan.json")))
  assert [plan.ramp().rows(s) for s in range(8)] == [2, 2, 4, 6, 6, 8, 8, 8]
  whole = _curve(out, side)
  os.remove(os.path.join(out, side, "summary.json"))
  folder = os.path.join(out, side, "workdir", "checkpoints")
  for name in os.listdir(folder):
    if name.isdigit() and int(name) > 4:
      shutil.rmtree(os.path.join(folder, name))
  ttq.main(command)
  resumed = _curve(out, side)
  assert [r["step"] for r in resumed] == [r["step"] for r in whole]
  for before, after in zip(whole, resumed):
    for name in ("pairs_mlm_loss", "text_mlm_loss", "text_mlm_accuracy"):
      assert after[name] == pytest.approx(before[name], rel=1e-5, abs=1e-6), after
