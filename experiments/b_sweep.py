"""
Why tokens/forward falls with B in the data-limited grid: the same rows at several data
sizes, the B 16 model decoded with a window of 4, per-distance proposals along the greedy outputs, and the
end-of-block pads in and out of the loss.

    nice -n 19 nohup python experiments/b_sweep.py --seeds 1 > out/b_sweep.log 2>&1 &   # re-run to resume
    python experiments/b_sweep.py --report        # every measurement and the decision rules' answers
    python experiments/b_sweep.py --quick --results /tmp/b.jsonl --out /tmp/b   # tiny, a few minutes

Run from a fixed commit in its own git worktree (docs/long_runs.md: the command, status and cost); each
finished run appends one JSON line to experiments/b_sweep.jsonl (resumable.record) with its commit, torch
version, threads, machine (CPU model, family, AVX-512) and core-seconds, and is skipped when the runner
starts again.

Protocol (committed before any run of it; nothing here changes after seeing results)
- What is known: in the powered grid's data-limited regime (train.py's default 4 x 128 model, N
  1000 examples, E 20 epochs: 620 AR-SFT steps, then 620 MARS steps as released) tokens/forward at tau 0.95
  falls with B (1.87 / 1.78 / 1.54 at B 4 / 8 / 16), while a single-seed check on the default run (endless
  data, 1200 + 1200 steps, the seven suite families) found it rising. What differs: how often each example
  is repeated, the number of steps, and the data mix. This sweep holds the data mix (experiments/
  powered_eval.train_set: the eight families, the powered split held out; power_grid.data_file, so D1's
  training sets are the grid's, seed for seed) and, for D1-D3, the steps; it varies the repetition.
- Conditions (N examples, the same flags for stage 1 and stage 2; batch 32):
      D1       N 1000, --epochs 20 (620 + 620 steps: the grid's regime A, 20 passes over each example)
      D2       N 5000, --epochs 4 (624 + 624 steps)
      D3       N 20000, --epochs 1 (625 + 625 steps: each example once per stage)
      endless  N 20000, --max_iters 1200 (1200 + 1200 steps drawn with replacement: the grid's endless
               regime and the default run's step count; more steps as well as less repetition)
- Rows, each condition: ar (AR-SFT, the parent; greedy only); from it, MARS as released (alpha 1, blocks
  from position 0, token-mean loss, pads trained) at B 4, 8, 16: mars_B4, mars_B8, mars_B16. D1 also:
  mars_B4_nopad, mars_B16_nopad (train.py --no-pad_targets: the EOS pads that fill each example's last
  block are not targets; stage 1 unchanged). Seeds 1, 2, 3 (each sets data, weights and order).
  The runner's order (so that single-seed answers come first): seed 1's D1 (ar, B4, B16, B16_nopad,
  B4_nopad, B8), D3, D2, endless; then seeds 2 and 3 the same way.
- Prompts: the powered split's sweep prompts (the first 100 of each of the eight families, 800; the
  grid's tau sweeps ran on the same). Teacher-forced measurements on the first 50 of each (400).
- Measurements, every MARS row: greedy accuracy (= tau 1); tokens/forward and accuracy at tau 0.95, 0.9,
  0.7, 0.5 with the trained window (B); the B 8 and B 16 rows also with a window of 4 at the same taus
  ("window4": item (a), the same weights with the B 4 model's window). Teacher-forced along the row's own
  greedy output y (item (b)): for every context end p (prompt + y[:p]) the decoder's proposals at
  distances d = 1..B (d 1: the last real token's output; d > 1: the (d-1)-th mask, exactly what
  decode.mars_decode_plain feeds), per prompt and distance: how many proposals had a target in y (n),
  how many equal greedy AR's token there (agree; d 1 agrees by construction), how many pass the gate
  (p >= tau) at tau 0.95 and 0.7 (pass), and how many pass and agree. Held-out losses from train.py.
- Statistics: experiments/paired.py's two-way interval over (seeds, prompts); tokens/forward and the
  per-distance shares (sum of pass / sum of n) through ratio_difference (the delta method). A verdict
  needs all three seeds; with fewer, --report prints the same rules marked "preliminary (k seeds)".
- Decision rules (decide() below; tau 0.95 decides, the other taus are reported):
  1. Direction, per condition: Delta = tokens/forward of mars_B16 minus mars_B4: "falls" if the interval
     is wholly below 0, "rises" if wholly above, else "not resolved". The flip: between the last condition
     (in the order D1, D2, D3, endless) that falls and the first after it that rises; "no flip" if none
     rises; if D1 does not fall, the grid's finding is not reproduced here and the other rules say so.
  2. Model or window (D1): w = B16 model at window 4 minus B4 model (same window); full = B16 at window 16
     minus B4. "the weights" if w's interval is wholly below 0 and w carries at least half of full (w /
     full >= 0.5); "the window" if w's interval includes 0 or is above it and B16 at window 16 minus B16
     at window 4 is wholly below 0; otherwise "both" (w / full printed).
  3. Per-distance signal (each distance gets about 1/B of the noisy targets, so a B 16 model sees each of
     d 2..4 a quarter as often as a B 4 model): it explains the fall if (i) at D1 the share of proposals
     passing tau, pooled over d 2..4, is lower for mars_B16 than mars_B4 (interval wholly below 0) and
     (ii) at every condition whose Delta is not "falls" that pooled difference's interval includes 0 or
     lies above it. (i) holds and (ii) fails: "lower confidence at d 2..4, but not what flips the
     direction"; (i) fails: "not explained by the per-distance signal". d 1 (trained by the clean loss
     alike at every B) is reported beside it: a B 16 deficit there points at the clean head, not the
     noisy signal. Agreement with greedy AR per distance is reported, no rule.
  4. Pads (D1): out_in = mars_B16_nopad minus mars_B16 tokens/forward; B effect = mars_B16 minus mars_B4.
     The pads candidate is closed if out_in's interval includes 0 and excludes -(B effect) (leaving pads
     out cannot undo the fall); "pads explain it" if out_in is wholly above 0 and mars_B16_nopad minus
     mars_B4_nopad is not "falls"; otherwise "partly". Accuracy (greedy) pads out minus in at B 4 and 16
     reported; pads out becomes a documented recommendation only if it raises tokens/forward (interval
     above 0) at no accuracy cost beyond the grid's flat margin (interval lower end above -1.7 points).
- Item (c), what the released code does (Xalp/MARS train/train_mars.py, read for this protocol): its
  collator is dllm's AppendEOSBlockWrapper (dllm/core/trainers/bd3lm.py), which pads input_ids AND labels
  with eos_token_id up to the next multiple of block_size, so the pads are targets of both streams
  (MARSTrainer's masked_indices = labels != -100); the batch padding of DataCollatorForSeq2Seq after that
  is -100, not trained. The loss is normalised per sequence by default (MDLMTrainer's
  loss_normalization_type "sequence", each target's loss / its sequence's target count / batch), so in the
  released trainer each sequence's pads dilute only that sequence's own targets; nanoMARS's default
  token-mean loss spreads them over the batch. train.py's --loss_norm sequence is the released choice.
- Cost (one core; 4 x 128 at 0.28 s per AR step and 0.57-0.60 per MARS step, the grid's timing): D1-D3 per
  seed 620 AR + 3 x 620 MARS steps ~ 22 min, D1 + 2 x 620 pads-out steps ~ 12 min; endless 1200 + 3 x
  1200 ~ 41 min; evaluation ~ 3-5 min a MARS row. Three seeds: about 9 core-hours with evaluation.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import paired, powered_eval  # noqa: E402
from experiments.claims import reading  # noqa: E402
from experiments.runs import data_file, decode, provenance, size, train  # noqa: E402
from experiments.resumable import core_seconds, done, machine, record  # noqa: E402
from nanomars.batch_decode import batch_ar, batch_decode  # noqa: E402
from nanomars.masks import causal_mask  # noqa: E402
from nanomars.util.checkpoint import load_model  # noqa: E402
from nanomars.util.progress import Progress  # noqa: E402
from nanomars.util.tasks import prompt_messages  # noqa: E402

CONDITIONS = {"D1": (1000, ["--epochs", "20"]), "D2": (5000, ["--epochs", "4"]), "D3": (20000, ["--epochs", "1"]),
              "endless": (20000, ["--max_iters", "1200"])}
DATA_ORDER = ("D1", "D2", "D3", "endless")  # from most to least repetition (rule 1)
RUN_ORDER = ("D1", "D3", "D2", "endless")  # the runner's, per seed
TAUS = (0.95, 0.9, 0.7, 0.5)
TF_TAUS = (0.95, 0.7)
DECIDE_TAU = "0.95"
FLAT = 0.017  # the grid's flat margin (accuracy)
FULL = dict(seeds=(1, 2, 3), conditions=CONDITIONS, model=size(4, 128), batch=32, sweep_per_family=100,
            tf_per_family=50, max_new_tokens=72, decode_batch=100, tf_batch=128, taus=TAUS, tf_taus=TF_TAUS)
QUICK = dict(seeds=(1,), conditions={"D1": (64, ["--epochs", "2"]), "D3": (128, ["--epochs", "1"])},
             model=["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--n_kv_head", "1", "--intermediate_size", "64"],
             batch=8, sweep_per_family=2, tf_per_family=1, max_new_tokens=12, decode_batch=100, tf_batch=128,
             taus=(0.95,), tf_taus=(0.95,))


def rows(condition):
    """name -> (B, pads trained) in the runner's order; "ar" (None) is the parent."""
    out = {"ar": None, "mars_B4": (4, True), "mars_B16": (16, True)}
    if condition == "D1":
        out.update(mars_B16_nopad=(16, False), mars_B4_nopad=(4, False))
    out["mars_B8"] = (8, True)
    return out


