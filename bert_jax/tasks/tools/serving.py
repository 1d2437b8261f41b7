r"""Serving exports of a fine-tuned model (or a pre-trained encoder): `python -m bert_jax.export`.

Three formats, from `WORKDIR/best/` of a fine-tuning run (`fine_tuned.load`), from a
sentence-embedding model (a folder with `embedding.json` or its workdir, a sentence-transformers
folder: `tasks/tools/embedding.py`; the `EMBEDDING` kind, whose outputs add `sentence_embedding`)
or from any checkpoint `checkpoints.load_pretrained` reads (then the encoder alone is exported):

* `saved_model`: a TensorFlow SavedModel made by `jax.experimental.jax2tf` (native
  serialization: the model is the StableHLO JAX lowers, run by TensorFlow's XlaCallModule op).
  Signature `serving_default`: `input_ids`, `input_mask`, `segment_ids`, int32 [batch, length]
  ([batch, choices, length] for multiple choice) -> the outputs of the task's output kind
  (`OutputKind.outputs` and `serve`, bert_jax/tasks/framework/output_kinds.py), float32.
  Batch and length are symbolic dimensions (jax2tf `polymorphic_shapes`), so one export serves
  any batch size and any length up to `max_position_embeddings` (checked when called). The
  parameters are `tf.Variable`s (the graph stays small, `saved_model_cli` lists them), and the
  module is lowered for `PLATFORMS` (cpu, cuda, tpu): TensorFlow picks the lowering of the device
  it runs on. `signature.json` beside `saved_model.pb` says how to make the inputs (tokenizer,
  casing, max_seq_length, the [CLS] A [SEP] B [SEP] layout), what the outputs mean and the
  labels; the vocabulary is a SavedModel asset (`assets/vocab.txt`, `assets/spm.model` or
  `assets/tokenizer.json`).
* `huggingface`: the family's transformers class of the output kind (`OutputKind.hf_head`,
  `Family.huggingface_class`; a pre-trained checkpoint with its masked-LM head: the family's
  masked-LM class): config.json
  (labels as id2label/label2id) + model.safetensors + the tokenizer files (vocab.txt,
  tokenizer_config.json with do_lower_case; or a model's tokenizer.json, as
  `PreTrainedTokenizerFast`), loadable offline by `AutoModelFor...` and `AutoTokenizer`. The
  names are the family's (`Family.huggingface_state`, `huggingface_task_state`; torch Linear
  weights are [out, in]).
* `sentence_transformers`: the `huggingface` export of the encoder (its transformers encoder
  class, the tokenizer files with `model_max_length` = max_seq_length) plus sentence-transformers'
  modules (`io/sentence_transformers.write_modules`: modules.json, sentence_bert_config.json,
  1_Pooling/, 2_Normalize/ when normalised), so that `SentenceTransformer(DIR)` computes the
  model's vectors; from any model `embedding.load` reads (a pre-trained checkpoint: mean pooling,
  not normalised, said on stderr).

There is no raw-string signature: TensorFlow Text's in-graph BertTokenizer does not tokenize as
`FullTokenizer` (the strings that differ: benchmarks/history/2026-11-28-finished-studies.md), so
inputs are token ids made by this project's tokenizer, or by any tokenizer that matches it.

Shape letters: B batch, C choices, S sequence, H hidden, K labels.
"""
import contextlib
import dataclasses
import json
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from bert_jax import families
from bert_jax.io import checkpoints, filesystem
from bert_jax.io import sentence_transformers as st_format
from bert_jax.model import pooling
from bert_jax.model.config import BertConfig
from bert_jax.tasks.framework import finetuning, output_kinds
from bert_jax.tasks.tools import embedding, fine_tuned
from bert_jax.text import tokenization

FORMATS = ("saved_model", "huggingface", "sentence_transformers")
ENCODER = output_kinds.ENCODER   # the kind of a pre-trained checkpoint exported without a head
ENCODER_INPUT_FORMAT = "[CLS] A [SEP] or [CLS] A [SEP] B [SEP]"
SIGNATURE_FILE = "signature.json"
SERVING_SIGNATURE = "serving_default"
# Where the SavedModel may run: each gets its own lowering in the one XlaCallModule op, chosen at
# run time by the device TensorFlow places it on (a GPU-only lowering fails on a CPU host).
PLATFORMS = ("cpu", "cuda", "tpu")

