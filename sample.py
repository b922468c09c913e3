"""
Decode with a trained model and SEE which tokens each forward accepted together:
  python sample.py --compare_ar                                   # default prompt, out/mars.pt
  python sample.py --prompt "Evaluate: not ( True and False )" --prompt "Reverse the string: abc"
  python sample.py --taus 1 0.95 0.7                              # one batch, each row its own tau
  python sample.py --temperature 0.8 --top_k 20 --seed 1          # sampled, reproducible
  python sample.py --ckpt path/to/Qwen2.5-0.5B-Instruct --device cuda --prompt "..."
--ckpt takes a nanoMARS checkpoint or a Hugging Face Qwen2.5 / MARS folder. The prompts are decoded as one
batch by the engine (nanomars/batch_decode.py: per-request KV caches, no row waits for another); one
prompt is a batch of one. Spans are marked with alternating colours on a terminal, [brackets] otherwise
(or with --brackets).
"""
import sys

import torch

from nanomars.batch_decode import batch_ar, batch_decode
from nanomars.decode import show_spans
from nanomars.model import default_device
from nanomars.util.checkpoint import load_model
from nanomars.util.cli import ArgumentParser, device_name, dtype_name, nonneg_float, positive_int, run, tau_float

DEFAULT_PROMPT = "Tom has 7 apples and buys 5 more, then gives away 3. How many apples does he have?"
SHORT = 32  # generated tokens below which fixed costs (the prompt's forward, Python) decide a speed ratio


def per_row_tau(model, tok, prompt, taus, block_size, max_new_tokens, color):
    """One batch, the same prompt in every row, each row with its own tau: the real-time knob."""
    ids = tok.prompt_ids(prompt)
    out = batch_decode(model, [ids] * len(taus), max_new_tokens, tok.mask_id, block_size, taus, tok.stop_ids)
    print(f"prompt: {prompt}")
    for tau, row in zip(taus, out.rows):
        print(f"tau {tau:<5g} {row.tokens_per_forward:.2f} tokens/forward: {show_spans(tok, row.spans, color)}")
    print(f"{out.tokens} tokens, {out.forwards} batch forwards, {out.seconds * 1000:.0f} ms")


def main():
    p = ArgumentParser(__doc__)
    p.add_argument("--ckpt", default="out/mars.pt", help="a nanoMARS checkpoint or a Hugging Face folder")
    p.add_argument("--prompt", action="append", help="a user message; repeat for a batch")
    p.add_argument("--tau", type=tau_float, default=0.9)
    p.add_argument("--taus", type=tau_float, nargs="+", help="decode the first prompt once per tau, in ONE batch")
    p.add_argument("--block_size", type=positive_int, default=None,
                   help="default: the checkpoint's training block size (4 for a Hugging Face folder)")
    p.add_argument("--max_new_tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=nonneg_float, default=0.0, help="0 = greedy")
    p.add_argument("--top_k", type=positive_int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare_ar", action="store_true", help="also decode with greedy AR and show the speedup")
    p.add_argument("--no_cache", action="store_true")
    p.add_argument("--brackets", action="store_true", help="mark spans with brackets even on a terminal")
    p.add_argument("--device", type=device_name, default=default_device())
    p.add_argument("--dtype", type=dtype_name, default="float32", help="float32 (exact: tau 1 == AR) or bfloat16")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    color = sys.stdout.isatty() and not args.brackets
    prompts = args.prompt or [DEFAULT_PROMPT]
    cache = None if args.no_cache else "request"

    model, tok, trained_block, _ = load_model(args.ckpt, args.device, args.dtype)
    block_size = args.block_size or trained_block
    if args.taus:
        return per_row_tau(model, tok, prompts[0], args.taus, block_size, args.max_new_tokens, color)
    ids = [tok.prompt_ids(prompt) for prompt in prompts]
    sampling = dict(temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    mars = lambda n: batch_decode(model, ids, n, tok.mask_id, block_size, args.tau, tok.stop_ids, cache=cache,
                                  **sampling)
    ar = lambda n: batch_ar(model, ids, n, tok.stop_ids, cache, **sampling)
    if args.compare_ar:  # first calls pay for allocations and kernel choice: keep that out of the timing
        mars(4), ar(4)
    out = mars(args.max_new_tokens)
    ar_out = ar(args.max_new_tokens) if args.compare_ar else None

    for i, prompt in enumerate(prompts):
        row = out.rows[i]
        print(f"prompt: {prompt}")
        print(f"MARS (tau {args.tau}, block {block_size}): " + show_spans(tok, row.spans, color))
        print(f"  {len(row.tokens)} tokens in {row.forwards} forwards = {row.tokens_per_forward:.2f} tokens/forward")
        if ar_out:
            print("AR: " + show_spans(tok, ar_out.rows[i].spans, color))
            same = "identical to" if ar_out.rows[i].tokens == row.tokens else "DIFFERENT from"
            print(f"  {len(ar_out.rows[i].tokens)} tokens in {ar_out.rows[i].forwards} forwards; "
                  f"MARS output is {same} AR's")
    print(f"MARS: {out.tokens} tokens, {out.forwards} batch forwards, {out.tokens_per_forward:.2f} tokens/forward, "
          f"{out.seconds * 1000:.0f} ms")
    if ar_out:
        print(f"AR:   {ar_out.tokens} tokens, {ar_out.forwards} batch forwards, {ar_out.seconds * 1000:.0f} ms")
        print(f"MARS vs AR: {ar_out.forwards / out.forwards:.2f}x fewer forwards, "
              f"{ar_out.seconds / out.seconds:.2f}x wall clock (both warmed up)")
        if ar_out.tokens / len(prompts) < SHORT:
            print(f"  note: {ar_out.tokens / len(prompts):.0f} tokens per answer is too short for the wall-clock "
                  "ratio to mean much (fixed costs and timer noise decide it); python tools/bench.py measures speed "
                  "over 210 prompts")


if __name__ == "__main__":
    run(main)
