"""The defaults the documents state are the code's defaults.

README.md and docs/*.md state defaults three ways, each checked here against the code:
* in prose, `` `--config.FIELD[=...]` (default V ``: the value of FIELD in the first defaults file
  that declares it (`experiments/common_defaults.py`, `pretraining_defaults.py`,
  `finetuning_defaults.py`, then the experiment files, in name order); `` `--FLAG` (default V ``:
  the default of the absl flag FLAG where a module of the project defines it; `` `BERT_JAX_*`
  (default V `` or `` `BERT_JAX_*`, default V ``: as in a table;
* in a table with a `default` column: a `config.FIELD` row the same way, a `BERT_JAX_*` row
  (an environment variable) against the constant the code falls back to (`ENV_DEFAULTS`);
* in an options table, a value marked `` `V` (default) `` on the row of option `NAME`: the
  default of the config field `NAME` (at any depth, e.g. `data.NAME`).
A default changed on one side only fails here, naming the document, line, field and both values.
"""
import ast
import functools
import glob
import importlib
import os
import re
from typing import Iterator, List, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = sorted(
    os.path.relpath(path, ROOT) for pattern in ("README.md", "docs/*.md")
    for path in glob.glob(os.path.join(ROOT, pattern)))
DEFAULTS_FILES = ("common_defaults", "pretraining_defaults", "finetuning_defaults")
# Environment variables with a default: (module, attribute or attribute[key]) of the fallback.
ENV_DEFAULTS = {
    "BERT_JAX_WORKDIR_LOCK_LEASE_SECS": ("bert_jax.io.workdir_lock", "DEFAULT_LEASE_SECS"),
    "BERT_JAX_DATA_WAIT_SECS": ("data_pipelines.workdir_data", "DEFAULT_WAIT_SECS"),
    "BERT_JAX_STORAGE_TIMEOUT_SECS": ("bert_jax.io.remote_storage", "_DEFAULTS[TIMEOUT]"),
    "BERT_JAX_STORAGE_RETRIES": ("bert_jax.io.remote_storage", "_DEFAULTS[RETRIES]"),
    "BERT_JAX_STORAGE_RETRY_DELAY_SECS": ("bert_jax.io.remote_storage", "_DEFAULTS[RETRY_DELAY]"),
}
# A stated value is a number or a code span (`(default from the file's name)` states none).
PROSE = re.compile(r"`--((?:config\.)?[\w.]+)(?:=[^`]*)?`\s+\(default\s+(`[^`]+`|-?\d[\d.]*)")
PROSE_ENV = re.compile(r"`(BERT_JAX_\w+)`(?:,\s+|\s+\()default\s+([\d.]+)")
MARKED = re.compile(r"`([^`]+)`\s+\(default\)")

Statement = Tuple[str, int, str, str]   # (document, line, name, stated value)


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def _line(text: str, offset: int) -> int:
  return text.count("\n", 0, offset) + 1


def _cells(row: str) -> List[str]:
  return [cell.strip() for cell in row.strip().strip("|").split("|")]


def statements(path: str, text: str) -> Iterator[Statement]:
  """Every (document, line, name, stated default) of `text`: names are `config.FIELD`,
  `BERT_JAX_*` or a bare option name."""
  for pattern, prefix in ((PROSE, "--"), (PROSE_ENV, "")):
    for match in pattern.finditer(text):
      name = match.group(1)
      name = name if name.startswith("config.") or not prefix else prefix + name
      yield path, _line(text, match.start()), name, match.group(2).strip("`")
  lines = text.splitlines()
  header, option = None, None
  for number, row in enumerate(lines, 1):
    if not row.lstrip().startswith("|"):
      header = option = None
      continue
    cells = _cells(row)
    if header is None:
      header = [c.lower() for c in cells]
      continue
    if set(row) <= set("|-: "):
      continue
    if "default" in header:
      value = cells[header.index("default")].strip("`")
      for name in re.findall(r"`((?:config\.)?[\w.]+)`", cells[0]):
        if name.startswith(("config.", "BERT_JAX_")):
          yield path, number, name, value
    option = re.findall(r"`([\w.]+)`", cells[0])[:1] or option
    for marked in MARKED.finditer(row):
      if option:
        yield path, number, option[0], marked.group(1)


