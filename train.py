"""
Trains a MARS model in two stages (docs/mars.md explains the method):
  python train.py --stage ar      # stage 1: AR-SFT from scratch (or --init_from a Qwen2.5 folder)
  python train.py --stage mars    # stage 2: MARS dual-track fine-tuning, starting from stage 1
  python train.py --config config/qwen05_ar.py --data sft.jsonl   # a preset: the paper's recipe
The knobs are flags, all in one place with their defaults and ranges (nanomars/util/train_args.py, or
python train.py --help); the ones a student changes: --block_size and --alpha (the method), --max_iters,
--batch_size and --lr (the run), --n_layer and --n_embd (the model). --stage and --objective also name
the baselines and peers that nanomars/compare/ registers (dual_track.OBJECTIVES).
Checkpoints: out/ar.pt and out/mars.pt (self-describing, atomic); --resume continues a stage.
With --init_from <Hugging Face folder> the run also writes out/<stage>_hf/, loadable by transformers.
Several GPUs: torchrun --standalone --nproc_per_node=N train.py ... keeps a full replica per GPU; add --fsdp to
shard weights, gradients and AdamW state across them (checkpoints in out/<stage>_dcp/, the last one also
exported as out/<stage>.pt and out/<stage>_hf/). How: nanomars/scale/distributed.py.
"""
import contextlib
import math
import os
import random
import time

import torch

import nanomars.compare  # noqa: F401  (registers the comparisons' objectives and stages)
from nanomars.dual_track import OBJECTIVES, STARTS, collate, random_offsets
from nanomars.model import Config, Decoder
from nanomars.scale.distributed import (close_distributed, distribute, gradient_sync, init_distributed, load_resume,
                                        mean_over_ranks, save)
from nanomars.util.checkpoint import load_model
from nanomars.util.cli import fail
from nanomars.util.tasks import held_out_split, read_jsonl, train_examples
from nanomars.util.tokenizer import load_default_tokenizer
from nanomars.util.train_args import parse_args

args = parse_args(doc=__doc__)  # every flag, and --config presets: nanomars/util/train_args.py

# -------------------------------------------------------------------------------------------- setup
rank, world, args.device = init_distributed(args.device, args.fsdp, args.dist_timeout)  # torchrun: a GPU each
master = rank == 0
torch.manual_seed(args.seed)  # the same initial weights on every rank (FSDP shards them, nothing broadcasts)
device_type = "cuda" if args.device.startswith("cuda") else "cpu"
autocast = torch.autocast(device_type, dtype=torch.bfloat16) if device_type == "cuda" else contextlib.nullcontext()
os.makedirs(args.out_dir, exist_ok=True)

# ---------------------------------------------------------------------------------- model + tokenizer
init_from = args.init_from or ("scratch" if args.stage == "ar" else os.path.join(args.out_dir, "ar.pt"))

def load_start():
    """(model, tokenizer, hf_folder or None, step, what restore loads or None): where this run starts."""
    if args.stage in STARTS:  # a stage that builds its own model (a comparison's: dual_track.STARTS)
        return STARTS[args.stage](args, init_from)
    if args.resume:  # this stage's own checkpoint: weights, step and AdamW state
        return load_resume(args.out_dir, args.stage, args.fsdp, args.device)
    if init_from == "scratch":
        tok = load_default_tokenizer()
        model = Decoder(Config(vocab_size=tok.vocab_size, n_layer=args.n_layer, n_embd=args.n_embd,
                               n_head=args.n_head, n_kv_head=args.n_kv_head,
                               intermediate_size=args.intermediate_size, max_seq_len=args.max_len or 512))
        model.init_weights()
        return model, tok, None, 0, None
    # stage 2 from stage 1, or a Hugging Face folder: float32 weights (--fsdp: on the CPU, sharding moves them)
    model, tok, _, ckpt = load_model(init_from, "cpu" if args.fsdp else args.device, torch.float32)
    return model, tok, init_from if ckpt is None else ckpt["args"].get("hf_folder"), 0, None

