r"""Sentence-embedding settings of a model folder, in the two forms they come in, read and written.

A sentence-embedding model is an encoder plus three settings (`EmbeddingSettings`): how token
states become one vector (`pooling`: `bert_jax.model.pooling.POOLINGS`), whether it is scaled to
unit length (`normalize`), and the longest input (`max_seq_length`, tokens with [CLS] and [SEP]).
They live beside the encoder as

* sentence-transformers' folder: `modules.json` lists the modules in order: a `Transformer` (the
  encoder, at "" or a subfolder such as `0_Transformer/`, with `sentence_bert_config.json`:
  `max_seq_length`, `do_lower_case`), a `Pooling` (`1_Pooling/config.json`: the classic
  `pooling_mode_mean_tokens` / `pooling_mode_cls_token` / `pooling_mode_lasttoken` booleans, or
  sentence-transformers 5+'s `"pooling_mode": "mean"`), and optionally a `Normalize`. Version 5+
  keeps the length in the tokenizer (`tokenizer_config.json`'s `model_max_length`, capped at the
  model's `max_position_embeddings` as it does). Any other module (`Dense`, `LayerNorm`, custom
  code) or pooling (`max`, `weightedmean`, several at once) is an `UnsupportedModuleError` naming
  the file and the module: bert_jax would compute other vectors than sentence-transformers.
  `write_modules` writes the classic form, which every sentence-transformers version reads.
* ours: `embedding.json`, `{"pooling": "mean", "normalize": true, "max_seq_length": 256}`, beside
  an encoder `checkpoints.load_pretrained` reads (a fine-tuned embedding model's `best/` or a
  `save_pretrained` folder): `read_embedding_json`, `write_embedding_json`.

`read_settings(path)` finds either (embedding.json first), else None: a pre-trained checkpoint
has no settings, and its users say what they default to (`DEFAULT`: mean pooling, not
normalised). `model_directory(path)` is where the encoder of a sentence-transformers folder is:
what `checkpoints` reads instead of `path`.
"""
import dataclasses
import json
from typing import Any, Dict, Optional, Tuple

from bert_jax.io import filesystem
from bert_jax.model.pooling import POOLINGS

EMBEDDING_FILE = "embedding.json"
EMBEDDING_FIELDS = ("pooling", "normalize", "max_seq_length", "do_lower_case")
MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
POOLING_FOLDER = "1_Pooling"
NORMALIZE_FOLDER = "2_Normalize"
MODULE_CONFIG = "config.json"                  # a Pooling or Normalize module's settings
MODEL_CONFIG = "config_sentence_transformers.json"

# A module's class name (the last part of its `type`) -> what it is to us. sentence-transformers
# has named them `sentence_transformers.models.Pooling` (every version) and, from 5 on, by their
# module (`sentence_transformers.sentence_transformer.modules.pooling.Pooling`).
MODULE_CLASSES = ("Transformer", "Pooling", "Normalize")
# sentence-transformers' pooling modes -> ours, and its classic boolean keys -> its modes.
POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
CLASSIC_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# transformers' "no limit" (VERY_LARGE_INTEGER) and anything like it: not a length.
_NO_LIMIT = 10 ** 9


class UnsupportedModuleError(ValueError):
  """A sentence-transformers folder with a module or setting bert_jax does not compute."""


@dataclasses.dataclass(frozen=True)
class EmbeddingSettings:
  """How an encoder's token states become a sentence vector."""
  pooling: str = "mean"                  # one of pooling.POOLINGS
  normalize: bool = False                # unit length (cosine similarity = dot product)
  max_seq_length: Optional[int] = None   # tokens with [CLS] and [SEP]; None: the model's longest
  # sentence-transformers' `do_lower_case`: the text lower-cased before the tokenizer (which may
  # lower-case again; the uncased models leave this False and lower-case in the tokenizer).
  lower_case: bool = False

  def __post_init__(self):
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling={self.pooling!r}: expected one of {POOLINGS}")
    if self.max_seq_length is not None and self.max_seq_length < 2:
      raise ValueError(f"max_seq_length={self.max_seq_length}: needs at least 2 ([CLS] [SEP])")

  def describe(self) -> str:
    length = self.max_seq_length or "the model's longest"
    return (f"{self.pooling} pooling, {'normalised' if self.normalize else 'not normalised'}, "
            f"max_seq_length {length}")


