"""Every notebook must run top to bottom (as a student would on a laptop CPU)."""
import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install -r requirements-test.txt to run notebooks")
nbclient = pytest.importorskip("nbclient", reason="pip install -r requirements-test.txt to run notebooks")

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path):
    os.environ.setdefault("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute()  # raises CellExecutionError, with the failing cell, on any error