def plan(seeds, conditions):
    return [(s, c, r) for s in seeds for c in RUN_ORDER if c in conditions for r in rows(c)]


# ------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def teacher_forced(model, prompts, outputs, mask_id, B, taus, batch=128):
    """Along each prompt's greedy output y: for every context end p (prompt + y[:p], p = 0..len(y)-1) the
    decoder's proposals at distances d = 1..B (one causal forward over prompt + y[:p] + B-1 masks, as
    decode.mars_decode_plain feeds them). Returns, per prompt, lists over d of: n (proposals whose target
    y[p+d-1] exists), agree (the proposal is that token), and per tau pass (p_d >= tau) and pass_agree."""
    dev = model.embed.weight.device
    items = [(i, p) for i, y in enumerate(outputs) for p in range(len(y))]
    n = np.zeros((len(prompts), B), dtype=np.int64)
    agree = np.zeros_like(n)
    passed = {t: np.zeros_like(n) for t in taus}
    passed_agree = {t: np.zeros_like(n) for t in taus}
    for k in range(0, len(items), batch):
        chunk = items[k:k + batch]
        seqs = [list(prompts[i]) + list(outputs[i][:p]) + [mask_id] * (B - 1) for i, p in chunk]
        T = max(map(len, seqs))
        x = torch.tensor([s + [mask_id] * (T - len(s)) for s in seqs], device=dev)  # right padding: unseen
        pos = torch.arange(T, device=dev).expand(len(seqs), T)
        ends = torch.tensor([len(s) for s in seqs], device=dev)
        window = (ends[:, None] - B + torch.arange(B, device=dev)[None, :])  # (b, B): the last B outputs
        probs = model(x, pos, causal_mask(T, device=dev), keep=window).float().softmax(-1)  # (b, B, V)
        conf, y_hat = (v.tolist() for v in probs.max(-1))
        for row, (i, p) in enumerate(chunk):
            y = outputs[i]
            for d in range(1, B + 1):
                if p + d - 1 >= len(y):
                    break
                ok = y_hat[row][d - 1] == y[p + d - 1]
                n[i, d - 1] += 1
                agree[i, d - 1] += ok
                for t in taus:
                    hit = conf[row][d - 1] >= t
                    passed[t][i, d - 1] += hit
                    passed_agree[t][i, d - 1] += hit and ok
    return {"n": n.tolist(), "agree": agree.tolist(),
            **{f"{t:g}": {"pass": passed[t].tolist(), "pass_agree": passed_agree[t].tolist()} for t in taus}}


