"""The names the documents give exist in the code.

README.md, WORKSPACE.md and docs/*.md name command-line flags, config fields, experiment
arguments, modules and files; each is checked against the code, so that a renamed one is not
documented on:
* `--flag` of a command `python -m bert_jax.{main,predict,export,extract_features}`,
  `python -m data_pipelines.NAME` or `python -m benchmarks.NAME`: defined by that module (absl's
  `DEFINE_*` calls, argparse's `add_argument`, read from the source of the module and the project
  modules it imports, so nothing heavy is imported), an absl built-in, or, for the data builder
  with `--runner`, an Apache Beam pipeline option. A `--flag` in prose, outside a command: defined
  by one of those modules;
* `--config.a.b`: a field of the config of some experiment (`experiments/*.py` `get_config()`,
  and of every `experiments/x.py:arg` the documents name);
* `experiments/x.py:arg`: `get_config(arg)` accepts it (`a|b` alternatives and `[...]` optional
  parts expanded; with a placeholder value such as `task=NAME`, only its keys are checked);
* `bert_jax.x.y[.name]` and `data_pipelines.x[.name]`: the module exists and defines the name;
  file paths (`bert_jax/x/y.py`, `experiments/x.py`, `tests/...`) exist.
Placeholders in capitals (`experiments/NAME.py`, `--config.FIELD=VALUE`) are not names.
"""
import ast
import functools
import glob
import importlib
import importlib.util
import itertools
import os
import re
import shlex

import pytest

from tests.test_doc_links import CODE_SPAN, FENCE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = sorted(
    os.path.relpath(path, ROOT) for pattern in ("README.md", "WORKSPACE.md", "docs/*.md")
    for path in glob.glob(os.path.join(ROOT, pattern)))
PROJECT = ("bert_jax", "data_pipelines", "benchmarks")
# absl's own flags, which every absl program accepts.
ABSL_FLAGS = {"flagfile", "undefok", "help", "helpfull", "helpshort", "helpxml", "v"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")   # NAME, N, SIZE, FIELD


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


# ---------------------------------------------------------------------------------- the code


def _module_file(name: str):
  """The source file of a project module (a package's __init__.py), or None."""
  base = os.path.join(ROOT, *name.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.isfile(path):
      return path
  return None


@functools.lru_cache(maxsize=None)
def _tree(path: str) -> ast.Module:
  return ast.parse(_read(path), path)


def _imported_modules(name: str):
  """The project modules `name` imports (statically, anywhere in its source)."""
  found = set()
  for node in ast.walk(_tree(_module_file(name))):
    names = []
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    found.update(n for n in names if n.split(".")[0] in PROJECT and _module_file(n))
  return found


def _closure(name: str):
  """`name` and every project module it imports, directly or not."""
  seen, todo = set(), [name]
  while todo:
    module = todo.pop()
    if module not in seen:
      seen.add(module)
      todo.extend(_imported_modules(module) - seen)
  return seen


def _string(node, constants=None):
  """A string literal, or a module constant's string (`parser.addoption(TIER, ...)`)."""
  if isinstance(node, ast.Name):
    return (constants or {}).get(node.id)
  return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _defined_flags(path: str):
  """{flag: is_bool} of absl `DEFINE_*` and argparse `add_argument` (pytest `addoption`) calls
  in a file."""
  flags = {}
  constants = {target.id: node.value.value for node in _tree(path).body
               if isinstance(node, ast.Assign) and _string(node.value)
               for target in node.targets if isinstance(target, ast.Name)}
  _str = lambda node: _string(node, constants)
  for node in ast.walk(_tree(path)):
    if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))):
      continue
    function = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
    if function.startswith("DEFINE_") and node.args and _str(node.args[0]):
      flags[_str(node.args[0])] = function in ("DEFINE_bool", "DEFINE_boolean")
    elif function in ("add_argument", "addoption", "add_value_provider_argument"):
      for arg in node.args:
        if (_str(arg) or "").startswith("--"):
          flags[_str(arg)[2:]] = False
  return flags


