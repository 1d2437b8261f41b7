"""`STORAGE_EMULATOR_HOST` for every storage layer: gs:// paths go to a local emulator.

Google's client libraries read `STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT`; the layers below
them each have their own setting, set here from it before they load (filled in below).
"""
import os

ENV = "STORAGE_EMULATOR_HOST"


def configure() -> None:
  """Points each layer's own setting at the emulator, if `STORAGE_EMULATOR_HOST` is set."""
  host = os.environ.get(ENV)
  if not host:
    return