def evaluate_row(path, B, cfg, device="cpu"):
    model, tok, _, _ = load_model(path, device)
    n, stop, mask, batch = cfg["max_new_tokens"], tok.stop_ids, tok.mask_id, cfg["decode_batch"]
    sweep = powered_eval.powered_split(cfg["sweep_per_family"])
    greedy = []  # the token ids, for the teacher-forced pass

    def ar(ps):
        out = batch_ar(model, ps, n, stop)
        greedy.extend(list(r.tokens) for r in out.rows)
        return out
    scores = {"ar": decode(tok, sweep, ar, batch)}
    if B is None:
        return scores
    mars = lambda w, tau: lambda ps: batch_decode(model, ps, n, mask, w, tau, stop)  # noqa: E731
    scores["sweep"] = {f"{tau:g}": decode(tok, sweep, mars(B, tau), batch) for tau in cfg["taus"]}
    if B > 4:
        scores["window4"] = {f"{tau:g}": decode(tok, sweep, mars(4, tau), batch) for tau in cfg["taus"]}
    tf_idx = list(powered_eval.subset_indices(sweep, cfg["tf_per_family"]))
    prompts = [tok.prompt_ids(prompt_messages(sweep[i])) for i in tf_idx]
    scores["teacher_forced"] = teacher_forced(model, prompts, [greedy[i] for i in tf_idx], mask, B, cfg["tf_taus"],
                                              cfg["tf_batch"])
    return scores