# Our input names -> transformers' (the outputs' are each output kind's `hf_outputs`).
HF_INPUT_NAMES = {"input_ids": "input_ids", "input_mask": "attention_mask",
                  "segment_ids": "token_type_ids"}
# An embedding model's outputs -> the names of SentenceTransformer's features.
ST_OUTPUT_NAMES = {"sentence_embedding": "sentence_embedding",
                   "sequence_output": "token_embeddings"}


@dataclasses.dataclass
class Servable:
  """A model ready to export: its kind, parameters, tokenizer and how inputs are made."""
  kind: Union[output_kinds.OutputKind, str]   # the task's output kind, or ENCODER (or a name)
  source: str                        # the directory or checkpoint it was loaded from
  bert_config: BertConfig
  params: Dict[str, Any]             # {"bert": ...} (+ {"head": ...} for a fine-tuned model)
  apply: Callable[[Dict, Dict], Dict[str, jax.Array]]   # (params, batch) -> raw model outputs
  task_name: str = ""
  labels: Tuple[str, ...] = ()
  max_seq_length: int = 0
  do_lower_case: Optional[bool] = None
  vocab_file: Optional[str] = None   # WordPiece vocabulary, or
  spm_model_file: Optional[str] = None   # SentencePiece model, or
  tokenizer_file: Optional[str] = None   # Hugging Face tokenizer.json (all None: none found)
  task_config: Optional[ml_collections.ConfigDict] = None
  num_choices: int = 0               # multiple choice: C in [B, C, S]
  input_format: str = ENCODER_INPUT_FORMAT   # how text becomes the inputs (the task's)
  notes: Dict[str, Any] = dataclasses.field(default_factory=dict)  # the task's signature notes
  embedding: Optional[st_format.EmbeddingSettings] = None   # a sentence-embedding model's

  @property
  def output_kind(self) -> output_kinds.OutputKind:
    return output_kinds.resolve(self.kind)

  @property
  def outputs(self) -> Tuple[str, ...]:
    return self.output_kind.output_names(self.params)


# ----------------------------------------------------------------------------------- loading


def load(path: str, dtype: str = "", do_lower_case: Optional[bool] = None,
         as_embedding: bool = False) -> Servable:
  """A sentence-embedding model (or, `as_embedding`, any checkpoint as one), else a fine-tuned
  model (`WORKDIR/best` or `WORKDIR`), else any pre-trained checkpoint.

  dtype: compute dtype override ("" keeps the run's; a checkpoint's default is float32).
  do_lower_case: a pre-trained checkpoint's casing; default what it records (a Hugging Face
    tokenizer_config.json), else True. A fine-tuned model's casing is the run's (an explicit
    value that disagrees is an error)."""
  if as_embedding or st_format.read_settings(embedding.model_folder(path)) is not None:
    return _load_embedding(path, dtype, do_lower_case)
  try:
    best = fine_tuned.best_directory(path)
  except FileNotFoundError:
    return _load_encoder(path, dtype, do_lower_case)
  model = fine_tuned.load(best, **({"dtype": dtype} if dtype else {}))
  config = model.config
  # A tokenizer.json's casing is its normalizer's, whatever the run's do_lower_case said.
  run_lower_case = bool(model.tokenizer.do_lower_case if config.tokenizer.tokenizer_file
                        else config.tokenizer.do_lower_case)
  if do_lower_case is not None and do_lower_case != run_lower_case:
    raise ValueError(f"{best} was fine-tuned with do_lower_case={run_lower_case}; "
                     f"--do_lower_case={do_lower_case} would not tokenize as it was trained")
  apply = lambda params, batch: model.model.apply({"params": params}, batch, deterministic=True)
  return Servable(
      kind=model.output_kind, source=model.directory, bert_config=model.bert_config,
      params=model.params, apply=apply, task_name=model.task.name, labels=tuple(model.labels),
      max_seq_length=int(config.max_seq_length),
      do_lower_case=run_lower_case,
      vocab_file=config.tokenizer.vocab_file or None,
      spm_model_file=config.tokenizer.spm_model_file or None,
      tokenizer_file=config.tokenizer.tokenizer_file or None,
      task_config=config,
      num_choices=len(model.labels) if model.output_kind.choices else 0,
      input_format=model.task.input_format, notes=model.task.signature_notes(model.directory))


