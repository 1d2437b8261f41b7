"""Every job on every encoder family: one matrix (BERT, ModernBERT, RoBERTa, XLM-RoBERTa).

Each family's checkpoint is written by `transformers` (random weights, biases and norms made
non-trivial, a tokenizer trained here: tests/family_fixtures.py), then read by bert_jax as a user
would. Every cell asserts numbers against transformers or the run itself, not only an exit code.
Fast cells: feature extraction (single and `|||` pair lines) equals transformers' last layer;
the masked-LM export loads with no missing key and the same logits; a pair classifier
fine-tuned, predicted and exported. Slow cells (each with a fast sibling here or in the family's
own tests): pre-training, continued pre-training, every task head and its transformers class,
the feature-based approach, the SavedModel and the TPU compile.
"""
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import families
from bert_jax.io import checkpoints
from bert_jax.tasks.tools import serving
from tests import family_fixtures, finetuning_fixtures as fx
from tests.test_export import _inputs, _reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("bert", "modernbert", "roberta", "xlm-roberta")
# Single lines and `A ||| B` pairs (extract_features' input format).
LINES = ("The quick brown fox jumps over the lazy dog.",
         "A small red boat drifted ||| slowly down the river, past the mill.",
         "Numbers like 3.14 and 2024 appear. ||| \"Where are you going?\" asked the child.")
# Each fine-tuning kind: (the output kind's transformers head, the Auto class that loads it).
KINDS = {"mrpc": ("sequence_classification", "AutoModelForSequenceClassification"),
         "ner": ("token_classification", "AutoModelForTokenClassification"),
         "squad": ("question_answering", "AutoModelForQuestionAnswering"),
         "squad2": ("question_answering", "AutoModelForQuestionAnswering"),
         "swag": ("multiple_choice", "AutoModelForMultipleChoice")}


def _transformers():
  transformers = pytest.importorskip("transformers", reason="the matrix compares every family "
                                     "with transformers, which is not installed")
  torch = pytest.importorskip("torch", reason="transformers needs torch to run the models")
  return transformers, torch


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """family -> a transformers-written checkpoint directory (written once per module)."""
  _transformers()
  root, written = tmp_path_factory.mktemp("families"), {}

  def get(family: str) -> str:
    if family not in written:
      written[family] = family_fixtures.WRITERS[family](str(root / family))
    return written[family]
  return get


def _forward(model, encoded):
  """A transformers model on a tokenizer's output, passing only the inputs its forward takes
  (ModernBERT's has no token_type_ids)."""
  accepted = inspect.signature(model.forward).parameters
  return model(**{k: v for k, v in encoded.items() if k in accepted})


