"""
The one decoder of nanoMARS: a Qwen2-shaped transformer, small enough to read top to bottom.

Notable features (all needed to load real Qwen2.5 checkpoints with the same code):
- RMSNorm computed in float32
- rotary position embeddings (RoPE) in the half-split `rotate_half` layout, driven by EXPLICIT position
  ids: MARS gives a noisy token the same position as its clean twin, so positions != indices
- grouped-query attention (n_kv_head <= n_head), optional q/k/v bias
- SwiGLU MLP, optional tied input/output embeddings
- ONE attention path that takes an explicit boolean mask (True = may attend); the masks themselves
  (causal, MARS dual-track, decode) are built by hand in masks.py. The same path serves training,
  AR decoding, MARS decoding and Qwen2.5.
- a KV cache with per-row lengths; new K/V are written at given slots (gpt-fast style), so stale
  entries beyond a row's length are simply masked and later overwritten.
MARS adds NO parameters: the model is an ordinary AR decoder; only the inputs and masks change.
Letters in shape comments: N = batch rows, T = query tokens, S = keys, C = width, V = vocabulary.
(B is kept for the MARS block size everywhere in nanoMARS; docs/mars.md explains the method.)
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 2048
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 2
    n_embd: int = 128
    intermediate_size: int = 352
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    qkv_bias: bool = True
    tie_embeddings: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**d)

    def __post_init__(self):
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"need n_embd % n_head == 0 and n_head % n_kv_head == 0, got "
                             f"n_embd={self.n_embd}, n_head={self.n_head}, n_kv_head={self.n_kv_head}")
        if (self.n_embd // self.n_head) % 2:  # RoPE rotates pairs of dimensions
            raise ValueError(f"the head size n_embd / n_head = {self.n_embd // self.n_head} must be even (RoPE)")


def default_device():
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in float32 (bf16 has too few mantissa bits for the mean of squares), as Qwen2 does
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    # half-split layout: (x1, x2) -> (-x2, x1), pairing dim i with dim i + d/2 (Hugging Face Qwen2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(pos, inv_freq, dtype):
    # pos: (N, T) long -> cos, sin: (N, 1, T, hs), computed in float32 then cast like Qwen2
    freqs = pos[..., None].float() * inv_freq  # (N, T, hs/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (N, T, hs)
    return emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)


class KVCache:
    """Per-layer K/V buffers (n_layer, N, n_kv_head, max_len, head_dim) plus each row's length.
    `lengths[b]` counts the slots of row b that hold K/V of REAL tokens; the decoder advances it.
    Anything written beyond it (e.g. K/V of mask tokens) is masked out and overwritten later.
    The model writes K/V (update); everything else changes the cache through the methods below."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        hs = config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_kv_head, max_len, hs)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)

    def update(self, layer, k, v, slots, n_keys):
        # k, v: (N, nkv, T, hs) written at slots (N, T); returns the first n_keys slots of the layer.
        # Cast on write: under autocast with float32 weights K leaves RoPE in float32 but V leaves its
        # Linear in bf16, and scatter_ needs one dtype (attention casts what it reads back itself).
        idx = slots[:, None, :, None].expand_as(k)
        self.k[layer].scatter_(2, idx, k.to(self.k.dtype))
        self.v[layer].scatter_(2, idx, v.to(self.v.dtype))
        return self.k[layer, :, :, :n_keys], self.v[layer, :, :, :n_keys]

    def advance(self, n):
        """Each row's length grows by n (N,) or int: the K/V just written there are real tokens'."""
        self.lengths += n

    def roll_back(self, lengths):
        """Each row keeps at most lengths (N,) slots; what lies past them is stale (masked, overwritten)."""
        self.lengths = torch.minimum(self.lengths, lengths)

    def keep_rows(self, keep):
        """Only rows `keep` ((N,) bool or indices) stay: finished rows leave the batch."""
        self.k, self.v, self.lengths = self.k[:, keep], self.v[:, keep], self.lengths[keep]

    def move(self, src, dst):
        """Copy each row's K/V from slots src (N, D) to slots dst (N, D), every layer and head (all are read
        before any is written)."""
        L, N, H, _, hs = self.k.shape
        at = lambda s: s[None, :, None, :, None].expand(L, N, H, s.shape[1], hs)  # noqa: E731
        for buf in (self.k, self.v):
            buf.scatter_(3, at(dst), buf.gather(3, at(src)))


class Attention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=False)
        self.use_sdpa = True  # False: the plain matmul-softmax path below, for readers (tests compare)

    def forward(self, x, cos, sin, mask, cache=None, slots=None):
        N, T, _ = x.shape
        q = self.q_proj(x).view(N, T, self.n_head, self.head_dim).transpose(1, 2)  # (N, nh, T, hs)
        k = self.k_proj(x).view(N, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (N, nkv, T, hs)
        v = self.v_proj(x).view(N, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:  # keys/values now span the cache slots the mask talks about: (N, nkv, S, hs)
            k, v = cache.update(self.layer, k, v, slots, mask.shape[-1])
        mask = mask[:, None] if mask.dim() == 3 else mask  # (N, 1, T, S) or (T, S): broadcast over heads
        rep = self.n_head // self.n_kv_head  # each kv head serves `rep` query heads (h = g * rep + r)
        if self.use_sdpa:
            # Grouped-query attention as ONE plain attention call with an explicit mask: kv head g's rep
            # query heads are stacked along the query axis, (N, nh, T, hs) -> (N, nkv, rep*T, hs), and the
            # mask is tiled to match, (rep*T, S). SDPA's enable_gqa=True with a mask rules out flash and,
            # depending on the torch version, the memory-efficient kernel, leaving CUDA the math kernel
            # (fp32 scores per head); a plain call with a mask can take the memory-efficient one
            # (tools/gpu_check.py reports the kernel picked). Unlike repeating K/V per query head, this copies
            # only q and the boolean mask: a decode step feeds few queries against a long cache.
            q = q.reshape(N, self.n_kv_head, rep * T, self.head_dim)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.tile(rep, 1))  # (N, nkv, rep*T, hs)
        else:  # the plain reference: K/V repeated to every query head, softmax(q k^T / sqrt(hs)) v
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (N, nh, S, hs)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (N, nh, T, S)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v  # (N, nh, T, hs)
        y = y.reshape(N, self.n_head, T, self.head_dim).transpose(1, 2).reshape(N, T, self.n_head * self.head_dim)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, cache=None, slots=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache, slots)
        return x + self.mlp(self.mlp_norm(x))