def _load_encoder(path: str, dtype: str, do_lower_case: Optional[bool]) -> Servable:
  bert_config, params = checkpoints.load_pretrained(path)
  if dtype:
    bert_config = bert_config.replace(dtype=dtype)
  # The masked-LM head, where the checkpoint has one, travels to the transformers export.
  heads = {"cls": params["cls"]} if "cls" in params else {}
  params = dict(checkpoints.to_model_layout({"bert": params["bert"]}, bert_config), **heads)
  try:
    vocab_file, spm_model_file, tokenizer_file = checkpoints.find_vocab(path)
  except FileNotFoundError:
    vocab_file = spm_model_file = tokenizer_file = None
  if tokenizer_file:   # its own normalizer is its casing
    do_lower_case = tokenization.HuggingFaceTokenizer(tokenizer_file).do_lower_case
  elif do_lower_case is None:
    recorded = checkpoints.recorded_lower_case(path)
    do_lower_case = recorded if recorded is not None else not spm_model_file
  encoder = families.of(bert_config).encoder(bert_config,
                                             add_pooling_layer="pooler" in params["bert"])

  def apply(params, batch):
    return encoder.apply({"params": params["bert"]}, batch["input_ids"], batch["input_mask"],
                         batch["segment_ids"], deterministic=True)

  return Servable(kind=ENCODER, source=path, bert_config=bert_config, params=params,
                  apply=apply, max_seq_length=bert_config.max_position_embeddings,
                  do_lower_case=do_lower_case, vocab_file=vocab_file,
                  spm_model_file=spm_model_file, tokenizer_file=tokenizer_file)


def _load_embedding(path: str, dtype: str, do_lower_case: Optional[bool]) -> Servable:
  model = embedding.load(path, dtype=dtype or "float32", do_lower_case=do_lower_case)
  config, settings = model.bert_config, model.settings
  encoder = families.of(config).encoder(config, add_pooling_layer=False)

  def apply(params, batch):
    out = encoder.apply({"params": params["bert"]}, batch["input_ids"], batch["input_mask"],
                        batch["segment_ids"], deterministic=True)
    return {"sequence_output": out["sequence_output"],                      # [B, S, H]
            "sentence_embedding": pooling.embed(out["sequence_output"], batch["input_mask"],
                                                settings.pooling, settings.normalize)}   # [B, H]

  notes = {"embedding": dict(dataclasses.asdict(settings), source=model.settings_source)}
  return Servable(kind=output_kinds.EMBEDDING, source=model.directory, bert_config=config,
                  params={"bert": model.params}, apply=apply,
                  max_seq_length=settings.max_seq_length, do_lower_case=model.do_lower_case,
                  notes=notes, embedding=settings, **model.vocab_files)


def tokenizer_for(servable: Servable):
  """The tokenizer the exported model's inputs must be made with (None: no vocabulary found)."""
  if not (servable.vocab_file or servable.spm_model_file or servable.tokenizer_file):
    return None
  return tokenization.create_tokenizer(servable.vocab_file, servable.spm_model_file,
                                       servable.do_lower_case, servable.tokenizer_file)


# ----------------------------------------------------------------------------------- outputs


def serving_function(servable: Servable) -> Callable:
  """(params, input_ids, input_mask, segment_ids) -> {output name: float32 array}: what the
  SavedModel computes, as a JAX function (jit it to serve from JAX): the output kind's."""
  kind, names = servable.output_kind, servable.outputs

  def serve(params, input_ids, input_mask, segment_ids):
    batch = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
    raw = {k: v.astype(jnp.float32) for k, v in servable.apply(params, batch).items()}
    return kind.serve(raw, names)

  return serve


