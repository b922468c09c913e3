"""
Batched decoding speed, side by side: MARS and its peers on the held-out prompts of a trained model:
  python tools/bench.py             # batch sizes 1 4 8 16, every strategy: a few minutes on an idle CPU
  python tools/bench.py --quick     # a smoke run, seconds
  python tools/bench.py --ckpt path/to/hf_folder --data my.jsonl --device cuda --dtype bfloat16   # your model, data
Strategies: AR with KV cache (the baseline), MARS without a cache, MARS with nanoMARS's block-level
cache (B_cache 4/8/16/32: the commit rides on the next forward), MARS with per-request caches, Jacobi
decoding (greedy, exact; the same checkpoint decoded as the plain AR model it still is: no mask token is
ever fed), and, all with per-request caches unless said: lossless MARS (the masks draft, AR verifies:
AR's own tokens), lossless MARS verifying a tree of the masks' top choices (nanomars/compare/tree.py; N nodes,
top k per depth), adaptive windows and aligned windows (nanomars/strategies.py), and the paper's
released block-cache sampler ("Paper block B_cache": the window is the rest of the B_cache-token block,
one extra forward commits each block, rows fill their block past the stop token).
MARS's peers (nanomars/compare/speculative.py, nanomars/compare/medusa.py), each verified by the target model unless said:
prompt lookup decoding (drafts copied from earlier text, no training), speculative decoding with a small
draft model (--draft: an AR model trained by train.py, see peers.py; its own forwards and seconds are
reported below the table and its seconds are part of its wall clock), and Medusa-1 heads (--medusa:
train.py --stage medusa), verified, and with MARS's tau gate in place of verification. The Medusa rows
run on the heads' own base, the frozen stage-1 model, not on --ckpt: their reference is its greedy AR.
A row whose file is missing is skipped with a note.
The rows named MARS decode the very same tokens (their caches change no token); the exact rows decode
AR's; the others each decode their own.
Columns: tok/fwd = generated tokens (up to the stop token) / forwards of the TARGET model that produced
them, the verifier's own token included (one definition for every row; a draft model's forwards are not
target forwards; for the paper's block sampler its prefill and commits are included); paper = the released
sampler's own count, for the "Paper block" rows only: every accepted token, post-stop ones included, / its
prefill, commits and the forwards a row took tokens in (at batch 1 exactly the released code's statistic);
fwd = model calls of the batch; tok/s = generated tokens / wall clock; xAR = wall clock of AR+cache on the
same prompts / this strategy's, measured in the same run; acc = accuracy judged by --check; =AR = the
fraction of prompts whose output is token for token greedy AR's (the row's model: --ckpt, or the heads'
base); params = parameters added to the model; training = what was trained beyond the AR model (stage 2:
MARS's dual-track fine-tuning); exact = greedy output is AR's by construction (a float32 property: =AR
measures it).
Each batch of prompts is decoded by every strategy in turn, so machine noise hits all of them alike.
Writes the table as JSON and a plot of xAR against batch size.
"""
import sys
import json
import os
import time
from functools import partial

import torch


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as python tools/bench.py

from nanomars.batch_decode import batch_ar, batch_decode, batch_jacobi, batch_lossless
from nanomars.util.checkpoint import load_model
from nanomars.util.cli import ArgumentParser, device_name, dtype_name, fail, nonneg_int, positive_int, tau_float
from nanomars.decode import check_decode_args
from nanomars.engine import Engine, PerRequestCache, forward_window
from nanomars.strategies import AdaptiveWindow, AlignedWindow
from nanomars.compare.block_cache import BlockCache, batch_paper_block
from nanomars.compare.medusa import MedusaGate, MedusaHeads, MedusaTree, load_medusa
from nanomars.model import KVCache
from nanomars.compare.speculative import DraftModel, PromptLookup
from nanomars.util.progress import Progress
from nanomars.util.tasks import FAMILIES, TEST_PER_FAMILY, held_out_split, load_checker, prompt_messages, read_jsonl, score
from nanomars.compare.stack import StackedTree
from nanomars.compare.tree import TreeLossless

