"""
Load real Qwen2.5 Hugging Face checkpoints (and released MARS ones, model_type "a2d-qwen2") by hand into
our Decoder, and save ours back in the same layout. No transformers needed: config.json is a dict, the
weights are safetensors (read by safetensors_io.py), the tokenizer is a vocabulary tiktoken can serve.
Our module names mirror Qwen2's, so the key map is a handful of renames and no weight is permuted
(Qwen2 uses the same half-split RoPE layout as we do).
"""
import json
import shutil
import unicodedata
from itertools import count
from pathlib import Path

import tiktoken
import torch

from ..model import Config, Decoder, default_device
from .safetensors_io import load_file, read_header, save_file
from .tokenizer import QWEN_PATTERN, ChatTokenizer

SUPPORTED = ("qwen2", "a2d-qwen2")
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "generation_config.json")


def load_qwen_config(folder) -> Config:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    c = json.loads(path.read_text())
    if c.get("model_type") not in SUPPORTED:
        raise ValueError(f"{path}: unsupported model_type {c.get('model_type')!r} (supported: {', '.join(SUPPORTED)})")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}  # new files nest rope_theta here
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                           "vocab_size") if k not in c]
    if missing:
        raise ValueError(f"{path}: missing field(s) {missing}")
    n_embd, n_head = c["hidden_size"], c["num_attention_heads"]
    unsupported = {  # Qwen2 features our Decoder does not have: refuse rather than load a different model
        "use_sliding_window=true": c.get("use_sliding_window", False),
        f"hidden_act {c.get('hidden_act')!r}": c.get("hidden_act", "silu") != "silu",
        f"RoPE scaling {rope}": rope.get("rope_type", rope.get("type", "default")) != "default",
        "head_dim != hidden_size / num_attention_heads": c.get("head_dim", n_embd // n_head) != n_embd // n_head}
    for what, bad in unsupported.items():
        if bad:
            raise ValueError(f"{path}: {what} is not supported")
    return Config(vocab_size=c["vocab_size"], n_layer=c["num_hidden_layers"], n_head=n_head,
                  n_kv_head=c.get("num_key_value_heads") or n_head, n_embd=n_embd,
                  intermediate_size=c["intermediate_size"], max_seq_len=c.get("max_position_embeddings", 32768),
                  rope_theta=float(c.get("rope_theta", rope.get("rope_theta", 10000.0))),
                  norm_eps=c.get("rms_norm_eps", 1e-6), qkv_bias=True,  # Qwen2's q/k/v always have a bias
                  tie_embeddings=c.get("tie_word_embeddings", False))  # transformers' Qwen2Config default


def hf_key(name):
    """Our parameter name -> Hugging Face Qwen2's, e.g. blocks.3.attn.q_proj.bias -> model.layers.3.self_attn.q_proj.bias"""
    if name.startswith("blocks."):
        name = "model.layers." + name[len("blocks."):]
        for ours, theirs in ((".attn_norm.", ".input_layernorm."), (".mlp_norm.", ".post_attention_layernorm."),
                             (".attn.", ".self_attn.")):
            name = name.replace(ours, theirs)
        return name
    return {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}.get(name, name)


def weight_files(folder):
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # sharded: the index names the shard of every tensor
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{index}: shard {shard} is missing from {folder}")
        return [folder / s for s in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def load_qwen(folder, device=None, dtype=None):
    """(model, tokenizer) from a Hugging Face Qwen2 / MARS folder. Weights go file -> mmap -> device once."""
    config = load_qwen_config(folder)
    tokenizer = load_qwen_tokenizer(folder)
    if tokenizer.vocab_size > config.vocab_size:  # e.g. <|mask|> must land on an existing embedding row
        raise ValueError(f"{folder}: the tokenizer uses {tokenizer.vocab_size} ids but the model has only "
                         f"{config.vocab_size} embedding rows")
    device = torch.device(device or default_device())
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    with torch.device("meta"):  # no memory, no random init: every tensor is replaced by a checkpoint one
        model = Decoder(config)
    ours = model.state_dict()  # meta tensors: names and shapes only
    want = {hf_key(k): k for k in ours if not (config.tie_embeddings and k == "lm_head.weight")}
    # check every name and shape BEFORE loading anything
    files = weight_files(folder)
    found = {name: (f, shape) for f in files for name, (_, shape, _, _) in read_header(f)[0].items()}
    if config.tie_embeddings:
        found.pop("lm_head.weight", None)  # some exporters also write the tied copy: same matrix
    missing, unexpected = sorted(set(want) - set(found)), sorted(set(found) - set(want))
    if missing or unexpected:
        raise ValueError(f"{folder}: checkpoint does not match the config: missing {missing}, unexpected {unexpected}")
    for name, (f, shape) in found.items():
        if tuple(shape) != tuple(ours[want[name]].shape):
            raise ValueError(f"{f}: {name} has shape {tuple(shape)}, expected {tuple(ours[want[name]].shape)}")
    state = {}
    for f in files:
        for name, t in load_file(f).items():
            if name in want:  # one cast/transfer; a no-op (still the mmap) when dtype and device already match
                state[want[name]] = t.to(device=device, dtype=dtype)
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_embeddings:  # assign=True replaced both Parameters: make them one again
        model.lm_head.weight = model.embed.weight
    model.inv_freq = model.rope_inv_freq().to(device)  # not in the checkpoint: computed, float32
    return model.eval(), tokenizer


def save_qwen(model, folder, source_folder=None):
    """Write config.json + model.safetensors in Hugging Face Qwen2 layout (loads here and in transformers).
    source_folder: the folder the model was loaded from; its tokenizer files are copied and its model
    type is kept (a released MARS checkpoint, "a2d-qwen2", stays one, with its architectures/auto_map)."""
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    c, folder = model.config, Path(folder)
    if not c.qkv_bias:
        raise ValueError("Qwen2 checkpoints always have q/k/v biases; this model has none")
    folder.mkdir(parents=True, exist_ok=True)
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": c.n_embd,
              "intermediate_size": c.intermediate_size, "num_hidden_layers": c.n_layer,
              "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "hidden_act": "silu",
              "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "vocab_size": c.vocab_size,
              "max_position_embeddings": c.max_seq_len, "tie_word_embeddings": c.tie_embeddings,
              "use_sliding_window": False, "torch_dtype": dtype, "dtype": dtype}  # transformers 4 / 5 names
    state = {hf_key(k): v for k, v in model.state_dict().items()
             if not (c.tie_embeddings and k == "lm_head.weight")}  # tied: HF stores embed_tokens only
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})  # transformers wants "format"
    if source_folder is not None:
        source = json.loads((Path(source_folder) / "config.json").read_text())
        config.update({k: source[k] for k in ("model_type", "architectures", "auto_map") if k in source})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if source_folder is not None and Path(source_folder).resolve() != folder.resolve():
        copied = [n for n in TOKENIZER_FILES if (Path(source_folder) / n).is_file()]
        if "tokenizer.json" not in copied and "vocab.json" not in copied:
            raise FileNotFoundError(f"{source_folder}: no tokenizer.json or vocab.json to copy")
        for n in copied:
            shutil.copyfile(Path(source_folder) / n, folder / n)