def _run(module, *flags):
  result = subprocess.run([sys.executable, "-m", module, *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


# ------------------------------------------------------------------------------------ fast cells


@pytest.mark.parametrize("family", FAMILIES)
def test_extract_features_equals_transformers(checkpoint, tmp_path, family):
  """Single and pair lines: the tokens transformers' tokenizer makes (its special tokens and pair
  layout included) and its model's last layer within 1e-4."""
  transformers, torch = _transformers()
  directory = checkpoint(family)
  source, target = tmp_path / "input.txt", tmp_path / "features.jsonl"
  source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
  _run("bert_jax.extract_features", f"--input_file={source}", f"--output_file={target}",
       f"--init_checkpoint={directory}", "--layers=-1", "--max_seq_length=64")
  records = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  model = transformers.AutoModel.from_pretrained(directory).eval()
  for line, record in zip(LINES, records):
    a, _, b = (part.strip() for part in line.partition("|||"))
    encoded = tokenizer(a, b or None, return_tensors="pt")   # none cut at 64 tokens
    tokens = [feature["token"] for feature in record["features"]]
    assert tokens == tokenizer.convert_ids_to_tokens(encoded["input_ids"][0]), (family, line)
    with torch.no_grad():
      theirs = _forward(model, encoded).last_hidden_state[0].numpy()          # [T, H]
    ours = np.array([feature["layers"][0]["values"] for feature in record["features"]])
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0, err_msg=f"{family}: {line}")


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_lm_export_is_the_checkpoint_again(checkpoint, tmp_path, family):
  """`export --format=huggingface` of a pre-trained checkpoint: the family's pre-training class
  with every tensor the checkpoint had, bit for bit, no missing or unexpected key, the special
  ids of its vocabulary, and bert_jax's masked-LM logits."""
  transformers, torch = _transformers()
  directory = checkpoint(family)
  output = tmp_path / "hf"
  _run("bert_jax.export", f"--model={directory}", "--format=huggingface", f"--output={output}")
  auto = (transformers.AutoModelForPreTraining if family == "bert"
          else transformers.AutoModelForMaskedLM)
  exported, info = auto.from_pretrained(str(output), output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  assert type(exported).__name__ == type(auto.from_pretrained(directory)).__name__
  from safetensors.numpy import load_file
  source = load_file(os.path.join(directory, "model.safetensors"))
  written = load_file(str(output / "model.safetensors"))
  for key, value in source.items():
    np.testing.assert_array_equal(written[key], value, err_msg=key)
  hf_config = json.loads((output / "config.json").read_text())
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  assert hf_config["pad_token_id"] == tokenizer.pad_token_id
  for field, token in (("cls_token_id", "cls_token_id"), ("sep_token_id", "sep_token_id"),
                       ("bos_token_id", "cls_token_id"), ("eos_token_id", "sep_token_id")):
    if field in hf_config:   # the vocabulary's ids, not transformers' defaults for the family
      assert hf_config[field] == getattr(tokenizer, token), field
  config, params = checkpoints.load_pretrained(directory)
  encoded = tokenizer(list(LINES[:2]), padding=True, return_tensors="np")
  model = families.of(config).pretraining_model(
      config, use_nsp="cls/seq_relationship" in families.of(config).pretraining_heads)
  ours = model.apply({"params": params}, encoded["input_ids"], encoded["attention_mask"],
                     encoded.get("token_type_ids"))["mlm_logits"]
  with torch.no_grad():
    out = _forward(exported.eval(), {k: torch.tensor(v) for k, v in encoded.items()})
  theirs = (out.prediction_logits if family == "bert" else out.logits).numpy()
  mask = encoded["attention_mask"][..., None]
  np.testing.assert_allclose(np.asarray(ours) * mask, theirs * mask, atol=1e-4, rtol=0)


def _fine_tune_and_export(checkpoint, tmp_path, family, kind):
  """Fine-tunes `kind` from the family's checkpoint, exports the best model to transformers and
  checks it there: its class, no missing or unexpected key, bert_jax's outputs within 1e-4."""
  transformers, torch = _transformers()
  workdir = fx.fine_tune(str(tmp_path), kind, checkpoint(family))
  results = json.loads(open(os.path.join(workdir, "results.json")).read())
  best = os.path.join(workdir, "best")
  servable = serving.load(best)
  head, auto = KINDS[kind]
  config = servable.bert_config
  output = str(tmp_path / "hf")
  serving.export(best, "huggingface", output)
  model, info = getattr(transformers, auto).from_pretrained(output, output_loading_info=True)
  assert type(model).__name__ == families.of(config).huggingface_class(config, head)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  model.eval()
  for batch, length in ((1, 7), (3, 16)):
    inputs = _inputs(servable, batch, length)
    if not families.of(config).token_types:
      inputs["segment_ids"] = np.zeros_like(inputs["segment_ids"])
    encoded = {"input_ids": inputs["input_ids"], "attention_mask": inputs["input_mask"],
               "token_type_ids": inputs["segment_ids"]}
    with torch.no_grad():
      theirs = _forward(model, {k: torch.tensor(v, dtype=torch.long) for k, v in encoded.items()})
    for key, value in _reference(servable, inputs).items():
      if key not in servable.output_kind.hf_outputs:
        continue
      got = getattr(theirs, servable.output_kind.hf_outputs[key]).numpy()
      if servable.output_kind.name == "tagging":   # padding positions are not compared
        got, value = got * inputs["input_mask"][..., None], value * inputs["input_mask"][..., None]
      np.testing.assert_allclose(got, value, atol=1e-4, rtol=0, err_msg=f"{family} {kind} {key}")
  return workdir, results


@pytest.mark.parametrize("family", FAMILIES)
def test_pair_classifier_fine_tunes_predicts_and_exports(checkpoint, tmp_path, family):
  """MRPC (sentence pairs): the run's dev predictions again from `predict` on raw pairs, and
  transformers' sequence classifier of the family computing the same logits."""
  from tests.test_predict import _dev_predictions, _predict
  from bert_jax.tasks.datasets import glue
  from bert_jax.tasks.tools import fine_tuned
  workdir, results = _fine_tune_and_export(checkpoint, tmp_path, family, "mrpc")
  assert 0.0 <= results["dev"]["accuracy"] <= 1.0 and np.isfinite(results["dev"]["loss"])
  dev = glue.read_examples(glue.spec_for("mrpc"), fine_tuned.load(workdir).config.data, "dev")
  counts, out, _ = _predict(workdir, tmp_path, "".join(f"{e.text_a}\t{e.text_b}\n" for e in dev))
  assert counts.predicted == len(dev)
  assert [o["label"] for o in out] == _dev_predictions(workdir)


def test_every_family_is_one_folder_and_one_registry_line():
  """The families' folders are the registry's lines; each reads its own transformers config."""
  folder = os.path.join(ROOT, "bert_jax", "families")
  folders = sorted(name for name in os.listdir(folder)
                   if os.path.isdir(os.path.join(folder, name)) and not name.startswith("_"))
  assert folders == sorted(families.FAMILIES)
  for name, family in families.FAMILIES.items():
    assert family.name == name
    for model_type in family.huggingface_model_types:
      assert families.for_huggingface({"model_type": model_type}, "config.json") is family
  with pytest.raises(ValueError, match="model_type 'gpt2'"):
    families.for_huggingface({"model_type": "gpt2"}, "config.json")


def test_no_switch_on_a_family_outside_the_family_folders():
  """No code outside bert_jax/families compares a config's family or a family's name (the
  registry answers). "bert" alone is also the encoder's parameter scope, so only the other
  names are searched as bare strings."""
  import re
  names = "|".join(re.escape(name) for name in families.FAMILIES if name != "bert")
  switch = re.compile(rf"""architecture\b\s*(==|!=|in\b)|\bis_modern\b|"""
                      rf"""["']({names})["']\s*(==|!=)|(==|!=)\s*["']({names})["']""")
  found = []
  for directory, _, files in os.walk(os.path.join(ROOT, "bert_jax")):
    if os.path.join("bert_jax", "families") in directory:
      continue
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as f:
          found += [f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}"
                    for i, line in enumerate(f, 1) if switch.search(line)]
  assert not found, found


# ------------------------------------------------------------------------------------ slow cells


# Every head kind on every family (sequence classification is the fast tier's MRPC cell), and
# SQuAD 2.0 (the same head as SQuAD; its no-answer logic is the task's, not the family's) on the
# family with no token types. SST-2 (MRPC's head on single sentences, which extract_features
# reads on every family in the fast tier) is fine-tuned in tests/test_finetuning.py.
TASK_CELLS = [(kind, family) for kind in ("ner", "squad", "swag") for family in FAMILIES] + [
    ("squad2", "modernbert")]


@pytest.mark.slow
@pytest.mark.parametrize("kind,family", TASK_CELLS)
def test_every_task_fine_tunes_and_exports(checkpoint, tmp_path, family, kind):
  _, results = _fine_tune_and_export(checkpoint, tmp_path, family, kind)
  assert results["dev"] and all(np.isfinite(v) for v in results["dev"].values()
                                if isinstance(v, float))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_continued_pre_training_starts_from_the_checkpoint(checkpoint, tmp_path, family):
  """experiments/continue_pretraining.py on the transformers checkpoint: its family's objective,
  its heads loaded (none initialised afresh), step 0's held-out loss that of the checkpoint."""
  from bert_jax.runtime.metric_writers import read_metrics
  from bert_jax.tasks import registry
  from experiments import continue_pretraining
  config = continue_pretraining.get_config("quick")
  config.init_checkpoint = checkpoint(family)
  workdir = str(tmp_path / "run")
  result = registry.run_job(config, workdir)
  assert np.isfinite(result["loss"])
  evals = read_metrics(workdir, "eval")
  assert [e["step"] for e in evals] == [0, config.num_train_steps]
  saved, _ = checkpoints.load_pretrained(workdir)
  loaded, _ = checkpoints.load_pretrained(checkpoint(family))
  assert type(saved) is type(loaded) and saved.architecture == loaded.architecture
  assert ("nsp_accuracy" in evals[0]) == (family == "bert")


@pytest.mark.slow
@pytest.mark.parametrize("experiment,family", [("pretrain_demo:quick", "bert"),
                                               ("pretrain_modernbert:phase=pretrain,quick",
                                                "modernbert"),
                                               ("pretrain_roberta:quick", "roberta")])
def test_pre_training_from_scratch(tmp_path, experiment, family):
  import importlib
  from bert_jax.runtime.metric_writers import read_metrics
  from bert_jax.tasks import registry
  name, arg = experiment.split(":")
  config = importlib.import_module(f"experiments.{name}").get_config(arg)
  workdir = str(tmp_path / "run")
  result = registry.run_job(config, workdir)
  assert np.isfinite(result["loss"])
  assert read_metrics(workdir, "train")[-1]["step"] == config.num_train_steps
  saved, _ = checkpoints.load_pretrained(workdir)
  assert saved.architecture == family


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_feature_based_ner_and_saved_model(checkpoint, tmp_path, family):
  """The feature-based approach (frozen encoder, BiLSTM tagger) and the encoder's SavedModel."""
  tf = pytest.importorskip("tensorflow")
  from bert_jax import tasks
  from experiments import ner_feature_based
  config = ner_feature_based.get_config("quick")
  config.init_checkpoint = checkpoint(family)
  workdir = str(tmp_path / "feature_based")
  tasks.run(config, workdir)
  assert os.path.exists(os.path.join(workdir, "results.json"))
  servable = serving.load(checkpoint(family))
  output = str(tmp_path / "saved_model")
  serving.export(checkpoint(family), "saved_model", output)
  inputs = _inputs(servable, 2, 9)
  got = tf.saved_model.load(output).signatures["serving_default"](
      **{k: tf.constant(v) for k, v in inputs.items()})
  want = _reference(servable, inputs)
  mask = inputs["input_mask"][..., None]
  np.testing.assert_allclose(got["sequence_output"].numpy() * mask,
                             want["sequence_output"] * mask, atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_compile_for_a_tpu_needs_no_task_data(checkpoint, tmp_path, family):
  """`--compile_for` of a GLUE fine-tuning of the family's checkpoint, no GLUE data given."""
  pytest.importorskip("libtpu", reason="--compile_for needs the TPU compiler (libtpu)")
  workdir = tmp_path / "compile"
  _run("bert_jax.main", f"--config={ROOT}/experiments/glue.py:task=mrpc,quick",
       f"--workdir={workdir}", "--compile_for=v5litepod-4",
       f"--config.init_checkpoint={checkpoint(family)}")
  report = json.loads((workdir / "compile_report.json").read_text())
  assert report["fits"] and report["model_flops_per_step"] > 0, report


@pytest.mark.slow
def test_roberta_with_vocab_json_and_merges_only(checkpoint, tmp_path):
  """A RoBERTa folder as older releases ship it (vocab.json + merges.txt, no tokenizer.json):
  fine-tuned, its best/ holds one tokenizer.json, and the transformers export's tokenizer gives
  transformers' ids."""
  import shutil
  transformers, _ = _transformers()
  bare = tmp_path / "roberta_bpe"
  shutil.copytree(checkpoint("roberta"), bare)
  (bare / "tokenizer.json").unlink()
  workdir, _ = _fine_tune_and_export(lambda family: str(bare), tmp_path, "roberta", "mrpc")
  assert os.path.exists(os.path.join(workdir, "best", "tokenizer.json"))
  theirs = transformers.AutoTokenizer.from_pretrained(checkpoint("roberta"))
  exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  for line in LINES:
    assert exported(line)["input_ids"] == theirs(line)["input_ids"], line
