"""
Decoding one sequence: greedy AR, and the MARS sliding window with threshold tau (docs/mars.md, "Decoding").

MARS step: known tokens x_0..x_{c-1}; one forward over [x_0..x_{c-1}, MASK x (B-1)] under a plain causal
mask. The output at x_{c-1} proposes x_c (exactly AR's prediction), the output at mask j-1 proposes
x_{c+j}. Accept y_0 always, then y_1, y_2, ... in order while their probability >= tau.
With the KV cache only K/V of real tokens are kept: each step feeds [tokens accepted last step | B-1
masks] and advances the cache length over the real tokens only, so the masks' K/V are dropped (they
sit beyond the length, hidden by the mask and overwritten next step) and every accepted token is
recomputed with its real id.
"""
import time
from dataclasses import dataclass, field

import torch

from .masks import causal_mask, decode_mask
from .model import KVCache


@dataclass
class Decoded:
    tokens: list = field(default_factory=list)  # generated ids (a stop token, when hit, is the last)
    spans: list = field(default_factory=list)  # the tokens accepted by each forward, in order
    seconds: float = 0.0

    @property
    def forwards(self):
        return len(self.spans)

    @property
    def tokens_per_forward(self):
        return len(self.tokens) / max(1, self.forwards)


METRICS = ("prob", "entropy", "margin")


def check_tau(tau, metric="prob"):
    """tau: a float or a tensor of per-row taus; raises a ValueError saying the legal range."""
    if metric not in METRICS:
        raise ValueError(f"unknown acceptance metric {metric!r}; choose one of {METRICS}")
    t = torch.as_tensor(tau, dtype=torch.float32)
    bad = {"prob": (t <= 0) | (t > 1), "margin": (t < 0) | (t > 1), "entropy": t < 0}[metric] | t.isnan()
    if bad.any():
        legal = {"prob": "(0, 1] (1 = one token per forward, exactly greedy AR)",
                 "margin": "[0, 1] (1 = exactly greedy AR)", "entropy": ">= 0 (0 = exactly greedy AR)"}[metric]
        raise ValueError(f"tau must be in {legal} for metric {metric!r}, got {t.tolist()}")


def check_decode_args(model, prompt, max_new_tokens, block_size=1, tau=1.0, metric="prob"):
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    check_tau(tau, metric)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    need, ctx = len(prompt) + max_new_tokens + block_size - 1, model.config.max_seq_len
    if need > ctx:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + block_size-1 "
                         f"({block_size - 1}) = {need} exceeds the model context of {ctx} tokens: shorten "
                         "the prompt or lower max_new_tokens")


def forward_new(model, tokens, cache, known):
    """Run new tokens (list of ids) after `known` tokens. With a cache, the known tokens' K/V are in it and
    only the new ones are computed; without, the whole sequence `known + tokens` is recomputed.
    Returns float32 logits (T_new, V) of the new tokens."""
    dev = model.embed.weight.device
    if cache is None:
        idx = torch.tensor([known + tokens], device=dev)
        T = idx.shape[1]
        pos = torch.arange(T, device=dev)[None]
        return model(idx, pos, causal_mask(T, device=dev))[0, len(known):]
    start = cache.lengths  # (1,) slots already holding real tokens
    idx = torch.tensor([tokens], device=dev)
    slots = start[:, None] + torch.arange(len(tokens), device=dev)[None]  # (1, T): also the positions
    return model(idx, slots, decode_mask(start, len(tokens), int(start[0]) + len(tokens)), cache, slots)[0]


def propose(logits, temperature=0.0, top_k=None, generator=None):
    """Proposals y (..., B) and the distributions p (..., B, V) that gate them, from a window's logits
    (..., B, V). temperature 0: y = argmax p, p = softmax(logits) (greedy). Else p = softmax(logits /
    temperature) and y is sampled from p restricted to its top_k tokens; the gate still reads the
    untruncated p (renormalised over one token, every top-1 proposal would look certain)."""
    if temperature == 0:
        p = logits.float().softmax(-1)
        return p.max(-1).indices, p
    logits = logits.float() / temperature
    p = logits.softmax(-1)
    q = p
    if top_k is not None:  # everything below the k-th largest logit is out (multinomial renormalises)
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        q = p.masked_fill(logits < kth, 0.0)
    y = torch.multinomial(q.flatten(0, -2), 1, generator=generator).view(p.shape[:-1])
    return y, p