def input_shape(servable: Servable) -> Tuple[Optional[int], ...]:
  """The inputs' shape with None for the free dimensions: [B, S] or [B, C, S]."""
  return (None, servable.num_choices, None) if servable.num_choices else (None, None)


def output_shapes(servable: Servable) -> Dict[str, list]:
  """Each output's shape as words ("batch", "length", ...) or sizes, for signature.json."""
  sizes = {"labels": len(servable.labels), "choices": servable.num_choices,
           "hidden": servable.bert_config.hidden_size}
  outputs = servable.output_kind.outputs
  return {name: [sizes.get(d, d) for d in outputs[name][0]] for name in servable.outputs}


def signature_description(servable: Servable, fmt: str, vocab_name: Optional[str],
                          platforms: Sequence[str] = ()) -> Dict[str, Any]:
  """What a serving user needs: inputs, outputs, labels and how to tokenize (signature.json)."""
  dims = ["batch", "choices", "length"] if servable.num_choices else ["batch", "length"]
  if servable.num_choices:
    dims[1] = servable.num_choices
  inputs = {
      "input_ids": "token ids of the vocabulary, 0 ([PAD]) after the last real token",
      "input_mask": "1 for real tokens, 0 for padding",
      "segment_ids": "0 for [CLS], A and its [SEP]; 1 for B and its [SEP]; 0 for padding",
  }
  kind = servable.output_kind
  outputs = {name: {"dtype": "float32", "shape": shape, "meaning": kind.outputs[name][1]}
             for name, shape in output_shapes(servable).items()}
  if fmt != "saved_model":   # transformers' argument and output names; torch.long ids
    inputs = {HF_INPUT_NAMES[k]: v for k, v in inputs.items()}
    names = ST_OUTPUT_NAMES if fmt == "sentence_transformers" else kind.hf_outputs
    outputs = {names[k]: v for k, v in outputs.items() if k in names}
    for name, shape in kind.hf_shapes.items():
      outputs[name]["shape"] = list(shape)
  description = {
      "format": fmt,
      "kind": kind.name,
      "task": servable.task_name,
      "source": servable.source,
      "inputs": {name: {"dtype": "int32" if fmt == "saved_model" else "int64", "shape": dims,
                        "meaning": meaning}
                 for name, meaning in inputs.items()},
      "outputs": outputs,
      "labels": list(servable.labels),
      "max_seq_length": servable.max_seq_length,
      "max_position_embeddings": servable.bert_config.max_position_embeddings,
      "tokenizer": {
          "type": ("wordpiece" if servable.vocab_file else
                   "sentencepiece" if servable.spm_model_file else
                   "huggingface_tokenizers" if servable.tokenizer_file else None),
          "vocab": vocab_name,
          "do_lower_case": servable.do_lower_case,
          "max_input_chars_per_word": 200 if servable.vocab_file else None,
          "special_tokens": _special_tokens(servable),
          "input_format": servable.input_format,
          "reference": "bert_jax.text.tokenization (FullTokenizer: the original BERT tokenizer "
                       "as Hugging Face's slow BertTokenizer) + bert_jax.text.pairs.encode_pairs",
      },
  }
  if fmt == "saved_model":
    description["signature"] = SERVING_SIGNATURE
    description["platforms"] = list(platforms)
    description["dynamic"] = ("batch and length are free; length <= max_position_embeddings; "
                              "the model was trained on lengths <= max_seq_length")
  description.update(servable.notes)   # the task's own: SQuAD's windows, NER's scheme
  return description


# ----------------------------------------------------------------------------------- SavedModel