try:
    model, tok, hf_folder, step, saved = load_start()
except (ValueError, FileNotFoundError) as e:
    fail(str(e))
if args.max_len is None:
    args.max_len = min(512, model.config.max_seq_len)
elif args.max_len > model.config.max_seq_len:
    fail(f"--max_len {args.max_len} is longer than the model's context of {model.config.max_seq_len} tokens")
args.lr = args.lr or (5e-6 if hf_folder else 2e-3 if args.stage == "ar" else 1e-3)
model.grad_checkpointing = args.grad_checkpointing

# ---------------------------------------------------------------------------------------- objective
# what this run trains, looked up by name: stage ar and each comparison's stage by the stage, stage mars by
# its --objective; objective(model, x, response, targets, offsets, gen) -> (loss, {name: detached loss})
task, objective = OBJECTIVES[args.objective if args.stage == "mars" else args.stage](args, tok.mask_id)
if master:
    start = f"resumed at step {step}" if args.resume else f"from {init_from}"
    print(f"stage {args.stage}: {task}; {model.num_params() / 1e6:.2f}M parameters {start}, device {args.device}, "
          f"world {world}" + (" (FSDP)" if args.fsdp else ""))

# ------------------------------------------------------------------------------------------- data
def render(examples):
    rendered = [tok.render(ex["messages"], last_turn_only=args.last_turn_only) for ex in examples]
    return [r for r in rendered if len(r[0]) + args.block_size <= args.max_len]

if args.data:
    try:
        train_set = render(read_jsonl(args.data))
    except (ValueError, OSError) as e:
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