# What a checkpoint without settings is embedded with (sentence-transformers' own default when it
# wraps a plain transformers model).
DEFAULT = EmbeddingSettings()


def _read_json(path: str) -> Any:
  try:
    return json.loads(filesystem.read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e


def _settings(path: str, **values) -> EmbeddingSettings:
  """EmbeddingSettings(**values), its own checks' errors naming the file they came from."""
  try:
    return EmbeddingSettings(**values)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from e


def _field(values: Dict, key: str, kind: type, path: str, default=None):
  """values[key] of the JSON file `path`, of type `kind` (JSON's own: a `true` is no number), or
  a clear error naming both."""
  value = values.get(key, default)
  if value is not None and type(value) is not kind:   # pylint: disable=unidiomatic-typecheck
    raise ValueError(f"{path}: {key}={value!r} is not a {kind.__name__}")
  return value


# ----------------------------------------------------------------------------------- ours


def read_embedding_json(directory: str) -> Optional[EmbeddingSettings]:
  """The settings of `directory/embedding.json`, or None when there is none."""
  path = filesystem.join(directory, EMBEDDING_FILE)
  if not filesystem.exists(path):
    return None
  values = _read_json(path)
  if not isinstance(values, dict):
    raise ValueError(f"{path}: expected a JSON object with pooling, normalize, max_seq_length")
  unknown = sorted(set(values) - set(EMBEDDING_FIELDS))
  if unknown:
    raise ValueError(f"{path}: unknown field(s) {unknown}; expected {list(EMBEDDING_FIELDS)}")
  return _settings(path, pooling=_field(values, "pooling", str, path, "mean"),
                   normalize=_field(values, "normalize", bool, path, False),
                   max_seq_length=_field(values, "max_seq_length", int, path),
                   lower_case=_field(values, "do_lower_case", bool, path, False))


def write_embedding_json(directory: str, settings: EmbeddingSettings) -> None:
  """`directory/embedding.json` of `settings` (what `read_embedding_json` reads back)."""
  values = {"pooling": settings.pooling, "normalize": settings.normalize,
            "max_seq_length": settings.max_seq_length}
  if settings.lower_case:
    values["do_lower_case"] = True
  filesystem.makedirs(directory)
  filesystem.write_text(filesystem.join(directory, EMBEDDING_FILE),
                        json.dumps(values, indent=2) + "\n")


# ----------------------------------------------------------------------------------- theirs


def is_folder(path: str) -> bool:
  """Whether `path` is a sentence-transformers folder (it has modules.json)."""
  return filesystem.isdir(path) and filesystem.exists(filesystem.join(path, MODULES_FILE))


def _entries(path: str) -> Tuple[Tuple[str, str, str], ...]:
  """(class name or the whole type, folder, what to call it) of each module of
  `path`/modules.json, in order; each folder checked to be inside `path`."""
  source = filesystem.join(path, MODULES_FILE)
  entries = _read_json(source)
  if not isinstance(entries, list) or not entries:
    raise ValueError(f"{source}: expected a list of modules")
  modules = []
  for index, entry in enumerate(entries):
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str) or not isinstance(
        entry.get("path", ""), str):
      raise ValueError(f"{source}: module {index} needs a \"type\" and a \"path\" (got {entry!r})")
    kind, folder = entry["type"], entry.get("path", "")
    if folder:   # a folder name read from a file: inside the model folder, nothing else
      filesystem.confined(path, folder, held_by=source, folder=True)
    ours = kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers.") else kind
    modules.append((ours, folder, f"module {index} ({kind} at {folder or '.'!r})"))
  return tuple(modules)


