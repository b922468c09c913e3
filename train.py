"""
Train nanoMARS in two stages (docs/mars.md explains the method):
  python train.py --stage ar      # stage 1: AR-SFT from scratch (or --init_from a Qwen2.5 folder)
  python train.py --stage mars    # stage 2: MARS dual-track fine-tuning, starting from stage 1
Checkpoints: out/ar.pt and out/mars.pt (self-describing, atomic); --resume continues a stage.
With --init_from <Hugging Face folder> the run also writes out/<stage>_hf/, loadable by transformers.
Several GPUs: torchrun --standalone --nproc_per_node=N train.py ... (DistributedDataParallel).
"""
import contextlib
import hashlib
import math
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from nanomars.checkpoint import load_model, save_checkpoint
from nanomars.cli import ArgumentParser, device_name, fail, nonneg_float, nonneg_int, positive_float, positive_int
from nanomars.dual_track import ar_loss, collate, dual_track_loss, random_offsets
from nanomars.model import Config, Decoder, default_device
from nanomars.tasks import read_jsonl, held_out_split, train_examples
from nanomars.tokenizer import load_default_tokenizer

p = ArgumentParser(__doc__)
p.add_argument("--stage", choices=["ar", "mars"], default="ar")
p.add_argument("--out_dir", default="out")
p.add_argument("--init_from", default=None, help="stage ar: 'scratch' (default) or a Hugging Face folder; "
               "stage mars: a .pt checkpoint (default out_dir/ar.pt) or a Hugging Face folder")
p.add_argument("--resume", action="store_true", help="continue this stage from out_dir/<stage>.pt")
p.add_argument("--data", default=None, help="a JSONL of {'messages': [...]} (default: the built-in task suite)")
p.add_argument("--n_train", type=positive_int, default=20000, help="examples drawn from the built-in suite")
p.add_argument("--max_len", type=positive_int, default=None, help="examples longer than this are dropped "
               "(default: 512, or the model's context if shorter)")
# the method
p.add_argument("--block_size", type=positive_int, default=4)
p.add_argument("--alpha", type=nonneg_float, default=1.0, help="weight of the clean-stream (AR) loss; 0 = no SFT loss")
p.add_argument("--bidirectional", action="store_true", help="block-diffusion mask (the paper's BD3LM ablation)")
p.add_argument("--random_offsets", action="store_true",
               help="stage mars: shift each example's blocks by a random offset in [0, block_size), drawn per "
               "example per step from the seeded batch generator, so the known context of a noisy prediction "
               "ends anywhere, as at decode time, not only at multiples of block_size (held-out loss stays at "
               "offset 0)")
