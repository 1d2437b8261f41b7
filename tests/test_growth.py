"""Growth (bert_jax/model/growth.py, `config.init_tiling`): a larger model initialised from a
smaller one by ModernBERT's weight tiling and Gopher's layer mapping."""
import numpy as np
import pytest

from bert_jax.model import growth
from bert_jax.model.config import BertConfig


def _reference_tile_from_middle_1d(small, size):
  # ModernBERT's `_tile_1d` (tile_weights_from_middle), written out as its loops.
  n, offset = len(small), (size - len(small)) // 2
  out = np.zeros(size, small.dtype)
  out[offset:offset + n] = small
  for i in range(offset):
    out[offset - 1 - i] = small[n - 1 - (i % n)]
  for i in range(offset + n, size):
    out[i] = small[(i - offset) % n]
  return out


@pytest.mark.parametrize("n,size", [(3, 7), (4, 4), (5, 6), (3, 12), (768 // 64, 1024 // 64)])
def test_tile_from_middle_is_modernberts_loop(n, size):
  small = np.arange(n, dtype=np.float32) + 1
  got = growth.tile(small, np.zeros(size, np.float32), "tile_from_middle")
  np.testing.assert_array_equal(got, _reference_tile_from_middle_1d(small, size))


def test_the_three_modes_on_a_matrix():
  rng = np.random.default_rng(0)
  small = rng.normal(size=(3, 4)).astype(np.float32)
  fresh = rng.normal(size=(7, 6)).astype(np.float32)
  middle = growth.tile(small, fresh, "tile_from_middle")
  # The small matrix at the centre (offsets 2 and 1), its periodic extension around it; axis by
  # axis, as ModernBERT tiles width then height.
  np.testing.assert_array_equal(middle[2:5, 1:5], small)
  rows = _reference_tile_from_middle_1d(np.arange(3), 7)
  cols = _reference_tile_from_middle_1d(np.arange(4), 6)
  np.testing.assert_array_equal(middle, small[np.ix_(rows, cols)])
  edge = growth.tile(small, fresh, "tile_from_edge")
  np.testing.assert_array_equal(edge, small[np.ix_(np.arange(7) % 3, np.arange(6) % 4)])
  center = growth.tile(small, fresh, "center")
  np.testing.assert_array_equal(center[2:5, 1:5], small)
  outside = np.ones_like(fresh, bool)
  outside[2:5, 1:5] = False
  np.testing.assert_array_equal(center[outside], fresh[outside])   # the fresh init kept
  with pytest.raises(ValueError, match="cannot grow shape"):
    growth.tile(fresh, small, "tile_from_edge")


def test_layer_mapping_is_gophers():
  assert growth.layer_mapping(22, 28) == [round(i * 22 / 28) for i in range(28)]
  # Python's rounding: 0.5 -> 0, and 1.5 -> 2, kept within the 2-layer model.
  assert growth.layer_mapping(2, 4) == [0, 0, 1, 1]
  assert growth.layer_mapping(4, 4) == [0, 1, 2, 3]


def _modern(layers, hidden, heads, glu_width, **kw):
  return BertConfig.named("modernbert-base", num_hidden_layers=layers, hidden_size=hidden,
                          num_attention_heads=heads, intermediate_size=glu_width,
                          vocab_size=64, pad_token_id=0, **kw)


def _params(config, seed):
  import jax
  from bert_jax.io import checkpoints
  from bert_jax import families
  from bert_jax.model import layers
  model = families.of(config).pretraining_model(config, use_nsp=False)
  return checkpoints.per_layer(layers.init_params(model, jax.random.PRNGKey(seed)), config)


def test_grow_a_modern_model_part_by_part():
  small_config, large_config = _modern(2, 64, 2, 96), _modern(4, 128, 4, 160)
  small, fresh = _params(small_config, 0), _params(large_config, 1)
  grown = growth.grow(small, small_config, fresh, large_config, "tile_from_middle")
  # Every parameter has the larger model's shape.
  import jax
  assert jax.tree_util.tree_map(np.shape, grown) == jax.tree_util.tree_map(np.shape, fresh)
  # Wqkv part by part: q, k and v each tiled; layer 2 of 4 from layer round(2 * 2 / 4) = 1.
  qkv = grown["bert"]["encoder"]["layer_2"]["attn"]["Wqkv"]["kernel"]
  small_qkv = small["bert"]["encoder"]["layer_1"]["attn"]["Wqkv"]["kernel"]
  for part in range(3):
    np.testing.assert_array_equal(
        np.split(qkv, 3, axis=-1)[part],
        growth.tile(np.split(small_qkv, 3, axis=-1)[part], np.zeros((128, 128)),
                    "tile_from_middle"))
  # The GLU's input and gate halves likewise.
  wi = grown["bert"]["encoder"]["layer_0"]["mlp"]["Wi"]["kernel"]
  small_wi = small["bert"]["encoder"]["layer_0"]["mlp"]["Wi"]["kernel"]
  np.testing.assert_array_equal(np.split(wi, 2, axis=-1)[1][32:96, 32:128],
                                np.split(small_wi, 2, axis=-1)[1])
  # The embeddings grow in width only; the decoder bias is the vocabulary's, kept.
  np.testing.assert_array_equal(grown["bert"]["embeddings"]["word_embeddings"]["embedding"][:, 32:96],
                                small["bert"]["embeddings"]["word_embeddings"]["embedding"])
  np.testing.assert_array_equal(grown["cls"]["predictions"]["output_bias"],
                                small["cls"]["predictions"]["output_bias"])
  # Layer 1 maps to the small layer 0, which has no attention norm: the fresh one stays.
  np.testing.assert_array_equal(grown["bert"]["encoder"]["layer_1"]["attn_norm"]["scale"],
                                fresh["bert"]["encoder"]["layer_1"]["attn_norm"]["scale"])


def test_what_tiling_cannot_grow_is_named():
  small = _modern(2, 64, 2, 96)
  with pytest.raises(ValueError, match="vocab_size differs"):
    growth.check_growable(small, small.replace(vocab_size=128))
  with pytest.raises(ValueError, match="never shrinks it: num_hidden_layers"):
    growth.check_growable(small, small.replace(num_hidden_layers=1))
  with pytest.raises(ValueError, match="keeps the head size"):
    growth.check_growable(small, small.replace(hidden_size=128))


def test_init_tiling_needs_a_smaller_checkpoint_and_a_known_mode():
  import importlib
  from bert_jax.tasks.jobs import pretraining
  config = importlib.import_module("experiments.pretrain_modernbert").get_config(
      "phase=pretrain,quick")
  config.init_tiling = "tile_from_middle"
  with pytest.raises(ValueError, match="set config.init_checkpoint"):
    pretraining.check_config(config)
  config.init_checkpoint, config.init_tiling = "/somewhere", "tiles"
  with pytest.raises(ValueError, match="config.init_tiling='tiles'"):
    pretraining.check_config(config)


@pytest.mark.slow
def test_a_larger_run_starts_from_the_smaller_checkpoint_tiled(tmp_path, capsys):
  # As a user grows ModernBERT-large from base: the larger experiment with the smaller model's
  # checkpoint and config.init_tiling; every parameter grown, then trained.
  import importlib
  import jax
  from bert_jax.io import checkpoints
  from bert_jax import families
  from bert_jax.model import layers
  from bert_jax.tasks.jobs import init_checkpoint, pretraining
  from bert_jax.tasks import registry
  from tests import finetuning_fixtures as fx
  config = importlib.import_module("experiments.pretrain_modernbert").get_config(
      "phase=pretrain,quick")   # 4 layers of 64, 2 heads of 32, GLU 96
  small_dir = fx.write_checkpoint(
      str(tmp_path / "small"), architecture="modernbert", num_hidden_layers=2, hidden_size=32,
      num_attention_heads=1, intermediate_size=48, vocab_size=config.model.vocab_size,
      local_attention=32, pad_token_id=0, type_vocab_size=1, max_position_embeddings=8192)
  config.init_checkpoint, config.init_tiling = small_dir, "tile_from_middle"
  result = registry.run_job(config, str(tmp_path / "large"))
  assert np.isfinite(result["loss"])
  assert "every parameter grown from its 2 x 32 model by tile_from_middle" in capsys.readouterr().out
  # What the run started from is the smaller model tiled (growth.grow on the same fresh init).
  large = pretraining.bert_config_from(config)
  fresh = layers.init_params(families.of(large).pretraining_model(large, use_nsp=False),
                               jax.random.PRNGKey(0))
  started = init_checkpoint.load_init_checkpoint(small_dir, fresh, large, "tile_from_middle")
  small_config, small = checkpoints.load_pretrained(small_dir)
  expected = growth.grow(small, small_config, checkpoints.per_layer(fresh, large), large,
                         "tile_from_middle")
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         checkpoints.per_layer(started, large), expected)
