"""
Decode with a trained model and SEE which tokens each forward accepted together:
  python sample.py --compare_ar                                   # default prompt, out/mars.pt
  python sample.py --prompt "Evaluate: not ( True and False )" --prompt "Reverse the string: abc"
  python sample.py --taus 1 0.95 0.7                              # one batch, each row its own tau
  python sample.py --temperature 0.8 --top_k 20 --seed 1          # sampled, reproducible
  python sample.py --init_from path/to/Qwen2.5-0.5B-Instruct --device cuda --prompt "..."
Several --prompt flags decode together as one batch (per-request KV caches: no row waits for another).
Spans are marked with alternating colours on a terminal, [brackets] otherwise (or with --brackets).
"""
import argparse
import sys

import torch

from nanomars.batch_decode import batch_ar, batch_decode, per_row_tau_demo
from nanomars.checkpoint import load_checkpoint
from nanomars.model import default_device
from nanomars.decode import show_spans
from nanomars.tokenizer import load_default_tokenizer

DEFAULT_PROMPT = "Tom has 7 apples and buys 5 more, then gives away 3. How many apples does he have?"
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--ckpt", default="out/mars.pt", help="a nanoMARS checkpoint")
p.add_argument("--init_from", default=None, help="a Hugging Face Qwen2.5 / MARS folder instead of --ckpt")
p.add_argument("--prompt", action="append", help="a user message; repeat for a batch")
p.add_argument("--tau", type=float, default=0.9)
p.add_argument("--taus", type=float, nargs="+", help="decode the first prompt once per tau, in ONE batch")
p.add_argument("--block_size", type=int, default=None, help="default: the checkpoint's training block size, else 4")
p.add_argument("--max_new_tokens", type=int, default=128)
p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
p.add_argument("--top_k", type=int, default=None)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--compare_ar", action="store_true", help="also decode with greedy AR and show the speedup")
p.add_argument("--no_cache", action="store_true")
p.add_argument("--brackets", action="store_true", help="mark spans with brackets even on a terminal")
p.add_argument("--device", default=default_device())
args = p.parse_args()
torch.manual_seed(args.seed)
color = sys.stdout.isatty() and not args.brackets
prompts = args.prompt or [DEFAULT_PROMPT]
cache = None if args.no_cache else "request"

try:
    if args.init_from:
        from nanomars.qwen import load_qwen
        model, tok = load_qwen(args.init_from, device=args.device)
        block_size = args.block_size or 4
    else:
        model, ckpt = load_checkpoint(args.ckpt, args.device)
        tok = load_default_tokenizer()
        block_size = args.block_size or ckpt["args"].get("block_size", 4)
    model.eval()
    if args.taus:
        print(per_row_tau_demo(model, tok, prompts[0], args.taus, block_size, args.max_new_tokens, color))
        sys.exit(0)
    ids = [tok.prompt_ids(prompt) for prompt in prompts]
    sampling = dict(temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    out = batch_decode(model, ids, args.max_new_tokens, tok.mask_id, block_size, args.tau, tok.stop_ids,
                       cache=cache, **sampling)
    ar = batch_ar(model, ids, args.max_new_tokens, tok.stop_ids, cache, **sampling) if args.compare_ar else None
except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")

for i, prompt in enumerate(prompts):
    row = out.rows[i]
    print(f"prompt: {prompt}")
    print(f"MARS (tau {args.tau}, block {block_size}): " + show_spans(tok, row.spans, color))
    print(f"  {len(row.tokens)} tokens in {row.forwards} forwards = {row.tokens_per_forward:.2f} tokens/forward")
    if ar:
        print("AR: " + show_spans(tok, ar.rows[i].spans, color))
        same = "identical to" if ar.rows[i].tokens == row.tokens else "DIFFERENT from"
        print(f"  {len(ar.rows[i].tokens)} tokens in {ar.rows[i].forwards} forwards; MARS output is {same} AR's")
print(f"MARS: {out.tokens} tokens, {out.forwards} batch forwards, {out.tokens_per_forward:.2f} tokens/forward, "
      f"{out.seconds * 1000:.0f} ms")
if ar:
    print(f"AR:   {ar.tokens} tokens, {ar.forwards} batch forwards, {ar.seconds * 1000:.0f} ms")
    print(f"MARS vs AR: {ar.forwards / out.forwards:.2f}x fewer forwards, {ar.seconds / out.seconds:.2f}x wall clock")
