"""
Checkpoints: nanoMARS's own self-describing .pt files (nanoGPT style, written atomically, read with
weights_only=True), and load_model, the ONE loader every script uses: a .pt checkpoint or a Hugging Face
Qwen2.5 / MARS folder -> (model, tokenizer, block size, checkpoint dict).
"""
import os
import zipfile
from dataclasses import asdict

import torch

from ..model import Config, Decoder
from .qwen import load_qwen, load_qwen_tokenizer
from .tokenizer import load_default_tokenizer


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
    """Returns (model, ckpt). Every problem is one ValueError / FileNotFoundError naming the file: missing,
    unreadable, not ours, or weights that do not fit the config stored beside them.
    The file is memory-mapped (mmap=True): pages are read when first touched, so the weights go from the
    page cache straight to `device`, and a resumed run's optimizer state (twice the weights for AdamW)
    stays on the CPU, unread until the optimizer loads it (inference never reads it).
    A mapping is only safe while the file keeps its contents: rewriting it IN PLACE (cp or torch.save onto
    the same path) or truncating it makes the next touch of a mapped page a SIGBUS; renaming a new file
    over it (save_checkpoint does) or deleting it is safe. So the weights are always COPIED off the mapping
    (on the CPU too) and ckpt["model"] is the model's own state dict; only ckpt["optimizer"] points into
    the file until the optimizer has loaded it (to a GPU: a copy; a CPU optimizer keeps the tensors, and
    its first step turns every page into a private copy)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train one first (python train.py --stage ar) "
                                "or pass the right path")
    try:
        # mmap needs torch's zip format; anything else (an old-format file, junk) is read whole as before
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"cannot read checkpoint {path} ({type(e).__name__}: {first_line}): the file is "
                         "truncated or not a torch checkpoint; retrain or copy it again") from None
    if not isinstance(ckpt, dict) or not {"model", "config"} <= set(ckpt):
        raise ValueError(f"{path} is not a nanoMARS checkpoint (expected a dict with 'model' and 'config')")
    try:
        config = Config.from_dict(ckpt["config"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: bad model config: {e}") from None
    with torch.device("meta"):  # names and shapes only: nothing random is built just to be overwritten
        model = Decoder(config)
    # checkpoints saved from a torch.compile'd model carry an '_orig_mod.' prefix: strip it
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    want = model.state_dict()
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise ValueError(f"{path}: the weights do not match the config stored with them (missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}); the file was edited or mixed up")
    for k, v in state.items():
        if v.shape != want[k].shape:
            raise ValueError(f"{path}: weight {k} has shape {tuple(v.shape)} but the stored config "
                             f"({config.n_layer} layers, width {config.n_embd}, vocab {config.vocab_size}) "
                             f"needs {tuple(want[k].shape)}; the file was edited or mixed up")
    model.load_state_dict(state, assign=True)  # the parameters are now the file's mapped tensors ...
    if config.tie_embeddings:  # assign=True replaced both Parameters: make them one again
        model.lm_head.weight = model.embed.weight
    for p in model.parameters():  # ... copied off the mapping here (a tied weight is yielded, copied, once)
        p.data = p.data.to(device, copy=True)
    model.inv_freq = model.rope_inv_freq().to(device)  # not in the checkpoint: computed, float32
    ckpt["model"] = model.state_dict()
    return model, ckpt


def load_model(path, device="cpu", dtype=None):
    """Any model nanoMARS can run -> (model, tokenizer, block_size, ckpt), model in eval mode.
    path: a nanoMARS .pt checkpoint (its tokenizer is the built-in one, or that of the Hugging Face folder
    it was fine-tuned from) or a Hugging Face Qwen2.5 / MARS folder (its own tokenizer). block_size is the
    one the checkpoint was trained with (4 for a folder: the released MARS checkpoints' default).
    ckpt is the checkpoint dict, None for a folder. Checks that every tokenizer id has an embedding row."""
    if os.path.isdir(path):
        model, tok = load_qwen(path, device=device, dtype=dtype)
        return model, tok, 4, None
    model, ckpt = load_checkpoint(path, device)
    hf_folder = ckpt.get("args", {}).get("hf_folder")
    if hf_folder:
        tok = load_qwen_tokenizer(hf_folder)
    else:
        tok = load_default_tokenizer()
    if tok.vocab_size > model.config.vocab_size:
        raise ValueError(f"{path}: the model has {model.config.vocab_size} embedding rows but its tokenizer "
                         f"({hf_folder or 'the built-in one, data/tokenizer.tiktoken'}) uses {tok.vocab_size} "
                         "ids: this checkpoint was trained with another tokenizer")
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), tok, ckpt.get("args", {}).get("block_size", 4), ckpt
