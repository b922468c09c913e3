"""
Batched decoding speed, side by side, on the held-out prompts of a trained model:
  python bench.py             # batch sizes 1 4 8 16, every strategy: a few minutes on an idle CPU
  python bench.py --quick     # a smoke run, seconds
  python bench.py --ckpt path/to/hf_folder --data my.jsonl --device cuda --dtype bfloat16   # your model, data
Strategies: AR with KV cache (the baseline), MARS without a cache, MARS with nanoMARS's block-level
cache (B_cache 4/8/16/32: the commit rides on the next forward), MARS with per-request caches, Jacobi
decoding (greedy, exact; the same checkpoint decoded as the plain AR model it still is: no mask token is
ever fed), and, all with per-request caches unless said: lossless MARS (the masks draft, AR verifies:
AR's own tokens), adaptive windows and aligned windows (nanomars/batch_decode.py), and the paper's
released block-cache sampler ("Paper block B_cache": the window is the rest of the B_cache-token block,
one extra forward commits each block, rows fill their block past the stop token).
The MARS rows decode the very same tokens; the other rows each decode their own.
Columns: tok/fwd = generated tokens (up to the stop token) / forwards that produced them, per row (for
the paper's block sampler: its prefill and commits included); paper = the released sampler's own count,
for the "Paper block" rows only: every accepted token, post-stop ones included, / its prefill, commits and
the forwards a row took tokens in (at batch 1 exactly the released code's statistic);
fwd = model calls of the batch; tok/s = generated tokens / wall clock; xAR = wall clock of AR+cache on the
same prompts / this strategy's, measured in the same run; acc = accuracy judged by --check.
Each batch of prompts is decoded by every strategy in turn, so machine noise hits all of them alike.
Writes the table as JSON and a plot of xAR against batch size.
"""
import json
import os
import time
from functools import partial

import torch

from nanomars.batch_decode import batch_ar, batch_decode, batch_jacobi, batch_lossless, batch_paper_block
from nanomars.checkpoint import load_model
from nanomars.decode import check_decode_args
from nanomars.cli import ArgumentParser, device_name, dtype_name, fail, nonneg_int, positive_int, tau_float
from nanomars.progress import Progress
from nanomars.tasks import FAMILIES, TEST_PER_FAMILY, held_out_split, load_checker, prompt_messages, read_jsonl, score

p = ArgumentParser(__doc__)
p.add_argument("--ckpt", default="out/mars.pt", help="a nanoMARS checkpoint or a Hugging Face folder")
p.add_argument("--tau", type=tau_float, default=0.95)
p.add_argument("--block_size", type=positive_int, default=None, help="default: the checkpoint's training block size")
p.add_argument("--batch_sizes", type=positive_int, nargs="+", default=[1, 4, 8, 16])
p.add_argument("--n_prompts", type=positive_int, default=None, help="default: 210 held-out prompts mixed over the "
               "task families, or every example of --data")
p.add_argument("--data", default=None, help="a JSONL of {'messages': [...]} instead of the held-out suite: the model "
               "answers the conversation up to its last assistant message, the reference")
p.add_argument("--check", default="suite", help="how the acc column judges an answer: 'suite' (the suite's checkers; "
               "exact match with the reference for other data) or FILE.py:FUNCTION / MODULE:FUNCTION, a function "
               "(example dict, response str) -> bool")
p.add_argument("--max_new_tokens", type=positive_int, default=64)
p.add_argument("--out", default="out/bench", help="writes <out>.json and <out>.png")
p.add_argument("--device", type=device_name, default="cpu")
p.add_argument("--dtype", type=dtype_name, default="float32", help="float32 (exact: the MARS rows agree) or bfloat16")
p.add_argument("--threads", type=nonneg_int, default=1, help="CPU threads; 0: torch's default. 1 by default: on a "
               "busy machine threads that wait for each other make every small forward many times slower")
p.add_argument("--profile", action="store_true", help="also print torch.profiler's op table for AR+cache and "
               "MARS per-request at the largest batch size")
p.add_argument("--quick", action="store_true", help="smoke run: 16 prompts, batch sizes 1 and 8, 32 tokens")
args = p.parse_args()
if args.quick:
    args.n_prompts, args.batch_sizes, args.max_new_tokens = 16, [1, 8], 32
torch.manual_seed(0)
if args.threads:
    torch.set_num_threads(args.threads)

