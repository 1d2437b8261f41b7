"""Test-wide settings: CPU only, fast compiles, no accelerator for TensorFlow."""
import os

# Must happen before jax / tensorflow are imported anywhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tiny test models are compile-bound: skip most XLA optimisation passes. Set through the
# environment so that subprocesses (the command-line tests) compile exactly like this process,
# which bitwise comparisons between the two rely on.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402

assert jax.config.read("jax_disable_most_optimizations")
