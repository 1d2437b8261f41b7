"""Old module paths keep importing, with a warning that names the new one: notebooks and scripts
written against them keep working. Two layouts moved: the flat one (`bert_jax.checkpoints`, ...)
and the single `bert_jax/tasks/` folder (`bert_jax.tasks.glue`, ...), now split by what is inside.

`import bert_jax.checkpoints` returns the module `bert_jax.io.checkpoints` itself (one module
object under two names, so patching either patches both).
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old name -> new module
MOVED = {f"bert_jax.{old}": new for old, new in {
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
    "pretraining": "bert_jax.tasks.jobs.pretraining",
    "finetuning": "bert_jax.tasks.framework.finetuning",
    "glue": "bert_jax.tasks.datasets.glue",
    "swag": "bert_jax.tasks.datasets.swag",
    "squad": "bert_jax.tasks.datasets.squad",
    "squad_metrics": "bert_jax.tasks.datasets.squad_metrics",
    "ner": "bert_jax.tasks.datasets.ner",
    "feature_based": "bert_jax.tasks.jobs.feature_based",
}.items()}
MOVED.update({f"bert_jax.tasks.{leaf}": f"bert_jax.tasks.{folder}.{leaf}" for folder, leaves in {
    "framework": ("finetuning",),
    "datasets": ("glue", "swag", "squad", "squad_metrics", "ner"),
    "jobs": ("pretraining", "feature_based", "ablations"),
    "tools": ("prediction", "serving", "compile_report", "fine_tuned"),
}.items() for leaf in leaves})


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
  """Finds an old module path as the module it moved to."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname not in MOVED:
      return None
    new_name = MOVED[fullname]
    warnings.warn(f"{fullname} moved to {new_name}; import that instead.", DeprecationWarning,
                  stacklevel=3)
    return importlib.util.spec_from_loader(fullname, _Alias(new_name))


def install() -> None:
  if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(MovedModuleFinder())
