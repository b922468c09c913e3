"""
Do the paper's quality claims hold where the models can do the task? A 5-seed grid in the competent regime.

    # the grid: two single-threaded runners from the protocol's commit, in its own worktree, sharing one queue
    git worktree add ../grid <protocol commit> && cd ../grid && mkdir -p out
    nohup python experiments/competent_grid.py > out/grid_1.log 2>&1 &     # re-run to resume
    nohup python experiments/competent_grid.py > out/grid_2.log 2>&1 &
    cp ../grid/experiments/competent_grid.jsonl experiments/    # on main, then commit: results as they come
    python experiments/competent_grid.py --report      # every claim: paired interval, rule, verdict
    python experiments/competent_grid.py --device cuda # a GPU: the whole grid in one process
    python experiments/competent_grid.py --quick --results /tmp/g.jsonl --out /tmp/g   # tiny, every row (CI)

Each finished run appends one JSON line to experiments/competent_grid.jsonl (resumable.record) with its commit,
torch version, threads, machine (CPU model), core-seconds and seconds per step, and is skipped when a runner
starts again. Runners on one machine share the queue: each takes the first run not done, not taken by a live
runner (a claim file under --out) and whose parent is done.

Protocol (committed before any run of it; nothing here changes after seeing results)
- Why: every grid so far ran where AR-SFT sat near the constant-answer floor (the powered grid's regime A:
  0.179 against 0.160, arithmetic 0.07), so the paper's quality claims could not show there. The competent
  pilot (experiments/competent.py) found a regime where the model does the task: P4, train.py's default
  4 x 128 model on the powered N 5000 file, 32 epochs: 0.425 on all 3650 powered prompts (constant answer
  0.163), arithmetic 0.752.
- The paper's premise is NOT met here, and this changes how claims are read: the paper's 2E control overfits
  (0.5B: 28.7 -> 26.4, Table 2), so "MARS beats the 2E control" there partly measures the control's loss.
  In the pilot (one seed) 64 epochs gained +3.3 [+1.8, +4.9] points over 32 in accuracy (held-out loss is
  lowest near epoch 19 and rises after: it overfits in loss, not in accuracy). So here ar_2E is a STRONGER
  control than ar_E, claim (b) asks whether MARS's 32 extra epochs are worth as much as 32 more AR epochs, and
  a "contradicted" on (b) says MARS is below an AR model trained as long, not that the paper's 0.5B result
  is wrong. The premise itself (ar_2E - ar_E) is reported with its rule so that a reader sees which case holds.
- Regime, exactly the pilot's P4: model 4 x 128 (heads 4, kv heads 2, MLP 352), batch 32, E = 32 epochs of
  the seed's N 5000 file (power_grid.data_file: the eight families, the powered split held out; the seed sets
  the examples, the weights and the order; 156 steps an epoch, an E run 4,992 steps), train.py's defaults
  otherwise. Seeds 1-5.
- Rows per seed (8, and the constant baseline): ar_E (32 epochs from scratch); ar_2E (64 epochs from scratch:
  the step-matched control of every stage-2 row, which trains 32 + 32 epochs); from ar_E, 32 more epochs of
      mars_B4     MARS B 4 as released (blocks from position 0, --no-random_offsets)
      offsets_B4  MARS B 4 with random block offsets (train.py's default)
      mars_B16    MARS B 16 as released
      no_sft_B4, no_sft_B16   the no-SFT ablation as released (--objective no_sft_released: noisy track only)
      bd3lm_B4    BD3LM as released (--objective bd3lm, blocks from position 0)
- Evaluation (every row): the tau-1 decoding of all 3650 powered prompts (powered_eval.powered_split(), 72 new
  tokens), per prompt and per family ("all": greedy, which is MARS at tau 1; BD3LM: its own block sampler at
  tau 1); every MARS-family row (the six stage-2 rows) a tau sweep at 1, 0.95, 0.9, 0.8, 0.7, 0.5 on the 800
  sweep prompts (the first 100 of each family), accuracy and tokens/forward (BD3LM: its own sampler); each
  row's held-out loss every epoch (train.py's 2% held out). The constant baseline: each family's most common
  training answer of the seed's file. Tokens/forward = generated tokens (up to and with the stop) / forwards,
  as everywhere in nanoMARS.
- Claims and rules (CLAIMS below; experiments/paired.py's interval over (seeds, prompts): two-way random
  effects, the seed-clustered t(S - 1) where the seed term is cut; tokens/forward by the delta method).
  Directional claims: "reproduced" if the 95% interval excludes 0 on the paper's side, "contradicted" if it
  excludes 0 on the other side, else "not detected" (with the interval and the smallest detectable effect).
  The flat claim (c2, the paper: "flat within 0.7"): "reproduced" if the whole interval lies inside +-1.7
  points (the paper's headline effect), "contradicted" if wholly outside, else "not detected". Measurements
  without a sourced paper direction (f, g): "detected above 0", "detected below 0" or "not detected".
      premise  ar_2E - ar_E, accuracy at tau 1 (the paper: -2.3, Table 2)                     direction -1
      a   mars_B4 - ar_E at tau 1 (paper +1.7, Table 2)                                        +1
      b   mars_B4 - ar_2E at tau 1, the step-matched control (paper +4.0, Table 2)             +1
      c   the clean-loss contrast (no_sft_B16 - no_sft_B4) - (mars_B16 - mars_B4) at tau 1 (paper about
          -5.5, Table 3)                                                                       -1
          c1  no_sft_B16 - no_sft_B4 (paper -6.2)                                              -1
          c2  mars_B16 - mars_B4 (paper -0.7: flat)                                             0, +-1.7
      d   bd3lm_B4 - mars_B4 at tau 1, all families (paper 22.8 against 30.4, Table 2)         -1
          d_arith  the same on the arithmetic prompts only (paper BBH 26.3 -> 7.5: reasoning collapses)  -1
      e   mars_B4 at tau 0.95 - at tau 1, accuracy on the sweep prompts (paper -1.1..-1.6 points at
          1.46-1.49 tokens/forward, Table 4)                                                   -1
          (its tokens/forward at 0.95, mean and sd over seeds, printed beside it)
      f   tokens/forward mars_B16 - mars_B4 at tau 0.95 and at 0.5 (no sourced paper figure; the earlier
          grids found its sign depends on tau and regime)                                      measurement
      g   offsets_B4 - mars_B4: accuracy at tau 1 and tokens/forward at tau 0.95               measurement
  Verdicts need all 5 seeds; with fewer, --report labels each line "interim (k seeds): no verdict".
- Pairing and surviving a lost machine: a stage-2 row of seed s records the digest (resumable.weights_digest)
  of the ar_E weights it started from, and the report uses it only if that equals the digest recorded by
  ar_E/seed s (else it is listed as unpaired and left out). A runner that lacks a seed's ar_E checkpoint (a new
  machine: out/ is not committed) retrains it with the same flags, seed and one thread, and goes on only if
  the digest equals the recorded one (the same CPU model, torch and thread count reproduce a run bit for bit);
  if not, it stops with an error, and the seed restarts (--restart_seed s moves its rows to
  experiments/competent_grid_superseded.jsonl, which the report never reads). The same holds for the 128-epoch
  measurement's chunks.
- One measurement outside the grid, after seed 1 (no verdict): AR-SFT seed 0 on the pilot's file (seed 0)
  trained to 128 epochs (one cosine schedule), in chunks of 16 epochs (train.py --resume --max_iters), each
  chunk's held-out loss and greedy accuracy on all prompts: does accuracy ever fall in this regime?
- Smallest detectable effect at 5 seeds (80% power, two-sided 5%): prompt noise alone, from the pilot's one-seed
  2E - E interval on 3650 prompts (half width 1.55 points, se 0.79): 0.79 / sqrt(5) = 0.35 -> about 1.0 point for
  two independently trained rows (fewer for MARS against its own parent, which agree on more prompts); on the
  800 sweep prompts about 2.1 points, on the 500 arithmetic prompts about 2.7. The seed term in this regime is
  unknown (one pilot seed): a paired difference whose per-seed values have sd s adds about 1.66 s (t with 4
  degrees of freedom); in the powered grid's regime A the detectable effects were 1.2-5.2 points.
- Training step (measured before this commit, this machine, 4 x 128, batch 32, N 5000, the median of steps
  21-60): AR 0.28 s with 1 thread, 0.20 s with 2 (so two 1-thread runners give 1.4x the throughput of one
  2-thread runner); torch.compile (train.py --compile) 0.32 s AR and 0.68 s MARS B 4 against 0.71 s without,
  with the same losses: no faster honest step (< 1.2x), so the grid runs uncompiled, 1 thread a runner. The
  batch layout (pad to the longest in the batch) stays: sorting by length would change which examples share
  a step, i.e. the training itself.
- Cost (one core): a MARS step 0.5-0.7 s (the pilot's AR step 0.22 s, this machine 0.28): ar_E ~20 min, ar_2E
  ~40, each of the six stage-2 rows ~45-60 min, evaluation ~2 min a row and ~20 for BD3LM's sampler: about 6
  core-hours a seed, ~30 for the grid, plus ~1.5 for the 128-epoch measurement: about 16 hours with two
  runners. Every row records its core-seconds and seconds per step.

Added after the grid (nothing above changes, no verdict changes): d_ar, BD3LM B 4 - AR-SFT E, the paper's other
BD3LM comparison, as a measurement (its words "detected above/below 0" or "not detected"); and beside every
claim's word its reading (experiments/claims.reading: where 0 and the paper's figure lie against the interval).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import paired, powered_eval, runner  # noqa: E402
from experiments.claims import difference, line, paired_rows, tokens_per_forward_line, verdict_row  # noqa: E402
from experiments.resumable import core_seconds, machine, weights_digest  # noqa: E402
from experiments.runner import load, recorded  # noqa: E402
from experiments.runs import Row, data_file, evaluate, provenance, size, train, train_and_evaluate, training  # noqa: E402

TAUS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.5)
FULL = dict(seeds=(1, 2, 3, 4, 5), N=5000, E=32, model=size(4, 128), batch=32, n_per_family=500,
            sweep_per_family=100, taus=TAUS, max_new_tokens=72, decode_batch=100, long=(128, 16))
QUICK = dict(seeds=(1,), N=64, E=1, model=["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--n_kv_head", "1",
                                          "--intermediate_size", "64"],
             batch=8, n_per_family=2, sweep_per_family=1, taus=(1.0, 0.95), max_new_tokens=12, decode_batch=100,
             long=(4, 2))
FLAT = 0.017  # the flat claim's band (+-1.7 points, the paper's headline effect)


def grid_rows(cfg):
    """The 8 rows of a seed: name -> Row (stage, parent, train.py flags less --data, B, taus)."""
    E, taus = cfg["E"], cfg["taus"]
    stage2 = lambda B, *flags: Row("mars", "ar_E", ["--epochs", str(E), "--block_size", str(B), *flags], B, taus)  # noqa: E731
    return {"ar_E": Row("ar", None, ["--epochs", str(E)], None),
            "ar_2E": Row("ar", None, ["--epochs", str(2 * E)], None),
            "mars_B4": stage2(4, "--no-random_offsets"),
            "offsets_B4": stage2(4, "--random_offsets"),
            "mars_B16": stage2(16, "--no-random_offsets"),
            "no_sft_B4": stage2(4, "--no-random_offsets", "--objective", "no_sft_released"),
            "no_sft_B16": stage2(16, "--no-random_offsets", "--objective", "no_sft_released"),
            "bd3lm_B4": stage2(4, "--no-random_offsets", "--objective", "bd3lm")}


def long_chunks(cfg):
    """The 128-epoch measurement's records, one per chunk: ["long/E16", ..., "long/E128"]."""
    total, every = cfg["long"]
    return [f"long/E{e}" for e in range(every, total + 1, every)]


