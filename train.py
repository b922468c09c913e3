"""
Train nanoMARS in two stages (docs/mars.md explains the method):
  python train.py --stage ar      # stage 1: AR-SFT from scratch (or --init_from a Qwen2.5 folder)
  python train.py --stage mars    # stage 2: MARS dual-track fine-tuning, starting from stage 1
  python train.py --config config/qwen05_ar.py --data sft.jsonl   # a preset: the paper's recipe
Checkpoints: out/ar.pt and out/mars.pt (self-describing, atomic); --resume continues a stage.
With --init_from <Hugging Face folder> the run also writes out/<stage>_hf/, loadable by transformers.
Several GPUs: torchrun --standalone --nproc_per_node=N train.py ... (DistributedDataParallel, a full replica
per GPU); add --fsdp to shard weights, gradients and AdamW state across the GPUs instead (FSDP2, for models
that do not fit one GPU): checkpoints go to out/<stage>_dcp/ (sharded, resumable with --resume --fsdp) and the
last one is also exported as out/<stage>.pt (and out/<stage>_hf/).
"""
import contextlib
import hashlib
import math
import os
import random
import time
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from nanomars.checkpoint import load_model, save_checkpoint
from nanomars.cli import fail
from nanomars.block_diffusion import block_diffusion_loss
from nanomars.dual_track import ar_loss, collate, diffusion_times, dual_track_loss, random_offsets
from nanomars.model import Config, Decoder
from nanomars.tasks import read_jsonl, held_out_split, train_examples
from nanomars.tokenizer import load_default_tokenizer
from nanomars.train_args import parse_args

args = parse_args(doc=__doc__)  # every flag, and --config presets: nanomars/train_args.py

# -------------------------------------------------------------------------------------------- setup
distributed = "RANK" in os.environ  # launched by torchrun
if args.fsdp and not distributed:
    fail("--fsdp shards across the processes torchrun starts: torchrun --standalone --nproc_per_node=N "
         "train.py --fsdp ...")