def gate(p, y, tau, metric="prob"):
    """(..., B) bool: does proposal j pass on its own? tau is a float or broadcasts against (..., B).
    prob: p_j[y_j] >= tau; entropy: H(p_j) <= tau; margin: top1 - top2 >= tau. tau = 1 (prob, margin)
    or 0 (entropy) passes nothing: one token per forward, exactly AR (a softmax can round to exactly 1.0
    in float32, so that case must not be left to the comparison)."""
    if metric == "prob":
        return (p.gather(-1, y[..., None])[..., 0] >= tau) & (tau < 1)
    if metric == "entropy":
        return (-(p * p.clamp_min(1e-30).log()).sum(-1) <= tau) & (tau > 0)
    if metric == "margin":
        top2 = p.topk(2, dim=-1).values
        return (top2[..., 0] - top2[..., 1] >= tau) & (tau < 1)
    raise ValueError(f"unknown acceptance metric {metric!r}; choose one of {METRICS}")


def n_accepted(ok):
    """ok: (..., B) bool per proposal -> (...,) how many are accepted: y_0 always, then y_1, y_2, ...
    while they pass, stopping at the first failure (never skipping ahead)."""
    ok = torch.cat([torch.ones_like(ok[..., :1]), ok[..., 1:]], -1)
    return ok.long().cumprod(-1).sum(-1)


def accept(logits, tau):
    """Greedy proposals from the window's logits (B, V); keep y_0, then y_j while p_j[y_j] >= tau,
    stopping at the first failure. tau >= 1 keeps exactly one token."""
    y, p = propose(logits)
    return y[:n_accepted(gate(p, y, tau))].tolist()


@torch.no_grad()
def mars_decode(model, prompt, max_new_tokens, mask_id, block_size=4, tau=0.95, stop_ids=(), use_cache=True):
    check_decode_args(model, prompt, max_new_tokens, block_size, tau)
    t0, out = time.perf_counter(), Decoded()
    cache = KVCache(model.config, 1, len(prompt) + max_new_tokens + block_size - 1,
                    model.embed.weight.device, model.embed.weight.dtype) if use_cache else None
    known, pending = [], list(prompt)  # pending: real tokens whose K/V are not cached yet
    while len(out.tokens) < max_new_tokens:
        logits = forward_new(model, pending + [mask_id] * (block_size - 1), cache, known)
        if cache is not None:
            cache.lengths += len(pending)  # keep real tokens' K/V only; the masks' fall beyond the length
        window = logits[len(pending) - 1:]  # (B, V): last real token's output, then each mask's
        span = accept(window, tau)[:max_new_tokens - len(out.tokens)]
        stop = next((i for i, t in enumerate(span) if t in stop_ids), None)
        span = span if stop is None else span[:stop + 1]  # drop anything accepted after a stop token
        out.spans.append(span)
        out.tokens += span
        if stop is not None:
            break
        known, pending = known + pending, span
    out.seconds = time.perf_counter() - t0
    return out


def ar_decode(model, prompt, max_new_tokens, stop_ids=(), use_cache=True):
    """Greedy AR decoding: the MARS window with no masks (block_size 1) keeps exactly the argmax of each
    forward. The baseline that MARS at tau = 1 must equal token for token."""
    return mars_decode(model, prompt, max_new_tokens, mask_id=None, block_size=1, tau=1.0,
                       stop_ids=stop_ids, use_cache=use_cache)


def show_spans(tok, spans, color=False):
    """The answer with each forward's accepted tokens marked: alternating background colours on a
    terminal, [brackets] otherwise. Stop tokens are not shown."""
    colors = ("\x1b[43m", "\x1b[46m")  # yellow, cyan backgrounds
    parts = []
    for i, span in enumerate(spans):
        text = "".join(tok.decode_tokens([t for t in span if t not in tok.stop_ids]))
        if text:
            parts.append(f"{colors[i % 2]}{text}\x1b[0m" if color else f"[{text}]")
    return "".join(parts)