def queue(cfg):
    """Every run in the runners' order: seed-major (the constant, ar_E, ar_2E, the stage-2 rows), the 128-epoch
    measurement right after seed 1."""
    names = []
    for s in cfg["seeds"]:
        names += [f"{row}/seed{s}" for row in ["constant", *grid_rows(cfg)]]
        if s == cfg["seeds"][0]:
            names += long_chunks(cfg)
    return names


def ready(name, finished, cfg):
    """Whether a run's inputs exist: a stage-2 row needs its seed's ar_E, a chunk the one before it and seed 1."""
    if name.startswith("long/"):
        chunks, first = long_chunks(cfg), cfg["seeds"][0]
        before = chunks[:chunks.index(name)]
        return all(f"{r}/seed{first}" in finished for r in ["constant", *grid_rows(cfg)]) and set(before) <= finished
    row, seed = name.split("/")
    parent = grid_rows(cfg).get(row, Row("", None, [], None)).parent
    return parent is None or f"{parent}/{seed}" in finished


# ------------------------------------------------------------------------------------------------ runner
def run_queue(results, out, cfg, meta, poll=60):
    examples = powered_eval.powered_split(cfg["n_per_family"])
    def run(name):
        return run_long(results, name, out, cfg, meta, examples) if name.startswith("long/") else \
            run_row(results, name, out, cfg, meta, examples)
    runner.run_queue(results, out, queue(cfg), lambda name, finished: ready(name, finished, cfg), run, meta,
                     "competent grid", poll)