def _folder(path: str, folder: str) -> str:
  """A module's folder ("" is the model folder itself)."""
  return filesystem.join(path, folder) if folder else path


def _modules(path: str) -> Tuple[Tuple[str, str, str], ...]:
  """`_entries`, checked: Transformer, Pooling, then optionally Normalize."""
  source = filesystem.join(path, MODULES_FILE)
  modules = _entries(path)
  for cls, _, name in modules:
    if cls not in MODULE_CLASSES:
      raise UnsupportedModuleError(
          f"{source}: {name} is not supported: bert_jax computes sentence-transformers' "
          f"Transformer, Pooling (mean, cls, lasttoken) and Normalize modules only, so this "
          "model's vectors would differ from sentence-transformers'")
  classes = [m[0] for m in modules]
  if classes not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
    raise UnsupportedModuleError(
        f"{source}: modules {classes}: bert_jax reads Transformer, Pooling and an optional "
        "Normalize, in that order")
  return modules


def model_directory(path: str) -> str:
  """Where the encoder of `path` is: a sentence-transformers folder's Transformer module (its
  subfolder, or the folder itself), else `path` unchanged. Only the Transformer is looked at:
  the encoder of a model with other modules (a Dense layer) loads, for fine-tuning say;
  `read_folder` refuses it as an embedding model."""
  if not is_folder(path):
    return path
  found = [folder for cls, folder, _ in _entries(path) if cls == "Transformer"]
  if len(found) != 1:
    raise UnsupportedModuleError(f"{filesystem.join(path, MODULES_FILE)}: {len(found)} "
                                 "Transformer modules; bert_jax reads models with one")
  return _folder(path, found[0])


def _pooling(path: str, folder: str, name: str) -> str:
  """Our pooling of a Pooling module's config.json (classic booleans or `pooling_mode`)."""
  source = filesystem.join(_folder(path, folder), MODULE_CONFIG)
  values = _read_json(source) if filesystem.exists(source) else {}
  if "pooling_mode" in values:
    modes = values["pooling_mode"]
    modes = modes if isinstance(modes, list) else [modes]
  else:   # the classic booleans; none set is mean, as sentence-transformers reads them
    modes = [mode for key, mode in CLASSIC_POOLING_KEYS.items() if values.get(key)] or ["mean"]
  if len(modes) != 1 or modes[0] not in POOLING_MODES:
    raise UnsupportedModuleError(
        f"{source}: {name} pools by {modes}: bert_jax pools by one of "
        f"{sorted(POOLING_MODES)} (sentence-transformers' names)")
  return POOLING_MODES[modes[0]]


def _max_seq_length(transformer: str, values: Dict, source: str) -> Optional[int]:
  """The classic `max_seq_length` of sentence_bert_config.json; else (sentence-transformers 5+)
  the tokenizer's `model_max_length`, capped at `max_position_embeddings` as it does."""
  length = _field(values, "max_seq_length", int, source)
  if length is not None:
    return length
  tokenizer_config = filesystem.join(transformer, "tokenizer_config.json")
  if not filesystem.exists(tokenizer_config):
    return None
  length = _read_json(tokenizer_config).get("model_max_length")
  if type(length) is not int or length >= _NO_LIMIT:   # pylint: disable=unidiomatic-typecheck
    return None
  model_config = filesystem.join(transformer, "config.json")
  positions = (_read_json(model_config).get("max_position_embeddings")
               if filesystem.exists(model_config) else None)
  return min(length, positions) if isinstance(positions, int) and positions > 0 else length