@functools.lru_cache(maxsize=None)
def command_flags(module: str):
  """{flag: is_bool} a `python -m module` command accepts (absl's built-ins included)."""
  flags = {}
  paths = [_module_file(m) for m in _closure(module)]
  main = os.path.join(ROOT, *module.split("."), "__main__.py")
  if os.path.isfile(main):   # a package run with -m: its __main__ and the package's modules
    paths += glob.glob(os.path.join(os.path.dirname(main), "*.py"))
  for path in paths:
    flags.update(_defined_flags(path))
  if any("DEFINE_" in _read(path) for path in paths):   # an absl program
    from absl import app, flags as absl_flags, logging  # noqa: F401  (they define the built-ins)
    by_module = absl_flags.FLAGS.flags_by_module_dict()
    for owner in ("absl.app", "absl.logging"):
      flags.update({f.name: f.flag_type() == "bool" for f in by_module.get(owner, ())})
    flags.update(dict.fromkeys(ABSL_FLAGS, False))
  return flags


@functools.lru_cache(maxsize=None)
def every_commands_flags():
  """The flags of every command-line module of the project together, and pytest's own options
  of tests/conftest.py (`--tier`)."""
  flags = {}
  for package in PROJECT:
    for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
      flags.update(_defined_flags(path))
  flags.update(_defined_flags(os.path.join(ROOT, "tests", "conftest.py")))
  return flags


@functools.lru_cache(maxsize=None)
def beam_options():
  """Apache Beam's pipeline options as its command line spells them, read from Beam's source
  (importing Beam takes seconds), or None where Beam is not installed."""
  spec = importlib.util.find_spec("apache_beam")   # finds the package without importing it
  if spec is None:
    return None
  path = os.path.join(spec.submodule_search_locations[0], "options", "pipeline_options.py")
  return dict.fromkeys(_defined_flags(path), False)


def _defines(flags, flag: str) -> bool:
  return (flag in flags or flag.replace("-", "_") in flags
          or (flag.startswith("no") and bool(flags.get(flag[2:]))))   # --noflag: a bool off


def accepts(module: str, flag: str, arguments) -> bool:
  if _defines(command_flags(module), flag):
    return True
  if module == "data_pipelines.create_pretraining_data" and any(
      a.startswith("--runner") for a in arguments):
    # The flags the builder does not define go to Beam as pipeline options.
    return beam_options() is None or _defines(beam_options(), flag)
  return False


def _top_level_statements(body):
  """A module's statements, those inside a top-level `if` or `try` included."""
  for node in body:
    yield node
    for block in ("body", "orelse", "finalbody"):
      if isinstance(node, (ast.If, ast.Try)):
        yield from _top_level_statements(getattr(node, block, []))
    for handler in getattr(node, "handlers", []):
      yield from _top_level_statements(handler.body)


def top_level_names(path: str):
  """{name: ast node} of what a module defines or imports at its top level."""
  names = {}
  for node in _top_level_statements(_tree(path).body):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names[node.name] = node
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        for leaf in ast.walk(target):
          if isinstance(leaf, ast.Name):
            names[leaf.id] = node
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      for alias in node.names:
        names[(alias.asname or alias.name).split(".")[0]] = node
  return names


def dotted_name_problem(name: str):
  """Why `bert_jax.x.y.attr` names nothing (None: it exists)."""
  parts = name.split(".")
  for cut in range(len(parts), 0, -1):
    if _module_file(".".join(parts[:cut])):
      break
  else:
    return "no such module"
  module, rest = ".".join(parts[:cut]), parts[cut:]
  if not rest:
    return None
  names = top_level_names(_module_file(module))
  if rest[0] not in names:
    return f"module {module} has no {rest[0]} (and there is no module {module}.{rest[0]})"
  node = names[rest[0]]
  if len(rest) > 1 and isinstance(node, ast.ClassDef):
    members = set()
    for item in node.body:
      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        members.add(item.name)
      elif isinstance(item, ast.Assign):
        members.update(t.id for t in item.targets if isinstance(t, ast.Name))
      elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
        members.add(item.target.id)
    if rest[1] not in members:
      return f"class {module}.{rest[0]} has no {rest[1]}"
  return None


# ------------------------------------------------------------------------------ the documents


def _line(text: str, offset: int) -> int:
  return text.count("\n", 0, offset) + 1


def _without_fences(text: str) -> str:
  """The text with its fenced blocks blanked to their line breaks (line numbers kept)."""
  return FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)


def _split_command(text: str):
  try:
    return shlex.split(text, comments=False)
  except ValueError:   # an unbalanced quote in a shortened command
    return text.split()


