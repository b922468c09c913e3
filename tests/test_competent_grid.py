"""experiments/competent_grid.py: --quick runs every row of a seed and the 128-epoch measurement's chunks end to
end, resumes, recovers a lost parent bit for bit, and the report leaves out rows whose parent is not their seed's
ar_E; the verdict words follow the protocol's rule."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import competent_grid as grid  # noqa: E402
from experiments import paired, powered_eval  # noqa: E402
from experiments.resumable import weights_digest  # noqa: E402
from nanomars.util.checkpoint import load_model  # noqa: E402


def run(tmp_path, *flags, results="grid.jsonl"):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "competent_grid.py"), "--quick", *flags,
           "--results", str(tmp_path / results), "--out", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return grid.load(tmp_path / results), proc.stdout


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("grid")
    return tmp_path, run(tmp_path)[0]


@pytest.mark.slow
def test_quick_runs_every_row_and_chunk_records_each_prompt_and_resumes(quick):
    tmp_path, results = quick
    cfg = grid.QUICK
    assert [r["name"] for r in results] == grid.queue(cfg)  # one runner: the queue's order
    n = len(powered_eval.powered_split(cfg["n_per_family"]))
    n_sweep = len(powered_eval.subset(powered_eval.powered_split(cfg["n_per_family"]), cfg["sweep_per_family"]))
    ar_e = next(r for r in results if r["row"] == "ar_E")
    for r in results:
        assert r["torch"] and r["threads"] == 1 and r["machine"]["cpu"] and r["core_seconds"] > 0 and "commit" in r
        assert len(r["all"]["right"]) == n
        if r["row"] in grid.grid_rows(cfg) or r["row"] == "long":
            assert r["step_seconds"] > 0 and r["held_out_loss"] and len(r["digest"]) == 16
        if grid.grid_rows(cfg).get(r["row"], grid.Row("", None, [], None)).parent:
            assert r["parent_digest"] == ar_e["digest"]
            assert set(r["sweep"]) == {"1", "0.95"}
            for e in r["sweep"].values():
                assert len(e["right"]) == len(e["tokens"]) == len(e["forwards"]) == n_sweep
    # one epoch is N // batch steps; ar_2E trains twice as many; each chunk of the long run continues the last
    steps = {r["name"]: r.get("steps") for r in results}
    assert steps["ar_E/seed1"] == 8 and steps["ar_2E/seed1"] == 16 and steps["long/E4"] == 32
    assert "all" in next(r for r in results if r["row"] == "bd3lm_B4")  # its own sampler at tau 1, every prompt
    again, _ = run(tmp_path)
    assert again == results  # a second sitting finds every run done and adds nothing
    _, report = run(tmp_path, "--report")
    assert "MARS B 4 - AR-SFT E (paper +1.7, Table 2)" in report and "long     AR-SFT seed 0, epoch 4" in report


@pytest.mark.slow
def test_a_lost_parent_is_retrained_and_pairs_only_if_its_weights_are_the_same(quick, tmp_path):
    src, results = quick
    shutil.copytree(src / "runs", tmp_path / "runs")
    # a new machine: no ar_E checkpoint and no long-run checkpoint; two runs still to do
    shutil.rmtree(tmp_path / "runs" / "seed1" / "ar_E")
    shutil.rmtree(tmp_path / "runs" / "long")
    lost = {"mars_B4/seed1", "long/E4"}
    with open(tmp_path / "grid.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in results if r["name"] not in lost)
    again, out = run(tmp_path)
    assert "retraining ar_E/seed1" in out and "retraining the 128-epoch run" in out
    before, after = ({r["name"]: r for r in rs} for rs in (results, again))
    for name in lost:  # the same weights, so the same outcome on every prompt
        assert after[name]["digest"] == before[name]["digest"]
        assert after[name]["all"]["right"] == before[name]["all"]["right"]
    # a recorded ar_E that this machine cannot reproduce: the runner stops rather than pair different weights
    edited = [{**r, "digest": "0" * 16} if r["row"] == "ar_E" else r for r in again if r["name"] != "mars_B4/seed1"]
    with open(tmp_path / "grid.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in edited)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "competent_grid.py"), "--quick",
                           "--results", str(tmp_path / "grid.jsonl"), "--out", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "error: ar_E/seed1 on this machine has weights" in proc.stderr
    assert "--restart_seed 1" in proc.stderr
    # and the report leaves out every stage-2 row whose parent is not the recorded ar_E
    kept, unpaired = grid.paired_rows(edited)
    assert sorted(unpaired) == sorted(r["name"] for r in edited if "parent_digest" in r)
    assert len(kept) == len(edited) - len(unpaired)


@pytest.mark.slow
def test_restart_seed_moves_the_seeds_rows_aside(quick, tmp_path):
    _, results = quick
    shutil.copy(quick[0] / "grid.jsonl", tmp_path / "grid.jsonl")
    grid.restart_seed(str(tmp_path / "grid.jsonl"), 1)
    assert [r["row"] for r in grid.load(tmp_path / "grid.jsonl")] == ["long", "long"]
    assert grid.load(tmp_path / "grid_superseded.jsonl") == [r for r in results if r["row"] != "long"]


PARENTS = os.path.join(ROOT, "experiments", "competent_grid_parents")


@pytest.mark.parametrize("name", sorted(os.listdir(PARENTS)) if os.path.isdir(PARENTS) else [])
def test_each_committed_parent_is_its_seeds_recorded_ar_E(name):
    """A new machine continues an unfinished seed from these weights: they must be the ones its rows pair with."""
    seed = int(name.removeprefix("ar_E_seed").removesuffix(".pt"))
    recorded = {r["name"]: r for r in grid.load(os.path.join(ROOT, "experiments", "competent_grid.jsonl"))}
    path = os.path.join(PARENTS, name)
    assert weights_digest(path) == recorded[f"ar_E/seed{seed}"]["digest"]
    load_model(path)  # what a stage-2 row's train.py --init_from does with it


def constructed(diff_per_seed, seeds=(1, 2, 3, 4, 5), prompts=400):
    """Records of mars_B4 and ar_E whose accuracies differ by diff_per_seed[s] on a known set of prompts."""
    cfg = {**grid.FULL, "n_per_family": 50, "sweep_per_family": 10}
    n = len(powered_eval.powered_split(cfg["n_per_family"]))
    rng, records = np.random.default_rng(0), []
    for s, d in zip(seeds, diff_per_seed):
        base = rng.random(n) < 0.4
        flip = np.zeros(n, bool)
        flip[rng.choice(n, int(abs(d) * n), replace=False)] = True
        better = np.where(flip, d > 0, base) if d else base
        for row, right in (("ar_E", base), ("mars_B4", better)):
            records.append({"name": f"{row}/seed{s}", "row": row, "seed": s, "digest": "p" if row == "ar_E" else "m",
                            **({"parent_digest": "p"} if row == "mars_B4" else {}),
                            "all": {"right": "".join("01"[int(x)] for x in right)}})
    return records, cfg


def test_the_verdict_follows_the_rule_and_waits_for_every_seed():
    records, cfg = constructed([0.06, 0.05, 0.07, 0.06, 0.05])
    a = next(r for r in grid.report(records, cfg)[0] if r["key"] == "a")
    iv = paired.accuracy_difference(*[[[int(c) for c in r["all"]["right"]] for r in records if r["row"] == row]
                                      for row in ("mars_B4", "ar_E")])
    assert (a["estimate"], a["lo"], a["hi"]) == pytest.approx((iv.estimate, iv.lo, iv.hi))
    assert a["lo"] > 0 and a["verdict"] == "reproduced"
    records, cfg = constructed([-0.06, -0.05, -0.07, -0.06, -0.05])
    assert next(r for r in grid.report(records, cfg)[0] if r["key"] == "a")["verdict"] == "contradicted"
    records, cfg = constructed([0.04, -0.04, 0.0, 0.03, -0.03])
    assert next(r for r in grid.report(records, cfg)[0] if r["key"] == "a")["verdict"] == "not detected"
    records, cfg = constructed([0.06, 0.05, 0.07], seeds=(1, 2, 3))
    assert next(r for r in grid.report(records, cfg)[0] if r["key"] == "a")["verdict"] == "interim (3 seeds): no verdict"
