"""Pretrained checkpoints in, and out: Hugging Face, Google TF, and this project's own.

`load_pretrained(path)` returns `(BertConfig, params)` where `params` is the parameter tree of the
config's family's pre-training model in the per-layer layout (`bert/encoder/layer_{i}/...`):
`params["bert"]` feeds the encoder, `params["cls"]` (present only if the source has the
pre-training heads) the heads. Every tensor is checked against the shapes the config implies; a
missing, unexpected or mis-shaped tensor raises `CheckpointMismatchError` naming them.

This layer handles formats (safetensors, pickles, TF, this project's own, training workdirs;
a sentence-transformers folder is read as its Transformer module's: `sentence_transformers`); the
names inside them are the family's (`bert_jax.families`: `flat_from_huggingface`, `flat_from_tf`,
...). Every format is first turned into a flat dict {"bert/encoder/layer_0/.../kernel": array}.
"""
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

import jax
import numpy as np
from absl import logging
from flax import traverse_util

from bert_jax import families
from bert_jax.io import filesystem, sentence_transformers
from bert_jax.model import layers
from bert_jax.model.config import BertConfig

Flat = Dict[str, np.ndarray]

OWN_CONFIG = "bert_jax_config.json"
OWN_PARAMS = "params.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt.pt")


class CheckpointMismatchError(ValueError):
  """The checkpoint's tensors do not match the model the config describes."""


# --------------------------------------------------------------------------- files