def commands(text: str):
  """(line, module, arguments) of every `python -m MODULE ...` in a fenced block or code span."""
  pieces = []
  for fence in FENCE.finditer(text):
    first = _line(text, fence.start())
    start, joined = None, ""
    for number, line in enumerate(fence.group(0).split("\n"), first):
      start = number if start is None else start
      if line.endswith("\\"):   # a continuation line: one command with the next
        joined += line[:-1] + " "
        continue
      pieces.append((start, joined + line))
      start, joined = None, ""
  blanked = _without_fences(text)
  for span in CODE_SPAN.finditer(blanked):
    pieces.append((_line(blanked, span.start()), span.group(0).strip("`").replace("\n", " ")))
  for number, piece in pieces:
    # Shell operators between commands; a `|` without spaces is a choice (`--format=a|b`).
    for command in re.split(r"&&|;|\s\|\|?\s", piece):
      match = re.search(r"python3? -m ([\w.]+)(.*)", command)
      if match:
        yield number, match.group(1), _split_command(match.group(2))


def flags_of(arguments):
  """The flag names of a command's arguments (`[--fsdp]` optional parts included)."""
  for argument in arguments:
    for part in argument.strip("[]").split("|"):
      match = re.match(r"--([A-Za-z][\w.-]*\w)", part.strip("[]"))
      if match and not PLACEHOLDER.match(match.group(1)):
        yield match.group(1)


def prose_flags(text: str):
  """(line, flag) of every code span that is a bare `--flag[=value]` (no command around it)."""
  blanked = _without_fences(text)
  for span in CODE_SPAN.finditer(blanked):
    match = re.fullmatch(r"`\[?--([a-z][\w-]*)(=[^`\s]*)?\]?`", span.group(0))
    if match:
      yield _line(blanked, span.start()), match.group(1)


def config_fields(text: str):
  """(line, field) of every `--config.a.b`."""
  for match in re.finditer(r"--config\.([A-Za-z_][\w.]*\w)", text):
    if not any(PLACEHOLDER.match(part) for part in match.group(1).split(".")):
      yield _line(text, match.start()), match.group(1)


def experiment_arguments(text: str):
  """(line, experiment, argument) of every `experiments/x.py:argument`."""
  for match in re.finditer(r"experiments/(\w+)\.py:([^\s`'\")]+)", text):
    yield _line(text, match.start()), match.group(1), match.group(2).rstrip(".,;:")


def expand(argument: str):
  """The concrete arguments of `task=NAME[,seeds=N]` or `phase=1\\|2`: every combination."""
  argument = argument.replace("\\", "")
  optional = re.findall(r"\[([^\]]*)\]", argument)
  base = re.sub(r"\[[^\]]*\]", "", argument)
  for chosen in itertools.product((False, True), repeat=len(optional)):
    full = base + "".join(part for part, on in zip(optional, chosen) if on)
    items = [item for item in full.split(",") if item]
    choices = []
    for item in items:
      key, equals, values = item.partition("=")
      choices.append([key + equals + value for value in values.split("|")] if equals else [key])
    for combination in itertools.product(*choices):
      yield ",".join(combination)


def dotted_names(text: str):
  """(line, name) of every `bert_jax.x.y` or `data_pipelines.x` (not inside a path or URL)."""
  for match in re.finditer(r"(?<![\w./-])((?:bert_jax|data_pipelines)(?:\.[A-Za-z_]\w*)+)", text):
    yield _line(text, match.start()), match.group(1)


def file_paths(text: str):
  """(line, path) of every repository path such as `bert_jax/x/y.py` or `tests/faults/`."""
  pattern = r"(?<![\w./-])((?:bert_jax|data_pipelines|experiments|benchmarks|tests)/[\w./*<>-]*)"
  for match in re.finditer(pattern, text):
    path = match.group(1).rstrip(".")
    if path.endswith(".py") or path.endswith("/") or "." in os.path.basename(path):
      yield _line(text, match.start()), path


# --------------------------------------------------------------------------------- experiments


def _flatten(config, prefix=""):
  for key, value in config.items():
    yield prefix + key
    if hasattr(value, "items") and not isinstance(value, dict):
      yield from _flatten(value, prefix + key + ".")


@functools.lru_cache(maxsize=None)
def experiment_config(name: str, argument=None):
  module = importlib.import_module(f"experiments.{name}")
  return module.get_config(argument)


def experiments():
  return sorted(os.path.basename(path)[:-3]
                for path in glob.glob(os.path.join(ROOT, "experiments", "*.py"))
                if "def get_config" in _read(path))