def run(results, out, cfg, seeds, conditions, meta):
    finished = done(results)
    todo = [(s, c, r) for s, c, r in plan(seeds, conditions) if f"{c}/{r}/seed{s}" not in finished]
    progress = Progress(len(todo), "b_sweep")
    for seed, cond, name in todo:
        key = f"{cond}/{name}/seed{seed}"
        progress.update(what=key)
        N, flags = cfg["conditions"][cond]
        data = data_file(out, seed, N)
        run_dir = os.path.join(out, f"seed{seed}", cond, name)
        os.makedirs(run_dir, exist_ok=True)
        spec = rows(cond)[name]
        c0, t0 = core_seconds(), time.time()
        model_cfg = {**cfg, "model": [*cfg["model"], "--device", meta["device"]]}
        interval = 200
        retrained = False
        if spec is None:
            stage, train_flags = "ar", ["--data", data, *flags]
        else:
            B, pads = spec
            parent = os.path.join(out, f"seed{seed}", cond, "ar", "ar.pt")
            if not os.path.exists(parent):  # another machine or sitting: retrain it (recorded)
                os.makedirs(os.path.dirname(parent), exist_ok=True)
                train("ar", os.path.dirname(parent), ["--data", data, *flags], seed, model_cfg, 10**9)
                retrained = True
            stage = "mars"
            train_flags = ["--init_from", parent, "--data", data, *flags, "--block_size", str(B), "--no-random_offsets",
                           *([] if pads else ["--no-pad_targets"])]
        curve, step_s = train(stage, run_dir, train_flags, seed, model_cfg, interval)
        c1, t1 = core_seconds(), time.time()
        scores = evaluate_row(os.path.join(run_dir, f"{stage}.pt"), None if spec is None else spec[0], cfg,
                              meta["device"])
        c2 = core_seconds()
        record(results, {"name": key, "condition": cond, "row": name, "seed": seed, "n_train": N, "flags": train_flags[2:]
                         if spec is None else train_flags[4:], "block_size": None if spec is None else spec[0],
                         "pad_targets": None if spec is None else spec[1], "model": cfg["model"], **meta,
                         "parent_retrained": retrained, "train_seconds": t1 - t0, "eval_seconds": time.time() - t1,
                         "step_seconds": float(np.median(step_s)) if step_s else None,
                         "core_seconds": {"train": c1 - c0, "eval": c2 - c1, "all": c2 - c0},
                         "held_out_loss": curve, **scores}, progress.print)
        progress.update(1)
    progress.close()