global_batch = args.batch_size * args.grad_accum * world
if args.epochs:
    if len(train_set) < global_batch:
        fail(f"--epochs: {len(train_set)} training examples make no batch of {global_batch}: lower --batch_size")
    schedule_iters = args.epochs * (len(train_set) // global_batch)  # the lr schedule spans all epochs
    args.max_iters = min(args.max_iters or schedule_iters, schedule_iters)
else:
    schedule_iters = args.max_iters = args.max_iters or 1200

def batches(gen):
    """The global batch of each optimizer step, one per next(): batch_size x grad_accum x world example indices
    (and block offsets with --random_offsets), drawn alike on every rank from one seeded stream, with replacement
    or with --epochs the next slice of the epoch's shuffled order. Micro-step m of rank r trains on slice
    m * world + r, so 2 processes x 1 micro-step train as 1 process x 2 micro-steps (tests/test_fsdp.py)."""
    epoch_order = torch.zeros(0, dtype=torch.long)  # --epochs: the examples this epoch has not trained on yet
    while True:
        if args.epochs:
            if len(epoch_order) < global_batch:
                epoch_order = torch.randperm(len(train_set), generator=gen)
            idx, epoch_order = epoch_order[:global_batch], epoch_order[global_batch:]
        else:
            idx = torch.randint(len(train_set), (global_batch,), generator=gen)
        yield idx, random_offsets(global_batch, args.block_size, gen) if args.random_offsets else None

def make_batch(data, idx, offsets=None):
    """(x, response, targets, offsets) for the examples data[idx], on the device."""
    tensors = collate([data[i] for i in idx], args.block_size, tok.eos_id, "cpu", offsets, args.pad_targets)
    if device_type == "cuda":  # from pinned memory the copy runs asynchronously, overlapping the GPU's work
        tensors = [t.pin_memory() for t in tensors]
    return (*(t.to(args.device, non_blocking=True) for t in tensors), offsets)

# The run's random streams, each from its own seed so that none replays another's numbers: the batches (which
# examples, which block offsets) from seed x 1000, and what an objective draws at random (bd3lm's times and hidden
# tokens, no_sft_released's weights) from seed x 7919 + draw, draw = 1 + the micro-step's index over steps,
# micro-steps and ranks (0: the held-out loss), so a resumed run draws the same. The multipliers mean nothing
# beyond keeping the seeds apart (7919 is a prime); changing them would change every run's numbers.
def compute_loss(model, batch, draw=0):
    """(loss, {name: detached loss}), tensors: .item() would make the CPU wait for the GPU every micro-step."""
    gen = torch.Generator(batch[0].device).manual_seed(args.seed * 7919 + draw)
    with autocast:
        return objective(model, *batch, gen)

# ------------------------------------------------------------------------------------------- train
# raw_model: the model itself on this rank (sharded in place under FSDP); model: what the loop calls (DDP under
# torchrun without --fsdp; --compile); AdamW, with its state (and under FSDP the weights) restored on --resume
raw_model, model, optimizer = distribute(model, args, saved)
ckpt_args = {**vars(args), "hf_folder": hf_folder}

@torch.no_grad()
def evaluate():  # every rank runs it: FSDP needs all ranks for its all-gathers (under DDP the others only wait)
    model.eval()
    gen = torch.Generator().manual_seed(0)  # the same held-out batches every time
    totals = {}
    for _ in range(args.eval_batches):
        batch = make_batch(val_set, torch.randint(len(val_set), (args.batch_size,), generator=gen))
        for k, v in compute_loss(raw_model, batch)[1].items():
            totals[k] = totals.get(k, 0.0) + v.item() / args.eval_batches
    model.train()
    return totals

def lr_at(it):  # linear warmup, then cosine decay to min_lr_ratio * lr
    if it < args.warmup:
        return args.lr * (it + 1) / args.warmup
    frac = (it - args.warmup) / max(1, schedule_iters - args.warmup)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

stream = batches(torch.Generator().manual_seed(args.seed * 1000))  # the same on every rank
for _ in range(step):  # resuming: skip the batches already trained on, so the run continues exactly
    next(stream)
model.train()
t0, start_step = time.perf_counter(), step
while step < args.max_iters:
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step)
    idx, offsets = next(stream)
    logged = {}
    for micro in range(args.grad_accum):
        rows = slice((micro * world + rank) * args.batch_size, (micro * world + rank + 1) * args.batch_size)
        batch = make_batch(train_set, idx[rows], None if offsets is None else offsets[rows])
        with gradient_sync(model, micro == args.grad_accum - 1):  # DDP: all-reduce on the last micro-step only
            loss, parts = compute_loss(model, batch, (step * args.grad_accum + micro) * world + rank + 1)
            (loss / args.grad_accum).backward()
        for k, v in {"loss": loss.detach(), **parts}.items():
            logged[k] = logged.get(k, 0.0) + v / args.grad_accum
    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), args.grad_clip)  # FSDP: the global norm (DTensors)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    if step % args.log_interval == 0 or step == 1:
        means = mean_over_ranks(torch.stack(list(logged.values())))  # averaged over micro-steps and ranks
        if master:
            dt = (time.perf_counter() - t0) / (step - start_step)
            print(f"step {step:5d} | " + " | ".join(f"{k} {v:.4f}" for k, v in zip(logged, means.tolist()))
                  + f" | lr {lr_at(step - 1):.2e} | {dt:.3f} s/step")
    if step % args.eval_interval == 0 or step == args.max_iters:
        held_out = evaluate()
        if master:
            print(f"eval  {step:5d} | held-out " + " | ".join(f"{k} {v:.4f}" for k, v in held_out.items()))
        save(raw_model, optimizer, step, ckpt_args, final=step == args.max_iters)
if master:
    print(f"done: {step - start_step} steps in {time.perf_counter() - t0:.1f} s -> {args.out_dir}/{args.stage}.pt")
close_distributed(model)  # torchrun: each rank (DDP: after printing a digest of its weights) ends here