try:
    check = load_checker(args.check)
    if args.data:
        examples = read_jsonl(args.data)[:args.n_prompts]
    else:
        n = args.n_prompts or 210
        if n > TEST_PER_FAMILY * len(FAMILIES):
            fail(f"--n_prompts: the held-out split has {TEST_PER_FAMILY * len(FAMILIES)} prompts, asked for {n}")
        # prompts round-robin over the task families, so every batch mixes prompt and answer lengths
        k, F = -(-n // len(FAMILIES)), len(FAMILIES)
        split = held_out_split(k)  # k of each family, family after family
        examples = [split[f * k + i] for i in range(k) for f in range(F)][:n]
    model, tok, trained_block, _ = load_model(args.ckpt, args.device, args.dtype)
except (ValueError, FileNotFoundError) as e:
    fail(str(e))
B = args.block_size or trained_block
prompts = [tok.prompt_ids(prompt_messages(ex)) for ex in examples]
try:  # every strategy would refuse the same way: say it once, before anything runs
    for prompt in prompts:
        check_decode_args(model, prompt, args.max_new_tokens, B)
except ValueError as e:
    fail(f"{args.ckpt}: {e}")

mars = partial(batch_decode, mask_id=tok.mask_id, block_size=B, tau=args.tau, stop_ids=tok.stop_ids)
strategies = {
    "AR+cache": partial(batch_ar, stop_ids=tok.stop_ids),
    "MARS no cache": partial(mars, cache=None),
    **{f"MARS block {c}": partial(mars, cache="block", cache_block=c) for c in (4, 8, 16, 32)},
    "MARS per-request": partial(mars, cache="request"),
    "Jacobi": partial(batch_jacobi, window=B, stop_ids=tok.stop_ids),
    "Lossless MARS": partial(batch_lossless, mask_id=tok.mask_id, block_size=B, stop_ids=tok.stop_ids),
    "Adaptive window": partial(mars, cache="request", adaptive=True),
    "Aligned window": partial(mars, cache="request", align=True),
    **{f"Paper block {c}": partial(batch_paper_block, mask_id=tok.mask_id, cache_block=c, tau=args.tau,
                                   stop_ids=tok.stop_ids) for c in (8, 32)},
}

results = []
t_start = time.perf_counter()
batches = {bs: [list(range(i, min(i + bs, len(prompts)))) for i in range(0, len(prompts), bs)]
           for bs in args.batch_sizes}
progress = Progress(sum(map(len, batches.values())) * len(strategies), "bench")
for bs in args.batch_sizes:
    progress.update(what=f"batch size {bs}")
    for run in strategies.values():  # warm up every path at this shape
        run(model, [prompts[i] for i in batches[bs][0]], 8)
    tot = {name: dict(rows=[], forwards=0, seconds=0.0, paper_tokens=0, paper_forwards=0) for name in strategies}
    for rows in batches[bs]:
        for name, run in strategies.items():
            t0 = time.perf_counter()
            out = run(model, [prompts[i] for i in rows], args.max_new_tokens)
            t = tot[name]
            t["seconds"] += time.perf_counter() - t0
            t["rows"] += out.rows  # in prompt order: the batches follow the prompts
            t["forwards"] += out.forwards
            if out.paper_tokens is not None:  # the paper's block sampler: its own count too
                t["paper_tokens"] += sum(out.paper_tokens)
                t["paper_forwards"] += sum(out.paper_forwards)
            progress.update(1)
    for name, t in tot.items():
        s = score(tok, examples, t["rows"], check)
        paper = t["paper_tokens"] / t["paper_forwards"] if t["paper_forwards"] else None
        results.append(dict(strategy=name, batch_size=bs, tokens_per_forward=s["tokens_per_forward"],
                            paper_tokens_per_forward=paper, batch_forwards=t["forwards"],
                            tokens_per_s=s["tokens"] / t["seconds"], x_ar=tot["AR+cache"]["seconds"] / t["seconds"],
                            accuracy=s["accuracy"]["all"], tokens=s["tokens"], seconds=t["seconds"]))
progress.close()

print(f"{args.ckpt}: {len(prompts)} prompts from {args.data or 'the held-out suite'}, max_new_tokens {args.max_new_tokens}, block {B}, "
      f"tau {args.tau}, {torch.get_num_threads()} threads, {time.perf_counter() - t_start:.0f} s")
print(f"{'strategy':<18}{'batch':>6}{'tok/fwd':>9}{'paper':>7}{'fwd':>7}{'tok/s':>9}{'xAR':>7}{'acc':>7}")
for r in results:
    paper = "" if r["paper_tokens_per_forward"] is None else f"{r['paper_tokens_per_forward']:.2f}"
    print(f"{r['strategy']:<18}{r['batch_size']:>6}{r['tokens_per_forward']:>9.2f}{paper:>7}{r['batch_forwards']:>7}"
          f"{r['tokens_per_s']:>9.0f}{r['x_ar']:>7.2f}{r['accuracy']:>7.3f}")

if args.profile:  # where the time goes: model ops (mm, attention, elementwise) vs the loop's own ops
    from torch.profiler import profile
    bs = max(args.batch_sizes)
    for name in ("AR+cache", "MARS per-request"):
        with profile() as prof:
            for i in range(0, len(prompts), bs):
                strategies[name](model, prompts[i:i + bs], args.max_new_tokens)
        print(f"\n{name}, batch {bs}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
with open(args.out + ".json", "w") as f:
    json.dump(dict(args=vars(args), block_size=B, results=results), f, indent=1, default=str)
import matplotlib
matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for name in strategies:
    rs = [r for r in results if r["strategy"] == name]
    ax1.plot([r["batch_size"] for r in rs], [r["x_ar"] for r in rs], "o-", label=name)
    ax2.plot([r["batch_size"] for r in rs], [r["tokens_per_s"] for r in rs], "o-", label=name)
ax1.set(xscale="log", xlabel="batch size", ylabel="wall-clock speedup vs AR+cache", title=f"tau {args.tau}")
ax2.set(xscale="log", xlabel="batch size", ylabel="tokens / s")
for ax in (ax1, ax2):
    ax.set_xticks(args.batch_sizes, [str(b) for b in args.batch_sizes])
ax1.axhline(1.0, color="gray", lw=0.5)
ax1.plot([4, 8, 16], [1.71, 1.60, 1.34], "k*", ms=10, label="paper: block cache, 7B GPU")
ax1.legend(fontsize=7)
fig.tight_layout()
fig.savefig(args.out + ".png", dpi=120)
print(f"wrote {args.out}.json and {args.out}.png")
