"""tools/bench.py end to end: MARS and its peers (prompt lookup, a draft model, Medusa heads, tree lossless MARS)
in one table, on one trained checkpoint. The exact rows decode greedy AR's tokens, so their accuracy is
AR's, exactly; the peers' columns (extra parameters, extra training, exact, the draft model's forwards)
are what their models say; a peer whose file is missing is a note, not a failure."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from nanomars.util.checkpoint import save_checkpoint
from nanomars.compare.medusa import Medusa, medusa_loss
from conftest import batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXACT = {"AR+cache", "Jacobi", "Lossless MARS", "Lossless tree 4/2", "Lossless tree 8/3", "Lossless tree 16/3",
         "Stacked tree 8/3 + lookup", "Prompt lookup", "Draft model", "Medusa verified", "Medusa tree 8/3"}
GATED = {"MARS no cache", "MARS block 4", "MARS block 8", "MARS block 16", "MARS block 32", "MARS per-request",
         "Adaptive window", "Aligned window", "Paper block 8", "Paper block 32", "Medusa tau gate"}  # tau 0.95


def bench(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "tools/bench.py", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def files(tok, trained, tmp_path_factory):
    """The trained checkpoint; a draft model: the same weights plus noise (it agrees with the target often,
    not always: 1.7 tokens/forward measured); Medusa heads trained 30 steps on the checkpoint itself, so
    their base's AR is the table's AR."""
    d = tmp_path_factory.mktemp("bench")
    save_checkpoint(str(d / "m.pt"), trained, None, 0, {"block_size": 4})
    draft = copy.deepcopy(trained)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    save_checkpoint(str(d / "draft.pt"), draft, None, 7, {"block_size": 4})
    medusa = Medusa(copy.deepcopy(trained), 3).train()
    opt = medusa.configure_optimizer(3e-3)
    for x, _, targets in batches(tok, 30, seed=2):
        medusa_loss(medusa, x, targets, 3)[0].backward()
        opt.step()
        opt.zero_grad()
    save_checkpoint(str(d / "medusa.pt"), medusa, None, 30, {"stage": "medusa", "init_from": str(d / "m.pt")})
    return d, draft.num_params(), medusa.extra_params()


def test_quick_puts_mars_and_its_peers_in_one_table(files):
    d, draft_params, head_params = files
    out = bench("--quick", "--ckpt", d / "m.pt", "--draft", d / "draft.pt", "--medusa", d / "medusa.pt",
                "--out", d / "bench")
    report = json.loads((d / "bench.json").read_text())
    results = report["results"]
    assert "forwards of the target model, the verifier's own token included" in out
    assert report["tokens_per_forward"] in out
    assert len([line for line in out.splitlines() if line.split()[-1:] in (["yes"], ["no"])]) == len(results)
    assert any(n.startswith("Draft model: ") and "7 steps" in n for n in report["notes"])
    assert any(n.startswith("Medusa: ") and "3 heads" in n and "30 steps" in n for n in report["notes"])
    for bs in (1, 8):
        rows = {r["strategy"]: r for r in results if r["batch_size"] == bs}
        assert set(rows) == EXACT | GATED
        ar = rows["AR+cache"]
        assert ar["tokens_per_forward"] == 1.0 and ar["x_ar"] == 1.0
        for name in EXACT:  # AR's tokens, hence AR's accuracy, each row in its own forwards
            r = rows[name]
            assert r["exact"] and r["same_as_ar"] == 1.0, name
            assert (r["tokens"], r["accuracy"]) == (ar["tokens"], ar["accuracy"]), name
        assert not any(rows[name]["exact"] for name in GATED)
        # drafts are kept: trees, draft model, heads and lookup take more than one token in some forwards
        for name in ("Lossless tree 4/2", "Lossless tree 16/3", "Draft model", "Medusa verified"):
            assert rows[name]["tokens_per_forward"] > 1.1, (name, rows[name]["tokens_per_forward"])
        assert rows["Prompt lookup"]["tokens_per_forward"] > 1.0
        # the draft model drafts 4 tokens per target forward, one forward each, inside its wall clock
        draft = rows["Draft model"]
        assert draft["draft_forwards"] == 4 * draft["batch_forwards"]
        assert 0 < draft["draft_seconds"] < draft["seconds"]
        assert all(r["draft_forwards"] == 0 for name, r in rows.items() if name != "Draft model")
        params = {name: r["extra_params"] for name, r in rows.items()}
        assert params == {**dict.fromkeys(rows, 0), "Draft model": draft_params, "Medusa verified": head_params,
                          "Medusa tree 8/3": head_params, "Medusa tau gate": head_params}
        assert head_params == 3 * (64 * 64 + 64)
        training = {name: r["extra_training"] for name, r in rows.items()}
        assert {name for name, t in training.items() if t == "none"} == {"AR+cache", "Jacobi", "Prompt lookup"}
        assert (training["Draft model"], training["Medusa verified"], training["Medusa tau gate"]) == (
            "draft model", "heads", "heads")
        assert {t for name, t in training.items() if "MARS" in name or "tree" in name and "Medusa" not in name or "window" in name
                or "Paper" in name} == {"stage 2"}
    # no verified B-1-token draft, chain or tree, beats what the answers' lengths allow
    ceiling = float(next(n for n in report["notes"] if n.startswith("Ceiling: ")).split("at most ")[1].split()[0])
    trees = [r for r in results if r["strategy"] == "Lossless MARS" or r["strategy"].startswith("Lossless tree")]
    assert max(r["tokens_per_forward"] for r in trees) <= ceiling
    assert (d / "bench.png").stat().st_size > 0


def test_missing_peer_files_are_notes(files):
    d = files[0]
    out = bench("--ckpt", d / "m.pt", "--draft", d / "nothing.pt", "--medusa", d / "none.pt", "--n_prompts", 4,
                "--batch_sizes", 2, "--max_new_tokens", 8, "--out", d / "small")
    report = json.loads((d / "small.json").read_text())
    names = {r["strategy"] for r in report["results"]}
    assert names == (EXACT | GATED) - {"Draft model", "Medusa verified", "Medusa tree 8/3", "Medusa tau gate"}
    assert f"Draft model: skipped, no {d / 'nothing.pt'}" in out
    assert f"Medusa: skipped, no {d / 'none.pt'}" in out
    peer_notes = [n for n in report["notes"] if n.startswith(("Draft model", "Medusa"))]
    assert len(peer_notes) == 2  # the two skips, nothing about rows that did not run


def test_compile_adds_rows_that_decode_what_their_eager_rows_decode(files):
    """--compile: AR+cache, MARS and lossless MARS again with the model's forward compiled; the compiling
    is timed apart (a note); the compiled rows' tokens and forwards are the eager rows'."""
    d, _, _ = files
    bench("--compile", "--ckpt", d / "m.pt", "--draft", "none", "--medusa", "none", "--n_prompts", 6, "--batch_sizes",
          1, 3, "--max_new_tokens", 16, "--out", d / "c")
    report = json.loads((d / "c.json").read_text())
    assert any(n.startswith("Compiled rows: torch.compile") for n in report["notes"])
    for bs in (1, 3):
        rows = {r["strategy"]: r for r in report["results"] if r["batch_size"] == bs}
        for compiled, eager in (("AR+cache compiled", "AR+cache"), ("MARS compiled", "MARS per-request"),
                                ("Lossless compiled", "Lossless MARS")):
            c, e = rows[compiled], rows[eager]
            assert (c["tokens"], c["batch_forwards"], c["accuracy"]) == (e["tokens"], e["batch_forwards"],
                                                                          e["accuracy"]), compiled
        assert rows["AR+cache compiled"]["same_as_ar"] == rows["Lossless compiled"]["same_as_ar"] == 1.0
        assert any(n.startswith(f"Efficiency at batch {bs} (xAR / tok/fwd): MARS per-request ") for n in report["notes"])
