"""The package layout: imports run one way between layers, and no module reaches into another
module's private names."""
import ast
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("bert_jax", "data_pipelines")


def _modules():
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          yield os.path.join(directory, name)


def test_layer_contracts_hold():
  """`lint-imports` checks the [importlinter] contracts of setup.cfg (the layer order)."""
  command = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
  if command is None:
    pytest.skip("import-linter is not installed (pip install -e '.[test]')")
  result = subprocess.run([command, "--config", os.path.join(ROOT, "setup.cfg")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "0 broken" in result.stdout


def _private_uses(path):
  """(line, text) of every `module._name` or `from module import _name` of a project module."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  modules = set()
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
      for alias in node.names:
        if alias.name.startswith("_") and not alias.name.startswith("__"):
          found.append((node.lineno, f"from {node.module} import {alias.name}"))
        modules.add(alias.asname or alias.name)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] in PACKAGES:
          modules.add(alias.asname or alias.name.split(".")[0])
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in modules and node.attr.startswith("_")
        and not node.attr.startswith("__")):
      found.append((node.lineno, f"{node.value.id}.{node.attr}"))
  return found


def test_no_module_uses_another_modules_private_names():
  offences = [f"{os.path.relpath(path, ROOT)}:{line}: {text}"
              for path in _modules() for line, text in _private_uses(path)]
  assert not offences, "\n".join(offences)


def test_the_private_name_check_finds_an_offence(tmp_path):
  sample = tmp_path / "sample.py"
  sample.write_text("from bert_jax.io import checkpoints\nx = checkpoints._per_layer\n")
  assert _private_uses(str(sample)) == [(2, "checkpoints._per_layer")]


def _benchmark_files():
  for directory, _, files in os.walk(os.path.join(ROOT, "benchmarks")):
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.join(directory, name)


def _package_names_used(path):
  """(line, module, name) of every name a file takes from the package: `from module import
  name` and `module.name`, the module imported from the package."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  modules, found = {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
      for alias in node.names:
        found.append((node.lineno, node.module, alias.name))
        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] in PACKAGES and alias.asname:
          modules[alias.asname] = alias.name
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in modules):
      found.append((node.lineno, modules[node.value.id], node.attr))
  return found


def test_benchmarks_use_only_public_documented_names():
  """A benchmark takes from bert_jax and data_pipelines only what they offer: no private name,
  and every function or class it calls has a docstring (a module or constant is its module's)."""
  import importlib
  import inspect
  offences = []
  for path in _benchmark_files():
    where = os.path.relpath(path, ROOT)
    offences += [f"{where}:{line}: {text}" for line, text in _private_uses(path)]
    for line, module, name in _package_names_used(path):
      try:
        value = getattr(importlib.import_module(module), name)
      except (AttributeError, ImportError):
        try:
          importlib.import_module(f"{module}.{name}")   # a submodule
          continue
        except ImportError:
          value = None   # a module of the package, not a name
      if value is None or inspect.ismodule(value):
        continue
      if (inspect.isfunction(value) or inspect.isclass(value)) and not inspect.getdoc(value):
        offences.append(f"{where}:{line}: {module}.{name} has no docstring")
  assert not offences, "\n".join(offences)


def test_old_module_paths_are_gone():
  """The project has no released version: a moved module leaves no shim at its old path."""
  import importlib
  for old in ("bert_jax.checkpoints", "bert_jax.glue", "bert_jax.tasks.glue"):
    with pytest.raises(ModuleNotFoundError):
      importlib.import_module(old)


def test_a_renamed_config_field_is_an_error_naming_its_replacement(tmp_path):
  from bert_jax import tasks
  from experiments import glue as glue_experiment, pretrain_demo
  for config in (glue_experiment.get_config("task=mrpc,quick"),
                 pretrain_demo.get_config("quick")):
    config.train_batch_size = 16
    with pytest.raises(ValueError, match=r"config\.global_batch_size.*--config\.global_batch_size=16"):
      tasks.run(config, str(tmp_path / "run"))
