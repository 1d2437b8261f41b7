"""Every pre-training experiment file's `quick` variant runs the real configuration end to end:
the demo corpus, phase 1 then phase 2 initialised from phase 1's workdir, LAMB with gradient
accumulation, and the left-to-right ablation."""
import importlib
import os

import pytest

from bert_jax.tasks import registry
from bert_jax.runtime.metric_writers import read_metrics


def _config(name, arg="quick"):
  return importlib.import_module(f"experiments.{name}").get_config(arg)


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
  """The quick variants' data (the demo corpus, built once) in a workdir to link from."""
  workdir = tmp_path_factory.mktemp("demo")
  config = _config("pretrain_demo")
  config.num_train_steps = 2
  config.eval_every_steps = 0
  registry.run_job(config, str(workdir))
  assert os.path.exists(workdir / "data" / "DONE")
  return workdir / "data"


def _run(config, workdir, data):
  os.makedirs(workdir, exist_ok=True)
  os.symlink(data, os.path.join(workdir, "data"))  # reused: the DONE marker is there
  result = registry.run_job(config, str(workdir))
  train = read_metrics(str(workdir), "train")
  assert train and train[-1]["step"] == config.num_train_steps
  assert all(r["loss"] == r["loss"] for r in train), "finite losses"
  return result


def test_demo_builds_its_corpus_and_vocabulary(demo_data):
  vocab = (demo_data / "vocab.txt").read_text().splitlines()
  assert vocab[0] == "[PAD]" and "[MASK]" in vocab and len(vocab) <= 800
  assert (demo_data / "train.tfrecord").stat().st_size > 10_000


@pytest.mark.slow
def test_base_phase_1_then_phase_2_from_its_workdir(demo_data, tmp_path):
  phase1 = _config("pretrain_bert_base", "phase=1,quick")
  result = _run(phase1, tmp_path / "p1", demo_data)
  assert "eval_mlm_accuracy" in result
  phase2 = _config("pretrain_bert_base", "phase=2,quick")
  assert phase2.max_predictions_per_seq >= phase1.max_predictions_per_seq
  phase2.init_checkpoint = str(tmp_path / "p1")
  _run(phase2, tmp_path / "p2", demo_data)


def test_large_config_is_the_paper_size():
  model = _config("pretrain_bert_large", "phase=1").model
  assert (model.num_hidden_layers, model.hidden_size, model.num_attention_heads) == (24, 1024, 16)
  assert _config("pretrain_bert_large", "phase=2").max_seq_length == 512
  # bfloat16 compute on the accelerators these recipes are for; the CPU quick runs stay float32.
  assert model.dtype == _config("pretrain_bert_base", "phase=2").model.dtype == "bfloat16"
  assert _config("pretrain_bert_base", "phase=1,quick").model.dtype == "float32"


def test_lamb_large_batch_with_accumulation(demo_data, tmp_path):
  config = _config("pretrain_lamb_large_batch", "phase=1,quick")
  assert config.optimizer.name == "lamb" and config.grad_accum_steps == 2
  _run(config, tmp_path / "lamb", demo_data)


@pytest.mark.parametrize("objective", ["ltr", "mlm"])
def test_ablations(demo_data, tmp_path, objective):
  config = _config("pretrain_bert_base", "quick")
  config.objective = objective
  result = _run(config, tmp_path / objective, demo_data)
  assert "nsp_loss" not in result and "mlm_loss" in result
