"""
The paper's experiments at nano scale (arXiv 2604.07023: AR-SFT, the 2E-epoch control, MARS at B = 4/8/16,
its no-SFT and block-diffusion ablations), with seeds and error bars.

    python experiments/paper_grid.py --pilot         # how N and E were chosen (experiments/paper_pilot.jsonl)
    nohup python experiments/paper_grid.py > out/paper_grid.log 2>&1 &     # the grid; re-run to resume
    # or, on 2 cores, one single-threaded process per regime (or per --seeds; never two on one run):
    OMP_NUM_THREADS=1 nohup python experiments/paper_grid.py --regime data-limited > out/grid_a.log 2>&1 &
    OMP_NUM_THREADS=1 nohup python experiments/paper_grid.py --regime endless > out/grid_b.log 2>&1 &
    python experiments/paper_grid.py --timing        # what a MARS epoch costs against an AR epoch, measured alone
    python experiments/paper_grid.py --quick --results /tmp/quick.jsonl     # the same code, tiny (CI, < 2 min)

Every finished run appends one JSON line to the results file (experiments/paper_grid.jsonl) and is skipped
when the runner starts again, so the grid can span several sittings (stderr shows the runs done of those to
do, the time taken and an estimate of the rest). notebooks/03_paper_at_nano_scale.ipynb reads the file and
draws every table and curve.

Protocol (written before the first full run; nothing below was changed after seeing grid results):
- Model: train.py's default 0.87M-parameter decoder (4 layers, width 128), train.py's defaults otherwise
  (batch 32, lr 2e-3 AR-SFT / 1e-3 MARS with 20 warmup steps and cosine decay to 0.1x, AdamW, seed s).
- Data-limited regime (the paper's): a FIXED set of N suite examples (train_examples(N, seed=s)), trained
  by epochs (--epochs: each example once per epoch, reshuffled). AR-SFT for E epochs; the control AR-SFT
  for 2E epochs from scratch; each stage-2 run starts from the AR E checkpoint and trains E more epochs.
- N and E: chosen from the pilot (--pilot, seed 0, which the grid never uses) by this rule, fixed before the
  pilot ran: AR-SFT at N in {250, 500} for 20, 40 and 80 epochs; "overfits between E and 2E" means the
  held-out AR loss at the end of 2E is higher than at E AND held-out accuracy (greedy, 350 prompts) is
  lower. Take the (N, E) with E in {20, 40} where accuracy falls most from E to 2E; if accuracy falls for
  none, take the one whose held-out loss rises most, and say plainly that accuracy did not fall.
  choose() applies this rule to experiments/paper_pilot.jsonl; the grid reads its answer from there.
- Endless regime (the README's default run): N = 20000 examples drawn with replacement, AR 1200 steps,
  the control AR 2400 steps, MARS B = 4 for 1200 steps from AR 1200.
- Seeds 1, 2, 3 for every row: the seed sets the initial weights, the training examples and their order.
- Stage-2 rows: MARS (alpha 1) at B = 4, 8, 16 as released (blocks from position 0, token-normalised
  loss); MARS B = 4 with the released trainer's sequence-normalised loss; the no-SFT ablation as released
  (noisy loss only, 1/t per sequence) at B = 4, 8, 16; BD3LM as released at B = 4; MARS with random
  block offsets (nanoMARS's default) at B = 4, 8, 16.
- Evaluation, every run, on the fixed held-out split (350 prompts, 50 per family, family checkers, 64 new
  tokens): greedy AR accuracy per family (= MARS at tau 1, tested token for token); MARS at tau 0.95,
  0.9, 0.8, 0.7, 0.5, 0.3 (accuracy and tokens/forward: the Pareto curve); Jacobi tokens/forward (window
  4) on AR-SFT models; BD3LM decoded by block_diffusion_decode (its tau 1 fills one position per forward,
  most confident first, so it is not AR); the median seconds per training step, for a MARS epoch / an
  AR epoch; the held-out loss at every epoch (every 200 steps in the endless regime).
- Epoch cost (added after the grid, because its step times were taken beside other jobs): --timing trains
  each data-limited row alone for 4 epochs (seed 1) and records its seconds per step.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments.resumable import done, record  # noqa: E402
from experiments.runs import train  # noqa: E402
from nanomars.batch_decode import batch_ar, batch_decode, batch_jacobi  # noqa: E402
from nanomars.compare.block_diffusion import block_diffusion_decode  # noqa: E402
from nanomars.util.checkpoint import load_model  # noqa: E402
from nanomars.util.progress import Progress  # noqa: E402
from nanomars.util.tasks import held_out_split, prompt_messages, score  # noqa: E402

TAUS = (0.95, 0.9, 0.8, 0.7, 0.5, 0.3)
FULL = dict(seeds=(1, 2, 3), blocks=(4, 8, 16), model=[], batch=32, n_per_family=50, max_new_tokens=64, taus=TAUS,
            endless=(20000, 1200), eval_interval=200)
QUICK = dict(seeds=(1,), blocks=(4,), model=["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--n_kv_head", "1",
                                "--intermediate_size", "64"],
             batch=8, n_per_family=2, max_new_tokens=12, taus=(0.9,), endless=(64, 8), eval_interval=4)


def stage2(B, *flags):
    return ["--block_size", str(B), *flags]


def grid_rows(N, E, blocks, endless_n, endless_steps):
    """name -> (stage, parent run or None, train.py flags, decoder block size). Stage-2 rows keep the
    released alignment unless they say otherwise."""
    epochs = lambda e: ["--n_train", str(N), "--epochs", str(e)]  # noqa: E731
    rows = {"ar_E": ("ar", None, epochs(E), None), "ar_2E": ("ar", None, epochs(2 * E), None)}
    for B in blocks:
        rows[f"mars_B{B}"] = ("mars", "ar_E", epochs(E) + stage2(B, "--no-random_offsets"), B)
    rows["mars_B4_seqnorm"] = ("mars", "ar_E", epochs(E) + stage2(4, "--no-random_offsets", "--loss_norm", "sequence"), 4)
    for B in blocks:
        rows[f"no_sft_B{B}"] = ("mars", "ar_E", epochs(E) + stage2(B, "--no-random_offsets", "--objective", "no_sft_released"), B)
    rows["bd3lm_B4"] = ("mars", "ar_E", epochs(E) + stage2(4, "--objective", "bd3lm"), 4)
    for B in blocks:
        rows[f"offsets_B{B}"] = ("mars", "ar_E", epochs(E) + stage2(B, "--random_offsets"), B)
    steps = lambda n: ["--n_train", str(endless_n), "--max_iters", str(n)]  # noqa: E731
    rows["endless_ar"] = ("ar", None, steps(endless_steps), None)
    rows["endless_ar_2x"] = ("ar", None, steps(2 * endless_steps), None)
    rows["endless_mars_B4"] = ("mars", "endless_ar", steps(endless_steps) + stage2(4, "--no-random_offsets"), 4)
    return rows


def decode_and_score(tok, examples, decode, batch=50):
    """decode(list of prompts) -> decoded rows; accuracy per family and tokens/forward over the examples."""
    rows = [row for i in range(0, len(examples), batch)
            for row in decode([tok.prompt_ids(prompt_messages(ex)) for ex in examples[i:i + batch]])]
    scores = score(tok, examples, rows)
    return {"accuracy": scores["accuracy"], "tokens_per_forward": scores["tokens_per_forward"]}


def evaluate_run(path, examples, B, objective, cfg):
    """The run's scores: AR accuracy; a tau sweep for stage-2 models; Jacobi tokens/forward for AR models."""
    model, tok, _, _ = load_model(path)
    n, stop = cfg["max_new_tokens"], tok.stop_ids
    if objective == "bd3lm":  # not an AR model: every point, tau 1 included, is the block sampler's
        bd = lambda tau: lambda ps: [block_diffusion_decode(model, p, n, tok.mask_id, B, tau, stop) for p in ps]  # noqa: E731
        return {"sweep": {f"{tau:g}": decode_and_score(tok, examples, bd(tau)) for tau in (1.0, *cfg["taus"])}}
    scores = {"ar": decode_and_score(tok, examples, lambda ps: batch_ar(model, ps, n, stop).rows)}
    if B is None:
        jacobi = decode_and_score(tok, examples, lambda ps: batch_jacobi(model, ps, n, 4, stop).rows)
        scores["jacobi_tokens_per_forward"] = jacobi["tokens_per_forward"]
    else:
        mars = lambda tau: lambda ps: batch_decode(model, ps, n, tok.mask_id, B, tau, stop).rows  # noqa: E731
        scores["sweep"] = {"1": scores["ar"],
                           **{f"{tau:g}": decode_and_score(tok, examples, mars(tau)) for tau in cfg["taus"]}}
    return scores