@functools.lru_cache(maxsize=None)
def known_config_fields():
  """Every field (and sub-config) of every experiment's default config and of every
  `experiments/x.py:arg` the documents name."""
  fields = set()
  configs = [(name, None) for name in experiments()]
  for path in DOCUMENTS:
    for _, name, argument in experiment_arguments(_read(path)):
      configs += [(name, a) for a in expand(argument)]
  for name, argument in configs:
    try:
      fields.update(_flatten(experiment_config(name, argument)))
    except Exception:   # a bad argument is test_experiment_arguments_are_accepted's to report
      pass
  return fields


# ---------------------------------------------------------------------------------------- tests


def test_the_extractors_find_what_they_look_for():
  text = ("Run\n\n```bash\npython -m bert_jax.main --config=experiments/glue.py:task=mrpc \\\n"
          "  --workdir=/tmp/x --config.model.dtype=bfloat16 && python -m bert_jax.predict"
          " --model=M\n```\n\nthen `python -m\ndata_pipelines.build_vocab [--vocab_size=8]`, "
          "`--compile_for=v5p-8`, `bert_jax.io.checkpoints.load_pretrained` and "
          "`bert_jax/model/config.py`; `--config.FIELD=VALUE`.\n")
  assert [(line, module, list(flags_of(arguments)))
          for line, module, arguments in commands(text)] == [
              (4, "bert_jax.main", ["config", "workdir", "config.model.dtype"]),
              (4, "bert_jax.predict", ["model"]),
              (8, "data_pipelines.build_vocab", ["vocab_size"])]
  assert list(prose_flags(text)) == [(9, "compile_for")]
  assert list(config_fields(text)) == [(5, "model.dtype")]
  assert list(experiment_arguments(text)) == [(4, "glue", "task=mrpc")]
  assert list(expand("task=NAME[,seeds=N]")) == ["task=NAME", "task=NAME,seeds=N"]
  assert list(expand("phase=1\\|2,quick")) == ["phase=1,quick", "phase=2,quick"]
  assert [name for _, name in dotted_names(text)] == ["bert_jax.main", "bert_jax.predict",
                                                      "data_pipelines.build_vocab",
                                                      "bert_jax.io.checkpoints.load_pretrained"]
  assert [path for _, path in file_paths(text)] == ["experiments/glue.py",
                                                    "bert_jax/model/config.py"]


def test_the_checks_catch_a_wrong_name():
  assert accepts("bert_jax.main", "compile_for", [])
  assert accepts("bert_jax.main", "verbosity", [])           # absl's own
  assert not accepts("bert_jax.main", "compile_to", [])
  assert accepts("data_pipelines.create_pretraining_data", "nodo_lower_case", [])
  assert dotted_name_problem("bert_jax.io.checkpoints.load_pretrained") is None
  assert dotted_name_problem("bert_jax.model.config.BertConfig.RUNTIME_FIELDS") is None
  assert dotted_name_problem("bert_jax.io.checkpoints.load_pretrain")
  assert dotted_name_problem("bert_jax.checkpoints")
  assert "model.dtype" in known_config_fields()
  assert "model.dtyp" not in known_config_fields()
  with pytest.raises(ValueError, match="Unknown experiment argument"):
    experiment_config("glue", "tsk=mrpc")


@pytest.mark.parametrize("path", DOCUMENTS)
def test_command_flags_are_defined(path):
  text = _read(path)
  wrong = []
  for line, module, arguments in commands(text):
    if module.split(".")[0] not in PROJECT or any(map(PLACEHOLDER.match, module.split("."))):
      continue   # python -m pytest, python -m benchmarks.NAME
    if not _module_file(module) and not os.path.isfile(
        os.path.join(ROOT, *module.split("."), "__main__.py")):
      wrong.append(f"{path}:{line}: python -m {module}: no such module")
      continue
    for flag in flags_of(arguments):
      if flag.startswith("config.") and module == "bert_jax.main":
        continue   # a config field: test_config_fields_exist
      if not accepts(module, flag, arguments):
        wrong.append(f"{path}:{line}: python -m {module} has no --{flag}")
  for line, flag in prose_flags(text):
    if not _defines(every_commands_flags(), flag) and not _defines(beam_options() or {}, flag):
      wrong.append(f"{path}:{line}: --{flag} is a flag of no command of the project")
  assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", DOCUMENTS)
def test_config_fields_exist(path):
  wrong = [f"{path}:{line}: --config.{field} is a field of no experiment's config"
           for line, field in config_fields(_read(path)) if field not in known_config_fields()]
  assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", DOCUMENTS)