# -----------------------------------------------------------------------------
# tokenizer: Qwen's byte-level BPE has rank == id, so its vocabulary IS a tiktoken rank table


def bytes_to_unicode():
    """GPT-2's byte -> printable character table: byte-level vocabularies spell byte b as chr(table[b])."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in bs]  # unprintable bytes move to chr(256), chr(257), ...
    return {**{b: chr(b) for b in bs}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


class QwenTokenizer(ChatTokenizer):
    def encode(self, text):
        # Qwen2.5's tokenizer NFC-normalizes first ("e" + combining accent -> "é"); tiktoken does not
        return super().encode(unicodedata.normalize("NFC", text))


def load_qwen_tokenizer(folder) -> ChatTokenizer:
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        path = folder / "tokenizer.json"
        t = json.loads(path.read_text(encoding="utf-8"))
        vocab, merges = t["model"]["vocab"], t["model"].get("merges", [])
        added = {a["content"]: a["id"] for a in t.get("added_tokens", [])}
    elif (folder / "vocab.json").is_file():
        path, cfg = folder / "vocab.json", folder / "tokenizer_config.json"
        vocab, merges = json.loads(path.read_text(encoding="utf-8")), []  # rank = id: merges.txt not needed
        decoder = json.loads(cfg.read_text(encoding="utf-8")).get("added_tokens_decoder", {}) if cfg.is_file() else {}
        added = {a["content"]: int(i) for i, a in decoder.items()}
    else:
        raise FileNotFoundError(f"{folder}: no tokenizer.json or vocab.json (tokenizer files missing)")
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    try:
        ranks = {bytes(byte_of[ch] for ch in tok): i for tok, i in vocab.items()}
    except KeyError:
        raise ValueError(f"{path}: not a byte-level BPE vocabulary (a token uses a character outside "
                         "GPT-2's byte table)") from None
    # tiktoken's token id IS its merge rank: the ids must be 0..n-1, and HF (which merges in list order)
    # agrees with tiktoken (which merges the lowest-rank pair first) only if the merges come in id order
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: token ids are not exactly 0..{len(ranks) - 1}, so rank != id and tiktoken "
                         "cannot serve this vocabulary")
    merged = [vocab.get(m.replace(" ", "") if isinstance(m, str) else "".join(m)) for m in merges]
    if None in merged or merged != sorted(merged):
        raise ValueError(f"{path}: the merges are not in token-id order, so rank != id and tiktoken cannot "
                         "serve this vocabulary")
    # added tokens with an id inside the vocabulary are ordinary tokens already
    specials = {s: i for s, i in added.items() if i >= len(ranks)}
    if "<|mask|>" not in specials:  # MARS's extra token: the first unused id, a spare embedding row
        specials["<|mask|>"] = next(i for i in count(len(ranks)) if i not in specials.values())
    enc = tiktoken.Encoding(name=folder.name or "qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks,
                            special_tokens=specials)
    return QwenTokenizer(enc, default_system=QWEN_SYSTEM)