if distributed:
    # the timeout bounds every wait inside a collective, e.g. the other ranks' while rank 0 writes a file
    dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo",
                            timeout=timedelta(minutes=args.dist_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device.startswith("cuda"):
        args.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(args.device)
else:
    rank, world = 0, 1
master = rank == 0
torch.manual_seed(args.seed)  # the same initial weights on every rank (FSDP shards them, nothing broadcasts)
device_type = "cuda" if args.device.startswith("cuda") else "cpu"
autocast = (torch.autocast(device_type, dtype=torch.bfloat16) if device_type == "cuda"
            else contextlib.nullcontext())
os.makedirs(args.out_dir, exist_ok=True)
ckpt_path = os.path.join(args.out_dir, f"{args.stage}.pt")
dcp_dir = os.path.join(args.out_dir, f"{args.stage}_dcp")  # --fsdp's sharded checkpoints
if args.fsdp:
    from nanomars.distributed import gather_full, latest_sharded, load_sharded, save_sharded, shard


# ---------------------------------------------------------------------------------- model + tokenizer
init_from = args.init_from or ("scratch" if args.stage == "ar" else os.path.join(args.out_dir, "ar.pt"))


def load_model_and_tokenizer():
    """Returns (model, tokenizer, hf_folder or None, step, optimizer state or None)."""
    if args.resume and args.fsdp:  # weights and AdamW state are loaded shard by shard once sharded, below
        meta = latest_sharded(dcp_dir)[1]
        with torch.device("meta"):  # names and shapes only: nothing allocated, nothing initialised
            model = Decoder(Config.from_dict(meta["config"]))
        hf_folder = meta["args"]["hf_folder"]
        if hf_folder:
            from nanomars.qwen import load_qwen_tokenizer
            return model, load_qwen_tokenizer(hf_folder), hf_folder, meta["step"], None
        return model, load_default_tokenizer(), None, meta["step"], None
    if init_from == "scratch" and not args.resume:
        tok = load_default_tokenizer()
        model = Decoder(Config(vocab_size=tok.vocab_size, n_layer=args.n_layer, n_embd=args.n_embd,
                               n_head=args.n_head, n_kv_head=args.n_kv_head,
                               intermediate_size=args.intermediate_size, max_seq_len=args.max_len or 512))
        model.init_weights()
        return model, tok, None, 0, None
    # resume this stage, or start from a checkpoint (stage 2 from stage 1) or a Hugging Face folder;
    # float32 master weights whatever the file holds (--fsdp: on the CPU, sharding moves them to the GPU)
    path = ckpt_path if args.resume else init_from
    model, tok, _, ckpt = load_model(path, "cpu" if args.fsdp else args.device, torch.float32)
    if ckpt is None:
        return model, tok, init_from, 0, None
    if args.resume and ckpt["optimizer"] is None:
        raise ValueError(f"{path} holds no optimizer state (an --fsdp run exported it): resume with --fsdp, "
                         f"from {dcp_dir}")
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
model.grad_checkpointing = args.grad_checkpointing
if master:
    print(f"stage {args.stage}: {model.num_params() / 1e6:.2f}M parameters from {init_from}, "
          f"block_size {args.block_size}, objective {args.objective}, alpha {args.alpha}, "
          f"loss_norm {args.loss_norm}, device {args.device}, world {world}"
          + (" (FSDP)" if args.fsdp else ""))
if args.fsdp:
    shard(model, device_type)  # in place: the same Decoder, its parameters now 1/world shards (DTensors)
    if args.resume:
        model.to_empty(device=args.device)  # room for this rank's shards, filled from the checkpoint below
else:
    model = model.to(args.device)

# ------------------------------------------------------------------------------------------- data
def render(examples):
    rendered = [tok.render(ex["messages"], last_turn_only=args.last_turn_only) for ex in examples]
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


global_batch = args.batch_size * args.grad_accum * world
if args.epochs:
    if len(train_set) < global_batch:
        fail(f"--epochs: {len(train_set)} training examples make no batch of {global_batch}: lower --batch_size")
    schedule_iters = args.epochs * (len(train_set) // global_batch)  # the lr schedule spans all epochs
    args.max_iters = min(args.max_iters or schedule_iters, schedule_iters)
else:
    schedule_iters = args.max_iters = args.max_iters or 1200
epoch_order = torch.zeros(0, dtype=torch.long)  # --epochs: the examples this epoch has not trained on yet


def draw_step(gen):
    """The global batch of one optimizer step: batch_size x grad_accum x world example indices (and block
    offsets with --random_offsets), drawn alike on every rank from one seeded stream. Micro-step m of rank
    r trains on slice m * world + r, so what a step sees does not depend on how it is split: 2 processes
    x 1 micro-step train as 1 process x 2 micro-steps (tests/test_fsdp.py). Drawn with replacement, or
    with --epochs the next slice of the epoch's shuffled order (a fresh order once too few are left)."""
    global epoch_order
    if args.epochs:
        if len(epoch_order) < global_batch:
            epoch_order = torch.randperm(len(train_set), generator=gen)
        idx, epoch_order = epoch_order[:global_batch], epoch_order[global_batch:]
    else:
        idx = torch.randint(len(train_set), (global_batch,), generator=gen)
    return idx, random_offsets(global_batch, args.block_size, gen) if args.random_offsets else None


def make_batch(data, idx, offsets=None):
    """(x, response, targets, offsets) for the examples data[idx], on the device."""
    tensors = collate([data[i] for i in idx], args.block_size, tok.eos_id, "cpu", offsets)
    if device_type == "cuda":  # from pinned memory the copy runs asynchronously, overlapping the GPU's work
        tensors = [t.pin_memory() for t in tensors]
    return (*(t.to(args.device, non_blocking=True) for t in tensors), offsets)


def compute_loss(model, batch, draw=0):
    """Returns (loss, {name: detached loss}) for this stage; tensors, as .item() would make the CPU wait
    for the GPU every micro-step: only logging steps read them. draw seeds the objectives that draw at
    random (no_sft_released's times, bd3lm's hidden tokens) from the step, so a resumed run repeats them."""
    x, response, targets, offsets = batch
    gen = torch.Generator(x.device).manual_seed(args.seed * 7919 + draw)
    with autocast:
        if args.stage == "ar":
            loss = ar_loss(model, x, targets)
            return loss, {"ar": loss.detach()}
        if args.objective == "bd3lm":
            loss, noisy = block_diffusion_loss(model, x, response, targets, args.block_size, tok.mask_id, gen,
                                               args.loss_norm)
            return loss, {"noisy": noisy}
        released = args.objective == "no_sft_released"
        loss, noisy, clean = dual_track_loss(model, x, response, targets, args.block_size, tok.mask_id,
                                             0.0 if released else args.alpha, args.objective == "csbd", offsets,
                                             args.loss_norm, 1 / diffusion_times(len(x), gen) if released else None)
    return loss, {"noisy": noisy, "clean": clean}


@torch.no_grad()
def evaluate():
    # every rank runs it: FSDP needs all ranks for its all-gathers (under DDP the others would only wait)
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


# ------------------------------------------------------------------------------------------- train
raw_model = model  # the Decoder itself (sharded in place under FSDP): what is evaluated and saved
optimizer = raw_model.configure_optimizer(args.lr, args.weight_decay, tuple(args.betas))
if opt_state:
    optimizer.load_state_dict(opt_state)
if args.fsdp and args.resume:
    try:
        load_sharded(latest_sharded(dcp_dir)[0], raw_model, optimizer)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
ddp_model = DDP(model) if distributed and not args.fsdp else None
model = ddp_model or raw_model
if args.compile:  # compile the DDP-wrapped model: compiled per gradient bucket, DDP still overlaps the
    model = torch.compile(model)  # all-reduce with backward
ckpt_args = {**vars(args), "hf_folder": hf_folder}


def save(final):
    """One process or DDP: rank 0 writes out_dir/<stage>.pt (and <stage>_hf/). FSDP: every rank writes its
    shards to out_dir/<stage>_dcp/; the final save also gathers the full weights into the same two exports
    (without optimizer state: the sharded checkpoint holds it)."""
    if args.fsdp:
        save_sharded(dcp_dir, raw_model, optimizer, {"step": step, "args": ckpt_args,
                                                     "config": asdict(raw_model.config)})
        full = gather_full(raw_model) if final else None  # a plain Decoder on rank 0, None elsewhere
    else:
        full = raw_model if master else None
    if full is not None:
        save_checkpoint(ckpt_path, full, None if args.fsdp else optimizer, step, ckpt_args)
        if hf_folder:
            from nanomars.qwen import save_qwen
            save_qwen(full, os.path.join(args.out_dir, f"{args.stage}_hf"), source_folder=hf_folder)
    if distributed:  # the others wait here, under --dist_timeout, not inside the next step's collectives
        dist.barrier()


gen = torch.Generator().manual_seed(args.seed * 1000)  # the batch stream, the same on every rank
for _ in range(step):  # resuming: skip the batches already trained on, so the run continues exactly
    draw_step(gen)
model.train()
t0, start_step = time.perf_counter(), step
while step < args.max_iters:
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step)
    idx, offsets = draw_step(gen)
    logged = {}
    for micro in range(args.grad_accum):
        rows = slice((micro * world + rank) * args.batch_size, (micro * world + rank + 1) * args.batch_size)
        batch = make_batch(train_set, idx[rows], None if offsets is None else offsets[rows])
        # DDP all-reduces gradients only on the last micro-step. FSDP reduce-scatters on every one, summing
        # into its fp32 gradient shards: skipping that (set_requires_gradient_sync(False)) would keep a
        # full-size bf16 gradient on every GPU between micro-steps (15 GB at 7B) and sum it in bf16
        sync = ddp_model.no_sync() if ddp_model and micro < args.grad_accum - 1 else contextlib.nullcontext()
        with sync:
            loss, parts = compute_loss(model, batch, (step * args.grad_accum + micro) * world + rank + 1)
            (loss / args.grad_accum).backward()
        for k, v in {"loss": loss.detach(), **parts}.items():
            logged[k] = logged.get(k, 0.0) + v / args.grad_accum
    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), args.grad_clip)  # FSDP: the global norm (DTensors)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    if step % args.log_interval == 0 or step == 1:
        means = torch.stack(list(logged.values()))  # this step's losses, averaged over micro-steps ...
        if distributed:
            dist.all_reduce(means)  # ... and over ranks (a sum: gloo has no average)
            means /= world
        if master:
            dt = (time.perf_counter() - t0) / (step - start_step)
            print(f"step {step:5d} | " + " | ".join(f"{k} {v:.4f}" for k, v in zip(logged, means.tolist()))
                  + f" | lr {lr_at(step - 1):.2e} | {dt:.3f} s/step")
    if step % args.eval_interval == 0 or step == args.max_iters:
        held_out = evaluate()
        if master:
            print(f"eval  {step:5d} | held-out " + " | ".join(f"{k} {v:.4f}" for k, v in held_out.items()))
        save(final=step == args.max_iters)
if master:
    print(f"done: {step - start_step} steps in {time.perf_counter() - t0:.1f} s -> {ckpt_path}"
          + (f" (sharded: {dcp_dir})" if args.fsdp else ""))
if ddp_model:  # every rank must hold the same weights: DDP averaged the same gradients into each
    weights = b"".join(p.detach().float().cpu().numpy().tobytes() for p in raw_model.parameters())
    print(f"rank {rank}: weights sha256 {hashlib.sha256(weights).hexdigest()[:16]}")
if distributed:
    dist.destroy_process_group()
