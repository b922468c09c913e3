"""
Held-out accuracy per task family, decoded by AR and by MARS at several tau, on the same prompts:
  python -m nanomars.evaluate --ckpt out/mars.pt --taus 1 0.95 0.9 0.7 --ar
"""
import argparse
import time
from collections import defaultdict

import torch

from .checkpoint import load_checkpoint
from .decode import ar_decode, mars_decode
from .tasks import check, held_out_split
from .tokenizer import load_default_tokenizer


def evaluate(model, tok, examples, tau=None, block_size=4, max_new_tokens=64):
    """Decode the user turn of every example (AR when tau is None, else MARS at tau); returns
    {"accuracy": {family: frac, ..., "all": frac}, "tokens_per_forward", "tokens", "forwards", "seconds"}."""
    right, total = defaultdict(int), defaultdict(int)
    tokens = forwards = 0
    t0 = time.perf_counter()
    for ex in examples:
        prompt = tok.prompt_ids([m for m in ex["messages"] if m["role"] != "assistant"])
        if tau is None:
            out = ar_decode(model, prompt, max_new_tokens, stop_ids=tok.stop_ids)
        else:
            out = mars_decode(model, prompt, max_new_tokens, tok.mask_id, block_size, tau, tok.stop_ids)
        answer = tok.decode([t for t in out.tokens if t not in tok.stop_ids])
        for key in (ex["family"], "all"):
            right[key] += check(ex, answer)
            total[key] += 1
        tokens, forwards = tokens + len(out.tokens), forwards + out.forwards
    return {"accuracy": {k: right[k] / total[k] for k in total}, "tokens_per_forward": tokens / forwards,
            "tokens": tokens, "forwards": forwards, "seconds": time.perf_counter() - t0}


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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default="out/mars.pt")
    p.add_argument("--taus", type=float, nargs="*", default=[1.0, 0.95, 0.9, 0.7])
    p.add_argument("--ar", action="store_true", help="also decode with plain greedy AR")
    p.add_argument("--block_size", type=int, default=None, help="default: the checkpoint's training block size")
    p.add_argument("--n_per_family", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(0)
    model, ckpt = load_checkpoint(args.ckpt)
    model.eval()
    tok = load_default_tokenizer()
    block_size = args.block_size or ckpt["args"].get("block_size", 4)
    examples = held_out_split(args.n_per_family)
    rows = {}
    if args.ar:
        rows["AR"] = evaluate(model, tok, examples)
    for tau in args.taus:
        rows[f"MARS t={tau:g}"] = evaluate(model, tok, examples, tau, block_size)
    print(f"{args.ckpt}: {len(examples)} held-out prompts, block_size {block_size}")
    print(format_table(rows))


if __name__ == "__main__":
    main()