def run_row(results, name, out, cfg, meta, examples):
    row_name, seed = name.split("/")
    s = int(seed[4:])
    data = data_file(out, s, cfg["N"])
    base = {"row": row_name, "seed": s, "n_train": cfg["N"]}
    if row_name == "constant":
        return {**base, "all": powered_eval.constant_baseline(training(data), examples)}
    row = grid_rows(cfg)[row_name]
    init = []
    if row.parent:
        path, digest = parent_weights(results, s, out, cfg, meta)
        init, base["parent_digest"] = ["--init_from", path], digest
    run_dir = os.path.join(out, seed, row_name)
    fields = train_and_evaluate(run_dir, row, [*init, "--data", data, *row.flags], s, cfg, meta, examples,
                                max(1, cfg["N"] // cfg["batch"]))
    return {**base, "model": cfg["model"], "flags": row.flags, "block_size": row.B, **fields}


def parent_weights(results, seed, out, cfg, meta):
    """(path, digest) of seed's ar_E weights, retrained where this machine lacks them; exits if they differ from
    the recorded ones (the protocol: the seed restarts)."""
    run_dir = os.path.join(out, f"seed{seed}", "ar_E")
    retrain = lambda: train("ar", run_dir, ["--data", data_file(out, seed, cfg["N"]), *grid_rows(cfg)["ar_E"].flags],  # noqa: E731
                            seed, {**cfg, "model": [*cfg["model"], "--device", meta["device"]]}, 10**9)
    return runner.parent_weights(results, f"ar_E/seed{seed}", os.path.join(run_dir, "ar.pt"), retrain,
                                 f"By the protocol the seed restarts: python experiments/competent_grid.py "
                                 f"--restart_seed {seed}, then run again")


def restart_seed(results, seed):
    """The protocol's way out when a seed's ar_E cannot be reproduced (the 128-epoch chunks stay)."""
    runner.restart_seed(results, seed, keep_row=lambda row: row == "long")


def run_long(results, name, out, cfg, meta, examples):
    """One chunk of the 128-epoch AR-SFT run (seed 0, the pilot's file): train on from the last chunk (retrained
    from scratch where this machine lacks it, checked against its recorded digest), then evaluate."""
    total, every = cfg["long"]
    epochs, per_epoch = int(name[6:]), cfg["N"] // cfg["batch"]
    run_dir, data = os.path.join(out, "long"), data_file(out, 0, cfg["N"])
    model = {**cfg, "model": [*cfg["model"], "--device", meta["device"]]}
    flags = ["--data", data, "--epochs", str(total)]
    path = os.path.join(run_dir, "ar.pt")
    resume = []
    if epochs > every:
        before = recorded(results, f"long/E{epochs - every}")
        if not (os.path.exists(path) and weights_digest(path) == before["digest"]):
            print(f"competent grid: retraining the 128-epoch run to {before['steps']} steps", flush=True)
            train("ar", run_dir, [*flags, "--max_iters", str(before["steps"])], 0, model, 10**9)
            if weights_digest(path) != before["digest"]:
                sys.exit(f"error: the 128-epoch run retrained to {before['steps']} steps differs from the recorded "
                         "one: restart the measurement (remove the long/ rows from the results file)")
        resume = ["--resume"]
    c0 = core_seconds()
    curve, step_s = train("ar", run_dir, [*flags, *resume, "--max_iters", str(epochs * per_epoch)], 0, model, per_epoch)
    c1, t1 = core_seconds(), time.time()
    scores = evaluate(path, Row("ar", None, [], None), examples, cfg, meta["device"])
    return {"row": "long", "seed": 0, "epochs": epochs, "schedule_epochs": total, "model": cfg["model"],
            "steps": curve[-1][0], "step_seconds": statistics.median(step_s), "train_core_seconds": c1 - c0,
            "eval_seconds": time.time() - t1, "held_out_loss": curve, "digest": weights_digest(path), **scores}


# ------------------------------------------------------------------------------------------------ report
# (key, claim, row a, row b, metric, tau a, tau b, direction: +1 / -1 the paper's sign of a - b, 0 flat, None a
# measurement[, one family's prompts only]); tau "1" is a row's "all" evaluation, any other its sweep's
CLAIMS = [
    ("premise", "AR-SFT 2E - E (paper -2.3, Table 2: the control overfits)", "ar_2E", "ar_E", "accuracy", "1", "1", -1),
    ("a", "MARS B 4 - AR-SFT E (paper +1.7, Table 2)", "mars_B4", "ar_E", "accuracy", "1", "1", +1),
    ("b", "MARS B 4 - AR-SFT 2E, the step-matched control (paper +4.0, Table 2)", "mars_B4", "ar_2E", "accuracy",
     "1", "1", +1),
    ("c1", "no SFT loss: B 16 - B 4 (paper -6.2, Table 3)", "no_sft_B16", "no_sft_B4", "accuracy", "1", "1", -1),
    ("c2", "with it: B 16 - B 4, flat (paper -0.7, Table 3)", "mars_B16", "mars_B4", "accuracy", "1", "1", 0),
    ("d", "BD3LM B 4 - MARS B 4 (paper -7.6: 22.8 against 30.4, Table 2)", "bd3lm_B4", "mars_B4", "accuracy", "1",
     "1", -1),
    ("d_arith", "BD3LM B 4 - MARS B 4, arithmetic only (paper: reasoning collapses, BBH 26.3 -> 7.5)", "bd3lm_B4",
     "mars_B4", "accuracy", "1", "1", -1, "arithmetic"),
    # added after the grid (so a measurement, no verdict): the paper's BD3LM comparison is against AR-SFT E as well
    ("d_ar", "BD3LM B 4 - AR-SFT E (paper -5.9: 22.8 against 28.7, Table 2; not in the protocol: a measurement)",
     "bd3lm_B4", "ar_E", "accuracy", "1", "1", None),
    ("e", "MARS B 4 tau 0.95 - tau 1 (paper -1.1..-1.6, Table 4)", "mars_B4", "mars_B4", "accuracy", "0.95", "1", -1),
    ("f95", "tokens/forward MARS B 16 - B 4 at tau 0.95", "mars_B16", "mars_B4", "tokens_per_forward", "0.95",
     "0.95", None),
    ("f50", "tokens/forward MARS B 16 - B 4 at tau 0.5", "mars_B16", "mars_B4", "tokens_per_forward", "0.5", "0.5",
     None),
    ("g", "random offsets - released, B 4, accuracy at tau 1", "offsets_B4", "mars_B4", "accuracy", "1", "1", None),
    ("g_tpf", "random offsets - released, B 4, tokens/forward at tau 0.95", "offsets_B4", "mars_B4",
     "tokens_per_forward", "0.95", "0.95", None),
]
CONTRAST = ("no_sft_B16", "no_sft_B4", "mars_B16", "mars_B4")  # claim c: (a - b) - (c - d), paper about -5.5


def report(results, cfg):
    """Every claim: {"key", "claim", "estimate", "lo", "hi", "seeds", "df", "method", "mde", "verdict", "reading"}
    (claims.verdict_row), and the names of the rows left out (unpaired)."""
    results, unpaired = paired_rows([r for r in results if r.get("row") != "long"])
    out, swept = [], {"1", *(f"{t:g}" for t in cfg["taus"])}
    for key, text, a, b, metric, tau_a, tau_b, direction, *family in CLAIMS:
        if not {tau_a, tau_b} <= swept:
            continue  # (--quick sweeps fewer taus)
        got = difference(results, a, b, metric, tau_a, tau_b, cfg, *family)
        if got:
            out.append(verdict_row(key, text, *got, direction, cfg, FLAT, 100 if metric == "accuracy" else 1))
    runs = {(r["row"], r["seed"]): r for r in results if "seed" in r}
    seeds = sorted(s for s in cfg["seeds"] if all((row, s) in runs for row in CONTRAST))
    if seeds:
        right = [np.array([[int(c) for c in runs[row, s]["all"]["right"]] for s in seeds], dtype=float)
                 for row in CONTRAST]
        iv = paired.interval((right[0] - right[1]) - (right[2] - right[3]))
        out.insert(4, verdict_row("c", "the clean-loss contrast (no-SFT B16 - B4) - (MARS B16 - B4) (paper about "
                                  "-5.5, Table 3)", iv, seeds, -1, cfg, FLAT))
    return out, unpaired


def accuracy_table(results):
    """row -> per-seed greedy accuracy on all prompts (the report's first table)."""
    table = {}
    for r in sorted(results, key=lambda r: (r.get("seed", 0), r["name"])):
        if "all" in r and r.get("row") != "long":
            table.setdefault(r["row"], {})[r["seed"]] = r["all"]["accuracy"]["all"]
    return table


def print_report(results, cfg):
    rows, unpaired = report(results, cfg)
    print("accuracy at tau 1 on all prompts, per seed:")
    for row, per_seed in accuracy_table(results).items():
        print(f"  {row:<11} " + "  ".join(f"s{s} {v:.3f}" for s, v in per_seed.items()))
    for r in rows:
        print(line(r))
    if tokens_per_forward_line(results):
        print(tokens_per_forward_line(results))
    for r in sorted((r for r in results if r.get("row") == "long"), key=lambda r: r["epochs"]):
        print(f"long     AR-SFT seed 0, epoch {r['epochs']} of {r['schedule_epochs']}: accuracy "
              f"{r['all']['accuracy']['all']:.3f}, held-out loss {r['held_out_loss'][-1][1]['ar']:.3f}")
    if unpaired:
        print("left out (parent digest is not the seed's ar_E): " + ", ".join(unpaired))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", action="store_true", help="every claim's paired interval and verdict")
    p.add_argument("--quick", action="store_true", help="a tiny model and data, every row, one seed (CI)")
    p.add_argument("--restart_seed", type=int, default=None, help="move a seed's rows to the superseded file")
    p.add_argument("--device", default="cpu", help="cpu or cuda (train.py trains in bf16 there)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every process (recorded)")
    p.add_argument("--results", default=os.path.join(ROOT, "experiments", "competent_grid.jsonl"))
    p.add_argument("--out", default=os.path.join(ROOT, "out", "competent_grid"), help="checkpoints, data, claims")
    args = p.parse_args()
    cfg = QUICK if args.quick else FULL
    if args.device.startswith("cuda"):
        cfg = {**cfg, "decode_batch": 1000}  # every row decodes as it would alone: the batch changes only the time
    if args.report:
        return print_report(load(args.results), cfg)
    if args.restart_seed is not None:
        return restart_seed(args.results, args.restart_seed)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # train.py's processes
    torch.set_num_threads(args.threads)  # this one's decoding
    run_queue(args.results, args.out, cfg, {**provenance(args.threads, args.device), "machine": machine()},
              poll=1 if args.quick else 60)


if __name__ == "__main__":
    main()