@contextlib.contextmanager
def _vocabulary(servable: Servable) -> Iterator[Tuple[Optional[str], Optional[str]]]:
  """Yields (path of the vocabulary file, its name in the export) or (None, None); a Hugging Face
  tokenizer read from another form (RoBERTa's vocab.json + merges.txt) as one tokenizer.json, in
  a temporary folder that is removed when the block ends (the SavedModel has copied it by then)."""
  path = servable.vocab_file or servable.spm_model_file or servable.tokenizer_file
  if not path:
    yield None, None
  elif servable.tokenizer_file and filesystem.basename(path) != "tokenizer.json":
    with tempfile.TemporaryDirectory(prefix="bert_jax_vocab_") as directory:
      path = os.path.join(directory, "tokenizer.json")
      filesystem.write_text(path, tokenization.HuggingFaceTokenizer(
          servable.tokenizer_file).tokenizer_json())
      yield path, "tokenizer.json"
  else:
    yield path, filesystem.basename(path)


def _special_tokens(servable: Servable) -> Dict[str, str]:
  """BERT's special tokens under the names the vocabulary writes them (a tokenizer.json's own)."""
  names = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
  if not servable.tokenizer_file:
    return names
  found = tokenization.HuggingFaceTokenizer(servable.tokenizer_file).special_tokens
  return {short: found[name] for short, name in names.items() if name in found}


def export_saved_model(servable: Servable, output: str,
                       platforms: Sequence[str] = PLATFORMS) -> Dict[str, Any]:
  """Writes the SavedModel (and signature.json) to `output`; returns the description."""
  import tensorflow as tf
  from jax.experimental import jax2tf

  # Symbolic batch b and length s (and a fixed number of choices). The length is bounded by the
  # position table (the constraint lets the positions' slice [:s] lower); a longer input is an
  # error when called ("slice size ... is out of bounds" from TensorFlow's shape refinement).
  shape = "(b, s)" if not servable.num_choices else f"(b, {servable.num_choices}, s)"
  max_length = servable.bert_config.max_position_embeddings
  converted = jax2tf.convert(
      serving_function(servable), polymorphic_shapes=[None, shape, shape, shape],
      polymorphic_constraints=(f"s <= {max_length}",), with_gradient=False,
      native_serialization_platforms=tuple(platforms))

  # Parameters as variables, named by their path in the parameter tree.
  # The encoder and the task's head (a pre-trained checkpoint's masked-LM head is not served).
  served = {k: v for k, v in servable.params.items() if k in ("bert", "head")}
  flat = {"/".join(k): np.asarray(v) for k, v in flat_tree(served).items()}
  variables = {name: tf.Variable(value, trainable=False, name=name)
               for name, value in flat.items()}
  params = _unflatten({name: variables[name] for name in flat})

  module = tf.Module()
  module._variables = list(variables.values())   # tracked: saved as variables, not constants
  dims = input_shape(servable)

  @tf.function(autograph=False, input_signature=[
      tf.TensorSpec(dims, tf.int32, name=name) for name in finetuning.MODEL_INPUTS])
  def serve(input_ids, input_mask, segment_ids):
    return converted(params, input_ids, input_mask, segment_ids)

  module.serve = serve
  # jax2tf lowers and serializes while `serve` is traced: both fixes must be in place then.
  # TensorFlow's writer checks nothing it writes to a URL (an export once exited 0 with 5 of its
  # 6 files in the bucket): it writes to a local directory, uploaded file by file, each checked.
  with _vocabulary(servable) as (vocab_path, vocab_name), written_whole(output) as partial, \
      filesystem.local_directory_target(partial) as local, \
      stablehlo_readable_by_tensorflow(), erf_without_composite():
    if vocab_path:   # copied into assets/ under its base name (best/ keeps vocab.txt, spm.model)
      module.vocab = tf.saved_model.Asset(vocab_path)
    tf.saved_model.save(module, local,
                        signatures={SERVING_SIGNATURE: serve.get_concrete_function()})
  description = signature_description(
      servable, "saved_model", f"assets/{vocab_name}" if vocab_name else None, platforms)
  filesystem.write_text(filesystem.join(output, SIGNATURE_FILE),
                        json.dumps(description, indent=2, ensure_ascii=False) + "\n")
  return description


