"""Test-wide settings: CPU only, fast compiles, no accelerator for TensorFlow."""
import os

# Must happen before jax / tensorflow are imported anywhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

# Tiny test models are compile-bound: skip most XLA optimisation passes.
jax.config.update("jax_disable_most_optimizations", True)