TOKENS_PER_FORWARD = ("tok/fwd = generated tokens up to the stop token / forwards of the target model, the "
                      "verifier's own token included (draft-model forwards not counted: see below)")
TREES = ((4, 2), (8, 3), (16, 3))  # tree lossless MARS: (nodes, top k per depth)

p = ArgumentParser(__doc__)
p.add_argument("--ckpt", default="out/mars.pt", help="a nanoMARS checkpoint or a Hugging Face folder")
p.add_argument("--draft", default="out/draft/ar.pt", help="the draft model's checkpoint (train.py --stage ar, "
               "small; nanomars/compare/speculative.py); 'none': no draft-model row")
p.add_argument("--medusa", default="out/medusa.pt", help="Medusa heads (train.py --stage medusa); 'none': no "
               "Medusa rows")
p.add_argument("--tau", type=tau_float, default=0.95, help="MARS's and the Medusa gate's threshold")
p.add_argument("--block_size", type=positive_int, default=None, help="MARS's block size B; default: the checkpoint's "
               "training block size")
p.add_argument("--jacobi_window", type=positive_int, default=None, help="Jacobi's window; default: B (as many "
               "proposals per forward as MARS)")
p.add_argument("--cache_blocks", type=positive_int, nargs="+", default=[4, 8, 16, 32], help="block sizes B_cache of "
               "the block-level cache's MARS rows")
p.add_argument("--paper_blocks", type=positive_int, nargs="+", default=[8, 32], help="block sizes of the released "
               "block sampler's rows")
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
p.add_argument("--compile", action="store_true", help="also AR+cache, MARS per-request and lossless MARS with the "
               "model's forward compiled (torch.compile, dynamic shapes); the compiling is timed apart, before the runs")
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


# ------------------------------------------------------------------------------------ the table's rows
# A row: run(prompts, max_new_tokens) -> BatchDecoded; training, exact, params (its columns); on: the
# model it decodes; ahead: the context room past the known tokens its forwards need; ar: the greedy AR
# outputs its =AR column compares with (None: the AR+cache row's, on --ckpt)
def row(run, training, exact, params=0, on=model, ahead=B, ar=None):
    return dict(run=run, training=training, exact=exact, params=params, on=on, ahead=ahead, ar=ar)


def engine_row(make, training, exact, on=model, **kw):
    """A row for a strategy of the engine (engine.py) on model `on` with per-request caches, a fresh
    strategy per call; a draft model's own forwards and seconds are copied onto the output."""
    def run(prompts, max_new_tokens):
        strategy = make()
        out = Engine(on, prompts, max_new_tokens, strategy, tok.stop_ids, PerRequestCache()).run()
        out.draft_forwards = getattr(strategy, "draft_forwards", 0)
        out.draft_seconds = getattr(strategy, "draft_seconds", 0.0)
        return out
    return row(run, training, exact, on=on, ahead=make().ahead, **kw)


def same_tokenizer(other_tok):
    return (type(other_tok), other_tok.vocab_size) == (type(tok), tok.vocab_size)


def draft_rows(path):
    """The draft-model row from an AR checkpoint (train.py --stage ar): ({name: row}, note or None)."""
    if path == "none":
        return {}, None
    if not os.path.exists(path):
        return {}, f"Draft model: skipped, no {path} (train it: see nanomars/compare/speculative.py)"
    draft, draft_tok, _, ckpt = load_model(path, args.device, args.dtype)
    if not same_tokenizer(draft_tok) or draft.config.vocab_size != model.config.vocab_size:
        return {}, f"Draft model: skipped, {path} was trained with another tokenizer than {args.ckpt}"
    c, steps = draft.config, (ckpt or {}).get("step")
    note = (f"Draft model: {path}, {c.n_layer}-layer, width {c.n_embd}, {draft.num_params():,} parameters"
            f"{f', {steps} steps' if steps else ''}; drafts {DraftModel(draft).k} tokens per target forward")
    return {"Draft model": engine_row(lambda: DraftModel(draft), "draft model", True, params=draft.num_params())}, note


