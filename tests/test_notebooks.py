"""Every notebook must run top to bottom (as a student would on a laptop CPU), and its figures must be real
images: both in a fresh execution and in the committed file (GitHub shows the stored outputs)."""
import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="pip install -r requirements-test.txt to run notebooks")
nbclient = pytest.importorskip("nbclient", reason="pip install -r requirements-test.txt to run notebooks")

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))
SHOW_SPANS = ("02_train_and_decode.ipynb", "04_decoding_step_by_step.ipynb")  # they show decoded spans
# The figures each notebook must draw, at least: losing one fails (a notebook without an entry draws none)
MIN_FIGURES = {"01_masks_and_signal_fraction.ipynb": 5, "02_train_and_decode.ipynb": 4,
               "03_paper_at_nano_scale.ipynb": 16, "04_decoding_step_by_step.ipynb": 3}


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def images(nb):
    """How many image/png outputs the notebook holds."""
    return sum("image/png" in out.get("data", {}) for c in code_cells(nb) for out in c.get("outputs", []))


def html_spans(nb):
    """How many outputs draw decoded spans as coloured HTML (decode.Spans)."""
    return sum("background:" in out.get("data", {}).get("text/html", "")
               for c in code_cells(nb) for out in c.get("outputs", []))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"
    assert set(MIN_FIGURES) <= {os.path.basename(p) for p in NOTEBOOKS}  # no minimum for a notebook that is gone


def test_the_figure_count_sees_a_lost_figure():
    """The count the minimum is checked against drops when one figure's output is lost."""
    path = next(p for p in NOTEBOOKS if os.path.basename(p) in MIN_FIGURES)
    nb = nbformat.read(path, as_version=4)
    before = images(nb)
    cell = next(c for c in code_cells(nb) if any("image/png" in o.get("data", {}) for o in c.outputs))
    cell.outputs = [o for o in cell.outputs if "image/png" not in o.get("data", {})]
    assert images(nb) < before


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_first_cell_sets_one_thread_and_the_repo_root(path):
    first = code_cells(nbformat.read(path, as_version=4))[0].source
    assert "torch.set_num_threads(1)" in first, "the first code cell must call torch.set_num_threads(1)"
    assert "sys.path.insert(0" in first and '".."' in first, "the first code cell must put the repo root on sys.path"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_notebook_holds_its_outputs(path):
    """The file on disk was executed top to bottom and saved with its outputs, figures as PNG."""
    nb = nbformat.read(path, as_version=4)
    cells = code_cells(nb)
    assert all(c.execution_count is not None for c in cells), "some code cells were never run: execute and save it"
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), "cells were not run top to bottom"
    errors = [out for c in cells for out in c.outputs if out.output_type == "error"]
    assert not errors, f"the saved notebook holds an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    need = MIN_FIGURES.get(os.path.basename(path), 0)
    assert images(nb) >= need, f"the saved notebook holds {images(nb)} figures, fewer than its {need}: execute and save it"
    if os.path.basename(path) in SHOW_SPANS:
        assert html_spans(nb), "the notebook shows no spans as coloured HTML: display(Spans(tok, spans))"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, monkeypatch):
    # No forced backend: the kernel draws with its inline backend, so figures come back as image/png
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(path, as_version=4)
    for c in code_cells(nb):  # judge this run alone, not the outputs stored in the file
        c.outputs, c.execution_count = [], None
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute()  # raises CellExecutionError, with the failing cell, on any error
    need = MIN_FIGURES.get(os.path.basename(path), 0)
    assert images(nb) >= need, f"the notebook drew {images(nb)} figures, fewer than its {need}"
    if os.path.basename(path) in SHOW_SPANS:
        assert html_spans(nb), "the notebook showed no spans as coloured HTML"