# ------------------------------------------------------------------------------------------------ rules
def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def index(results):
    return {(r["condition"], r["row"], r["seed"]): r for r in results}


def seeds_of(runs, cond, *names):
    return sorted({s for (c, r, s) in runs if c == cond and r == names[0]}.intersection(
        *({s for (c, r, s) in runs if c == cond and r == n} for n in names[1:])))


def tpf(runs, cond, a, b, tau=DECIDE_TAU, where_a="sweep", where_b="sweep"):
    """Tokens/forward of row a minus row b (per-prompt, paired over the seeds both have) -> (Interval, seeds)
    or None. where: "sweep" (the row's own window) or "window4"."""
    seeds = [s for s in seeds_of(runs, cond, a, b) if where_a in runs[cond, a, s] and where_b in runs[cond, b, s]]
    if not seeds:
        return None
    side = lambda row, where, key: np.array([runs[cond, row, s][where][tau][key] for s in seeds], dtype=float)  # noqa: E731
    return paired.ratio_difference(side(a, where_a, "tokens"), side(a, where_a, "forwards"),
                                   side(b, where_b, "tokens"), side(b, where_b, "forwards")), seeds


def accuracy(runs, cond, a, b):
    seeds = seeds_of(runs, cond, a, b)
    if not seeds:
        return None
    right = lambda row: [[int(c) for c in runs[cond, row, s]["ar"]["right"]] for s in seeds]  # noqa: E731
    return paired.accuracy_difference(right(a), right(b)), seeds


def share(runs, cond, a, b, distances, tau=DECIDE_TAU, what="pass"):
    """The share of proposals at `distances` that pass tau (what="pass"), agree with greedy AR ("agree") or
    both ("pass_agree"): row a minus row b, pooled over the distances, per prompt -> (Interval, seeds)."""
    seeds = seeds_of(runs, cond, a, b)
    if not seeds:
        return None

    def side(row):
        num, den = [], []
        for s in seeds:
            tf = runs[cond, row, s]["teacher_forced"]
            counts = np.array(tf["agree"] if what == "agree" else tf[tau][what], dtype=float)
            n = np.array(tf["n"], dtype=float)
            cols = [d - 1 for d in distances]
            num.append(counts[:, cols].sum(1))
            den.append(n[:, cols].sum(1))
        return np.array(num), np.array(den)
    (na, da), (nb, db) = side(a), side(b)
    return paired.ratio_difference(na, da, nb, db), seeds


def label(iv):
    return "falls" if iv.hi < 0 else "rises" if iv.lo > 0 else "not resolved"


