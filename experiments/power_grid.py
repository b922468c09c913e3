"""
The paper's claims (arXiv 2604.07023) tested with power: a regime where AR-SFT learns and then overfits,
chosen by a rule fixed before its pilot; 500 held-out prompts per family; 5 seeds; paired intervals.
experiments/paper_grid.py was the first, underpowered attempt (3 seeds, 350 prompts, unpaired).

    python experiments/power_grid.py --timing     # seconds per training step of each candidate size
    nohup python experiments/power_grid.py --pilot > out/power_pilot.log 2>&1 &    # one thread (--threads)
    # the grid, one single-threaded process per slice (never two on one run); re-run a slice to resume:
    nohup python experiments/power_grid.py --regime data-limited --seeds 1 2 3 > out/power_a.log 2>&1 &
    nohup python experiments/power_grid.py --regime endless > out/power_b.log 2>&1 &
    python experiments/power_grid.py --report     # every claim: paired difference, 95% interval, verdict
    python experiments/power_grid.py --quick --results /tmp/q.jsonl --out /tmp/q   # tiny, < 1 min (CI)

Run from a fixed commit in its own git worktree, so edits on main cannot change a running experiment. Each
finished run appends a JSON line (experiments/power_grid.jsonl, power_pilot.jsonl, power_timing.jsonl) with
the torch version, the thread count, the device and the git commit, and is skipped when the runner starts
again. --device cuda runs the same grid on a GPU (bf16 training as train.py does it there).

Protocol (committed before the pilot ran; nothing here changes after seeing pilot or grid results)
- Data: training sets drawn by experiments/powered_eval.train_set: the seven suite families and the long-
  answer family data/worked_arithmetic.py (answers 25-63 tokens, median 46, so a block of 16 fits), in
  equal shares, no prompt of the powered split. A run's file holds N examples plus 2% more, which train.py
  holds out for its loss curve (so it trains on exactly N). The seed sets the examples, weights and order.
- Evaluation: powered_eval.powered_split(): 500 prompts per family (format 150: it has only 270), 3650 in
  all; the old 350 are its first 50 of each suite family. Greedy, 72 new tokens (the longest worked answer
  is 63 tokens + the stop). Stored per prompt, in the split's order: right ("1"/"0", one string), tokens,
  forwards. Tau sweeps, adaptive windows and BD3LM's sampler run on the sweep prompts, the first 100 of
  each family (800; powered_eval.subset_indices says where they are in the split).
- Constant baseline: per seed, each family's most common training answer, scored on the same prompts.
- Pilot (--pilot, seed 0, which the grid never uses): for each candidate below, AR-SFT for E and, from
  scratch, 2E epochs; greedy accuracy on all powered prompts; the constant baseline of its training set.
  Candidates (model = layers x width; heads 4, kv heads 2, MLP 2.75 x width; train.py's defaults otherwise;
  S = the steps of an AR-SFT E run, E x (N // 32)):
      A  4 x 128 (train.py's default model, 0.87M parameters), N 1000, E 20 (S 620)
      B  4 x 128, N 2000, E 20 (S 1240)
      C  6 x 256 (4.7M parameters), N 2000, E 8 (S 496)
      D  6 x 256, N 1000, E 20 (S 620)
  A's grid alone fits the CPU budget (below); B more data, C and D a bigger model (fewer examples each
  epoch for D, so it overfits sooner). 8 x 256 (6.2M) was measured and left out: 1.3x 6 x 256's cost, whose
  grid already needs a GPU.
- The rule (choose()): a candidate passes when
    (a1) AR-SFT E's accuracy on all prompts is at least twice the constant baseline's;
    (a2) it learns a reasoning family: AR-SFT E's accuracy on arithmetic or on worked_arithmetic >= 0.25
         (their constant baselines: 0.03-0.06 and under 0.01; all families together about 0.165);
    (b)  AR-SFT 2E minus AR-SFT E, paired over the prompts, has a 95% interval wholly below 0 (one seed:
         prompt noise only; the grid tests the same difference again over 5 seeds, claim "overfits").
  Of the candidates that pass, the one whose grid costs least (steps of an AR-SFT E run x its measured
  seconds per step). If none passes, the closest: most conditions passed, then the lowest upper end of
  the 2E - E interval; the grid then prints that no candidate passed and which conditions failed.
- Grid, seeds 1-5, every row: AR-SFT E; AR-SFT 2E from scratch; from AR-SFT E, E more epochs of: MARS
  (alpha 1) at B = 4, 8, 16 as released (blocks from position 0) and with random block offsets
  (nanoMARS's default); the no-SFT ablation as released at B = 4 and 16; BD3LM as released at B = 4. The
  endless regime (the README's run: train.py's default model, N 20000 drawn with replacement, AR 1200
  steps, AR 2400 steps, MARS B = 4 as released 1200 steps from AR 1200), its data drawn the same way (the
  eight families, no held-out prompt) and evaluated the same way.
  Evaluations: greedy (= MARS at tau 1) on all prompts for every row but BD3LM; MARS rows, on the sweep
  prompts, tau 0.95, 0.9, 0.8, 0.7, 0.5, and the B = 16 models also with the adaptive window at those
  taus (tokens/forward and the mean window, the compute each forward spends); no-SFT rows tau 0.95;
  BD3LM its own sampler at tau 1 and 0.95.
- Statistics (experiments/paired.py, where the choice is argued): every comparison is a paired difference
  (same seeds, same prompts) with a 95% t interval from a two-way random-effects model of the per-(seed,
  prompt) differences (seed and prompt variance from ANOVA mean squares, Satterthwaite's degrees of
  freedom), not a bootstrap (it would count the seed-by-prompt noise twice) nor McNemar (one seed, no
  interval); tokens per forward by the same interval on the delta method's per-prompt terms.
- Verdicts: "reproduced" (interval excludes 0 in the paper's direction), "contradicted" (excludes 0 the
  other way), "not detected" (includes 0: the interval and the smallest effect this design detects,
  mde = (t_0.975 + t_0.80) x se, 2.80 se for many degrees of freedom, are printed). A "flat" claim (no
  difference) is reproduced when the interval lies inside +-1.7 points (the paper's headline effect).
  The claims, their rows and directions: CLAIMS below (--report prints them all).
- Power: the interval's half width is t x se, se^2 = (MS_seed + MS_prompt - MS_noise) / (5 x 3650). If
  seeds agree and 15% of prompts are discordant (MARS against its parent), that is +-0.6 to 0.8 points;
  if the paired difference itself varies from seed to seed with sd s, the seed term alone gives
  t_4 x s / sqrt(5) = 1.24 s: the +-1 point target needs s below 0.8 points, else more seeds.
- Budget: about 10 hours of one CPU core in all. Measured with --timing (batch 32, this mix, one thread,
  19 single steps after a first; three sittings, load 1-3 on 2 cores, agreeing within 10%), seconds per
  step, mean (the shortest step: its batch was the shortest):
      4 x 128: AR-SFT 0.28 (0.18), MARS B4 0.57 (0.41), B16 0.60 (0.42)
      6 x 256: AR-SFT 1.00 (0.79), MARS B4 2.28 (1.58), B16 2.60 (1.60)
      8 x 256: AR-SFT 1.3 (1.02), MARS B4 2.9 (2.17): medians at load 1 (power_timing.jsonl's 8 x 256
               rows ran beside another job, at load 3.8: 1.8, 4.0 and, B16, 8.2)
  A MARS step costs r = 2.1 (4 x 128) to 2.4 (6 x 256) AR steps (the old grid's default-model AR step on
  the seven families, whose answers are shorter: 0.16 s). Greedy decoding, batches of 100, per prompt
  (models trained a few steps, ~19 tokens per prompt): 4 x 128 3.7 ms, 6 x 256 11 ms, 8 x 256 14 ms;
  MARS B16 at tau 0.95 about 3x that, B4 1.3x (an upper bound: trained models accept more per forward).
  Pilot: A 3 x 620 steps x 0.28 s = 9 min, B 3 x 1240 x 0.28 = 17 min, C 3 x 496 x 1.00 = 25 min, D 3 x
  620 x 1.00 = 31 min, + 8 greedy evaluations of 3650 prompts (~4 min): about 90 minutes of one core.
  Grid, per seed: 1 (E) + 2 (2E) + 9 stage-2 x r AR-SFT E runs = 21.9 S (4 x 128) or 24.6 S (6 x 256)
  steps; endless (4 x 128): 3600 AR + 1200 MARS steps = 0.47 h; evaluation ~0.2 h (4 x 128) or ~0.6 h
  (6 x 256). Five seeds: A 5 x (21.9 x 620 x 0.28 s + 0.47 h + 0.2 h) = 8.6 h, with the pilot 10 h; B 14 h;
  C 22 h; D 27 h. If the rule chooses B, C or D, the grid runs on one GPU (--device cuda; decoding in
  batches of 1000 there): models this small are launch-bound there, roughly 0.02-0.05 s a step whatever
  their size (an estimate: no GPU was at hand to measure it; --timing --device cuda does), so D: 5 x (12 x
  620 + 4800) = 61200 steps, under 1 h, plus decoding about 1 h: about 2 GPU hours. bf16 training on a GPU
  is not CPU float32: the pilot then runs again there (--pilot --device cuda --results ...) and its choice
  by this same rule is the GPU grid's regime; the CPU pilot stays as the record.

Changed after the grid ran (the protocol above is as it was committed, and no verdict changed):
- Intervals: where the seed variance estimate is cut to zero, the wider of the random-effects interval and the
  seed-clustered t(seeds - 1) interval (experiments/paired.py states the rule; --report marks where it applied).
- --report adds, as measurements over the same records: the step-matched control beside every claim whose rows
  trained different numbers of steps (CONTROLS), the clean-loss x B contrast (INTERACTION), where the paper's
  figure falls against each accuracy interval, and tokens/forward by B at every tau.
- The two tokens/forward claims once quoted a 7B rise with B (+0.14, +0.19) for which no source in the paper
  was found; their direction (up with B) is the protocol's and stays, their labels no longer give a figure.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import paired, powered_eval  # noqa: E402
from experiments.claims import paper_figure, reading  # noqa: E402
from experiments.resumable import done, record  # noqa: E402
from experiments.runs import Row, Rows, data_file, decode, provenance, size, train, training  # noqa: E402
from nanomars.batch_decode import batch_ar, batch_decode  # noqa: E402
from nanomars.compare.block_diffusion import block_diffusion_decode  # noqa: E402
from nanomars.util.checkpoint import load_model  # noqa: E402
from nanomars.util.progress import Progress  # noqa: E402


TAUS = (0.95, 0.9, 0.8, 0.7, 0.5)
FULL = dict(seeds=(1, 2, 3, 4, 5), blocks=(4, 8, 16), batch=32, n_per_family=500, sweep_per_family=100, taus=TAUS,
            max_new_tokens=72, decode_batch=100, endless=(20000, 1200), endless_model=size(4, 128), eval_interval=200)
QUICK = dict(seeds=(1,), blocks=(4,), batch=8, n_per_family=2, sweep_per_family=1, taus=(0.95,), max_new_tokens=12,
             decode_batch=100, endless=(64, 8), endless_model=["--n_layer", "1", "--n_embd", "32", "--n_head", "2",
                                                                 "--n_kv_head", "1", "--intermediate_size", "64"],
             eval_interval=4)
CANDIDATES = {"A": dict(model=size(4, 128), N=1000, E=20), "B": dict(model=size(4, 128), N=2000, E=20),
              "C": dict(model=size(6, 256), N=2000, E=8), "D": dict(model=size(6, 256), N=1000, E=20)}
QUICK_CANDIDATES = {"A": dict(model=QUICK["endless_model"], N=64, E=1), "B": dict(model=QUICK["endless_model"], N=32, E=2)}
SIZES = {"4x128": size(4, 128), "6x256": size(6, 256), "8x256": size(8, 256)}  # --timing
GRID_COST = 1 + 2 + 9 * 2.3  # runs of an AR-SFT E, per seed (protocol: budget)
LEARNS, REASONING = 0.25, ("arithmetic", "worked_arithmetic")


def grid_rows(N, E, cfg):
    epochs = lambda e: ["--epochs", str(e)]  # noqa: E731
    blocks, taus = cfg["blocks"], cfg["taus"]
    rows = {"ar_E": Row("ar", None, epochs(E), None), "ar_2E": Row("ar", None, epochs(2 * E), None)}
    for B in blocks:
        last = B == blocks[-1]
        rows[f"mars_B{B}"] = Row("mars", "ar_E", epochs(E) + stage2(B, "--no-random_offsets"), B, taus, last)
        rows[f"offsets_B{B}"] = Row("mars", "ar_E", epochs(E) + stage2(B, "--random_offsets"), B, taus, last)
    for B in dict.fromkeys((blocks[0], blocks[-1])):
        rows[f"no_sft_B{B}"] = Row("mars", "ar_E", epochs(E) + stage2(B, "--no-random_offsets", "--objective",
                                                                     "no_sft_released"), B, (0.95,))
    rows[f"bd3lm_B{blocks[0]}"] = Row("mars", "ar_E", epochs(E) + stage2(blocks[0], "--objective", "bd3lm"),
                                      blocks[0], (1.0, 0.95))
    steps = cfg["endless"][1]
    rows["endless_ar"] = Row("ar", None, ["--max_iters", str(steps)], None)
    rows["endless_ar_2x"] = Row("ar", None, ["--max_iters", str(2 * steps)], None)
    rows["endless_mars_B4"] = Row("mars", "endless_ar", ["--max_iters", str(steps), *stage2(4, "--no-random_offsets")],
                                  4, taus)
    return rows


def stage2(B, *flags):
    return ["--block_size", str(B), *flags]


# ------------------------------------------------------------------------------------------ bookkeeping
# ------------------------------------------------------------------------------------------- evaluation
def evaluate_run(path, row, examples, cfg, device):
    model, tok, _, _ = load_model(path, device)
    n, stop, mask, batch = cfg["max_new_tokens"], tok.stop_ids, tok.mask_id, cfg["decode_batch"]
    sweep = powered_eval.subset(examples, cfg["sweep_per_family"])
    if "bd3lm" in row.flags:  # not an AR model: every point is its own sampler's
        bd = lambda tau: lambda ps: Rows([block_diffusion_decode(model, p, n, mask, row.B, tau, stop) for p in ps])  # noqa: E731
        return {"sweep": {f"{tau:g}": decode(tok, sweep, bd(tau), batch) for tau in row.taus}}
    scores = {"ar": decode(tok, examples, lambda ps: batch_ar(model, ps, n, stop), batch)}
    mars = lambda tau, **kw: lambda ps: batch_decode(model, ps, n, mask, row.B, tau, stop, **kw)  # noqa: E731
    if row.taus:
        scores["sweep"] = {f"{tau:g}": decode(tok, sweep, mars(tau), batch) for tau in row.taus}
    if row.adaptive:
        scores["adaptive"] = {f"{tau:g}": decode(tok, sweep, mars(tau, adaptive=True), batch) for tau in row.taus}
    return scores


def run_one(run_dir, row, flags, seed, model, cfg, device, examples, interval):
    """Trains one run (train.py with `flags`, row.stage) and evaluates it as `row` says -> its record's fields."""
    os.makedirs(run_dir, exist_ok=True)
    t0 = time.time()
    # train() puts "--device cpu" first: the later --device here wins (argparse keeps the last)
    curve, step_s = train(row.stage, run_dir, flags, seed, {**cfg, "model": [*model, "--device", device]}, interval)
    t1 = time.time()
    scores = evaluate_run(os.path.join(run_dir, f"{row.stage}.pt"), row, examples, cfg, device)
    return {"train_seconds": t1 - t0, "eval_seconds": time.time() - t1, "step_seconds": statistics.median(step_s),
            "held_out_loss": curve, **scores}