def linear_cross_entropy(h, weight, targets):
    # h: (k, C), weight: (V, C), targets: (k,) -> (k,) float32 cross-entropies of the logits h @ weight^T
    return F.cross_entropy(F.linear(h, weight).float(), targets, reduction="none")


def chunked_cross_entropy(h, weight, targets, chunk=2**26):
    """(K,) float32 cross-entropies of the logits h @ weight^T (h: (K, C), weight: (V, C)) against
    targets (K,), without the (K, V) float32 logits ever existing at once: about chunk / V rows at a
    time. Each chunk is checkpointed: autograd keeps only its inputs, and its logits are recomputed in
    backward (plain autograd would keep every chunk's (rows, V) log-probabilities until backward). The
    cost is one more lm_head forward over these rows; the result and gradients are the unchunked ones."""
    rows = max(1, chunk // weight.shape[0])
    return torch.cat([torch.utils.checkpoint.checkpoint(linear_cross_entropy, h[i:i + rows], weight,
                                                        targets[i:i + rows], use_reentrant=False)
                      for i in range(0, max(1, len(h)), rows)])  # one chunk at least: K = 0 gives (0,)


class Decoder(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", self.rope_inv_freq(), persistent=False)
        self.grad_checkpointing = False  # recompute each block in backward: trades compute for memory
        self.loss_chunk = 2**26  # logits the training loss computes at once (256 MB in float32)

    def rope_inv_freq(self):
        hs = self.config.n_embd // self.config.n_head
        return 1.0 / self.config.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs)

    def init_weights(self):
        # GPT-2 style normal(0.02) init; also (re)computes the RoPE buffer, e.g. after to_empty() from meta
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        self.inv_freq = self.rope_inv_freq().to(self.embed.weight.device)

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() / .cuda() all come through here: let them move the RoPE frequencies but not
        # round them (bf16 inv_freq would put every position's angle off by up to ~0.4%)
        super()._apply(fn, recurse)
        self.inv_freq = self.rope_inv_freq().to(self.inv_freq.device)
        return self

    def forward(self, idx, pos, mask, cache=None, slots=None, keep=None, targets=None):
        """idx, pos: (N, T) token and position ids; mask: (N, T, S) or (T, S) bool, True = query t may
        attend key s, where the keys are the T inputs themselves (S = T) or, with a cache, its first S
        slots after this step's K/V were written at `slots` (N, T). Returns float32 logits (N, T, V).
        keep: the outputs that get logits, as the lm_head is the largest matmul of a big-vocabulary model
        (Qwen2.5: V = 151,936, 0.6 MB of float32 logits per output) and most outputs are never read.
        None: all of them, (N, T, V); a slice or 1-D index tensor of positions: (N, k, V); an (N, k) long
        tensor, positions per row: (N, k, V); an (N, T) bool tensor: (K, V), the True ones in row-major
        order. targets: (K,) token ids, one per kept output: returns their float32 cross-entropies (K,)
        instead of logits, computed chunk by chunk (chunked_cross_entropy), as training needs.
        Positions are not checked here (that would stall a GPU on every call): the decoders check the
        prompt against max_seq_len before they start, train.py drops examples longer than the context."""
        x = self.hidden(idx, pos, mask, cache, slots, keep)
        if targets is not None:
            return chunked_cross_entropy(x, self.lm_head.weight, targets, self.loss_chunk)  # (K,)
        return self.lm_head(x).float()  # (..., V)

    def hidden(self, idx, pos, mask, cache=None, slots=None, keep=None):
        """forward's final-norm outputs at the kept positions, (N, k, C) or (K, C): what the lm_head reads
        (and what Medusa's heads read, compare/medusa.py)."""
        if idx.shape != pos.shape:
            raise ValueError(f"idx {tuple(idx.shape)} and pos {tuple(pos.shape)} must have the same shape")
        x = self.embed(idx)  # (N, T, C)
        cos, sin = rope_cos_sin(pos, self.inv_freq, x.dtype)
        for block in self.blocks:
            if self.grad_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, mask, cache, slots)
        if isinstance(keep, torch.Tensor) and keep.dtype == torch.bool and keep.dim() == 2:
            x = x[keep]  # (K, C)
        elif isinstance(keep, torch.Tensor) and keep.dim() == 2:
            x = x.gather(1, keep[..., None].expand(-1, -1, x.shape[-1]))  # (N, k, C)
        elif keep is not None:
            x = x[:, keep]  # (N, k, C)
        return self.norm(x)  # per output, so selecting first changes nothing

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # parameters() yields a tied weight once

    def configure_optimizer(self, lr, weight_decay=0.01, betas=(0.9, 0.95)):
        """AdamW with two groups: matrices (and the embedding) decay, norms and biases do not."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)

    def set_attention(self, use_sdpa: bool):
        for block in self.blocks:
            block.attn.use_sdpa = use_sdpa