def _check_model_config(path: str) -> None:
  """config_sentence_transformers.json: a SentenceTransformer without a default prompt (a prompt
  put before every text is not applied here)."""
  source = filesystem.join(path, MODEL_CONFIG)
  if not filesystem.exists(source):
    return
  values = _read_json(source)
  model_type = values.get("model_type", "SentenceTransformer")
  if model_type != "SentenceTransformer":
    raise UnsupportedModuleError(f"{source}: model_type={model_type!r}: bert_jax reads "
                                 "SentenceTransformer models")
  if values.get("default_prompt_name"):
    raise UnsupportedModuleError(
        f"{source}: default_prompt_name={values['default_prompt_name']!r}: sentence-transformers "
        "puts that prompt before every text, which bert_jax does not; remove it to embed the "
        "texts as they are")


def read_folder(path: str) -> EmbeddingSettings:
  """The settings of the sentence-transformers folder `path` (see the module docstring)."""
  _check_model_config(path)
  modules = _modules(path)
  (_, transformer_folder, _), (_, pooling_folder, pooling_name) = modules[:2]
  transformer = _folder(path, transformer_folder)
  source = filesystem.join(transformer, TRANSFORMER_CONFIG)
  values = _read_json(source) if filesystem.exists(source) else {}
  task = values.get("transformer_task", "feature-extraction")
  if task != "feature-extraction":
    raise UnsupportedModuleError(f"{source}: transformer_task={task!r}: bert_jax reads the "
                                 "encoder's token states (feature-extraction)")
  return _settings(source, pooling=_pooling(path, pooling_folder, pooling_name),
                   normalize=len(modules) == 3,
                   max_seq_length=_max_seq_length(transformer, values, source),
                   lower_case=_field(values, "do_lower_case", bool, source, False))


def write_modules(directory: str, settings: EmbeddingSettings, dimension: int) -> None:
  """sentence-transformers' module files in `directory`, the encoder's files already there (the
  Transformer module at ""): modules.json, sentence_bert_config.json, 1_Pooling/config.json and,
  when normalised, 2_Normalize/ (its config.json empty: the defaults, which every version reads).
  The classic form: the `sentence_transformers.models.*` types and pooling booleans."""
  if settings.max_seq_length is None:
    raise ValueError("write_modules needs max_seq_length (sentence-transformers truncates there)")
  modules = [("Transformer", ""), ("Pooling", POOLING_FOLDER)]
  if settings.normalize:
    modules.append(("Normalize", NORMALIZE_FOLDER))
  entries = [{"idx": i, "name": str(i), "path": folder,
              "type": f"sentence_transformers.models.{cls}"}
             for i, (cls, folder) in enumerate(modules)]
  theirs = {ours: mode for mode, ours in POOLING_MODES.items()}[settings.pooling]
  pooling = {"word_embedding_dimension": dimension}
  pooling.update({key: mode == theirs for key, mode in CLASSIC_POOLING_KEYS.items()})
  files = {
      MODULES_FILE: entries,
      TRANSFORMER_CONFIG: {"max_seq_length": settings.max_seq_length,
                           "do_lower_case": settings.lower_case},
      f"{POOLING_FOLDER}/{MODULE_CONFIG}": pooling,
      MODEL_CONFIG: {"model_type": "SentenceTransformer", "prompts": {},
                     "default_prompt_name": None,
                     "similarity_fn_name": "cosine" if settings.normalize else "dot"},
  }
  if settings.normalize:
    files[f"{NORMALIZE_FOLDER}/{MODULE_CONFIG}"] = {}
  for name, values in files.items():
    target = filesystem.join(directory, *name.split("/"))
    filesystem.makedirs(filesystem.dirname(target))
    filesystem.write_text(target, json.dumps(values, indent=2) + "\n")


# ----------------------------------------------------------------------------------- either


def read_settings(path: str) -> Optional[Tuple[EmbeddingSettings, str]]:
  """(settings, the file they came from) of a model folder: its embedding.json, else its
  sentence-transformers modules; None when it has neither (a pre-trained checkpoint)."""
  if not filesystem.isdir(path):
    return None
  settings = read_embedding_json(path)
  if settings is not None:
    return settings, filesystem.join(path, EMBEDDING_FILE)
  if is_folder(path):
    return read_folder(path), filesystem.join(path, MODULES_FILE)
  return None
