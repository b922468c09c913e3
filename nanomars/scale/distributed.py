"""
train.py on several processes (torchrun), and its checkpoints. train.py calls these functions in order:
init_distributed, load_resume (--resume), distribute (place, the optimizer, restore, parallel); every step
gradient_sync and mean_over_ranks; save after each evaluation; close_distributed at the end. Two ways to use N GPUs:
- DistributedDataParallel (DDP, the default under torchrun): a full replica per GPU; backward averages the
  gradients over the ranks (an all-reduce), so every rank takes the same optimizer step.
- FSDP2 (--fsdp, PyTorch's own torch.distributed.fsdp.fully_shard), for models that do not fit one GPU
  (Qwen2.5-7B: 16 bytes a parameter for fp32 weights, gradients and AdamW state, 122 GB): each rank keeps
  1/world of every weight, gradient and optimizer state, and all-gathers one block's weights just before that
  block runs. Its checkpoints are sharded too (torch.distributed.checkpoint, DCP): every rank writes its own
  shards, and a run resumes from them exactly on the same number of ranks. The FSDP machinery is at the end
  of this file; its torch modules are imported where they are used, as importing them takes half a second
  that every run without --fsdp would pay.
"""
import contextlib
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ..util.checkpoint import load_model, save_checkpoint
from ..util.cli import fail
from ..model import Config, Decoder
from ..util.qwen import load_qwen_tokenizer, save_qwen
from ..util.tokenizer import load_default_tokenizer


# -------------------------------------------------------------------------------------------- processes
def init_distributed(device, fsdp, timeout_minutes):
    """(rank, world, device). Launched by torchrun (RANK is set): join the process group (nccl on GPUs, gloo on
    the CPU) and take this rank's GPU. Alone: (0, 1, device)."""
    if "RANK" not in os.environ:
        if fsdp:
            fail("--fsdp shards across the processes torchrun starts: torchrun --standalone --nproc_per_node=N "
                 "train.py --fsdp ...")
        return 0, 1, device
    cuda = device.startswith("cuda")
    # the timeout bounds every wait inside a collective, e.g. the other ranks' while rank 0 writes a file
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=timeout_minutes))
    if cuda:
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def mean_over_ranks(t):
    """t averaged over the ranks, in place (an all-reduce sum: gloo has no average); t itself when alone."""
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t


# ------------------------------------------------------------------------------- the model on the ranks
def distribute(model, args, saved):
    """(raw_model, model, optimizer) for the training loop: the model placed on this rank (place: raw_model,
    sharded in place under FSDP), its AdamW (args.lr, weight_decay, betas) with, on --resume, the state that
    load_resume found restored (under FSDP also the weights), and what the loop calls (parallel: DDP under
    torchrun without --fsdp, --compile)."""
    raw_model = place(model, args.device, args.fsdp)
    optimizer = raw_model.configure_optimizer(args.lr, args.weight_decay, tuple(args.betas))
    if args.resume:
        restore(raw_model, optimizer, saved)
    return raw_model, parallel(raw_model, args.fsdp, args.compile), optimizer


def place(model, device, fsdp):
    """The model on this rank's device, in place: moved whole, or (FSDP) sharded, each rank keeping 1/world of
    every weight. A model resumed under FSDP has no weights yet (load_resume built it on the meta device):
    it gets room for this rank's shards, which restore fills."""
    if not fsdp:
        return model.to(device)
    resumed = next(model.parameters()).is_meta
    shard(model, "cuda" if device.startswith("cuda") else "cpu")
    if resumed:
        model.to_empty(device=device)
    return model


def parallel(model, fsdp, compile):
    """The model the training loop calls. Under torchrun without --fsdp: a DDP replica, whose backward
    all-reduces the gradients (a sharded model communicates by itself). --compile compiles the DDP-wrapped
    model: compiled per gradient bucket, so DDP still overlaps the all-reduce with backward."""
    if dist.is_initialized() and not fsdp:
        model = DDP(model)
    return torch.compile(model) if compile else model


