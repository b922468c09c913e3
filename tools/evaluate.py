"""
Held-out accuracy per task family, decoded by AR and by MARS at several tau, on the same prompts:
  python tools/evaluate.py --ckpt out/mars.pt --taus 1 0.95 0.9 0.7 --ar
On a Hugging Face folder (a Qwen2.5 or a released MARS checkpoint, with its own tokenizer) and your data:
  python tools/evaluate.py --ckpt path/to/folder --data my.jsonl --check my_checks.py:is_right --device cuda
evaluate() is also what the notebooks call.
"""
import os
import sys
import time

import torch


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as python tools/evaluate.py

from nanomars.batch_decode import batch_ar, batch_decode
from nanomars.util.checkpoint import load_model
from nanomars.util.cli import ArgumentParser, device_name, dtype_name, positive_int, run, tau_float
from nanomars.util.progress import Progress
from nanomars.util.tasks import check, held_out_split, load_checker, prompt_messages, read_jsonl, score


def evaluate(model, tok, examples, tau=None, block_size=4, max_new_tokens=64, checker=check, progress=None,
             **options):
    """Decode the user turn of every example, one prompt at a time: plain AR when tau is None
    (batch_ar), else MARS at tau (batch_decode); returns {"accuracy": {family: frac, ..., "all": frac},
    "tokens_per_forward", "tokens", "forwards", "seconds"}.
    checker(example, response) -> bool (default: the suite's checkers, exact match for other examples).
    progress: a nanomars.util.progress.Progress, advanced by one per example.
    options: the decoder's own (batch_decode's cache, window, align, adaptive, metric; batch_ar's cache)."""
    rows = []
    t0 = time.perf_counter()
    for ex in examples:
        prompt = [tok.prompt_ids(prompt_messages(ex))]  # the conversation up to the reply that is checked
        if tau is None:
            out = batch_ar(model, prompt, max_new_tokens, tok.stop_ids, **options)
        else:
            out = batch_decode(model, prompt, max_new_tokens, tok.mask_id, block_size, tau, tok.stop_ids, **options)
        rows.append(out.rows[0])
        if progress:
            progress.update(1)
    seconds = time.perf_counter() - t0
    return {**score(tok, examples, rows, checker), "seconds": seconds}


def format_table(rows):
    """rows: {label: result of evaluate()} -> a text table, one column per family."""
    families = sorted(next(iter(rows.values()))["accuracy"], key=lambda f: (f == "all", f))  # "all" last
    head = f"{'decoder':<12}" + "".join(f"{f[:10]:>11}" for f in families) + f"{'tok/fwd':>9}{'seconds':>9}"
    lines = [head]
    for label, r in rows.items():
        lines.append(f"{label:<12}" + "".join(f"{r['accuracy'][f]:>11.3f}" for f in families) +
                     f"{r['tokens_per_forward']:>9.2f}{r['seconds']:>9.1f}")
    return "\n".join(lines)


def main():
    p = ArgumentParser(__doc__)
    p.add_argument("--ckpt", default="out/mars.pt", help="a nanoMARS checkpoint or a Hugging Face folder")
    p.add_argument("--taus", type=tau_float, nargs="*", default=[1.0, 0.95, 0.9, 0.7])
    p.add_argument("--ar", action="store_true", help="also decode with plain greedy AR")
    p.add_argument("--block_size", type=positive_int, default=None, help="default: the checkpoint's training block size")
    p.add_argument("--n_per_family", type=positive_int, default=50, help="held-out prompts per task family (at most 50)")
    p.add_argument("--data", default=None, help="a JSONL of {'messages': [...]} to evaluate instead of the held-out "
                   "suite: the model answers the conversation up to its last assistant message, the reference")
    p.add_argument("--check", default="suite", help="how an answer is judged: 'suite' (the suite's checkers; exact "
                   "match with the reference for other data) or FILE.py:FUNCTION / MODULE:FUNCTION, a function "
                   "(example dict, response str) -> bool")
    p.add_argument("--max_new_tokens", type=positive_int, default=64)
    p.add_argument("--device", type=device_name, default="cpu")
    p.add_argument("--dtype", type=dtype_name, default="float32", help="float32 (exact: tau 1 == AR) or bfloat16")
    args = p.parse_args()
    if not args.ar and not args.taus:
        p.error("nothing to evaluate: give --ar and/or --taus")
    torch.manual_seed(0)
    checker = load_checker(args.check)
    model, tok, trained_block, _ = load_model(args.ckpt, args.device, args.dtype)
    block_size = args.block_size or trained_block
    examples = read_jsonl(args.data) if args.data else held_out_split(args.n_per_family)
    decoders = {"AR": None} if args.ar else {}
    decoders.update({f"MARS t={tau:g}": tau for tau in args.taus})
    progress = Progress(len(decoders) * len(examples), "evaluate")
    rows = {}
    for label, tau in decoders.items():
        progress.update(what=label)
        rows[label] = evaluate(model, tok, examples, tau, block_size, args.max_new_tokens, checker, progress)
    progress.close()
    print(f"{args.ckpt}: {len(examples)} prompts from {args.data or 'the held-out suite'}, block_size {block_size}")
    print(format_table(rows))


if __name__ == "__main__":
    run(main)