def decide(results, n_seeds=3, tau=DECIDE_TAU):
    """The protocol's four rules on the results -> {rule: {"answer": str, "preliminary": bool, numbers}}."""
    runs = index(results)
    out = {}
    # 1. direction per condition and the flip
    direction, used = {}, {}
    for cond in DATA_ORDER:
        got = tpf(runs, cond, "mars_B16", "mars_B4", tau)
        if got:
            direction[cond], used[cond] = got[0], len(got[1])
    labels = {c: label(iv) for c, iv in direction.items()}
    falls = [c for c in DATA_ORDER if labels.get(c) == "falls"]
    if not direction:
        answer = "no runs yet"
    elif labels.get("D1") not in (None, "falls"):
        answer = f"D1 {labels['D1']}: the grid's fall is not reproduced"
    elif not falls:
        answer = "no condition falls yet"
    else:
        last = falls[-1]
        after = [c for c in DATA_ORDER[DATA_ORDER.index(last) + 1:] if labels.get(c) == "rises"]
        later = [f"{c} {labels[c]}" for c in DATA_ORDER[DATA_ORDER.index(last) + 1:] if c in labels]
        waiting = "" if last == DATA_ORDER[-1] else " (no later condition measured yet)"
        answer = (f"flips between {last} and {after[0]}" if after else f"no flip: falls up to {last}" +
                  (f", then {', '.join(later)}" if later else waiting))
    out["direction"] = {"answer": answer, "labels": labels, "preliminary": any(k < n_seeds for k in used.values()),
                        "delta": {c: list(iv[:3]) for c, iv in direction.items()}}
    # 2. model or window, D1
    w, full, win = (tpf(runs, "D1", "mars_B16", "mars_B4", tau, "window4", "sweep"),
                    tpf(runs, "D1", "mars_B16", "mars_B4", tau), tpf(runs, "D1", "mars_B16", "mars_B16", tau, "sweep", "window4"))
    if w and full and win:
        (w, k), (full, _), (win, _) = w, full, win
        frac = w.estimate / full.estimate if full.estimate else float("nan")
        if w.hi < 0 and frac >= 0.5:
            answer = "the weights"
        elif w.hi >= 0 and win.hi < 0:
            answer = "the window"
        else:
            answer = "both"
        out["model_or_window"] = {"answer": answer, "preliminary": len(k) < n_seeds, "weights_share": frac,
                                  "B16w4_minus_B4": list(w[:3]), "B16_minus_B4": list(full[:3]),
                                  "B16_minus_B16w4": list(win[:3])}
    # 3. per-distance signal
    pooled = {c: share(runs, c, "mars_B16", "mars_B4", (2, 3, 4), tau) for c in DATA_ORDER}
    pooled = {c: v for c, v in pooled.items() if v}
    if "D1" in pooled:
        d1, k = pooled["D1"]
        i_holds = d1.hi < 0
        others = [c for c in pooled if c != "D1" and c in labels and labels[c] != "falls"]
        ii_holds = all(pooled[c][0].hi >= 0 for c in others)
        answer = ("explains it" if i_holds and ii_holds and others else
                  "explains D1's fall; no condition without a fall yet to test (ii)" if i_holds and not others else
                  "lower confidence at d 2..4, but not what flips the direction" if i_holds else
                  "not explained by the per-distance signal")
        d1_clean = share(runs, "D1", "mars_B16", "mars_B4", (1,), tau)
        out["per_distance"] = {"answer": answer, "preliminary": len(k) < n_seeds or any(
            len(pooled[c][1]) < n_seeds for c in others), "pooled_d2_4": {c: list(v[0][:3]) for c, v in pooled.items()},
            "d1": list(d1_clean[0][:3]) if d1_clean else None}
    # 4. pads, D1
    oi, b_eff, nopad = (tpf(runs, "D1", "mars_B16_nopad", "mars_B16", tau), tpf(runs, "D1", "mars_B16", "mars_B4", tau),
                        tpf(runs, "D1", "mars_B16_nopad", "mars_B4_nopad", tau))
    if oi and b_eff and nopad:
        (oi, k), (b_eff, _), (nopad, _) = oi, b_eff, nopad
        undo = -b_eff.estimate
        if oi.lo <= 0 <= oi.hi and not (oi.lo <= undo <= oi.hi):
            answer = "closed: pads out neither helps nor could undo the B effect"
        elif oi.lo > 0 and label(nopad) != "falls":
            answer = "pads explain it"
        else:
            answer = "partly"
        acc = {B: accuracy(runs, "D1", f"mars_B{B}_nopad", f"mars_B{B}") for B in (4, 16)}
        better = {B: bool(a and (lambda t: t and t[0].lo > 0)(tpf(runs, "D1", f"mars_B{B}_nopad", f"mars_B{B}", tau))
                          and a[0].lo > -FLAT) for B, a in acc.items()}
        out["pads"] = {"answer": answer, "preliminary": len(k) < n_seeds, "out_minus_in_B16": list(oi[:3]),
                       "B_effect": list(b_eff[:3]), "B_effect_pads_out": list(nopad[:3]),
                       "accuracy_out_minus_in": {B: list(a[0][:3]) if a else None for B, a in acc.items()},
                       "recommend_pads_out": better}
    return out