def test_experiment_arguments_are_accepted(path):
  wrong = []
  for line, name, argument in experiment_arguments(_read(path)):
    if not os.path.isfile(os.path.join(ROOT, "experiments", name + ".py")):
      wrong.append(f"{path}:{line}: no experiments/{name}.py")
      continue
    for concrete in expand(argument):
      placeholder = any(PLACEHOLDER.match(item.partition("=")[2])
                        for item in concrete.split(","))
      try:
        experiment_config(name, concrete)
      except Exception as e:  # pylint: disable=broad-except
        if not placeholder or "Unknown experiment argument" in str(e):
          wrong.append(f"{path}:{line}: experiments/{name}.py:{concrete}: "
                       f"{type(e).__name__}: {e}")
  assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", DOCUMENTS)
def test_modules_and_files_exist(path):
  text = _read(path)
  wrong = [f"{path}:{line}: {name}: {dotted_name_problem(name)}"
           for line, name in dotted_names(text) if dotted_name_problem(name)]
  for line, file_path in file_paths(text):
    if os.path.exists(os.path.join(ROOT, file_path)):
      continue
    parts = re.split(r"[/.]", file_path)
    if any(PLACEHOLDER.match(part) for part in parts) or "<" in file_path or "*" in file_path:
      continue   # experiments/NAME.py, datasets/<task>.py, bert_jax/runtime/*.py
    wrong.append(f"{path}:{line}: {file_path} does not exist")
  assert not wrong, "\n".join(wrong)


def test_the_scaling_guide_lists_every_benchmark():
  """docs/scaling.md's list of benchmarks (`python -m benchmarks.NAME`) names every module and
  package of benchmarks/ that runs (helpers aside)."""
  runnable = set()
  for name in os.listdir(os.path.join(ROOT, "benchmarks")):
    path = os.path.join(ROOT, "benchmarks", name)
    if name.endswith(".py") and name not in ("__init__.py", "bench_util.py", "process_setup.py"):
      runnable.add(name[:-3])
    elif os.path.isfile(os.path.join(path, "__main__.py")):
      runnable.add(name)
  text = _read("docs/scaling.md")
  listed = text.split("`python -m benchmarks.NAME`:", 1)[1].split("\n\n", 1)[0]
  missing = sorted(name for name in runnable if f"`{name}`" not in listed)
  assert not missing, f"docs/scaling.md does not list: {missing}"


def test_jax_install_commands_carry_the_supported_range():
  """Every `jax[tpu]` / `jax[cuda..]` a guide installs is pinned to setup.cfg's jax range: an
  unpinned one would pull a jax the project was not measured with."""
  import configparser
  setup = configparser.ConfigParser()
  setup.read(os.path.join(ROOT, "setup.cfg"))
  pin = next(line.strip() for line in setup["options"]["install_requires"].splitlines()
             if line.strip().startswith("jax>=") or line.strip().startswith("jax<"))
  allowed = pin[len("jax"):]
  wrong = [f"{path}: {spec}" for path in DOCUMENTS
           for spec in re.findall(r"jax\[(?:tpu|cuda\d*)\][^\s\"`']*", _read(path))
           if not spec.endswith("]" + allowed)]
  assert not wrong, wrong


def test_install_commands_install_from_the_checkout_and_name_its_extras():
  """bert_jax is installed from its checkout (it is not on the package index): every `pip
  install` a document gives names the package by a path (`.`, `-e .`, `./bert_jax`, `/bert_jax`),
  never as `bert_jax[...]` from the index, and each extra it asks for is one setup.cfg declares."""
  import configparser
  setup = configparser.ConfigParser()
  setup.read(os.path.join(ROOT, "setup.cfg"))
  extras = set(setup["options.extras_require"])
  wrong = []
  for path in DOCUMENTS + ["notebooks/quickstart.ipynb"]:
    for command in re.findall(r"pip install[^`\n;&|#]*", _read(path)):
      for word in command.replace('\\"', '"').split()[2:]:
        word = word.strip("\"'")
        package, _, extra = word.partition("[")
        if package in ("bert_jax", "bert-jax"):
          wrong.append(f"{path}: `{command.strip()}` installs bert_jax from the index")
        elif package in (".", "./bert_jax", "/bert_jax") and extra:
          wrong += [f"{path}: `{command.strip()}`: no extra {name!r} in setup.cfg"
                    for name in extra.rstrip("]").split(",") if name not in extras]
  assert not wrong, "\n".join(wrong)