def ddp_of(model):
    """The DistributedDataParallel wrapper inside `model` (compiled or not), or None."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return model if isinstance(model, DDP) else None


def gradient_sync(model, last_micro_step):
    """The context of one micro-step's backward. DDP all-reduces the gradients only on the last micro-step of
    an optimizer step. FSDP reduce-scatters on every one, summing into its fp32 gradient shards: skipping that
    (set_requires_gradient_sync(False)) would keep a full-size bf16 gradient on every GPU between micro-steps
    (15 GB at 7B) and sum it in bf16."""
    ddp = ddp_of(model)
    return ddp.no_sync() if ddp and not last_micro_step else contextlib.nullcontext()


# ------------------------------------------------------------------------------------------ checkpoints
def checkpoint_paths(out_dir, stage):
    """out_dir/<stage>.pt (the checkpoint, or under FSDP the gathered export) and out_dir/<stage>_dcp/ (FSDP's
    sharded checkpoints)."""
    return os.path.join(out_dir, f"{stage}.pt"), os.path.join(out_dir, f"{stage}_dcp")


def load_resume(out_dir, stage, fsdp, device):
    """Where --resume continues this stage: (model, tokenizer, hf_folder, step, saved), `saved` being what
    restore loads once the model is placed. One process or DDP: the float32 weights of out_dir/<stage>.pt on
    `device`, and saved = its AdamW state. FSDP: a model of names and shapes only (on the meta device: nothing
    allocated, nothing initialised), and saved = the newest sharded checkpoint's folder."""
    path, sharded_dir = checkpoint_paths(out_dir, stage)
    if fsdp:
        folder, meta = latest_sharded(sharded_dir)
        with torch.device("meta"):
            model = Decoder(Config.from_dict(meta["config"]))
        hf_folder = meta["args"]["hf_folder"]
        tok = load_qwen_tokenizer(hf_folder) if hf_folder else load_default_tokenizer()
        return model, tok, hf_folder, meta["step"], folder
    model, tok, _, ckpt = load_model(path, device, torch.float32)
    if ckpt["optimizer"] is None:
        raise ValueError(f"{path} holds no optimizer state (an --fsdp run exported it): resume with --fsdp, "
                         f"from {sharded_dir}")
    return model, tok, ckpt["args"].get("hf_folder"), ckpt["step"], ckpt["optimizer"]


def restore(model, optimizer, saved):
    """Load what load_resume found: AdamW's state dict (the model holds its weights already), or a sharded
    checkpoint's folder, whose weights and AdamW state fill the sharded model and its optimizer."""
    if isinstance(saved, str):
        load_sharded(saved, model, optimizer)
    else:
        optimizer.load_state_dict(saved)


def save(model, optimizer, step, run_args, final):
    """Checkpoint the run; run_args (train.py's flags and hf_folder, stored in the checkpoint) say where
    (out_dir, stage) and how (fsdp). One process or DDP: rank 0 writes out_dir/<stage>.pt (atomically) and,
    for a model fine-tuned from a Hugging Face folder, <stage>_hf/. FSDP: every rank writes its shards to
    out_dir/<stage>_dcp/; the final save also gathers the full weights into the same two exports (without
    optimizer state: the sharded checkpoint holds it). Returns on every rank once the files are written."""
    path, sharded_dir = checkpoint_paths(run_args["out_dir"], run_args["stage"])
    if run_args["fsdp"]:
        save_sharded(sharded_dir, model, optimizer, {"step": step, "args": run_args,
                                                     "config": asdict(model.config)})
        full = gather_full(model) if final else None  # a plain Decoder on rank 0, None elsewhere
    else:
        full = model if not dist.is_initialized() or dist.get_rank() == 0 else None
    if full is not None:
        save_checkpoint(path, full, None if run_args["fsdp"] else optimizer, step, run_args)
        if run_args["hf_folder"]:
            save_qwen(full, os.path.join(run_args["out_dir"], f"{run_args['stage']}_hf"),
                      source_folder=run_args["hf_folder"])
    if dist.is_initialized():  # the others wait here, under --dist_timeout, not inside the next step's collectives
        dist.barrier()