def _configs():
  configs = [importlib.import_module(f"experiments.{name}").get_config() for name in
             DEFAULTS_FILES]
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py"))):
    name = os.path.basename(path)[:-3]
    module = importlib.import_module(f"experiments.{name}")
    if name not in DEFAULTS_FILES and hasattr(module, "get_config"):
      configs.append(module.get_config())
  return configs


def _fields(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


@functools.lru_cache(maxsize=None)
def _flag_defaults():
  """{flag: default} of every absl `flags.DEFINE_*("name", default, ...)` with a literal default
  in the project's modules (read from the source: nothing is imported)."""
  found = {}
  for package in ("bert_jax", "data_pipelines", "benchmarks"):
    for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
      for node in ast.walk(ast.parse(_read(os.path.relpath(path, ROOT)))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("DEFINE_") and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)):
          try:
            found[node.args[0].value] = ast.literal_eval(node.args[1])
          except ValueError:
            pass   # a default computed at import: not stated in the documents
  return found


def code_default(name: str, configs) -> Tuple[bool, object]:
  """(found, value): the code's default for a stated name."""
  if name.startswith("--"):
    flags = _flag_defaults()
    return (name[2:] in flags), flags.get(name[2:])
  if name in ENV_DEFAULTS:
    module, attribute = ENV_DEFAULTS[name]
    module = importlib.import_module(module)
    table, _, key = attribute.partition("[")
    value = getattr(module, table)
    return True, value[getattr(module, key.rstrip("]"))] if key else value
  field = name[len("config."):] if name.startswith("config.") else None
  for config in configs:
    for path, value in _fields(config):
      if path == field or (field is None and path.split(".")[-1] == name):
        return True, value
  return False, None


def same(stated: str, value) -> bool:
  stated = stated.strip("\"'")
  if isinstance(value, bool) or value is None:
    return stated == str(value) or stated.lower() == str(value).lower()
  if isinstance(value, (int, float)):
    try:
      return float(stated.replace(",", "")) == float(value)
    except ValueError:
      return False
  return stated == str(value) or (stated == "" and value == "")


@pytest.fixture(scope="module")
def configs():
  return _configs()


def test_the_three_forms_are_read():
  text = ("Set `--config.step_timeout_seconds=S` (default 3600; 0: off).\n"
          "`--heartbeat_timeout_seconds` (default 30 s), `BERT_JAX_DATA_WAIT_SECS`, default 7200\n\n"
          "| variable | meaning | default |\n|---|---|---|\n| `BERT_JAX_STORAGE_RETRIES` | x | 6 |\n\n"
          "| option | values | |\n|---|---|---|\n| `mask_selection` | `count` (default) | a |\n"
          "| | `bernoulli` | b |\n")
  assert [s[2:] for s in statements("x.md", text)] == [
      ("config.step_timeout_seconds", "3600"), ("--heartbeat_timeout_seconds", "30"),
      ("BERT_JAX_DATA_WAIT_SECS", "7200"), ("BERT_JAX_STORAGE_RETRIES", "6"),
      ("mask_selection", "count")]


def test_a_default_changed_on_one_side_is_reported(configs):
  found, value = code_default("config.step_timeout_seconds", configs)
  assert found and same(str(value), value) and not same(str(value) + "1", value)
  assert code_default("mask_selection", configs) == (True, "count")
  assert code_default("BERT_JAX_STORAGE_RETRIES", configs) == (True, 6)
  assert not code_default("config.no_such_field", configs)[0]
  assert code_default("--heartbeat_timeout_seconds", configs)[0]


def test_the_documents_state_defaults():
  assert sum(1 for path in DOCUMENTS for _ in statements(path, _read(path))) >= 15


@pytest.mark.parametrize("path", DOCUMENTS)
def test_stated_defaults_are_the_codes(path, configs):
  wrong = []
  for document, line, name, stated in statements(path, _read(path)):
    found, value = code_default(name, configs)
    if not found:
      wrong.append(f"{document}:{line}: {name} (default {stated}) is declared nowhere")
    elif not same(stated, value):
      wrong.append(f"{document}:{line}: {name}: the document says {stated!r}, the code {value!r}")
  assert not wrong, "\n".join(wrong)
