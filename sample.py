"""
Decode with a trained model and SEE which tokens each forward accepted together:
  python sample.py --prompt "Sort these words alphabetically: pear, apple, kiwi" --tau 0.9 --compare_ar
  python sample.py --init_from path/to/Qwen2.5-0.5B-Instruct --device cuda --prompt "..."
Spans are marked with alternating colours on a terminal, [brackets] otherwise (or with --brackets).
"""
import argparse
import sys

import torch

from nanomars.checkpoint import load_checkpoint
from nanomars.decode import ar_decode, mars_decode, show_spans
from nanomars.tokenizer import load_default_tokenizer

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--ckpt", default="out/mars.pt", help="a nanoMARS checkpoint")
p.add_argument("--init_from", default=None, help="a Hugging Face Qwen2.5 / MARS folder instead of --ckpt")
p.add_argument("--prompt", default="Tom has 7 apples and buys 5 more, then gives away 3. How many apples does he have?")
p.add_argument("--tau", type=float, default=0.9)
p.add_argument("--block_size", type=int, default=None, help="default: the checkpoint's training block size, else 4")
p.add_argument("--max_new_tokens", type=int, default=128)
p.add_argument("--compare_ar", action="store_true", help="also decode with greedy AR and show the speedup")
p.add_argument("--no_cache", action="store_true")
p.add_argument("--brackets", action="store_true", help="mark spans with brackets even on a terminal")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else
               "mps" if torch.backends.mps.is_available() else "cpu")
args = p.parse_args()
torch.manual_seed(0)

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
    prompt = tok.prompt_ids(args.prompt)
    out = mars_decode(model, prompt, args.max_new_tokens, tok.mask_id, block_size, args.tau, tok.stop_ids,
                      use_cache=not args.no_cache)
except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")

color = sys.stdout.isatty() and not args.brackets
print(f"prompt: {args.prompt}")
print(f"MARS (tau {args.tau}, block {block_size}): " + show_spans(tok, out.spans, color))
print(f"  {len(out.tokens)} tokens in {out.forwards} forwards = {out.tokens_per_forward:.2f} tokens/forward, "
      f"{out.seconds * 1000:.0f} ms")
if args.compare_ar:
    ar = ar_decode(model, prompt, args.max_new_tokens, tok.stop_ids, use_cache=not args.no_cache)
    print(f"AR: " + show_spans(tok, ar.spans, color))
    print(f"  {len(ar.tokens)} tokens in {ar.forwards} forwards, {ar.seconds * 1000:.0f} ms")
    same = "identical to" if ar.tokens == out.tokens else "DIFFERENT from"
    print(f"MARS vs AR: {ar.forwards / out.forwards:.2f}x fewer forwards, "
          f"{ar.seconds / out.seconds:.2f}x wall clock; MARS output is {same} AR's")