def medusa_rows(path):
    """The Medusa rows from train.py --stage medusa's checkpoint: verified (exact) and with the tau gate
    (exact only at tau 1), on the heads' own base. Returns ({name: row}, note or None)."""
    if path == "none":
        return {}, None
    if not os.path.exists(path):
        return {}, f"Medusa: skipped, no {path} (train the heads: python train.py --stage medusa)"
    medusa, medusa_tok, ckpt = load_medusa(path, args.device)
    if not same_tokenizer(medusa_tok) or medusa.config.vocab_size != model.config.vocab_size:
        return {}, f"Medusa: skipped, {path}'s base uses another tokenizer than {args.ckpt}"
    medusa = medusa.to(args.dtype)
    base = ckpt["args"].get("init_from") or os.path.join(ckpt["args"].get("out_dir", "out"), "ar.pt")
    ar = [r.tokens for r in batch_ar(medusa.base, prompts, args.max_new_tokens, tok.stop_ids).rows]
    info = dict(on=medusa, params=medusa.extra_params(), ar=ar)
    note = (f"Medusa: {path}, {medusa.n_heads} heads ({medusa.extra_params():,} parameters, the lm_head shared), "
            f"{ckpt['step']} steps, on their frozen base {base}: =AR compares with that model's greedy AR")
    return {"Medusa verified": engine_row(lambda: MedusaHeads(medusa), "heads", True, **info),
            "Medusa tree 8/3": engine_row(lambda: MedusaTree(medusa, 8, 3), "heads", True, **info),
            "Medusa tau gate": engine_row(lambda: MedusaGate(medusa, args.tau), "heads", gated, **info)}, note


mars = partial(batch_decode, model, mask_id=tok.mask_id, block_size=B, tau=args.tau, stop_ids=tok.stop_ids)
gated = args.tau == 1  # the exact column of a row with a tau gate: greedy AR at tau 1 only
try:
    peers, notes = {}, []
    for rows_of, path in ((draft_rows, args.draft), (medusa_rows, args.medusa)):
        found, note = rows_of(path)
        peers.update(found)
        notes += [note] if note else []
except (ValueError, FileNotFoundError) as e:
    fail(str(e))
strategies = {
    "AR+cache": row(partial(batch_ar, model, stop_ids=tok.stop_ids), "none", True, ahead=1),
    "MARS no cache": row(partial(mars, cache=None), "stage 2", gated),
    **{f"MARS block {c}": row(partial(mars, cache=BlockCache(c)), "stage 2", gated) for c in args.cache_blocks},
    "MARS per-request": row(partial(mars, cache="request"), "stage 2", gated),
    "Jacobi": row(partial(batch_jacobi, model, window=args.jacobi_window or B, stop_ids=tok.stop_ids), "none", True,
                  ahead=args.jacobi_window or B),
    "Lossless MARS": row(partial(batch_lossless, model, mask_id=tok.mask_id, block_size=B, stop_ids=tok.stop_ids),
                         "stage 2", True),
    **{f"Lossless tree {n}/{k}": engine_row(partial(TreeLossless, tok.mask_id, B, n, k), "stage 2", True)
       for n, k in TREES},
    "Stacked tree 8/3 + lookup": engine_row(partial(StackedTree, tok.mask_id, B, 8, 3), "stage 2", True),
    "Adaptive window": row(partial(mars, cache="request", window=AdaptiveWindow()), "stage 2", gated),
    "Aligned window": row(partial(mars, cache="request", window=AlignedWindow()), "stage 2", gated),
    **{f"Paper block {c}": row(partial(batch_paper_block, model, mask_id=tok.mask_id, cache_block=c, tau=args.tau,
                                       stop_ids=tok.stop_ids), "stage 2", gated, ahead=1) for c in args.paper_blocks},
    "Prompt lookup": engine_row(PromptLookup, "none", True),
    **peers,
}
if args.compile:  # the same rows with the model's forward compiled: their xAR is still against eager AR+cache
    compiled = torch.compile(model, dynamic=True)  # one graph per shape class (batch 1 or more, 1 token or more,
    torch._dynamo.config.recompile_limit = 64  # 1 logit column or more, ...): more than dynamo's default 8
    cmars = partial(batch_decode, compiled, mask_id=tok.mask_id, block_size=B, tau=args.tau, stop_ids=tok.stop_ids)
    strategies.update({
        "AR+cache compiled": row(partial(batch_ar, compiled, stop_ids=tok.stop_ids), "none", True, ahead=1),
        "MARS compiled": row(partial(cmars, cache="request"), "stage 2", gated),
        "Lossless compiled": row(partial(batch_lossless, compiled, mask_id=tok.mask_id, block_size=B,
                                         stop_ids=tok.stop_ids), "stage 2", True)})