# optimisation
p.add_argument("--max_iters", type=positive_int, default=1200)
p.add_argument("--batch_size", type=positive_int, default=32)
p.add_argument("--grad_accum", type=positive_int, default=1)
p.add_argument("--lr", type=positive_float, default=None, help="default: 2e-3 (ar) / 1e-3 (mars) from scratch; 5e-6 (the paper's) for Qwen2.5")
p.add_argument("--warmup", type=nonneg_int, default=20)
p.add_argument("--weight_decay", type=nonneg_float, default=0.01)
p.add_argument("--grad_clip", type=positive_float, default=1.0)
p.add_argument("--eval_interval", type=positive_int, default=200)
p.add_argument("--eval_batches", type=positive_int, default=4)
# model shape, used only from scratch
p.add_argument("--n_layer", type=positive_int, default=4)
p.add_argument("--n_embd", type=positive_int, default=128)
p.add_argument("--n_head", type=positive_int, default=4)
p.add_argument("--n_kv_head", type=positive_int, default=2)
p.add_argument("--intermediate_size", type=positive_int, default=352)
# system
p.add_argument("--device", type=device_name, default=default_device())
p.add_argument("--grad_checkpointing", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--seed", type=nonneg_int, default=1337)
args = p.parse_args()
if args.random_offsets and args.stage != "mars":
    p.error("--random_offsets is for --stage mars (stage ar has no blocks)")

# -------------------------------------------------------------------------------------------- setup
ddp = "RANK" in os.environ  # launched by torchrun
if ddp:
    dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device.startswith("cuda"):
        args.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(args.device)
else:
    rank, world = 0, 1
master = rank == 0
torch.manual_seed(args.seed + rank)
device_type = "cuda" if args.device.startswith("cuda") else "cpu"
autocast = (torch.autocast(device_type, dtype=torch.bfloat16) if device_type == "cuda"
            else contextlib.nullcontext())
os.makedirs(args.out_dir, exist_ok=True)
ckpt_path = os.path.join(args.out_dir, f"{args.stage}.pt")


# ---------------------------------------------------------------------------------- model + tokenizer
init_from = args.init_from or ("scratch" if args.stage == "ar" else os.path.join(args.out_dir, "ar.pt"))


def load_model_and_tokenizer():
    """Returns (model, tokenizer, hf_folder or None, step, optimizer state or None)."""
    if init_from == "scratch" and not args.resume:
        tok = load_default_tokenizer()
        model = Decoder(Config(vocab_size=tok.vocab_size, n_layer=args.n_layer, n_embd=args.n_embd,
                               n_head=args.n_head, n_kv_head=args.n_kv_head,
                               intermediate_size=args.intermediate_size, max_seq_len=args.max_len or 512))
        model.init_weights()
        return model, tok, None, 0, None
    # resume this stage, or start from a checkpoint (stage 2 from stage 1) or a Hugging Face folder;
    # float32 master weights whatever the file holds
    model, tok, _, ckpt = load_model(ckpt_path if args.resume else init_from, args.device, torch.float32)
    if ckpt is None:
        return model, tok, init_from, 0, None
    hf_folder = ckpt["args"].get("hf_folder")
    return (model, tok, hf_folder, ckpt["step"], ckpt["optimizer"]) if args.resume else (model, tok, hf_folder, 0, None)


try:
    model, tok, hf_folder, step, opt_state = load_model_and_tokenizer()
except (ValueError, FileNotFoundError) as e:
    fail(str(e))
if args.max_len is None:
    args.max_len = min(512, model.config.max_seq_len)
elif args.max_len > model.config.max_seq_len:
    fail(f"--max_len {args.max_len} is longer than the model's context of {model.config.max_seq_len} tokens")
args.lr = args.lr or (5e-6 if hf_folder else 2e-3 if args.stage == "ar" else 1e-3)
model = model.to(args.device)
model.grad_checkpointing = args.grad_checkpointing
if master:
    print(f"stage {args.stage}: {model.num_params() / 1e6:.2f}M parameters from {init_from}, "
          f"block_size {args.block_size}, alpha {args.alpha}, device {args.device}, world {world}")

# ------------------------------------------------------------------------------------------- data
def render(examples):
    rendered = [tok.render(ex["messages"]) for ex in examples]
    return [r for r in rendered if len(r[0]) + args.block_size <= args.max_len]


if args.data:
    try:
        train_set = render(read_jsonl(args.data))
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    if len(train_set) < 2:
        fail(f"{args.data}: {len(train_set)} example(s) fit --max_len {args.max_len} (+ block_size): need at "
             "least 2, one held out for the loss curve and one to train on")
    random.Random(args.seed).shuffle(train_set)
    n_val = max(1, len(train_set) // 50)  # hold out 2% of the user's data for the loss curve
    val_set, train_set = train_set[:n_val], train_set[n_val:]
else:
    train_set = render(train_examples(args.n_train, seed=args.seed))
    val_set = render(held_out_split())
if not train_set or not val_set:
    fail(f"no {'training' if not train_set else 'held-out'} example fits --max_len {args.max_len} "
         f"(+ block_size {args.block_size}): raise --max_len")


def get_batch(data, gen, shift=False):
    """(x, response, targets, offsets); offsets (--random_offsets, training batches only) or None."""
    idx = torch.randint(len(data), (args.batch_size,), generator=gen)
    offsets = random_offsets(args.batch_size, args.block_size, gen) if shift else None
    return (*collate([data[i] for i in idx], args.block_size, tok.eos_id, args.device, offsets), offsets)


def compute_loss(model, batch):
    """Returns (loss, {name: value}) for this stage."""
    x, response, targets, offsets = batch
    with autocast:
        if args.stage == "ar":
            loss = ar_loss(model, x, targets)
            return loss, {"ar": loss.item()}
        loss, noisy, clean = dual_track_loss(model, x, response, targets, args.block_size, tok.mask_id,
                                             args.alpha, args.bidirectional, offsets)
    return loss, {"noisy": noisy.item(), "clean": clean.item()}


@torch.no_grad()
def evaluate():
    model.eval()
    gen = torch.Generator().manual_seed(0)  # the same held-out batches every time
    totals = {}
    for _ in range(args.eval_batches):
        for k, v in compute_loss(raw_model, get_batch(val_set, gen))[1].items():
            totals[k] = totals.get(k, 0.0) + v / args.eval_batches
    model.train()
    return totals


def lr_at(it):  # linear warmup, then cosine decay to 10%
    if it < args.warmup:
        return args.lr * (it + 1) / args.warmup
    frac = (it - args.warmup) / max(1, args.max_iters - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))


# ------------------------------------------------------------------------------------------- train
optimizer = model.configure_optimizer(args.lr, args.weight_decay)
if opt_state:
    optimizer.load_state_dict(opt_state)
raw_model = model
if args.compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model)
ckpt_args = {**vars(args), "hf_folder": hf_folder}


def save():
    save_checkpoint(ckpt_path, raw_model, optimizer, step, ckpt_args)
    if hf_folder:
        from nanomars.qwen import save_qwen
        save_qwen(raw_model, os.path.join(args.out_dir, f"{args.stage}_hf"), source_folder=hf_folder)


gen = torch.Generator().manual_seed(args.seed * 1000 + rank + step)  # each rank draws its own batches
model.train()
t0, start_step = time.perf_counter(), step
while step < args.max_iters:
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step)
    for micro in range(args.grad_accum):
        # DDP: all-reduce gradients only on the last micro-step
        sync = contextlib.nullcontext() if not ddp or micro == args.grad_accum - 1 else model.no_sync()
        with sync:
            loss, parts = compute_loss(model, get_batch(train_set, gen, args.random_offsets))
            (loss / args.grad_accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    if master and (step % 10 == 0 or step == 1):
        dt = (time.perf_counter() - t0) / (step - start_step)
        print(f"step {step:5d} | loss {loss.item():.4f} | " +
              " | ".join(f"{k} {v:.4f}" for k, v in parts.items()) + f" | lr {lr_at(step - 1):.2e} | {dt:.3f} s/step")
    if step % args.eval_interval == 0 or step == args.max_iters:
        if master:
            print(f"eval  {step:5d} | held-out " + " | ".join(f"{k} {v:.4f}" for k, v in evaluate().items()))
            save()
if master:
    print(f"done: {step - start_step} steps in {time.perf_counter() - t0:.1f} s -> {ckpt_path}")
if ddp:  # every rank must hold the same weights: DDP averaged the same gradients into each
    weights = b"".join(p.detach().float().cpu().numpy().tobytes() for p in raw_model.parameters())
    print(f"rank {rank}: weights sha256 {hashlib.sha256(weights).hexdigest()[:16]}")
    dist.destroy_process_group()
