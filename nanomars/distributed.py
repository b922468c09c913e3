"""
Sharded training for models that do not fit one GPU (Qwen2.5-7B: 16 bytes a parameter for fp32 weights,
gradients and AdamW state, 122 GB), with PyTorch's own FSDP2 (torch.distributed.fsdp.fully_shard): each rank
keeps 1/world of every weight, gradient and optimizer state, and all-gathers one block's weights just before
that block runs. Its checkpoints are sharded too (torch.distributed.checkpoint, DCP): every rank writes its own
shards, and a run resumes from them exactly on the same number of ranks. train.py --fsdp uses this file.
"""
import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .model import Decoder


def shard(model, device_type):
    """Shard each Block, then the root (embedding, final norm, lm_head), in place, over every rank. A Block's
    weights exist in full only while it runs forward or backward. A tied lm_head.weight IS embed.weight and
    both sit in the root's group, so it stays one parameter. CUDA: bf16 compute from fp32 master shards, and
    gradients reduce-scattered in fp32. CPU (gloo, the tests): fp32 throughout, so a sharded run can be
    compared with a one-process one."""
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
    model_state, optim_state = get_state_dict(model, optimizer)  # the layout to fill in
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def gather_full(model):
    """Collective: rank 0 gets a plain (unsharded) Decoder on the CPU with the full fp32 weights, gathered
    one tensor at a time straight to CPU memory; the other ranks get None. For export: save_checkpoint and
    save_qwen take it as they take an ordinary model."""
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