for name, r in list(strategies.items()):  # a row that reaches further past the prompt than B may not fit
    try:
        for prompt in prompts:
            check_decode_args(r["on"], prompt, args.max_new_tokens, r["ahead"])
    except ValueError as e:
        notes.append(f"{name}: skipped, {e}")
        del strategies[name]

results = []
t_start = time.perf_counter()
if args.compile:  # compile every graph the timed runs need (batch 1 and 2: prefill, 1 token, a window)
    t0 = time.perf_counter()
    for name in ("AR+cache compiled", "MARS compiled", "Lossless compiled"):
        for n in (1, 2):
            strategies[name]["run"](prompts[:n], 8)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    notes.append(f"Compiled rows: torch.compile(model, dynamic=True), {graphs} graphs in {time.perf_counter() - t0:.0f} s "
                 f"of compiling before the timed runs (not in their wall clock)")
batches = {bs: [list(range(i, min(i + bs, len(prompts)))) for i in range(0, len(prompts), bs)]
           for bs in args.batch_sizes}
progress = Progress(sum(map(len, batches.values())) * len(strategies), "bench")
for bs in args.batch_sizes:
    progress.update(what=f"batch size {bs}")
    for r in strategies.values():  # warm up every path at this shape
        r["run"]([prompts[i] for i in batches[bs][0]], 8)
    tot = {name: dict(rows=[], forwards=0, seconds=0.0, paper_tokens=0, paper_forwards=0, draft_forwards=0,
                      draft_seconds=0.0) for name in strategies}
    for rows in batches[bs]:
        for name, r in strategies.items():
            t0 = time.perf_counter()
            out = r["run"]([prompts[i] for i in rows], args.max_new_tokens)
            t = tot[name]
            t["seconds"] += time.perf_counter() - t0
            t["rows"] += out.rows  # in prompt order: the batches follow the prompts
            t["forwards"] += out.forwards
            if hasattr(out, "paper_tokens"):  # the paper's block sampler: its own count too
                t["paper_tokens"] += sum(out.paper_tokens)
                t["paper_forwards"] += sum(out.paper_forwards)
            t["draft_forwards"] += getattr(out, "draft_forwards", 0)
            t["draft_seconds"] += getattr(out, "draft_seconds", 0.0)
            progress.update(1)
    for name, t in tot.items():
        s, r = score(tok, examples, t["rows"], check), strategies[name]
        ar = r["ar"] or [a.tokens for a in tot["AR+cache"]["rows"]]  # greedy AR's outputs of the row's model
        same = sum(mine.tokens == theirs for mine, theirs in zip(t["rows"], ar)) / len(ar)
        paper = t["paper_tokens"] / t["paper_forwards"] if t["paper_forwards"] else None
        results.append(dict(strategy=name, batch_size=bs, tokens_per_forward=s["tokens_per_forward"],
                            paper_tokens_per_forward=paper, batch_forwards=t["forwards"],
                            tokens_per_s=s["tokens"] / t["seconds"], x_ar=tot["AR+cache"]["seconds"] / t["seconds"],
                            accuracy=s["accuracy"]["all"], same_as_ar=same,
                            extra_params=r["params"], extra_training=r["training"], exact=r["exact"],
                            draft_forwards=t["draft_forwards"], draft_seconds=t["draft_seconds"],
                            tokens=s["tokens"], seconds=t["seconds"]))
    if bs == args.batch_sizes[0]:  # what the answers' lengths allow a verified draft of B-1 tokens
        lengths = [len(a.tokens) for a in tot["AR+cache"]["rows"]]
        ceiling = sum(lengths) / sum(1 + -(-(n - 1) // B) for n in lengths if n)
        notes.append(f"Ceiling: AR's answers here are {sum(lengths) / len(lengths):.1f} tokens on average (up to the "
                     f"stop token); verifying B-1 = {B - 1} drafted tokens per forward (chain or tree, B tokens at most, "
                     f"the first forward with no draft) gives at most {ceiling:.2f} tok/fwd")
progress.close()

print(f"{args.ckpt}: {len(prompts)} prompts from {args.data or 'the held-out suite'}, max_new_tokens {args.max_new_tokens}, block {B}, "
      f"tau {args.tau}, {torch.get_num_threads()} threads, {time.perf_counter() - t_start:.0f} s")
print(TOKENS_PER_FORWARD)
print(f"{'strategy':<20}{'batch':>6}{'tok/fwd':>9}{'paper':>7}{'fwd':>7}{'tok/s':>9}{'xAR':>7}{'acc':>7}{'=AR':>6}"
      f"{'params':>9}  {'training':<12}exact")
for r in results:
    paper = "" if r["paper_tokens_per_forward"] is None else f"{r['paper_tokens_per_forward']:.2f}"
    print(f"{r['strategy']:<20}{r['batch_size']:>6}{r['tokens_per_forward']:>9.2f}{paper:>7}{r['batch_forwards']:>7}"
          f"{r['tokens_per_s']:>9.0f}{r['x_ar']:>7.2f}{r['accuracy']:>7.3f}{r['same_as_ar']:>6.2f}"
          f"{r['extra_params']:>9,}  {r['extra_training']:<12}{'yes' if r['exact'] else 'no'}")
if args.compile:  # a shape the warm-up missed compiles inside a timed run, and its wall clock pays for it
    notes.append(f"Compiled rows: {torch._dynamo.utils.counters['stats']['unique_graphs'] - graphs} graphs compiled "
                 f"during the timed runs")
for bs in args.batch_sizes:  # 1 = each forward costs what an AR step costs; MARS's forward reads B positions
    by = {r["strategy"]: r for r in results if r["batch_size"] == bs}
    eff = [f"{name} {by[name]['x_ar'] / by[name]['tokens_per_forward']:.2f}" for name in ("MARS per-request",
                                                                                    "Lossless MARS") if name in by]
    eff += [f"{name} {by[name]['x_ar'] / by['AR+cache compiled']['x_ar'] / by[name]['tokens_per_forward']:.2f} (against "
            f"compiled AR)" for name in ("MARS compiled", "Lossless compiled") if name in by]
    notes.append(f"Efficiency at batch {bs} (xAR / tok/fwd): " + ", ".join(eff))
for r in results:
    if r["draft_forwards"]:
        notes.append(f"Draft model at batch {r['batch_size']}: {r['draft_forwards']} draft forwards ("
                     f"{r['draft_forwards'] / r['batch_forwards']:.1f} per target forward), {r['draft_seconds']:.2f} "
                     f"s of its {r['seconds']:.2f} s")
print("\n".join(notes))

if args.profile:  # where the time goes: model ops (mm, attention, elementwise) vs the loop's own ops
    from torch.profiler import profile
    bs = max(args.batch_sizes)
    for name in ("AR+cache", "MARS per-request"):
        with profile() as prof:
            for i in range(0, len(prompts), bs):
                strategies[name]["run"](prompts[i:i + bs], args.max_new_tokens)
        print(f"\n{name}, batch {bs}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    # the time between forwards: each step timed whole and in its forward (engine.forward_window), per batch size
    import nanomars.engine as engine_module
    inner, forward_s = engine_module.forward_window, [0.0]

    def timed_forward(*a, **kw):
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        forward_s[0] += time.perf_counter() - t0
        return out
    engine_module.forward_window = timed_forward
    print("\nPer step, ms: the whole step / its forward / the rest, the decode loop's own work (its share)")
    for bs in args.batch_sizes:
        for name in ("AR+cache", "MARS per-request", "Lossless MARS"):
            forward_s[0], forwards, t0 = 0.0, 0, time.perf_counter()
            for i in range(0, len(prompts), bs):
                forwards += strategies[name]["run"](prompts[i:i + bs], args.max_new_tokens).forwards
            step, fwd = (time.perf_counter() - t0) / forwards * 1e3, forward_s[0] / forwards * 1e3
            print(f"batch {bs:>3} {name:<18}{step:7.2f} / {fwd:6.2f} / {step - fwd:5.2f} ({(step - fwd) / step:.0%})")
    engine_module.forward_window = inner
    # what bounds MARS's efficiency (xAR / tok/fwd): a forward that feeds B tokens a row against AR's 1, the
    # model alone (60 cached tokens a row), timed as the engine calls it
    print(f"\nOne forward, model only, ms: 1 token a row (AR) / {B} (MARS) / their ratio")
    with torch.inference_mode():
        for bs in args.batch_sizes:
            calls, ms = {}, {1: float("inf"), B: float("inf")}
            for T in ms:
                cache = KVCache(model.config, bs, 60 + 2 * B, args.device, next(model.parameters()).dtype)
                start, x = torch.full((bs,), 60, device=args.device), torch.zeros(bs, T, dtype=torch.long, device=args.device)
                calls[T] = partial(forward_window, model, x, start, torch.ones_like(start), T, cache)
            for _ in range(20):  # alternating, each one's best of 20 rounds: machine noise hits both alike
                for T, call in calls.items():
                    t0 = time.perf_counter()
                    for _ in range(10):
                        call()
                    ms[T] = min(ms[T], (time.perf_counter() - t0) / 10 * 1e3)
            ms = [ms[1], ms[B]]
            print(f"batch {bs:>3}: {ms[0]:.2f} / {ms[1]:.2f} / {ms[0] / ms[1]:.2f}")

os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
with open(args.out + ".json", "w") as f:
    json.dump(dict(args=vars(args), block_size=B, tokens_per_forward=TOKENS_PER_FORWARD, notes=notes,
                   results=results), f, indent=1, default=str)
import matplotlib
matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5), layout="constrained")
for i, name in enumerate(strategies):
    rs = [r for r in results if r["strategy"] == name]
    style = dict(color=plt.cm.tab20(i % 20), ls="--" if rs[0]["exact"] else "-", label=name)  # dashed: exact
    ax1.plot([r["batch_size"] for r in rs], [r["x_ar"] for r in rs], "o", **style)
    ax2.plot([r["batch_size"] for r in rs], [r["tokens_per_s"] for r in rs], "o", **style)
ax1.set(xscale="log", xlabel="batch size", ylabel="wall-clock speedup vs AR+cache", title=f"tau {args.tau}")
ax2.set(xscale="log", xlabel="batch size", ylabel="tokens / s", title="dashed: exact (greedy AR's output)")
for ax in (ax1, ax2):
    ax.set_xticks(args.batch_sizes, [str(b) for b in args.batch_sizes])
    ax.minorticks_off()
ax1.axhline(1.0, color="gray", lw=0.5)
ax1.plot([4, 8, 16], [1.71, 1.60, 1.34], "k*", ms=10, label="paper Table 5: block cache, 7B GPU, tau 0.95")
fig.legend(*ax1.get_legend_handles_labels(), fontsize=7, loc="outside right upper")
fig.savefig(args.out + ".png", dpi=120)
print(f"wrote {args.out}.json and {args.out}.png")
