"""Old module paths of the flat layout (`bert_jax.checkpoints`, ...) keep importing, with a
warning that names the new one: notebooks and scripts written against them keep working.

`import bert_jax.checkpoints` returns the module `bert_jax.io.checkpoints` itself (one module
object under two names, so patching either patches both).
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old name (under bert_jax.) -> new module
MOVED = {
    "config": "bert_jax.model.config",
    "modeling": "bert_jax.model.modeling",
    "heads": "bert_jax.model.heads",
    "ops": "bert_jax.model.ops",
    "tokenization": "bert_jax.text.tokenization",
    "checkpoints": "bert_jax.io.checkpoints",
    "training_checkpoints": "bert_jax.io.training_checkpoints",
    "metric_writers": "bert_jax.runtime.metric_writers",
    "optim": "bert_jax.runtime.optim",
    "host_memory": "bert_jax.runtime.host_memory",
    "length_buckets": "bert_jax.runtime.length_buckets",
    "sharding": "bert_jax.parallel.sharding",
    "pretraining": "bert_jax.tasks.pretraining",
    "finetuning": "bert_jax.tasks.finetuning",
    "glue": "bert_jax.tasks.glue",
    "swag": "bert_jax.tasks.swag",
    "squad": "bert_jax.tasks.squad",
    "squad_metrics": "bert_jax.tasks.squad_metrics",
    "ner": "bert_jax.tasks.ner",
    "feature_based": "bert_jax.tasks.feature_based",
}


class _Alias(importlib.abc.Loader):

  def __init__(self, new_name: str):
    self.new_name = new_name

  def create_module(self, spec):
    module = importlib.import_module(self.new_name)
    self._own_spec = module.__spec__
    return module

  def exec_module(self, module):
    # The import machinery gave the module the alias's spec; it keeps its own.
    module.__spec__ = self._own_spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
  """Finds `bert_jax.<old>` as the module it moved to."""

  def find_spec(self, fullname, path=None, target=None):
    package, _, leaf = fullname.rpartition(".")
    if package != "bert_jax" or leaf not in MOVED:
      return None
    new_name = MOVED[leaf]
    warnings.warn(f"{fullname} moved to {new_name}; import that instead.", DeprecationWarning,
                  stacklevel=3)
    return importlib.util.spec_from_loader(fullname, _Alias(new_name))


def install() -> None:
  if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(MovedModuleFinder())