def report(results, cfg):
    runs = index(results)
    fmt = lambda iv: f"{iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}] ({reading(iv.lo, iv.hi, None)})"  # noqa: E731
    for cond in DATA_ORDER:
        for a, b in (("mars_B8", "mars_B4"), ("mars_B16", "mars_B4")):
            for tau in map(lambda t: f"{t:g}", cfg["taus"]):
                got = tpf(runs, cond, a, b, tau)
                if got:
                    print(f"{cond} tau {tau}: tokens/forward {a} - {b} {fmt(got[0])} ({len(got[1])} seeds)")
        for B in (8, 16):
            got = tpf(runs, cond, f"mars_B{B}", "mars_B4", DECIDE_TAU, "window4", "sweep")
            if got:
                print(f"{cond} tau {DECIDE_TAU}: B{B} model at window 4 - B4 model {fmt(got[0])} ({len(got[1])} seeds)")
        for d in range(1, 5):
            for what in ("pass", "agree"):
                got = share(runs, cond, "mars_B16", "mars_B4", (d,), DECIDE_TAU, what)
                if got:
                    print(f"{cond} d {d}: share {what} B16 - B4 {fmt(got[0])}")
        for name in sorted({r for (c, r, s) in runs if c == cond}):
            accs = [runs[cond, name, s]["ar"]["accuracy"]["all"] for (c, r, s) in runs if c == cond and r == name]
            print(f"{cond} {name}: greedy accuracy {np.mean(accs):.3f} ({len(accs)} seeds)")
    machines = {}
    for r in results:  # the machine is a recorded factor: one seed's rows should share one
        machines.setdefault(r["seed"], set()).add((r.get("machine") or {}).get("cpu"))
    for seed, cpus in sorted(machines.items()):
        if len(cpus) > 1:
            print(f"WARNING: seed {seed}'s rows ran on {len(cpus)} machines: {sorted(map(str, cpus))}")
    print(json.dumps(decide(results), indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", action="store_true", help="the measurements and the decision rules' answers")
    p.add_argument("--quick", action="store_true", help="everything tiny (a 1-layer model, 2 conditions)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="only these of the protocol's seeds")
    p.add_argument("--conditions", nargs="+", default=None, help="only these conditions")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every process (recorded)")
    p.add_argument("--results", default=os.path.join(ROOT, "experiments", "b_sweep.jsonl"))
    p.add_argument("--out", default=os.path.join(ROOT, "out", "b_sweep"), help="checkpoints, logs, data")
    args = p.parse_args()
    cfg = QUICK if args.quick else FULL
    seeds = args.seeds or cfg["seeds"]
    conditions = args.conditions or list(cfg["conditions"])
    if not set(seeds) <= set(cfg["seeds"]) or not set(conditions) <= set(cfg["conditions"]):
        p.error(f"the protocol's seeds are {list(cfg['seeds'])}, its conditions {list(cfg['conditions'])}")
    if args.report:
        return report(load(args.results), cfg)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    meta = {**provenance(args.threads, args.device), "machine": machine()}
    run(args.results, args.out, cfg, seeds, conditions, meta)


if __name__ == "__main__":
    main()