def choose(pilot):
    """The protocol's rule on the pilot's rows -> (N, E, whether accuracy fell from E to 2E)."""
    runs = {(r["N"], r["epochs"]): r for r in pilot}
    pairs = []
    for (N, E), r in runs.items():
        if (N, 2 * E) in runs and E in (20, 40):
            r2 = runs[(N, 2 * E)]
            pairs.append((r2["ar"]["accuracy"]["all"] - r["ar"]["accuracy"]["all"],
                          r2["held_out_loss"][-1][1]["ar"] - r["held_out_loss"][-1][1]["ar"], N, E))
    if not pairs:
        raise ValueError("the pilot has no (N, E) with a 2E run: python experiments/paper_grid.py --pilot")
    overfit = [p for p in pairs if p[0] < 0 and p[1] > 0]
    _, _, N, E = min(overfit) if overfit else max(pairs, key=lambda p: p[1])
    return N, E, bool(overfit)


def eval_interval(flags, N, cfg):
    """The held-out loss after every epoch, or every cfg["eval_interval"] steps in the endless regime."""
    return cfg["eval_interval"] if "--max_iters" in flags else max(1, N // cfg["batch"])


def parent_checkpoint(rows, parent, seed, cfg, out, N):
    parent_dir = os.path.join(out, f"seed{seed}", parent)
    if not os.path.exists(os.path.join(parent_dir, "ar.pt")):  # a later sitting on a fresh machine:
        os.makedirs(parent_dir, exist_ok=True)  # retrain the parent (deterministic: the same weights)
        train("ar", parent_dir, rows[parent][2], seed, cfg, eval_interval(rows[parent][2], N, cfg))
    return os.path.join(parent_dir, "ar.pt")


def run_grid(cfg, N, E, results, out, regime="both", seeds=None):
    examples = held_out_split(cfg["n_per_family"])
    rows = grid_rows(N, E, cfg["blocks"], *cfg["endless"])
    finished = done(results)
    todo = [(seed, name) for seed in seeds or cfg["seeds"] for name in rows if f"{name}/seed{seed}" not in finished
            and (regime == "both" or (regime == "endless") == name.startswith("endless"))]
    progress = Progress(len(todo), "paper_grid")
    for seed, name in todo:
        stage, parent, flags, B = rows[name]
        key = f"{name}/seed{seed}"
        progress.update(what=f"training {key}")
        run_dir = os.path.join(out, f"seed{seed}", name)
        os.makedirs(run_dir, exist_ok=True)
        init = ["--init_from", parent_checkpoint(rows, parent, seed, cfg, out, N)] if parent else []
        t0 = time.time()
        curve, step_s = train(stage, run_dir, [*init, *flags], seed, cfg, eval_interval(flags, N, cfg))
        step_s = statistics.median(step_s)
        seconds = time.time() - t0
        objective = flags[flags.index("--objective") + 1] if "--objective" in flags else "mars" if B else "ar"
        progress.update(what=f"evaluating {key}")
        scores = evaluate_run(os.path.join(run_dir, f"{stage}.pt"), examples, B, objective, cfg)
        record(results, {"name": key, "row": name, "seed": seed, "block_size": B, "objective": objective,
                         "flags": flags, "train_seconds": seconds, "step_seconds": step_s,
                         "held_out_loss": curve, **scores}, progress.print)
        progress.update(1, f"finished {key}")
    progress.close()


def run_timing(cfg, N, E, results, out, epochs=4):
    """What an epoch of each data-limited row costs, measured one run at a time on an otherwise quiet machine
    (the grid's own step times ran beside other jobs and include a held-out evaluation every epoch): seed 1,
    `epochs` epochs from the same AR-SFT checkpoint, no evaluation until the last step; the record is train.py's
    running mean of seconds per step at its last log line. An epoch is N / batch steps for every row, so
    the ratio of step times is the ratio of epoch times."""
    rows = grid_rows(N, E, cfg["blocks"], *cfg["endless"])
    steps = epochs * max(1, N // cfg["batch"])
    finished = done(results)
    todo = [name for name in rows if name != "ar_2E" and not name.startswith("endless")
            and f"timing/{name}" not in finished]
    progress = Progress(len(todo), "paper_grid --timing")
    for name in todo:
        stage, parent, flags, B = rows[name]
        key = f"timing/{name}"
        progress.update(what=f"training {key}")
        run_dir = os.path.join(out, "timing", name)
        os.makedirs(run_dir, exist_ok=True)
        init = ["--init_from", parent_checkpoint(rows, parent, cfg["seeds"][0], cfg, out, N)] if parent else []
        flags = [*flags[:flags.index("--epochs") + 1], str(epochs), *flags[flags.index("--epochs") + 2:]]
        _, step_s = train(stage, run_dir, [*init, *flags], cfg["seeds"][0], cfg, steps)
        record(results, {"name": key, "row": name, "steps": steps, "step_seconds": step_s[-1]}, progress.print)
        progress.update(1, f"finished {key}")
    progress.close()


def run_pilot(results, out, cfg=FULL):
    """AR-SFT at N in {250, 500} for 20, 40, 80 epochs, seed 0: the held-out loss curve and accuracy."""
    examples = held_out_split(cfg["n_per_family"])
    finished = done(results)
    todo = [(N, E) for N in (250, 500) for E in (20, 40, 80) if f"pilot/N{N}/E{E}" not in finished]
    progress = Progress(len(todo), "paper_grid --pilot")
    for N, E in todo:
        key = f"pilot/N{N}/E{E}"
        progress.update(what=f"training {key}")
        run_dir = os.path.join(out, "pilot", f"N{N}_E{E}")
        os.makedirs(run_dir, exist_ok=True)
        curve, step_s = train("ar", run_dir, ["--n_train", str(N), "--epochs", str(E)], 0, cfg, N // cfg["batch"])
        step_s = statistics.median(step_s)
        model, tok, _, _ = load_model(os.path.join(run_dir, "ar.pt"))
        ar = decode_and_score(tok, examples, lambda ps: batch_ar(model, ps, cfg["max_new_tokens"], tok.stop_ids).rows)
        record(results, {"name": key, "N": N, "epochs": E, "held_out_loss": curve, "step_seconds": step_s, "ar": ar},
               progress.print)
        progress.update(1, f"finished {key}")
    progress.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny grid (one seed, B = 4 only, a 1-layer model, N 64, E 1)")
    p.add_argument("--pilot", action="store_true", help="the runs that chose N and E")
    p.add_argument("--timing", action="store_true",
                   help="seconds per training step of every data-limited row, one at a time (run it alone)")
    p.add_argument("--regime", choices=["both", "data-limited", "endless"], default="both",
                   help="run one regime's rows only: two single-threaded processes, one per regime, share 2 cores")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="only these of the grid's seeds (1 2 3)")
    p.add_argument("--results", default=None, help="default: experiments/paper_grid.jsonl (paper_pilot.jsonl with --pilot, "
                   "paper_timing.jsonl with --timing)")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "paper_grid"), help="checkpoints and logs")
    args = p.parse_args()
    grid_seeds = (QUICK if args.quick else FULL)["seeds"]
    if args.seeds and not set(args.seeds) <= set(grid_seeds):
        p.error(f"--seeds: the protocol's seeds are {list(grid_seeds)}")
    default = "paper_pilot.jsonl" if args.pilot else "paper_timing.jsonl" if args.timing else "paper_grid.jsonl"
    results = args.results or os.path.join(ROOT, "experiments", default)
    torch.set_num_threads(1)  # this process only decodes; train.py runs with torch's default threads
    if args.pilot:
        return run_pilot(results, args.out)
    if args.quick:
        if args.timing:
            return run_timing(QUICK, 64, 1, results, args.out, epochs=1)
        return run_grid(QUICK, 64, 1, results, args.out, args.regime, args.seeds)
    pilot = os.path.join(ROOT, "experiments", "paper_pilot.jsonl")
    if not os.path.exists(pilot):
        sys.exit("error: no pilot to choose N and E from: run python experiments/paper_grid.py --pilot first")
    N, E, _ = choose([json.loads(line) for line in open(pilot) if line.strip()])
    print(f"N = {N} examples, E = {E} epochs (the pilot's choice)", flush=True)
    if args.timing:
        return run_timing(FULL, N, E, results, args.out)
    run_grid(FULL, N, E, results, args.out, args.regime, args.seeds)


if __name__ == "__main__":
    main()
