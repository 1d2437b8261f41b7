"""What a benchmark's process sets before JAX, TensorFlow or PyTorch start: imported first by the
benchmarks that run both sides of a comparison, and importing nothing heavy itself."""
import os

ENVIRONMENT = (("JAX_PLATFORMS", "cpu"), ("TF_CPP_MIN_LOG_LEVEL", "2"),
               ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"))


def prepare(main: bool) -> None:
  """CPU JAX, quiet TensorFlow, no hub download (each unless set already); and when `main` (the
  benchmark's own process), glibc's freed-memory options as bert_jax.main sets them, before any
  thread starts (faster CPU steps). Not on import by a test, where other threads run already
  and it would only warn."""
  for name, value in ENVIRONMENT:
    os.environ.setdefault(name, value)
  if main:
    from bert_jax.runtime import host_memory
    host_memory.keep_freed_memory()
