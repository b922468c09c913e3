"""experiments/power_grid.py: the long-answer family, the powered split, the paired statistics, the pilot's rule,
and --quick (the grid's own code on a tiny model, resumable)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
sys.path.insert(0, ROOT)
import paired  # noqa: E402
import power_grid  # noqa: E402
import powered_eval  # noqa: E402
from data import worked_arithmetic as worked  # noqa: E402
from nanomars.util import tasks  # noqa: E402


# ------------------------------------------------------------------------------------ the long-answer family
def test_worked_arithmetic_checks_the_final_number_and_is_long(tok):
    rng, lengths = random.Random(0), []
    for _ in range(300):
        prompt, answer = worked.generate(rng)
        assert worked.check(prompt, answer)
        wrong = answer[:answer.rindex("is ") + 3] + str(worked.solve(prompt) + 1) + "."
        assert not worked.check(prompt, wrong) and not worked.check(prompt, answer.rsplit(" The answer", 1)[0])
        assert all(int(v) < 1300 for v in answer.replace(".", " ").split() if v.isdigit())
        lengths.append(len(tok.encode(answer)) + 1)  # + the stop token
    assert min(lengths) >= 20 and max(lengths) <= 71 and 30 <= sorted(lengths)[150] <= 60  # fits 72 new tokens


# ------------------------------------------------------------------------------------------ the powered split
def test_old_split_unchanged_and_the_first_50_of_each_suite_family():
    old = tasks.held_out_split()
    assert tasks.read_jsonl(Path(ROOT) / "data" / "test.jsonl") == old  # the committed 350, as before
    split = powered_eval.powered_split()
    by_family = {f: [ex for ex in split if ex["family"] == f] for f in powered_eval.FAMILIES}
    assert {f: len(v) for f, v in by_family.items()} == {f: 150 if f == "format" else 500 for f in powered_eval.FAMILIES}
    assert [ex for f in tasks.FAMILIES for ex in by_family[f][:50]] == old
    suite = [ex for ex in powered_eval.powered_split(50) if ex["family"] in tasks.FAMILIES]
    assert suite == old and [ex for ex in powered_eval.powered_split(5) if ex["family"] != worked.NAME] == tasks.held_out_split(5)
    for f, items in by_family.items():  # past the old 50, every prompt is new
        prompts = [tasks.user_prompt(ex) for ex in items]
        assert len(set(prompts[50:])) == len(prompts) - 50 and not set(prompts[:50]) & set(prompts[50:])


def test_format_has_270_prompts_so_its_split_keeps_half():
    rng = random.Random(0)
    prompts = {tasks.user_prompt(tasks.make_example("format", rng)) for _ in range(30000)}
    assert len(prompts) == 270
    held = {tasks.user_prompt(ex) for ex in powered_eval.powered_split() if ex["family"] == "format"}
    assert 0.4 < len(held) / len(prompts) < 0.6


def test_training_sets_never_hold_a_held_out_prompt_and_are_balanced():
    held = {tasks.user_prompt(ex) for ex in powered_eval.powered_split()}
    train = powered_eval.train_set(1600, seed=3, exclude=held)
    assert not held & {tasks.user_prompt(ex) for ex in train}
    assert {f: sum(ex["family"] == f for ex in train) for f in powered_eval.FAMILIES} == dict.fromkeys(powered_eval.FAMILIES, 200)
    assert powered_eval.train_set(1600, seed=4, exclude=held) != train  # the seed sets the examples


def test_constant_baseline_answers_each_familys_most_common_training_answer():
    ex = lambda f, q, a: {"family": f, "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}  # noqa: E731
    train = [ex("counting", "How many fruits are in this list: kiwi, cat?", a) for a in ("1", "2", "2")]
    test = [ex("counting", "How many fruits are in this list: kiwi, pear?", "2"),
            ex("counting", "How many fruits are in this list: kiwi, dog?", "1"),
            ex("boolean", "Evaluate: True and False", "False")]
    base = powered_eval.constant_baseline(train, test)
    assert base["answers"] == {"counting": "2"} and base["right"] == "100"
    assert base["accuracy"] == {"counting": 0.5, "boolean": 0.0, "all": 1 / 3}


# ---------------------------------------------------------------------------------------- paired statistics
def flips(rng, seeds, prompts, p, n_flips):
    """b: random 0/1 per (seed, prompt); a: b with exactly n_flips wrong answers made right in every seed."""
    b = (rng.random((seeds, prompts)) < p).astype(int)
    a = b.copy()
    for s in range(seeds):
        a[s, np.flatnonzero(b[s] == 0)[:n_flips]] = 1
    return a, b


def test_paired_interval_finds_a_known_difference():
    a, b = flips(np.random.default_rng(0), 5, 1000, 0.3, 50)
    est, lo, hi, se, df, method = paired.accuracy_difference(a, b)
    assert est == pytest.approx(0.05) and 0 < lo < 0.05 < hi
    assert paired.verdict(lo, hi, +1) == "reproduced" and paired.verdict(lo, hi, -1) == "contradicted"
    assert paired.accuracy_difference(b, b)[:3] == (0.0, 0.0, 0.0)  # the same outcomes: no difference at all


def test_one_seed_is_the_paired_binomial_interval():
    """With one seed only prompts vary: se = sd of the per-prompt differences / sqrt(prompts)."""
    a, b = flips(np.random.default_rng(1), 1, 2000, 0.3, 100)
    iv = paired.accuracy_difference(a, b)
    assert iv.se == pytest.approx((a - b).std(ddof=1) / np.sqrt(2000)) and iv.df == pytest.approx(1999)
    assert iv.hi - iv.estimate == pytest.approx(1.961 * iv.se, rel=1e-3)


def test_seeds_that_disagree_widen_the_interval():
    rng = np.random.default_rng(1)
    a, b = flips(rng, 5, 1000, 0.3, 30)
    iv = paired.accuracy_difference(a, b)
    spread = a.copy()
    for s, n in enumerate((0, 0, 60, 120, 120)):  # seeds disagree on the difference
        spread[s, np.flatnonzero(a[s] == 0)[:n]] = 1
    wide = paired.accuracy_difference(spread, b)
    assert wide.hi - wide.lo > 3 * (iv.hi - iv.lo) and wide.df < 10  # the seed term: t with few degrees of freedom


@pytest.mark.parametrize("seed_sd", [0.0, 0.05])
def test_interval_covers_the_truth_about_95_percent(seed_sd):
    """Simulated pairs of rows whose expected difference is known (0.08), with and without seeds that differ:
    of 400 experiments (5 seeds x 300 prompts) the interval covers the truth in 92-99% (measured over 1000: 98%
    when seeds agree, the t paying for 5 seeds that cannot tell; 97% at seed sd 0.02, 94% at 0.05)."""
    rng, covered = np.random.default_rng(2), 0
    for _ in range(400):
        b = (rng.random((5, 300)) < 0.4).astype(int)
        up = 0.2 + rng.normal(0, seed_sd, (5, 1))  # P(b wrong -> a right), per seed; mean 0.2
        a = np.where(b == 0, rng.random((5, 300)) < up, rng.random((5, 300)) >= 0.1)  # P(b right -> a wrong) 0.1
        _, lo, hi, *_ = paired.accuracy_difference(a, b)  # truth: 0.6 * 0.2 - 0.4 * 0.1 = 0.08
        covered += lo <= 0.08 <= hi
    assert 0.92 <= covered / 400 <= 0.99


def test_ratio_interval_mde_and_flat_verdicts():
    rng = np.random.default_rng(3)
    fa, fb = rng.integers(5, 20, (3, 200)), rng.integers(5, 20, (3, 200))
    iv = paired.ratio_difference(2 * fa, fa, 1.5 * fb, fb)  # 2 and 1.5 tokens per forward on every prompt
    assert iv[:3] == pytest.approx((0.5, 0.5, 0.5))
    iv = paired.ratio_difference(2 * fa + rng.integers(0, 3, (3, 200)), fa, 1.5 * fb, fb)
    assert iv.lo < iv.estimate < iv.hi and iv.estimate > 0.5
    assert paired.mde(paired.Interval(0, -1, 1, 0.01, 1e9)) == pytest.approx(0.028, abs=1e-4)  # 2.80 se
    assert paired.verdict(-0.01, 0.01, 0, 0.017) == "reproduced"
    assert paired.verdict(-0.03, 0.01, 0, 0.017) == "not detected"
    assert paired.verdict(0.02, 0.05, 0, 0.017) == "contradicted"
    assert paired.verdict(-0.01, 0.02, +1) == "not detected"


def test_a_claim_on_one_family_pairs_that_familys_sweep_prompts_only():
    cfg = power_grid.FULL
    sweep = [ex["family"] for ex in powered_eval.subset(powered_eval.powered_split(cfg["n_per_family"]),
                                                       cfg["sweep_per_family"])]
    rng = np.random.default_rng(5)
    keep = np.array(sweep) == worked.NAME
    # tokens per forward: 1.2 on every family but the long one, where B 16 accepts 0.1 more than B 4 (2.1 vs 2.0)
    per_forward = {"mars_B4": np.where(keep, 2.0, 1.2), "mars_B16": np.where(keep, 2.1, 1.2)}
    forwards = {(row, s): rng.integers(5, 30, len(sweep)) for row in per_forward for s in (1, 2)}
    tokens = {(row, s): f * per_forward[row] + rng.integers(0, 2, len(sweep)) for (row, s), f in forwards.items()}
    results = [{"row": row, "seed": s, "sweep": {"0.95": {"tokens": tokens[row, s].tolist(),
                                                          "forwards": forwards[row, s].tolist()}}}
               for row, s in forwards]
    iv, seeds = power_grid.claim(results, "mars_B16", "mars_B4", "tokens_per_forward", "0.95", "0.95", cfg,
                                 worked.NAME)
    assert seeds == [1, 2] and keep.sum() == cfg["sweep_per_family"]
    pick = lambda what, row: np.stack([what[row, s][keep] for s in seeds])  # noqa: E731
    want = paired.ratio_difference(pick(tokens, "mars_B16"), pick(forwards, "mars_B16"),
                                   pick(tokens, "mars_B4"), pick(forwards, "mars_B4"))
    assert iv == pytest.approx(want) and 0.08 < iv.estimate < 0.12  # the long family's +0.1
    everywhere = power_grid.claim(results, "mars_B16", "mars_B4", "tokens_per_forward", "0.95", "0.95", cfg)[0]
    assert everywhere.estimate < 0.5 * iv.estimate  # diluted by the seven other families


# ---------------------------------------------------------------------------------------- the pilot's rule
def pilot(c, acc_e, acc_const, arith, right_e, right_2e, steps=100, step_s=1.0):
    run = lambda row, right, acc: {"candidate": c, "row": row, "held_out_loss": [[steps, {"ar": 1.0}]],  # noqa: E731
                                   "step_seconds": step_s, "ar": {"accuracy": {"all": acc, "arithmetic": arith},
                                                                  "right": right}}
    return [run("constant", "0" * 400, acc_const), run("ar_E", right_e, acc_e), run("ar_2E", right_2e, acc_e)]


def drop(n):  # E right on the first 200 prompts, 2E on the first 200 - n: a paired drop of n / 400
    return "1" * 200 + "0" * 200, "1" * (200 - n) + "0" * (200 + n)


def test_choose_takes_the_cheapest_candidate_that_passes():
    records = (pilot("A", 0.5, 0.2, 0.3, *drop(40), steps=100, step_s=2.0)
               + pilot("B", 0.5, 0.2, 0.3, *drop(20), steps=100, step_s=1.0)  # passes too, and costs half
               + pilot("C", 0.5, 0.3, 0.3, *drop(40), step_s=0.1)  # cheapest, but not twice the baseline
               + pilot("D", 0.5, 0.2, 0.1, *drop(40), step_s=0.1))  # learns no reasoning family
    choice = power_grid.choose(records)
    assert choice["candidate"] == "B" and choice["passed"]
    assert {c: (w["a1"], w["a2"], w["b"]) for c, w in choice["why"].items()} == {
        "A": (True, True, True), "B": (True, True, True), "C": (False, True, True), "D": (True, False, True)}
    assert choice["why"]["A"]["2E_minus_E"][0] == pytest.approx(-0.1) and choice["why"]["B"]["cost_s"] == 100


def test_choose_takes_the_closest_when_none_passes():
    records = (pilot("A", 0.5, 0.2, 0.3, *drop(1))  # (a) passes, the drop is within the interval
               + pilot("B", 0.5, 0.2, 0.3, *drop(3))  # the same, the interval's upper end lower
               + pilot("C", 0.3, 0.2, 0.1, *drop(60)))  # a clear drop, but fails (a1) and (a2)
    choice = power_grid.choose(records)
    assert choice == {**choice, "candidate": "B", "passed": False}
    assert not choice["why"]["B"]["b"] and choice["why"]["C"]["b"]


# ------------------------------------------------------------------------------------------------- --quick
def run(tmp_path, *flags, results="grid.jsonl"):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "power_grid.py"), "--quick", *flags,
           "--results", str(tmp_path / results), "--out", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [json.loads(line) for line in open(tmp_path / results)], proc.stdout


@pytest.mark.slow
def test_quick_grid_runs_every_kind_of_row_records_each_prompt_and_resumes(tmp_path):
    results, _ = run(tmp_path)
    cfg = power_grid.QUICK
    by_row = {r["row"]: r for r in results}
    assert set(by_row) == {"constant", "endless_constant", *power_grid.grid_rows(64, 1, cfg)}
    n = len(powered_eval.powered_split(cfg["n_per_family"]))
    n_sweep = len(powered_eval.subset(powered_eval.powered_split(cfg["n_per_family"]), cfg["sweep_per_family"]))
    for r in results:
        assert r["torch"] and r["threads"] == 1 and r["device"] == "cpu" and "commit" in r
        evals = [r["ar"]] if "ar" in r else []
        evals += [*r.get("sweep", {}).values(), *r.get("adaptive", {}).values()]
        assert evals, r["row"]
        for e in evals:  # per prompt: right or wrong, and (decoded rows) tokens and forwards
            assert len(e["right"]) in (n, n_sweep) and set(e["right"]) <= {"0", "1"}
            assert e["accuracy"]["all"] == pytest.approx(e["right"].count("1") / len(e["right"]))
            if "tokens" in e:
                assert len(e["tokens"]) == len(e["forwards"]) == len(e["right"])
    assert set(by_row["bd3lm_B4"]["sweep"]) == {"1", "0.95"} and "ar" not in by_row["bd3lm_B4"]
    assert set(by_row["offsets_B4"]["adaptive"]) == {"0.95"} and by_row["mars_B4"]["adaptive"]
    assert by_row["ar_E"]["ar"]["tokens_per_forward"] == 1 and len(by_row["ar_2E"]["held_out_loss"]) == 2
    # the training file the runner wrote holds no held-out prompt (the full powered split, not only the quick one)
    held = {tasks.user_prompt(ex) for ex in powered_eval.powered_split()}
    train = tasks.read_jsonl(tmp_path / "runs" / "seed1" / "train_64.jsonl")
    assert len(train) == 65 and not held & {tasks.user_prompt(ex) for ex in train}
    again, _ = run(tmp_path)
    assert again == results  # a second sitting finds every run done and adds nothing
    _, report = run(tmp_path, "--report")
    assert "MARS beats AR-SFT (paper +1.7): mars_B4@1 - ar_E@1 accuracy" in report


@pytest.mark.slow
def test_quick_pilot_then_its_choice(tmp_path):
    results, out = run(tmp_path, "--pilot", results="pilot.jsonl")
    assert sorted(r["name"] for r in results) == sorted(f"pilot/{c}/{row}" for c in power_grid.QUICK_CANDIDATES
                                                        for row in ("constant", "ar_E", "ar_2E"))
    assert json.loads(out[out.index("{\n"):]) == power_grid.choose(results)
