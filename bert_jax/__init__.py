"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax.

Layers (imports run one way, checked by `tests/test_layers.py`):
  CLIs (`main`, `extract_features`) -> `tasks` -> `runtime` -> `parallel` -> `io` -> `model`, `text`
"""
from bert_jax import moved_modules
from bert_jax.model.config import BertConfig

moved_modules.install()

__all__ = ["BertConfig"]
__version__ = "0.1.0"
