"""docs/results.md quotes the quick start's measurement (python tools/quick_start.py, its JSON in
docs/quick_start.json): every number of its table of recipes ("Training") and the machine it names are the
file's, so a new measurement that changes them fails here until the page says what it measured."""
import json
import os

from conftest import ROOT

MEASURED = json.load(open(os.path.join(ROOT, "docs", "quick_start.json")))
PAGE = open(os.path.join(ROOT, "docs", "results.md")).read()


def table_row(commit):
    """The cells of the row of the table that names `commit` in its commit column."""
    rows = [[c.strip().strip("*") for c in line.strip().strip("|").split("|")] for line in PAGE.splitlines()
            if line.startswith("|")]
    found = [r for r in rows if len(r) > 1 and r[1] == commit]
    assert len(found) == 1, f"docs/results.md: {len(found)} table rows name commit {commit}"
    return found[0]


def test_the_table_quotes_every_measured_recipe():
    for run in MEASURED["runs"]:
        s, bench = run["seconds"], run["bench"]
        expected = [f"{run['loop']['ar']['steps']} + {run['loop']['mars']['steps']}", f"{s['ar']:.0f} s",
                    f"{s['mars']:.0f} s", f"{s['sample']:.0f} s", f"{s['total'] / 60:.1f} min",
                    f"{bench['mars']['tokens_per_forward']:.2f}", f"{bench['mars']['accuracy']:.3f}",
                    f"{bench['ar']['accuracy']:.3f}"]
        assert table_row(run["commit"])[2:] == expected, run["commit"]


def test_the_page_names_the_machine_and_its_load():
    m = MEASURED["machine"]
    words = [f"{m['cores']} {m['cpu']} cores", f"torch {m['torch'].split('+')[0]}", f"{m['threads']} threads",
             f"load average {m['load_before'][0]:.2f}"]
    said = PAGE[PAGE.index("python tools/quick_start.py"):PAGE.index("| recipe | commit")]  # the run's own words
    flat = " ".join(said.split())  # a phrase may wrap across lines
    assert all(w in flat for w in words), [w for w in words if w not in flat]