# ------------------------------------------------------------------------------------------------ pilot
def run_pilot(results, out, cfg, candidates, meta):
    examples = powered_eval.powered_split(cfg["n_per_family"])
    finished = done(results)
    todo = [(c, r) for c in candidates for r in ("constant", "ar_E", "ar_2E") if f"pilot/{c}/{r}" not in finished]
    progress = Progress(len(todo), "power_grid --pilot")
    for c, name in todo:
        key, cand = f"pilot/{c}/{name}", candidates[c]
        progress.update(what=key)
        data = data_file(out, 0, cand["N"])
        row = {"candidate": c, "row": name, "N": cand["N"], "epochs": cand["E"], "model": cand["model"], **meta}
        if name == "constant":
            row["ar"] = powered_eval.constant_baseline(training(data), examples)
        else:
            E = cand["E"] * (2 if name == "ar_2E" else 1)
            flags = ["--data", data, "--epochs", str(E)]
            row.update(run_one(os.path.join(out, "pilot", c, name), Row("ar", None, [], None), flags, 0,
                               cand["model"], cfg, meta["device"], examples, max(1, cand["N"] // cfg["batch"])))
        record(results, {"name": key, **row}, progress.print)
        progress.update(1)
    progress.close()
    print(json.dumps(choose(load(results)), indent=1))


def choose(pilot):
    """The protocol's rule on the pilot's records -> {"candidate", "passed", "why": per candidate: the numbers
    and conditions}."""
    runs = {(r["candidate"], r["row"]): r for r in pilot}
    why = {}
    for c in dict.fromkeys(r["candidate"] for r in pilot):
        if not all((c, r) in runs for r in ("constant", "ar_E", "ar_2E")):
            continue
        e, e2, const = runs[c, "ar_E"], runs[c, "ar_2E"], runs[c, "constant"]
        diff, lo, hi, *_ = paired.accuracy_difference([list(map(int, e2["ar"]["right"]))],
                                                        [list(map(int, e["ar"]["right"]))])
        acc = e["ar"]["accuracy"]
        why[c] = {"accuracy_E": acc["all"], "constant": const["ar"]["accuracy"]["all"],
                  "reasoning": max(acc.get(f, 0.0) for f in REASONING), "2E_minus_E": [diff, lo, hi],
                  "cost_s": e["held_out_loss"][-1][0] * e["step_seconds"]}  # steps x seconds per step
        why[c].update(a1=acc["all"] >= 2 * why[c]["constant"], a2=why[c]["reasoning"] >= LEARNS, b=hi < 0)
    if not why:
        raise ValueError("the pilot has no finished candidate: python experiments/power_grid.py --pilot")
    passed = [c for c, w in why.items() if w["a1"] and w["a2"] and w["b"]]
    if passed:
        best = min(passed, key=lambda c: why[c]["cost_s"])
    else:
        best = max(why, key=lambda c: (why[c]["a1"] + why[c]["a2"] + why[c]["b"], -why[c]["2E_minus_E"][2]))
    return {"candidate": best, "passed": bool(passed), "why": why}


# ------------------------------------------------------------------------------------------------- grid
def run_grid(results, out, cfg, regime, meta, regime_name="both", seeds=None):
    """regime: {"name", "model", "N", "E"} (the pilot's choice)."""
    examples = powered_eval.powered_split(cfg["n_per_family"])
    rows = grid_rows(regime["N"], regime["E"], cfg)
    endless_n = cfg["endless"][0]
    finished = done(results)
    names = ["constant", *rows, "endless_constant"]
    todo = [(s, name) for s in seeds or cfg["seeds"] for name in names if f"{name}/seed{s}" not in finished
            and (regime_name == "both" or (regime_name == "endless") == name.startswith("endless"))]
    progress = Progress(len(todo), "power_grid")
    for seed, name in todo:
        key = f"{name}/seed{seed}"
        progress.update(what=key)
        endless = name.startswith("endless")
        n = endless_n if endless else regime["N"]
        data = data_file(out, seed, n)
        base = {"name": key, "row": name, "seed": seed, "regime": regime["name"], "n_train": n, **meta}
        if name.endswith("constant"):
            record(results, {**base, "ar": powered_eval.constant_baseline(training(data), examples)}, progress.print)
            progress.update(1)
            continue
        row = rows[name]
        model = cfg["endless_model"] if endless else regime["model"]
        init = ["--init_from", parent(rows, row.parent, seed, model, data, cfg, out, meta)] if row.parent else []
        interval = cfg["eval_interval"] if endless else max(1, n // cfg["batch"])
        fields = run_one(os.path.join(out, f"seed{seed}", name), row, [*init, "--data", data, *row.flags], seed,
                         model, cfg, meta["device"], examples, interval)
        record(results, {**base, "model": model, "flags": row.flags, "block_size": row.B, **fields}, progress.print)
        progress.update(1)
    progress.close()


def parent(rows, name, seed, model, data, cfg, out, meta):
    """The parent's checkpoint; retrained if this machine lacks it (deterministic on the same machine)."""
    run_dir = os.path.join(out, f"seed{seed}", name)
    if not os.path.exists(os.path.join(run_dir, "ar.pt")):
        os.makedirs(run_dir, exist_ok=True)
        interval = cfg["eval_interval"] if name.startswith("endless") else 10**9
        train("ar", run_dir, ["--data", data, *rows[name].flags], seed,
              {**cfg, "model": [*model, "--device", meta["device"]]}, interval)
    return os.path.join(run_dir, "ar.pt")


# ----------------------------------------------------------------------------------------------- report
# (claim, row a, row b, what is compared, the paper's direction: a - b > 0 is +1; 0: "flat"[, one family's
# prompts only]); at tau "1" a row's greedy evaluation (all prompts), else the sweep's (sweep prompts;
# "adaptive:" the adaptive window)
CLAIMS = [
    ("AR-SFT E against the constant baseline", "ar_E", "constant", "accuracy", "1", "1", None),
    ("MARS beats AR-SFT (paper +1.7)", "mars_B4", "ar_E", "accuracy", "1", "1", +1),
    ("MARS beats the 2E control (paper +4.0)", "mars_B4", "ar_2E", "accuracy", "1", "1", +1),
    ("AR-SFT overfits from E to 2E (paper -2.3)", "ar_2E", "ar_E", "accuracy", "1", "1", -1),
    ("no SFT loss: quality falls from B 4 to 16 (paper -6.2)", "no_sft_B16", "no_sft_B4", "accuracy", "1", "1", -1),
    ("with it: quality flat from B 4 to 16 (paper -0.7)", "mars_B16", "mars_B4", "accuracy", "1", "1", 0),
    ("the SFT loss matters at B 16 (paper -7.5)", "no_sft_B16", "mars_B16", "accuracy", "1", "1", -1),
    ("BD3LM falls below AR-SFT (paper -5.9)", "bd3lm_B4", "ar_E", "accuracy", "1", "1", -1),
    ("tau 0.95 costs a little accuracy (paper -1.1..-1.6)", "mars_B4", "mars_B4", "accuracy", "0.95", "1", -1),
    ("tokens/forward rises from B 4 to 8 (no sourced paper figure)", "mars_B8", "mars_B4", "tokens_per_forward", "0.95", "0.95", +1),
    ("tokens/forward rises from B 4 to 16 (no sourced paper figure)", "mars_B16", "mars_B4", "tokens_per_forward", "0.95", "0.95", +1),
    ("random offsets against released blocks, B 4", "offsets_B4", "mars_B4", "accuracy", "0.95", "0.95", None),
    ("adaptive window against fixed, B 16", "mars_B16", "mars_B16", "tokens_per_forward", "adaptive:0.95", "0.95", None),
    ("adaptive window of B 16 against B 4", "mars_B16", "mars_B4", "tokens_per_forward", "adaptive:0.95", "0.95", None),
    ("endless: MARS against AR-SFT", "endless_mars_B4", "endless_ar", "accuracy", "1", "1", +1),
    # added after four seeds were in (so no verdict, only measurements): the endless regime's control, and the
    # two B claims above on the long-answer family alone (answers of 25-63 tokens, where a block of 16 fits)
    ("endless: MARS against the AR control", "endless_mars_B4", "endless_ar_2x", "accuracy", "1", "1", None),
    ("long answers: tokens/forward from B 4 to 8", "mars_B8", "mars_B4", "tokens_per_forward", "0.95", "0.95", None,
     powered_eval.worked.NAME),
    ("long answers: tokens/forward from B 4 to 16", "mars_B16", "mars_B4", "tokens_per_forward", "0.95", "0.95",
     None, powered_eval.worked.NAME),
]
FLAT = 0.017


def evaluation(run, tau):
    if tau.startswith("adaptive:"):
        return run["adaptive"][tau.split(":")[1]], "sweep"
    if tau == "1" and "ar" in run:
        return run["ar"], "all"
    return run["sweep"][tau], "sweep"


def claim(results, a, b, metric, tau_a, tau_b, cfg, family=None):
    """The paired difference a - b over the seeds both rows have (on one family's prompts, if given):
    (paired.Interval, seeds) or None."""
    runs = {(r["row"], r.get("seed")): r for r in results}
    seeds = sorted(s for (row, s) in runs if row == a and (b, s) in runs)
    if not seeds:
        return None
    examples = powered_eval.powered_split(cfg["n_per_family"])
    sweep_idx = list(powered_eval.subset_indices(examples, cfg["sweep_per_family"]))
    ends = [[evaluation(runs[row, s], tau) for s in seeds] for row, tau in ((a, tau_a), (b, tau_b))]
    on_sweep = any(where == "sweep" for side in ends for _, where in side)  # then both sides on the sweep prompts
    prompts = sweep_idx if on_sweep else range(len(examples))
    kept = np.array([family in (None, examples[i]["family"]) for i in prompts])

    def per_prompt(side, key):  # (seeds, prompts)
        values = [np.array([int(c) for c in e["right"]] if key == "right" else e[key], dtype=float) for e, _ in side]
        return np.stack([v[sweep_idx] if on_sweep and where == "all" else v for v, (_, where) in zip(values, side)])[:, kept]
    if metric == "accuracy":
        return paired.accuracy_difference(per_prompt(ends[0], "right"), per_prompt(ends[1], "right")), seeds
    (ta, fa), (tb, fb) = [(per_prompt(side, "tokens"), per_prompt(side, "forwards")) for side in ends]
    return paired.ratio_difference(ta, fa, tb, fb), seeds


# Added after the grid, measurements over the same records; no protocol claim changes:
# - the step-matched control of every claim whose rows trained different numbers of steps (stage 2 counts its
#   parent's steps): (row a, row b) -> the row trained as many steps as a, of b's kind, judged by the claim's
#   direction. AR-SFT 2E against E compares different lengths by design (the claim is about training longer).
CONTROLS = {("mars_B4", "ar_E"): "ar_2E", ("bd3lm_B4", "ar_E"): "ar_2E", ("endless_mars_B4", "endless_ar"): "endless_ar_2x"}
BY_DESIGN = {("ar_2E", "ar_E")}
# - the clean loss's effect on B as one contrast: (no-SFT B16 - B4) - (MARS B16 - B4), per seed and prompt, tau 1
#   (the paper's 0.5B ablation: -6.2 without the clean loss, flat, within 0.7, with it: about -5.5)
INTERACTION = ("no_sft_B16", "no_sft_B4", "mars_B16", "mars_B4")
INTERACTION_CLAIM = "the clean loss keeps B flat, one contrast (paper about -5.5)"


def trained_steps(results, cfg):
    """row -> the optimizer steps behind its model (a stage-2 row: its own plus its parent's), if every seed
    agrees; rows without training (the constant baselines) are absent."""
    parents = {name: row.parent for name, row in grid_rows(1, 1, cfg).items()}
    own = {}
    for r in results:
        if r.get("held_out_loss"):
            own.setdefault(r["row"], set()).add(r["held_out_loss"][-1][0])
    steps = {}
    for row, values in own.items():
        parent = parents.get(row)
        total = {v + p for v in values for p in (own.get(parent, {0}) if parent else {0})}
        if len(total) == 1:
            steps[row] = total.pop()
    return steps


def describe(iv, seeds, direction, text=None, metric="accuracy"):
    """One line: estimate, interval, its degrees of freedom and rule, the verdict (and mde when not detected), and
    the reading (claims.reading: where 0 and the paper's figure quoted in text lie)."""
    says = "measured (no paper claim)" if direction is None else paired.verdict(iv.lo, iv.hi, direction, FLAT)
    extra = f", smallest detectable {paired.mde(iv):.4f}" if says == "not detected" else ""
    rule = ", seed term cut: seed-clustered" if iv.method == "seed-clustered" else ""
    return (f"{iv.estimate:+.4f} [{iv.lo:+.4f}, {iv.hi:+.4f}] ({len(seeds)} seeds, t({iv.df:.0f}){rule}): "
            f"{says} ({claim_reading(iv, direction, text, metric)}){extra}")


def claim_reading(iv, direction, text=None, metric="accuracy"):
    """claims.reading of an interval, in the paper's units (accuracy in points), the paper's figure from text."""
    scale = 100 if metric == "accuracy" else 1
    return reading(scale * iv.lo, scale * iv.hi, direction, text and paper_figure(text), scale * FLAT)


def greedy_right(results, rows, cfg):
    """(seeds all the rows have, {row: (seeds, prompts) 0/1 greedy outcomes on all prompts})."""
    runs = {(r["row"], r.get("seed")): r for r in results}
    seeds = sorted(s for (row, s) in runs if row == rows[0] and all((o, s) in runs and "ar" in runs[o, s] for o in rows))
    return seeds, {row: np.array([[int(c) for c in runs[row, s]["ar"]["right"]] for s in seeds], dtype=float)
                   for row in rows}


def tokens_per_forward(results, row, tau):
    """Per seed: sum of tokens / sum of forwards of the row's sweep at tau (None where the row has no sweep)."""
    per_seed = [sum(r["sweep"][tau]["tokens"]) / sum(r["sweep"][tau]["forwards"]) for r in results
                if r["row"] == row and tau in r.get("sweep", {})]
    return per_seed or None


def report(results, cfg):
    steps = trained_steps(results, cfg)
    for text, a, b, metric, tau_a, tau_b, direction, *family in CLAIMS:
        got = claim(results, a, b, metric, tau_a, tau_b, cfg, *family)
        if got is None:
            print(f"{text}: no runs yet")
            continue
        iv, seeds = got
        print(f"{text}: {a}@{tau_a} - {b}@{tau_b} {metric} {describe(iv, seeds, direction, text, metric)}")
        sa, sb = steps.get(a), steps.get(b)
        if a == b or sa is None or sb is None or sa == sb:
            continue
        if (a, b) in BY_DESIGN:
            print(f"    steps: {a} {sa}, {b} {sb} (the claim is about training longer)")
        elif (a, b) in CONTROLS:
            control = CONTROLS[a, b]
            got = claim(results, a, control, metric, tau_a, tau_b, cfg, *family)
            if got:
                print(f"    steps: {a} {sa}, {b} {sb}; step-matched control {control} ({steps.get(control)} steps): "
                      f"{a} - {control} {describe(*got, direction, metric=metric)}")
        else:
            print(f"    steps: {a} {sa}, {b} {sb}: NO step-matched control in the grid")
    seeds, right = greedy_right(results, INTERACTION, cfg)
    if seeds:
        n16, n4, m16, m4 = (right[row] for row in INTERACTION)
        iv = paired.interval((n16 - n4) - (m16 - m4))
        print(f"{INTERACTION_CLAIM}: (no_sft_B16 - no_sft_B4) - (mars_B16 - mars_B4) accuracy, tau 1 "
              f"{describe(iv, seeds, -1, INTERACTION_CLAIM)}")
    blocks = [B for B in cfg["blocks"] if any(r["row"] == f"mars_B{B}" for r in results)]
    if len(blocks) < 2:
        return
    print("tokens/forward by B at every tau (sweep prompts; mean +- sd over seeds of each seed's ratio; "
          "differences to B 4 paired, 95% interval; measured, no verdict):")
    for prefix in ("mars", "offsets"):
        for tau in (f"{t:g}" for t in cfg["taus"]):
            means = []
            for B in blocks:
                v = tokens_per_forward(results, f"{prefix}_B{B}", tau)
                means.append(f"B {B} {statistics.mean(v):.2f} +- {statistics.stdev(v) if len(v) > 1 else 0:.2f}"
                             if v else f"B {B} -")
            diffs = []
            for B in blocks[1:]:
                got = claim(results, f"{prefix}_B{B}", f"{prefix}_B{blocks[0]}", "tokens_per_forward", tau, tau, cfg)
                if got:
                    iv = got[0]
                    diffs.append(f"B{B}-B{blocks[0]} {iv.estimate:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}]")
            print(f"  {prefix:<7} tau {tau:<4}: " + ", ".join(means) + " | " + ", ".join(diffs))


# ----------------------------------------------------------------------------------------------- timing
def run_timing(results, out, cfg, meta, steps=20):
    """Seconds per training step of each model size, AR-SFT and MARS at B = 4 and 16: the mean, minimum and
    median of `steps` - 1 single steps (train.py logs a running mean every step; each step's time is recovered
    from two consecutive means; the first step, which warms up, is left out)."""
    data = data_file(out, 0, 2000)
    finished = done(results)
    todo = [(s, kind) for s in SIZES for kind in ("ar", "mars_B4", "mars_B16") if f"timing/{s}/{kind}" not in finished]
    progress = Progress(len(todo), "power_grid --timing")
    for s, kind in todo:
        progress.update(what=f"timing/{s}/{kind}")
        run_dir, model = os.path.join(out, "timing", s), {**cfg, "model": [*SIZES[s], "--device", meta["device"]]}
        flags = ["--data", data, "--max_iters", str(steps), "--log_interval", "1"]
        if kind != "ar" and not os.path.exists(os.path.join(run_dir, "ar.pt")):  # a new sitting: the start again
            train("ar", run_dir, flags, 0, model, steps)
        if kind != "ar":
            flags += ["--init_from", os.path.join(run_dir, "ar.pt"), *stage2(int(kind[6:]), "--no-random_offsets")]
        _, means = train("ar" if kind == "ar" else "mars", run_dir, flags, 0, model, steps)
        each = [k * m - (k - 1) * prev for k, (prev, m) in enumerate(zip(means, means[1:]), 2)]
        record(results, {"name": f"timing/{s}/{kind}", "mean_s": statistics.mean(each), "min_s": min(each),
                         "median_s": statistics.median(each), **meta}, progress.print)
        progress.update(1)
    progress.close()


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pilot", action="store_true", help="the runs the protocol's rule chooses the regime from")
    p.add_argument("--timing", action="store_true", help="seconds per training step of each candidate size")
    p.add_argument("--report", action="store_true", help="every claim's paired difference, interval and verdict")
    p.add_argument("--quick", action="store_true", help="everything tiny: 1 seed, B = 4, a 1-layer model (CI)")
    p.add_argument("--regime", choices=["both", "data-limited", "endless"], default="both")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="only these of the grid's seeds (1-5)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (train.py trains in bf16 there)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every process (recorded)")
    p.add_argument("--results", default=None, help="default: experiments/power_grid.jsonl (power_pilot.jsonl with "
                   "--pilot, power_timing.jsonl with --timing)")
    p.add_argument("--pilot_results", default=os.path.join(ROOT, "experiments", "power_pilot.jsonl"))
    p.add_argument("--out", default=os.path.join(ROOT, "out", "power_grid"), help="checkpoints, logs, data")
    args = p.parse_args()
    cfg = QUICK if args.quick else FULL
    if args.device.startswith("cuda"):
        cfg = {**cfg, "decode_batch": 1000}  # every row decodes as it would alone: the batch changes only the time
    if args.seeds and not set(args.seeds) <= set(cfg["seeds"]):
        p.error(f"--seeds: the protocol's seeds are {list(cfg['seeds'])}")
    default = "power_pilot.jsonl" if args.pilot else "power_timing.jsonl" if args.timing else "power_grid.jsonl"
    results = args.results or os.path.join(ROOT, "experiments", default)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # train.py's processes
    torch.set_num_threads(args.threads)  # this one's decoding
    meta = provenance(args.threads, args.device)
    if args.report:
        return report(load(results), cfg)
    if args.timing:
        return run_timing(results, args.out, cfg, meta)
    candidates = QUICK_CANDIDATES if args.quick else CANDIDATES
    if args.pilot:
        return run_pilot(results, args.out, cfg, candidates, meta)
    if args.quick:
        return run_grid(results, args.out, cfg, {**QUICK_CANDIDATES["A"], "name": "A"}, meta, args.regime, args.seeds)
    if not os.path.exists(args.pilot_results):
        sys.exit("error: no pilot to choose the regime from: python experiments/power_grid.py --pilot first")
    choice = choose(load(args.pilot_results))
    c, why = choice["candidate"], choice["why"][choice["candidate"]]
    failed = [k for k in ("a1", "a2", "b") if not why[k]]
    print(f"regime: candidate {c} {CANDIDATES[c]}" + ("" if choice["passed"] else
          f" -- NO candidate passed the rule; the closest, failing {', '.join(failed)}"), flush=True)
    print(f"estimated grid: {GRID_COST * len(cfg['seeds']) * why['cost_s'] / 3600:.1f} CPU hours of training "
          "(+ the endless regime and evaluation)", flush=True)
    run_grid(results, args.out, cfg, {**CANDIDATES[c], "name": c}, meta, args.regime, args.seeds)


if __name__ == "__main__":
    main()
