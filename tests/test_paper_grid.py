"""experiments/paper_grid.py --quick: the grid's own code on a tiny model, every kind of row, resumable."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from paper_grid import QUICK, grid_rows  # noqa: E402


def run(tmp_path, *flags, results="grid.jsonl"):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "paper_grid.py"), "--quick", *flags,
           "--results", str(tmp_path / results), "--out", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [json.loads(line) for line in open(tmp_path / results)]


def test_the_grid_holds_every_row_the_paper_ran():
    rows = grid_rows(500, 20, (4, 8, 16), 20000, 1200)
    assert len(rows) == 16
    assert rows["ar_2E"][2] == ["--n_train", "500", "--epochs", "40"]  # the control: twice the epochs, from scratch
    assert all(parent in (None, "ar_E", "endless_ar") for _, parent, _, _ in rows.values())
    assert "--no-random_offsets" in rows["mars_B16"][2] and "--random_offsets" in rows["offsets_B16"][2]
    assert rows["no_sft_B8"][2][-2:] == ["--objective", "no_sft_released"]
    assert rows["mars_B4_seqnorm"][2][-2:] == ["--loss_norm", "sequence"]
    assert rows["endless_ar_2x"][2] == ["--n_train", "20000", "--max_iters", "2400"]


@pytest.mark.slow
def test_quick_grid_runs_every_kind_of_row_and_resumes(tmp_path):
    results = run(tmp_path)
    by_row = {r["row"]: r for r in results}
    assert set(by_row) == set(grid_rows(64, 1, (4,), 64, 8))
    for name, r in by_row.items():
        assert r["held_out_loss"], name  # a loss curve was parsed from train.py
        assert r["step_seconds"] > 0
        if r["objective"] == "bd3lm":
            assert set(r["sweep"]) == {"1", "0.9"} and "ar" not in r
        else:
            assert 0 <= r["ar"]["accuracy"]["all"] <= 1 and r["ar"]["tokens_per_forward"] == 1
            assert set(r["ar"]["accuracy"]) >= {"arithmetic", "all"}
        if r["block_size"]:  # a stage-2 model: tau 1 and every tau of the protocol's sweep
            assert set(r["sweep"]) == {"1", *(f"{tau:g}" for tau in QUICK["taus"])}
    assert by_row["mars_B4"]["sweep"]["1"] == by_row["mars_B4"]["ar"]  # tau 1 is AR
    # the Jacobi figure is Jacobi's: decoded again here from the AR-SFT checkpoint the grid trained
    from nanomars.batch_decode import batch_jacobi
    from nanomars.util.checkpoint import load_model
    from nanomars.util.tasks import held_out_split
    model, tok, _, _ = load_model(str(tmp_path / "runs" / "seed1" / "ar_E" / "ar.pt"))
    prompts = [tok.prompt_ids(ex["messages"][:1]) for ex in held_out_split(QUICK["n_per_family"])]
    jacobi = batch_jacobi(model, prompts, QUICK["max_new_tokens"], 4, tok.stop_ids)
    assert by_row["ar_E"]["jacobi_tokens_per_forward"] == jacobi.tokens_per_forward
    assert len(by_row["ar_2E"]["held_out_loss"]) == 2 * len(by_row["ar_E"]["held_out_loss"])  # one point per epoch
    assert run(tmp_path) == results  # a second sitting finds every run done and adds nothing


def test_jacobi_figure_counts_jacobis_forwards(monkeypatch, tok):
    """evaluate_run on an AR model that always predicts one token (not a stop token): AR takes a forward per
    token; Jacobi takes 1 forward for the first token, then one per whole window of 4, so 12 tokens in 4."""
    import paper_grid
    from conftest import constant_model
    from nanomars.util.tasks import held_out_split
    model = constant_model(tok.encode("a")[0], vocab_size=tok.vocab_size)
    monkeypatch.setattr(paper_grid, "load_model", lambda path: (model, tok, 4, None))
    scores = paper_grid.evaluate_run("ar.pt", held_out_split(1), None, "ar", {**QUICK, "max_new_tokens": 12})
    assert scores["ar"]["tokens_per_forward"] == 1.0
    assert scores["jacobi_tokens_per_forward"] == 12 / 4


@pytest.mark.slow
def test_timing_times_every_data_limited_training_once(tmp_path):
    results = run(tmp_path, "--timing", results="timing.jsonl")
    expected = {name for name in grid_rows(64, 1, (4,), 64, 8) if name != "ar_2E" and not name.startswith("endless")}
    assert [r["row"] for r in results] == [name for name in grid_rows(64, 1, (4,), 64, 8) if name in expected]
    assert all(r["step_seconds"] > 0 and r["steps"] == 8 for r in results)  # 1 epoch of 64 examples, batch 8
    assert run(tmp_path, "--timing", results="timing.jsonl") == results  # resumable like the grid


def pilot_row(N, E, acc, final_loss):
    return {"N": N, "epochs": E, "ar": {"accuracy": {"all": acc}}, "held_out_loss": [[1, {"ar": 9.0}], [2, {"ar": final_loss}]]}


def test_choose_takes_the_steepest_accuracy_drop_where_loss_also_rises():
    from paper_grid import choose
    pilot = [pilot_row(250, 20, 0.30, 1.5), pilot_row(250, 40, 0.25, 2.0), pilot_row(250, 80, 0.24, 2.5),
             pilot_row(500, 20, 0.30, 1.5), pilot_row(500, 40, 0.20, 1.4)]  # accuracy falls most, but loss falls too
    assert choose(pilot) == (250, 20, True)  # -0.05, against -0.01 from 40 to 80 epochs
    rising = [pilot_row(250, 20, 0.1, 1.5), pilot_row(250, 40, 0.2, 1.6), pilot_row(500, 20, 0.1, 1.5), pilot_row(500, 40, 0.3, 2.5)]
    assert choose(rising) == (500, 20, False)  # accuracy never falls: the largest held-out loss rise, said plainly
