"""CI runs notebooks/quickstart.ipynb in its quick form (tiny checkpoint, a few steps)."""
import os

import pytest

from tests import finetuning_fixtures as fx

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(__file__)), "notebooks",
                        "quickstart.ipynb")


@pytest.mark.slow
def test_quickstart_notebook_runs_in_quick_form(tmp_path):
  nbformat = pytest.importorskip("nbformat", reason="test extra nbformat not installed")
  nbclient = pytest.importorskip("nbclient", reason="test extra nbclient not installed")
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  parameters = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(parameters) == 1, "the notebook needs exactly one cell tagged 'parameters'"
  vocab = fx.VOCAB + ["yesterday", "child", "teacher", "looked", "at", "walked", "to", "past",
                      "painted", "cleaned", "house", "table"]
  ckpt = fx.write_checkpoint(str(tmp_path / "ckpt"), vocab=vocab, vocab_size=len(vocab))
  parameters[0].source += (f"\nQUICK = True\nCHECKPOINT = {ckpt!r}\n"
                           f"WORKDIR = {str(tmp_path / 'work')!r}\n")
  root = os.path.dirname(os.path.dirname(NOTEBOOK))
  nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": root}}).execute()
  outputs = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "16 dev predictions" in outputs and "cosine similarity" in outputs
  assert os.path.exists(tmp_path / "work" / "MRPC.tsv")
