"""Self-describing checkpoints (nanoGPT style), written atomically and read with weights_only=True."""
import os
from dataclasses import asdict

import torch

from .model import Config, Decoder


def save_checkpoint(path, model, optimizer, step, args):
    """One dict: weights, optimizer state, model config, step and the run's arguments. Written to a temp
    file then renamed over `path`, so an interrupted run never leaves a half-written checkpoint."""
    raw = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    raw = getattr(raw, "module", raw)  # unwrap DistributedDataParallel
    ckpt = {"model": raw.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
            "config": asdict(raw.config), "step": step, "args": dict(args)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, device="cpu"):
    """Returns (model, ckpt). Clear errors for a missing or unreadable file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train one first (python train.py --stage ar) "
                                "or pass the right path")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise ValueError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(f"{path} is not a nanoMARS checkpoint (expected a dict with 'model' and 'config')")
    model = Decoder(Config.from_dict(ckpt["config"]))
    # checkpoints saved from a torch.compile'd model carry an '_orig_mod.' prefix: strip it
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    return model.to(device), ckpt