@contextlib.contextmanager
def written_whole(output: str) -> Iterator[str]:
  """Yields `OUTPUT.partial` to write an export into; when the block ends, it replaces `output`.

  An export killed half-way (kill -9, a full disk) leaves `OUTPUT.partial`, never a half-written
  `output` that a server could load as good; the next export starts that directory afresh.
  `signature.json`, written into `output` after the move, marks a finished export on stores
  where a directory moves file by file (Cloud Storage); there, `output` is then listed against
  what `OUTPUT.partial` held (`WriteNotLandedError` naming a file the store did not keep), so
  an export never reports success over a missing file.
  """
  partial = output.rstrip("/") + ".partial"
  if filesystem.exists(partial):
    filesystem.rmtree(partial)
  filesystem.makedirs(partial)
  yield partial
  written = filesystem.tree_sizes(partial) if filesystem.is_url(output) else None
  if filesystem.exists(output):
    filesystem.rmtree(output)
  filesystem.rename(partial, output)
  if written is not None:
    filesystem.check_tree_landed(output, written)


def _version(text: str) -> Tuple[int, ...]:
  return tuple(int(x) for x in text.split("."))


@contextlib.contextmanager
def stablehlo_readable_by_tensorflow():
  """StableHLO serialized no newer than the installed TensorFlow can read.

  jax.export writes the StableHLO version of 4 weeks ago (`WEEK_4`); TensorFlow releases are
  slower, and this JAX's (1.15.0 for jax 0.10) is newer than TensorFlow 2.21's (1.13.7): its
  XlaCallModule then fails on load with "failed to deserialize portable artifact" (erf, in the
  GELU, is serialized as a `composite_v2` op it does not know). So the version is capped at
  TensorFlow's own (`get_current_version`): the SavedModel loads in this TensorFlow and any later
  one. jax.export has no option for it: the cap replaces the function it asks, for the duration."""
  try:
    from jax._src.lib.mlir.dialects import hlo
    from tensorflow.compiler.mlir.stablehlo import stablehlo as tf_stablehlo
    consumer = tf_stablehlo.get_current_version()
    original = hlo.get_version_from_compatibility_requirement
  except (ImportError, AttributeError) as e:   # other versions: serialize as jax does
    logging.warning("StableHLO version not capped for TensorFlow (%s); the SavedModel may need "
                    "a newer TensorFlow than this one", e)
    yield
    return

  def capped(requirement):
    return min(original(requirement), consumer, key=_version)

  hlo.get_version_from_compatibility_requirement = capped
  try:
    yield
  finally:
    hlo.get_version_from_compatibility_requirement = original


# The float32 erf that JAX's lowering writes as the decomposition of its `chlo.erf` composite
# (Eigen's rational approximation): erf(x) = clamp(x P(x^2) / Q(x^2), -1, 1), x clamped to [-4, 4].
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)


def erf_rational(x: jax.Array) -> jax.Array:
  """erf as plain StableHLO arithmetic: the same operations as JAX's erf decomposition."""
  dtype = x.dtype
  x = jnp.clip(x.astype(jnp.float32), -4.0, 4.0)
  x2 = x * x
  p = jnp.float32(_ERF_P[0]) * x2
  for a in _ERF_P[1:-1]:
    p = (p + jnp.float32(a)) * x2
  p = p + jnp.float32(_ERF_P[-1])
  q = jnp.float32(_ERF_Q[0]) * x2
  for b in _ERF_Q[1:-1]:
    q = (q + jnp.float32(b)) * x2
  q = q + jnp.float32(_ERF_Q[-1])
  return jnp.clip(x * p / q, -1.0, 1.0).astype(dtype)


@contextlib.contextmanager
def erf_without_composite():
  """`lax.erf` (the GELU's) lowered to plain arithmetic instead of a `chlo.erf` composite.

  JAX lowers erf to a StableHLO composite whose decomposition is a separate function.
  TensorFlow 2.21's XlaCallModule does not refine the symbolic shapes inside it ("Module has
  dynamic shapes: 'stablehlo.dynamic_broadcast_in_dim' op has dynamic shapes" when called), so
  a model with dynamic batch and length fails. Lowered as `erf_rational` (the decomposition's
  own arithmetic, inline) it refines like every other op. The lowering rule is swapped for the
  duration only: jit elsewhere in the process keeps JAX's."""
  from jax._src.interpreters import mlir as mlir_internal
  from jax.interpreters import mlir
  saved = mlir_internal._lowerings.get(jax.lax.erf_p)
  mlir.register_lowering(jax.lax.erf_p, mlir.lower_fun(erf_rational, multiple_results=False))
  try:
    yield
  finally:
    if saved is None:
      mlir_internal._lowerings.pop(jax.lax.erf_p, None)
    else:
      mlir_internal._lowerings[jax.lax.erf_p] = saved