def read_config(path: str) -> BertConfig:
  """A `BertConfig` from a JSON file, local or a URL (gs://...): this project's fields, or
  transformers' `config.json` (its `model_type` names the family that reads it)."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"BERT config file not found: {path}")
  text = filesystem.read_text(path)
  try:
    values = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e
  if isinstance(values, dict) and "model_type" in values:
    return families.for_huggingface(values, path).config_from_huggingface(values, path)
  return BertConfig.from_json_string(text, source=path)


def write_config(config: BertConfig, path: str, include_runtime: bool = False) -> None:
  """Writes `config` as JSON (what `BertConfig.to_json_file` writes), local or a URL."""
  filesystem.write_text(path, config.to_json_string(include_runtime))


def load_safetensors(path: str) -> Dict[str, np.ndarray]:
  """{name: array} of a safetensors file, local (memory-mapped read) or a URL."""
  from safetensors import numpy as st
  if not filesystem.is_url(path):
    return st.load_file(path)
  with filesystem.open(path, "rb") as f:
    return st.load(f.read())


def save_safetensors(state: Dict[str, np.ndarray], path: str,
                     metadata: Optional[Dict[str, str]] = None) -> None:
  """Writes a safetensors file, local or a URL."""
  from safetensors import numpy as st
  if not filesystem.is_url(path):
    st.save_file(state, path, metadata=metadata)
    return
  with filesystem.open(path, "wb") as f:
    f.write(st.save(state, metadata=metadata))


# --------------------------------------------------------------------------- shapes and checks


def expected_shapes(config: BertConfig, with_heads: bool = True) -> Dict[str, Tuple[int, ...]]:
  """{flat name: shape} of the family's pre-training model, every head it has, and the encoder's
  pooler, in the per-layer layout (no compilation)."""
  config = config.replace(scan_layers=False, remat=False)
  family = families.of(config)
  model = family.pretraining_model(config,
                                   use_nsp="cls/seq_relationship" in family.pretraining_heads)
  shapes = jax.eval_shape(lambda: layers.init_params(model, jax.random.PRNGKey(0)))
  flat = {"/".join(k): tuple(v.shape)
          for k, v in traverse_util.flatten_dict(shapes).items()}
  if not any(k.startswith("bert/pooler/") for k in flat):
    # A masked LM without a pooler; a fine-tuned encoder has its classifier's pooling there.
    encoder = family.encoder(config, add_pooling_layer=True)
    pooler = jax.eval_shape(lambda: layers.init_params(encoder, jax.random.PRNGKey(0)))
    flat.update({"bert/" + "/".join(k): tuple(v.shape)
                 for k, v in traverse_util.flatten_dict(pooler).items() if k[0] == "pooler"})
  if not with_heads:
    flat = {k: v for k, v in flat.items() if not k.startswith("cls/")}
  return flat


def check_and_unflatten(flat: Flat, config: BertConfig, source: str,
                        optional: Iterable[str] = ()) -> Dict:
  """Validates names and shapes against the config, then builds the nested params tree.

  The encoder (`bert/...`) must be complete; the heads (`cls/...`) are loaded when present and
  reported when absent. Names matching a regex in `optional` may be missing (e.g. a pooler).
  """
  expected = expected_shapes(config)
  family = families.of(config)
  optional = tuple(optional) + family.optional_parameters
  optional_re = [re.compile(p) for p in optional]
  unexpected = sorted(set(flat) - set(expected))
  wrong = [f"{k}: checkpoint {tuple(flat[k].shape)} vs model {expected[k]}"
           for k in sorted(set(flat) & set(expected)) if tuple(flat[k].shape) != expected[k]]
  missing = sorted(k for k in set(expected) - set(flat)
                   if not k.startswith("cls/") and not any(r.match(k) for r in optional_re))
  if unexpected or wrong or missing:
    lines = [f"Checkpoint {source} does not match the model of its config:"]
    for title, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", wrong)):
      if items:
        lines.append(f"  {title} ({len(items)}): " + ", ".join(items[:20]) +
                     (" ..." if len(items) > 20 else ""))
    raise CheckpointMismatchError("\n".join(lines))
  # Each head is all there or absent: a model pre-trained without NSP (objective mlm or ltr)
  # has the masked-LM head only.
  present_heads = set()
  for head in family.pretraining_heads:
    names = {k for k in expected if k.startswith(head + "/")}
    present = names & set(flat)
    if present and present != names:
      raise CheckpointMismatchError(f"Checkpoint {source} has only part of the pre-training head "
                                    f"{head}; missing: {sorted(names - present)}")
    present_heads |= present
  if not present_heads:
    logging.info("Checkpoint %s has no pre-training heads (cls/...): only the encoder is loaded.",
                 source)
  tree = traverse_util.unflatten_dict({tuple(k.split("/")): np.asarray(v, np.float32)
                                       for k, v in flat.items()})
  return tree


def flatten(params: Dict) -> Flat:
  """A nested parameter tree -> {"a/b/kernel": numpy array}: the flat names every format here
  reads and writes (`check_and_unflatten` turns them back, checked against a config)."""
  return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}


# --------------------------------------------------------------------------- scanned layout


def to_model_layout(params: Dict, config: BertConfig) -> Dict:
  """Converts loaded (per-layer) params to the layout `config.scan_layers` asks for."""
  if not config.scan_layers:
    return params
  params = jax.tree_util.tree_map(np.asarray, params)
  families.of(config).stack_layers(
      params["bert"]["encoder"] if "bert" in params else params["encoder"], config)
  return params


# --------------------------------------------------------------------------- Hugging Face


def _read_safetensors(directory: str) -> Dict[str, np.ndarray]:
  single = filesystem.join(directory, "model.safetensors")
  index = filesystem.join(directory, "model.safetensors.index.json")
  if filesystem.exists(single):
    return load_safetensors(single)
  shards = sorted(set(json.loads(filesystem.read_text(index))["weight_map"].values()))
  state = {}
  for shard in shards:   # names read from the index: confined to its folder
    state.update(load_safetensors(filesystem.confined(directory, shard, held_by=index)))
  return state


# Set by a command-line program's `--allow_pickle` (bert_jax.main, bert_jax.export,
# bert_jax.extract_features): the user's word that the pickle checkpoints this process loads
# come from a source they trust; the jobs' own `load_pretrained` calls then take them.
_pickle_trusted = False


def trust_pickle_files() -> None:
  """Lets every `load_pretrained` of this process read `pytorch_model.bin`-style pickles."""
  global _pickle_trusted
  _pickle_trusted = True


def _read_pickle(path: str, allow_pickle: bool) -> Dict[str, np.ndarray]:
  if not (allow_pickle or _pickle_trusted):
    raise ValueError(
        f"Refusing to load {path}: pickle files can run arbitrary code when loaded. Convert it to "
        "safetensors, or, if you trust its source, pass --allow_pickle to bert_jax.main, "
        "bert_jax.export or bert_jax.extract_features (in Python: "
        "load_pretrained(path, allow_pickle=True)).")
  import torch  # Only needed for this opt-in path.
  with filesystem.local_copy(path) as local:
    state = torch.load(local, map_location="cpu", weights_only=True)
  return {k: v.float().numpy() for k, v in state.items()}


def _load_huggingface(directory: str, allow_pickle: bool) -> Tuple[BertConfig, Dict]:
  """A transformers encoder or masked LM of any family (its `config.json`'s model_type)."""
  config = read_config(filesystem.join(directory, "config.json"))
  if filesystem.glob(filesystem.join(directory, "model*.safetensors*")):
    state = _read_safetensors(directory)
  else:
    pickles = [p for p in filesystem.glob(filesystem.join(directory, "*"))
               if p.endswith(PICKLE_SUFFIXES)]
    if not pickles:
      raise FileNotFoundError(f"{directory} has config.json but no model.safetensors")
    state = _read_pickle(pickles[0], allow_pickle)
  flat = families.of(config).flat_from_huggingface(state, directory)
  # An encoder may be saved without its pooler (BertModel(add_pooling_layer=False), a masked LM).
  params = check_and_unflatten(flat, config, directory, optional=[r"bert/pooler/"])
  return config, params


def huggingface_state(config: BertConfig, params: Dict) -> Dict[str, np.ndarray]:
  """transformers' state dict of `params` (torch Linear weights [out, in], float32 numpy), the
  family's names: with the pre-training heads its pre-training class's keys (BERT's `bert.`,
  `cls.`; ModernBERT's `model.`, `head.`, `decoder.`), without them its encoder class's."""
  return families.of(config).huggingface_state(flatten(per_layer(params, config)))


def huggingface_config(config: BertConfig, architecture: str) -> Dict:
  """transformers' `config.json` fields of `config` for the model class `architecture`."""
  return families.of(config).huggingface_config(config, architecture)


def export_huggingface(config: BertConfig, params: Dict, directory: str,
                       tokenizer=None) -> str:
  """Writes `config.json` + `model.safetensors` that transformers loads as the family's
  pre-training class (BertForPreTraining, ModernBertForMaskedLM, ...) when `params` has the
  heads, else as its encoder class; returns the class. `tokenizer`: the special ids the family's
  config records are the vocabulary's (`Family.special_token_ids`)."""
  family = families.of(config)
  filesystem.makedirs(directory)
  state = huggingface_state(config, params)
  has_heads = "cls" in per_layer(params, config)
  head = family.pretrained_head(config) if has_heads else "encoder"
  architecture = family.huggingface_class(config, head, directory)
  save_safetensors(state, filesystem.join(directory, "model.safetensors"),
                   metadata={"format": "pt"})
  hf_config = huggingface_config(config, architecture)
  if tokenizer is not None:
    hf_config.update({field: getattr(tokenizer, attribute)
                      for field, attribute in family.special_token_ids})
  filesystem.write_text(filesystem.join(directory, "config.json"),
                        json.dumps(hf_config, indent=2, sort_keys=True))
  return architecture


# --------------------------------------------------------------------------- Google TF


def _load_tf_checkpoint(prefix: str, tf_gelu_approximate: bool) -> Tuple[BertConfig, Dict]:
  import tensorflow as tf
  config = read_config(filesystem.join(filesystem.dirname(prefix), "bert_config.json"))
  if tf_gelu_approximate and config.hidden_act == "gelu":
    # The original TF code's gelu() is the tanh approximation, whatever the JSON says.
    config = config.replace(hidden_act="gelu_tanh")
  reader = tf.train.load_checkpoint(prefix)  # takes gs:// URLs too
  variables = {name: reader.get_tensor(name)
               for name in reader.get_variable_to_shape_map()}
  params = check_and_unflatten(families.of(config).flat_from_tf(variables), config, prefix)
  return config, params


def export_tf_checkpoint(config: BertConfig, params: Dict, prefix: str) -> None:
  """Writes a TF1-style checkpoint with the original variable names plus `bert_config.json`.

  `prefix` may be a URL: TF's saver checks nothing it writes there, so it writes into a local
  folder that is uploaded file by file, every file checked (`filesystem.local_directory_target`).
  The `checkpoint` state file names the prefix relative to its folder, as the upload needs."""
  variables = families.of(config).tf_from_flat(flatten(per_layer(params, config)))
  import tensorflow as tf
  directory = filesystem.dirname(filesystem.absolute(prefix))
  filesystem.makedirs(directory)
  with filesystem.local_directory_target(directory) as local:
    with tf.Graph().as_default():
      tf_vars = [tf.compat.v1.Variable(v, name=k) for k, v in variables.items()]
      saver = tf.compat.v1.train.Saver(tf_vars, save_relative_paths=True)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        saver.save(session, os.path.join(local, prefix.rstrip("/").rsplit("/", 1)[-1]),
                   write_meta_graph=False)
  tf_config = config.to_dict(include_runtime=False)
  if tf_config["hidden_act"] == "gelu_tanh":
    tf_config["hidden_act"] = "gelu"  # what the original code calls its tanh form
  filesystem.write_text(filesystem.join(directory, "bert_config.json"),
                        json.dumps(tf_config, indent=2, sort_keys=True))


# --------------------------------------------------------------------------- own format


def save_pretrained(config: BertConfig, params: Dict, directory: str) -> None:
  """This project's export: `bert_jax_config.json` + `params.safetensors` (flat names)."""
  filesystem.makedirs(directory)
  flat = {k: np.ascontiguousarray(v, np.float32)
          for k, v in flatten(per_layer(params, config)).items()}
  save_safetensors(flat, filesystem.join(directory, OWN_PARAMS))
  write_config(config, filesystem.join(directory, OWN_CONFIG), include_runtime=True)


def _load_own(directory: str) -> Tuple[BertConfig, Dict]:
  config = read_config(filesystem.join(directory, OWN_CONFIG))
  params = check_and_unflatten(load_safetensors(filesystem.join(directory, OWN_PARAMS)), config,
                               directory)
  return config, params


def per_layer(params: Dict, config: BertConfig) -> Dict:
  """Params of `config`'s model (host or device arrays, either layout) per layer, under `bert`."""
  params = jax.tree_util.tree_map(np.asarray, params)
  encoder = params["bert"]["encoder"] if "bert" in params else params["encoder"]
  if "layer" in encoder:
    families.of(config).unstack_layers(encoder, config)
  if "bert" not in params:
    params = {"bert": params}
  return params


# --------------------------------------------------------------------------- entry point


def detect_format(path: str) -> str:
  """'own', 'huggingface', 'tf' or 'workdir' for a path, or a clear error."""
  if filesystem.isdir(path):
    if filesystem.exists(filesystem.join(path, OWN_CONFIG)):
      return "own"
    if filesystem.exists(filesystem.join(path, "config.json")):
      return "huggingface"
    if filesystem.isdir(filesystem.join(path, "checkpoints")):
      return "workdir"
    if filesystem.glob(filesystem.join(path, "*.index")) and filesystem.exists(
        filesystem.join(path, "bert_config.json")):
      return "tf"
    raise ValueError(f"{path}: not a recognised checkpoint directory (expected config.json + "
                     f"model.safetensors, {OWN_CONFIG}, bert_config.json + bert_model.ckpt.*, "
                     "or a training workdir with checkpoints/)")
  if filesystem.exists(path + ".index"):
    return "tf"
  if path.endswith(PICKLE_SUFFIXES) and filesystem.exists(path):
    raise ValueError(f"{path}: give the directory holding config.json and this file")
  raise FileNotFoundError(f"Checkpoint not found: {path}")


def load_pretrained(path: str, *, allow_pickle: bool = False,
                    tf_gelu_approximate: bool = True) -> Tuple[BertConfig, Dict]:
  """Loads (config, params) from any supported checkpoint.

  path: a Hugging Face directory (config.json + model.safetensors, BertModel or
    BertForPreTraining keys), a Google TF checkpoint prefix (`.../bert_model.ckpt` with
    `bert_config.json` beside it) or its directory, a directory written by `save_pretrained`,
    or a bert_jax training workdir (its latest complete checkpoint).
  allow_pickle: permit `pytorch_model.bin`-style pickle files (they can run code when loaded).
  tf_gelu_approximate: a TF checkpoint's "gelu" means the tanh approximation in the original code.
  A sentence-transformers folder (modules.json) is read as its Transformer module's folder.
  """
  path = sentence_transformers.model_directory(path)
  fmt = detect_format(path)
  if fmt == "huggingface":
    return _load_huggingface(path, allow_pickle)
  if fmt == "tf":
    prefix = path
    if filesystem.isdir(path):
      index = filesystem.glob(filesystem.join(path, "*.index"))
      prefix = index[0][:-len(".index")]
    return _load_tf_checkpoint(prefix, tf_gelu_approximate)
  if fmt == "own":
    return _load_own(path)
  return load_params_from_workdir(path)


def load_pretrained_config(path: str, *, tf_gelu_approximate: bool = True) -> BertConfig:
  """The `BertConfig` of any checkpoint `load_pretrained` reads, without reading its weights."""
  path = sentence_transformers.model_directory(path)
  fmt = detect_format(path)
  if fmt == "own":
    return read_config(filesystem.join(path, OWN_CONFIG))
  if fmt == "huggingface":
    return read_config(filesystem.join(path, "config.json"))
  if fmt == "workdir":
    from bert_jax.io import training_checkpoints
    return read_config(filesystem.join(path, training_checkpoints.BERT_CONFIG))
  directory = path if filesystem.isdir(path) else filesystem.dirname(path)
  config = read_config(filesystem.join(directory, "bert_config.json"))
  if tf_gelu_approximate and config.hidden_act == "gelu":
    config = config.replace(hidden_act="gelu_tanh")   # as _load_tf_checkpoint
  return config


# The vocabulary beside a checkpoint, in this order: WordPiece (released checkpoints, HF BERT dirs,
# a pre-training workdir's data/), a SentencePiece model copied into a fine-tuned best/ directory,
# then a Hugging Face tokenizer.json (ModernBERT-class checkpoints ship only that). A BERT
# directory with both vocab.txt and tokenizer.json keeps vocab.txt: FullTokenizer is the
# reference tokenizer token for token.
VOCAB_CANDIDATES = ("vocab.txt", "data/vocab.txt")
SPM_CANDIDATES = ("spm.model", "data/spm.model")
TOKENIZER_JSON_CANDIDATES = ("tokenizer.json", "data/tokenizer.json")
# Last: RoBERTa's original byte-level BPE files (older releases, fairseq conversions ship no
# tokenizer.json): a vocab.json counts only with its merges.txt in the same folder, and goes in
# the tokenizer_file slot (`tokenization.HuggingFaceTokenizer` reads the pair).
BPE_VOCAB_CANDIDATES = ("vocab.json", "data/vocab.json")
BPE_MERGES = "merges.txt"


def find_vocab(path: str) -> Tuple[Optional[str], Optional[str], Optional[str]]:
  """(vocab_file, spm_model_file, tokenizer_file) found beside the checkpoint at `path`: exactly
  one is a path, the others None (what `tokenization.create_tokenizer` takes); or a clear error.

  In order: vocab.txt, spm.model, tokenizer.json, then a vocab.json with merges.txt beside it
  (returned as the tokenizer_file); each also under data/; in a sentence-transformers folder,
  beside its Transformer module."""
  path = sentence_transformers.model_directory(path)
  directory = path if filesystem.isdir(path) else filesystem.dirname(path)
  lacking_merges: List[str] = []
  for slot, names in enumerate((VOCAB_CANDIDATES, SPM_CANDIDATES, TOKENIZER_JSON_CANDIDATES,
                                BPE_VOCAB_CANDIDATES)):
    for name in names:
      candidate = filesystem.join(directory, *name.split("/"))
      if not filesystem.exists(candidate):
        continue
      if names is BPE_VOCAB_CANDIDATES and not filesystem.exists(
          filesystem.join(filesystem.dirname(candidate), BPE_MERGES)):
        lacking_merges.append(candidate)
        continue
      found: List[Optional[str]] = [None, None, None]
      found[min(slot, 2)] = candidate
      return found[0], found[1], found[2]
  names = (VOCAB_CANDIDATES + SPM_CANDIDATES + TOKENIZER_JSON_CANDIDATES
           + tuple(f"{name} (with {BPE_MERGES} beside it)" for name in BPE_VOCAB_CANDIDATES))
  raise FileNotFoundError(
      f"No vocabulary: {directory} has no {' or '.join(names)}; pass the vocabulary the "
      "checkpoint was trained with (vocab_file / spm_model_file / tokenizer_file)."
      + "".join(f" {p} is there but {filesystem.join(filesystem.dirname(p), BPE_MERGES)} is "
                "missing (a byte-level BPE vocab.json needs its merges.txt)."
                for p in lacking_merges))


def recorded_lower_case(path: str) -> Optional[bool]:
  """The casing a checkpoint directory records (Hugging Face `tokenizer_config.json`), if any."""
  path = sentence_transformers.model_directory(path)
  directory = path if filesystem.isdir(path) else filesystem.dirname(path)
  config_path = filesystem.join(directory, "tokenizer_config.json")
  if not filesystem.exists(config_path):
    return None
  value = json.loads(filesystem.read_text(config_path)).get("do_lower_case")
  return value if isinstance(value, bool) else None


def load_params_from_workdir(workdir: str) -> Tuple[BertConfig, Dict]:
  """(BertConfig, params) from the newest checkpoint of a training workdir (e.g. phase 1)."""
  from bert_jax.io import training_checkpoints  # workdir: only needed with a training run
  config = read_config(filesystem.join(workdir, training_checkpoints.BERT_CONFIG))
  checkpointer = training_checkpoints.TrainingCheckpointer(workdir, async_save=False)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise FileNotFoundError(f"{workdir} has no complete checkpoint under checkpoints/")
    params = checkpointer.restore_params(step)
  finally:
    checkpointer.close()
  flat = flatten(per_layer(params, config))
  logging.info("Loaded params of step %d from %s", step, workdir)
  return config, check_and_unflatten(flat, config, f"{workdir} (step {step})")


def missing_heads(params: Dict, config: BertConfig) -> List[str]:
  """Names of the family's pre-training heads that a loaded checkpoint lacks (empty if
  complete)."""
  present = params.get("cls", {})
  return [head for head in families.of(config).pretraining_heads
          if head.split("/")[1] not in present]
