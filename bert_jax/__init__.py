"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax."""
from bert_jax.config import BertConfig

__all__ = ["BertConfig"]
__version__ = "0.1.0"