def flat_tree(tree: Dict) -> Dict[Tuple[str, ...], Any]:
  """{path tuple: host array} of a parameter tree."""
  from flax import traverse_util
  return traverse_util.flatten_dict(jax.device_get(tree))


def _unflatten(flat: Dict[str, Any]) -> Dict:
  from flax import traverse_util
  return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


# ----------------------------------------------------------------------------------- Hugging Face


def _output_layer(servable: Servable) -> Dict[str, np.ndarray]:
  """The task head's one output layer ({"kernel": [H, K], "bias": [K]}, host arrays)."""
  modules = dict(jax.device_get(servable.params["head"]))
  if len(modules) != 1:
    raise ValueError(f"{servable.source}: the head has {sorted(modules)}; a transformers task "
                     "class has one output layer")
  return {k: np.asarray(v, np.float32) for k, v in next(iter(modules.values())).items()}


def export_huggingface(servable: Servable, output: str,
                       encoder_only: bool = False) -> Dict[str, Any]:
  """Writes the family's transformers class of the output kind (`OutputKind.hf_head`; a
  pre-trained checkpoint with its masked-LM head: the family's pre-training / masked-LM class,
  unless `encoder_only`) and the tokenizer files to `output`."""
  with written_whole(output) as partial:
    architecture, vocab_name = _write_huggingface(servable, partial, encoder_only)
  return _describe(servable, output, "huggingface", vocab_name, architecture)


def export_sentence_transformers(servable: Servable, output: str) -> Dict[str, Any]:
  """Writes the encoder as `export_huggingface` does and sentence-transformers' modules beside
  it (see the module docstring): a folder `SentenceTransformer(output)` loads."""
  if servable.embedding is None:
    raise ValueError(f"{servable.source}: not loaded as an embedding model "
                     "(serving.load(..., as_embedding=True))")
  if not (servable.vocab_file or servable.tokenizer_file):
    raise ValueError(f"{servable.source}: sentence-transformers loads its tokenizer through "
                     "transformers, which reads a vocab.txt or a tokenizer.json; this model has "
                     f"{servable.spm_model_file or 'no vocabulary'}")
  with written_whole(output) as partial:
    architecture, vocab_name = _write_huggingface(servable, partial, encoder_only=True)
    st_format.write_modules(partial, servable.embedding, servable.bert_config.hidden_size)
  return _describe(servable, output, "sentence_transformers", vocab_name, architecture)


def _describe(servable: Servable, output: str, fmt: str, vocab_name: Optional[str],
              architecture: str) -> Dict[str, Any]:
  """signature.json of a transformers export, written into `output` last (see written_whole)."""
  description = signature_description(servable, fmt, vocab_name)
  description["transformers_class"] = architecture
  filesystem.write_text(filesystem.join(output, SIGNATURE_FILE),
                        json.dumps(description, indent=2, ensure_ascii=False) + "\n")
  return description


