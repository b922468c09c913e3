"""experiments/sft_on_pretrained.py: --quick runs the pilot and every grid row end to end, each fine-tuned row
starting from its recorded parent, and resumes; the SFT sets are disjoint from the base's data and the held-out
prompts; the pilot rule picks the smallest setting that passes; a base that is the competent grid's recorded
ar_E is taken, not retrained."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import powered_eval, runner  # noqa: E402
from experiments import sft_on_pretrained as sft  # noqa: E402
from experiments.resumable import weights_digest  # noqa: E402
from experiments.runs import data_file, training  # noqa: E402
from nanomars.util.tasks import user_prompt  # noqa: E402


def run(tmp_path, *flags):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "sft_on_pretrained.py"), "--quick", *flags,
           "--results", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return runner.load(tmp_path / "s_pilot.jsonl"), runner.load(tmp_path / "s.jsonl"), proc.stdout


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sft")
    return (tmp_path, *run(tmp_path))


@pytest.mark.slow
def test_quick_runs_the_pilot_then_every_grid_row_each_from_its_recorded_parent(quick):
    tmp_path, pilot, grid, _ = quick
    cfg = sft.QUICK
    plan = sft.Plan(cfg, "", "", {}, pilot=True)
    assert [r["name"] for r in pilot] == plan.names()  # one runner: the queue's order
    assert [r["row"] for r in grid] == ["constant", "base", "ar_E", "ar_2E", "mars_B4", "offsets_B4", "bd3lm_B4"]
    n = len(powered_eval.powered_split(cfg["n_per_family"]))
    for records in (pilot, grid):
        digest = {r["name"].rsplit("/", 2)[-2] if r["row"] != "base" else "base": r.get("digest") for r in records
                  if r["row"] in ("base", "ar_E")}
        for r in records:
            assert len(r["all"]["right"]) == n and r["torch"] and r["threads"] == 1 and "commit" in r
            if r["row"] in ("ar_E", "ar_2E"):  # fine-tuned from the base, the SFT set's epochs, its own accuracy
                assert r["parent_digest"] == digest["base"]
            elif r["row"] != "constant" and r["row"] != "base":
                assert r["parent_digest"] == digest["ar_E"]
    # the base is scored on every candidate's SFT set in the pilot, on the chosen one's in the grid
    assert set(pilot[1]["sft"]) == {f"{kind}{n}" for kind, n, _ in cfg["candidates"].values()}
    assert set(grid[1]["sft"]) == {f"{grid[2]['kind']}{grid[2]['n_sft']}"}
    steps = {r["row"]: r["steps"] for r in grid if "steps" in r}
    per_epoch = grid[2]["n_sft"] // cfg["batch"]
    assert steps["ar_E"] == grid[2]["E"] * per_epoch and steps["ar_2E"] == 2 * steps["ar_E"]
    assert steps["mars_B4"] == steps["ar_E"]
    assert set(next(r for r in grid if r["row"] == "mars_B4")["sweep"]) == {"1", "0.95"}


@pytest.mark.slow
def test_a_second_sitting_adds_nothing_and_the_report_reads_the_file(quick):
    tmp_path, pilot, grid, _ = quick
    again_pilot, again, _ = run(tmp_path)
    assert (again_pilot, again) == (pilot, grid)
    *_, report = run(tmp_path, "--report")
    assert "MARS B 4 - AR-SFT 2E, the step-matched control (paper +4.0, Table 2)" in report
    *_, choice = run(tmp_path, "--choose")
    assert "pilot rule" in choice


@pytest.mark.slow
def test_a_base_that_is_the_competent_grids_recorded_ar_E_is_copied_not_retrained(quick, tmp_path):
    src, pilot, _, _ = quick
    base = next(r for r in pilot if r["row"] == "base")
    seed = base["seed"]
    competent = tmp_path / "competent.jsonl"
    competent.write_text(json.dumps({"name": f"ar_E/seed{seed}", "digest": base["digest"]}) + "\n")
    parents = tmp_path / "parents"
    parents.mkdir()
    (parents / f"ar_E_seed{seed}.pt").write_bytes((src / "runs" / f"seed{seed}" / "base" / "ar.pt").read_bytes())
    cfg = {**sft.QUICK, "competent": str(competent), "competent_dirs": (str(parents),)}
    plan = sft.Plan(cfg, str(tmp_path / "p.jsonl"), str(tmp_path / "runs"), {"device": "cpu"}, pilot=True)
    assert plan.base_from_competent(f"base/seed{seed}") == (str(parents / f"ar_E_seed{seed}.pt"), base["digest"])
    plan.train_only(f"base/seed{seed}")
    assert weights_digest(tmp_path / "runs" / f"seed{seed}" / "base" / "ar.pt") == base["digest"]
    competent.write_text(json.dumps({"name": f"ar_E/seed{seed}", "digest": "0" * 16}) + "\n")
    assert plan.base_from_competent(f"base/seed{seed}") is None  # other weights: the base is trained here


def test_an_sft_set_is_fixed_per_seed_and_disjoint_from_the_base_data_and_the_held_out_prompts(tmp_path):
    path = sft.sft_file(str(tmp_path), 3, "math", 40, 64)
    examples = training(path)
    assert len(examples) == 41  # 40 trained on, 1 that train.py holds out
    assert {ex["family"] for ex in examples} == set(sft.KINDS["math"])
    taken = {user_prompt(ex) for ex in powered_eval.powered_split()}
    taken |= {user_prompt(ex) for ex in training(data_file(str(tmp_path), 3, 64))}
    assert not {user_prompt(ex) for ex in examples} & taken
    assert len({user_prompt(ex) for ex in examples}) == len(examples)
    os.remove(path)
    assert training(sft.sft_file(str(tmp_path), 3, "math", 40, 64)) == examples  # the same set, rewritten
    assert training(sft.sft_file(str(tmp_path), 4, "math", 40, 64)) != examples


def pilot_records(diffs, acc_e=0.45, constant=0.16, n=3650):
    """The pilot's records where candidate c's ar_2E is right on diffs[c] fewer prompts' share than its ar_E."""
    cfg, rng = sft.FULL, np.random.default_rng(0)
    s = cfg["pilot_seed"]
    right = lambda p: "".join("01"[int(x)] for x in rng.random(n) < p)  # noqa: E731
    records = [{"name": f"constant/seed{s}", "row": "constant", "seed": s, "all": {"right": right(constant),
                                                                                    "accuracy": {"all": constant}}}]
    for c, d in diffs.items():
        kind, size, _ = cfg["candidates"][c]
        e = np.array([int(x) for x in right(acc_e)])
        e2 = e.copy()
        e2[np.flatnonzero(e)[:int(abs(d) * n)]] = 0 if d < 0 else 1
        for row, hits in (("ar_E", e), ("ar_2E", e2)):
            records.append({"name": f"{c}/{row}/seed{s}", "row": row, "seed": s,
                            "all": {"right": "".join(map(str, hits)), "accuracy": {"all": hits.mean()}},
                            "sft": {f"{kind}{size}": {"accuracy": {"all": 0.9}}}})
    return records, cfg


def test_the_pilot_rule_takes_the_smallest_setting_where_2E_falls_below_E():
    records, cfg = pilot_records({"mix500_E4": -0.001, "math500_E8": -0.05, "mix500_E32": -0.08, "math2000_E8": -0.05})
    got = sft.choose(records, cfg)
    assert [c for c, w in got["why"].items() if w["i"]] == ["math500_E8", "mix500_E32", "math2000_E8"]
    assert got["passed"] and got["candidate"] == "math500_E8" and not got["complete"]
    records, cfg = pilot_records({"mix2000_E8": -0.05, "math500_E32": -0.05})  # the same n x 2E: the smaller n
    assert sft.choose(records, cfg)["candidate"] == "math500_E32"
    records, cfg = pilot_records({"math500_E8": -0.05}, acc_e=0.30)  # (ii): not well above the constant answer
    got = sft.choose(records, cfg)
    assert got["why"]["math500_E8"]["i"] and not got["why"]["math500_E8"]["ii"] and got["candidate"] is None
    records, cfg = pilot_records({c: +0.03 for c in sft.CANDIDATES})  # more epochs help everywhere: no grid
    got = sft.choose(records, cfg)
    assert got["complete"] and not got["passed"] and got["candidate"] is None