# ---------------------------------------------------------------------------------------------- the end
def close_distributed(model):
    """End a torchrun run, and with it this process. Under DDP every rank must hold the same weights (each
    averaged the same gradients into its own copy): each prints a digest of its weights, for
    tests/test_train.py to compare."""
    if not dist.is_initialized():
        return
    ddp = ddp_of(model)
    if ddp:
        weights = b"".join(p.detach().float().cpu().numpy().tobytes() for p in ddp.module.parameters())
        print(f"rank {dist.get_rank()}: weights sha256 {hashlib.sha256(weights).hexdigest()[:16]}")
    dist.barrier()  # no rank tears its connections down while another still uses them (gloo can abort then)
    dist.destroy_process_group()
    # Even so, the interpreter's own teardown can abort a rank (SIGABRT, "terminate called without an active
    # exception": gloo's threads free tensors while Python is being torn down; seen once in CI, FSDP on gloo).
    # Everything is saved and every rank is past the barrier, so nothing is left to do: skip that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------------- FSDP
def shard(model, device_type):
    """Shard each Block, then the root (embedding, final norm, lm_head), in place, over every rank. A Block's
    weights exist in full only while it runs forward or backward. A tied lm_head.weight IS embed.weight and
    both sit in the root's group, so it stays one parameter. CUDA: bf16 compute from fp32 master shards, and
    gradients reduce-scattered in fp32. CPU (gloo, the tests): fp32 throughout, so a sharded run can be
    compared with a one-process one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device_type == "cuda"
          else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # moves any CPU weights to the mesh's device as it shards
    return model


def save_sharded(folder, model, optimizer, meta):
    """Every rank writes its shards of the weights and AdamW state to folder/step_<N>/ (collective), rank 0
    adds meta.json (meta: step, args, model config), and only then points folder/latest at it, by renaming
    a new pointer file over the old one: an interrupted save leaves `latest` on the previous, complete
    checkpoint. Older step folders are deleted after the switch."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    name = f"step_{meta['step']:07d}"
    path = os.path.join(folder, name)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)  # returns once all wrote
    if dist.get_rank() == 0:
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        with open(os.path.join(folder, "latest.tmp"), "w") as f:
            f.write(name + "\n")
        os.replace(os.path.join(folder, "latest.tmp"), os.path.join(folder, "latest"))
        for old in os.listdir(folder):
            if old.startswith("step_") and old != name:
                shutil.rmtree(os.path.join(folder, old))


def latest_sharded(folder):
    """(path, meta) of the newest complete sharded checkpoint in folder."""
    pointer = os.path.join(folder, "latest")
    if not os.path.isfile(pointer):
        raise FileNotFoundError(f"no sharded checkpoint in {folder} (no 'latest' file): train this stage with "
                                "--fsdp first, or resume without --fsdp from the .pt file")
    with open(pointer) as f:
        path = os.path.join(folder, f.read().strip())
    with open(os.path.join(path, "meta.json")) as f:
        return path, json.load(f)


def load_sharded(path, model, optimizer):
    """Load a save_sharded checkpoint into an already sharded model and its optimizer (collective): each
    rank reads only the pieces of the files that its own shards need."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_state, optim_state = get_state_dict(model, optimizer)  # the layout to fill in
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def gather_full(model):
    """Collective: rank 0 gets a plain (unsharded) Decoder on the CPU with the full fp32 weights, gathered
    one tensor at a time straight to CPU memory; the other ranks get None. For export: save_checkpoint and
    save_qwen take it as they take an ordinary model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    with torch.device("meta"):
        full = Decoder(model.config)
    full.load_state_dict(state, assign=True)
    if full.config.tie_embeddings:  # assign=True replaced both names' Parameters: make them one again
        full.lm_head.weight = full.embed.weight
    full.inv_freq = full.rope_inv_freq()  # a buffer not in any state dict: computed, float32
    return full