def _write_huggingface(servable: Servable, directory: str,
                       encoder_only: bool) -> Tuple[str, Optional[str]]:
  """config.json, model.safetensors and the tokenizer files in `directory`: (the transformers
  class, the vocabulary's name there or None)."""
  config = servable.bert_config
  if config.causal_attention:
    raise ValueError(f"{servable.source} uses left-to-right attention (causal_attention), which "
                     "transformers' BERT classes cannot express; export --format=saved_model")
  family, kind = families.of(config), servable.output_kind
  bert = dict(servable.params["bert"])
  if kind.has_head:   # the family says where the pooler goes (or that it is left out)
    architecture = family.huggingface_class(config, kind.hf_head, servable.source)
    encoder = checkpoints.flatten(checkpoints.per_layer({"bert": bert}, config))
    state = family.huggingface_task_state(kind.hf_head, encoder, _output_layer(servable))
  else:
    heads = None if encoder_only else servable.params.get("cls")
    head = family.pretrained_head(config) if heads else "encoder"
    architecture = family.huggingface_class(config, head, servable.source)
    state = checkpoints.huggingface_state(config, dict({"bert": bert},
                                                       **({"cls": heads} if heads else {})))
  hf_config = checkpoints.huggingface_config(config, architecture)
  tokenizer = tokenizer_for(servable)
  if tokenizer is not None:
    # The special ids the family's config records are the vocabulary's the model was trained
    # with (transformers' ModernBertConfig would otherwise say the released tokenizer's 50,281).
    hf_config.update({field: getattr(tokenizer, attribute)
                      for field, attribute in family.special_token_ids})
  hf_config.update(kind.hf_config(servable.labels))
  hf_config = {k: v for k, v in hf_config.items() if v is not None}
  checkpoints.save_safetensors(state, filesystem.join(directory, "model.safetensors"),
                               metadata={"format": "pt"})
  filesystem.write_text(filesystem.join(directory, "config.json"),
                        json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  return architecture, _write_huggingface_tokenizer(servable, directory)


def _write_huggingface_tokenizer(servable: Servable, output: str) -> Optional[str]:
  """vocab.txt + tokenizer_config.json + special_tokens_map.json (WordPiece; transformers' BERT
  tokenizers have no SentencePiece form), or the model's tokenizer.json with them
  (`PreTrainedTokenizerFast`, casing in the file's normalizer)."""
  if servable.tokenizer_file:   # one tokenizer.json, whatever it was read from
    source = tokenization.HuggingFaceTokenizer(servable.tokenizer_file)
    filesystem.write_text(filesystem.join(output, "tokenizer.json"), source.tokenizer_json())
    special = {f"{short}_token": token for short, token in _special_tokens(servable).items()}
    tokenizer_config = dict(special, tokenizer_class="PreTrainedTokenizerFast",
                            model_max_length=int(servable.max_seq_length))
    filesystem.write_text(filesystem.join(output, "tokenizer_config.json"),
                          json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    filesystem.write_text(filesystem.join(output, "special_tokens_map.json"),
                          json.dumps(special, indent=2, sort_keys=True) + "\n")
    return "tokenizer.json"
  if not servable.vocab_file:
    return None
  filesystem.copy(servable.vocab_file, filesystem.join(output, "vocab.txt"))
  special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
             "cls_token": "[CLS]", "mask_token": "[MASK]"}
  tokenizer_config = dict(special, tokenizer_class="BertTokenizer",
                          do_lower_case=bool(servable.do_lower_case), do_basic_tokenize=True,
                          tokenize_chinese_chars=True, strip_accents=None,
                          model_max_length=int(servable.max_seq_length))
  filesystem.write_text(filesystem.join(output, "tokenizer_config.json"),
                        json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
  filesystem.write_text(filesystem.join(output, "special_tokens_map.json"),
                        json.dumps(special, indent=2, sort_keys=True) + "\n")
  return "vocab.txt"


# ----------------------------------------------------------------------------------- entry point


def export(model: str, fmt: str, output: str, *, dtype: str = "",
           do_lower_case: Optional[bool] = None, platforms: Sequence[str] = PLATFORMS,
           encoder_only: bool = False) -> Dict[str, Any]:
  """Loads `model` (see `load`; for `sentence_transformers`, as an embedding model) and writes
  it to `output` in `fmt` (FORMATS); `encoder_only`: a pre-trained checkpoint's transformers
  export without its masked-LM head."""
  if fmt not in FORMATS:
    raise ValueError(f"format={fmt!r}: expected one of {FORMATS}")
  servable = load(model, dtype=dtype, do_lower_case=do_lower_case,
                  as_embedding=fmt == "sentence_transformers")
  if fmt == "saved_model":
    return export_saved_model(servable, output, platforms)
  if fmt == "sentence_transformers":
    return export_sentence_transformers(servable, output)
  return export_huggingface(servable, output, encoder_only)
