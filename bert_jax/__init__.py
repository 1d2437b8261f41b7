"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax.

Layers (each imports only the layers below it; setup.cfg's import-linter contracts, checked by
`tests/test_layers.py`):
  CLIs (`main`, `extract_features`, `predict`, `export`) -> `tasks` -> `data_pipelines`
  -> `runtime` -> `parallel`, `text` -> `io` -> `model`
"""
import os
import sys

# TensorFlow and Triton cannot share a process: `import tensorflow`, then `import triton`,
# segfaults. Where the default (CUDA) build of torch is installed, triton comes with it and
# torch imports it by itself (transformers' models load torch._dynamo, which looks for it), so
# a process that runs bert_jax (TensorFlow input pipelines and exports) and then a transformers
# model (parity checks, exports read back) would crash. bert_jax keeps Triton out of its
# processes: torch runs without its Triton kernels, which nothing here uses. Set
# BERT_JAX_ALLOW_TRITON=1 for a process that needs Triton and never imports TensorFlow.
if os.environ.get("BERT_JAX_ALLOW_TRITON") != "1":
  sys.modules.setdefault("triton", None)

from bert_jax.model.config import BertConfig  # noqa: E402

__all__ = ["BertConfig"]
__version__ = "0.1.0"
