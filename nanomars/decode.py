"""
Decoding one sequence (docs/mars.md, "Decoding" and "Caches"). Read top to bottom:
1. the acceptance rule: next_tokens, propose, gate, n_accepted, accept;
2. mars_decode_plain: the whole MARS decoder without a cache. Known tokens x_0..x_{c-1}; one forward over
   [x_0..x_{c-1}, MASK x (B-1)] under a plain causal mask; the output at x_{c-1} proposes x_c (exactly AR's
   prediction), the output at mask i proposes x_{c+1+i}. Accept y_0 always, then y_1, y_2, ... in order
   while their probability >= tau;
3. mars_decode: the same with the KV cache (model.KVCache). Only real tokens' K/V are kept: each step
   feeds [tokens accepted last step | B-1 masks] and advances the cache length over the real tokens
   only, so the masks' K/V sit beyond the length (hidden, overwritten next step) and every accepted token
   is recomputed with its real id; ar_decode, the AR baseline, feeds no masks and takes the argmax;
4. lossless MARS (lossless_decode): the masks' proposals are only a draft, fed as real tokens by the
   next forward, whose outputs at them are AR's own predictions; the draft's prefix AR agrees with is
   kept (speculative decoding, verify_draft), so the output is AR's for any model.
The batched engine (engine.py, strategies.py) runs the same rules for many prompts at once.
"""
import html
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
    V = model.config.vocab_size
    bad = next((t for t in prompt if not 0 <= t < V), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the model's vocabulary of {V} ids (0..{V - 1}): encode "
                         "the prompt with the model's own tokenizer")
    need, ctx = len(prompt) + max_new_tokens + block_size - 1, model.config.max_seq_len
    if need > ctx:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + block_size-1 "
                         f"({block_size - 1}) = {need} exceeds the model context of {ctx} tokens: shorten "
                         "the prompt or lower max_new_tokens")


def sampling_dist(logits, temperature, top_k=None):
    """(..., V) the distribution sampling draws from: softmax(logits / temperature) over the top_k
    tokens (every token tied with the k-th largest logit included), renormalised."""
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1)


def sample(dist, generator=None):
    """One token per distribution: dist (..., V) -> (...,)."""
    return torch.multinomial(dist.flatten(0, -2), 1, generator=generator).view(dist.shape[:-1])


def next_tokens(logits, temperature=0.0, top_k=None, generator=None):
    """The tokens decoding takes from logits (..., V) -> (...,): the argmax (temperature 0, greedy), or a
    sample of softmax(logits / temperature) over the top_k tokens."""
    if temperature == 0:  # max(-1) gives argmax's index (the first maximal one), 2-3x faster on a CPU
        return logits.max(-1).indices
    return sample(sampling_dist(logits, temperature, top_k), generator)


def propose(logits, temperature=0.0, top_k=None, generator=None):
    """Proposals y (..., B) and the distributions p (..., B, V) that gate them, from a window's logits
    (..., B, V): y = next_tokens(logits), p = softmax(logits / temperature) (temperature 0: softmax(logits)).
    The gate reads the untruncated p (renormalised over the top_k tokens, every top-1 proposal would look
    certain)."""
    p = (logits.float() / (temperature or 1.0)).softmax(-1)
    return next_tokens(logits, temperature, top_k, generator), p


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


def cut(span, budget, stop_ids):
    """An accepted span cut to the token budget and after its first stop token: (span, stopped)."""
    span = span[:budget]
    stop = next((i for i, t in enumerate(span) if t in stop_ids), None)
    return (span, False) if stop is None else (span[:stop + 1], True)


@torch.no_grad()
def mars_decode_plain(model, prompt, max_new_tokens, mask_id, block_size=4, tau=0.95, stop_ids=()):
    """The whole MARS decoder, no cache: every forward recomputes [prompt + answer so far | B-1 masks].
    Slow (each forward redoes everything) but plain; the cached and batched decoders are tested to give
    exactly its tokens and spans."""
    check_decode_args(model, prompt, max_new_tokens, block_size, tau)
    t0, out, dev = time.perf_counter(), Decoded(), model.embed.weight.device
    known = list(prompt)
    while len(out.tokens) < max_new_tokens:
        x = torch.tensor([known + [mask_id] * (block_size - 1)], device=dev)  # (1, T)
        T = x.shape[1]
        # logits only for the window (B, V): the last real token's output, then each mask's
        window = model(x, torch.arange(T, device=dev)[None], causal_mask(T, device=dev),
                       keep=slice(len(known) - 1, None))[0]
        span, stopped = cut(accept(window, tau), max_new_tokens - len(out.tokens), stop_ids)
        out.spans.append(span)
        out.tokens += span
        known += span
        if stopped:
            break
    out.seconds = time.perf_counter() - t0
    return out

# -----------------------------------------------------------------------------
# with the KV cache


@torch.no_grad()
def mars_decode(model, prompt, max_new_tokens, mask_id, block_size=4, tau=0.95, stop_ids=()):
    """mars_decode_plain with a KV cache: the same tokens and spans, each forward computing only the new
    tokens."""
    check_decode_args(model, prompt, max_new_tokens, block_size, tau)
    t0, out, dev = time.perf_counter(), Decoded(), model.embed.weight.device
    cache = KVCache(model.config, 1, len(prompt) + max_new_tokens + block_size - 1, dev, model.embed.weight.dtype)
    pending = list(prompt)  # real tokens whose K/V are not cached yet
    while len(out.tokens) < max_new_tokens:
        fed = pending + [mask_id] * (block_size - 1)
        start = cache.lengths  # (1,) slots already holding real tokens
        slots = start[:, None] + torch.arange(len(fed), device=dev)[None]  # (1, T): also the positions
        mask = decode_mask(start, len(fed), int(start[0]) + len(fed))  # (1, T, S): the cache + itself
        # logits only for the window (B, V): the last real token's output, then each mask's
        window = model(torch.tensor([fed], device=dev), slots, mask, cache, slots,
                       keep=slice(len(pending) - 1, None))[0]
        cache.advance(len(pending))  # keep real tokens' K/V only; the masks' fall beyond the length
        span, stopped = cut(accept(window, tau), max_new_tokens - len(out.tokens), stop_ids)
        out.spans.append(span)
        out.tokens += span
        pending = span
        if stopped:
            break
    out.seconds = time.perf_counter() - t0
    return out


@torch.no_grad()
def ar_decode(model, prompt, max_new_tokens, stop_ids=(), use_cache=True):
    """Greedy AR, the baseline (the engine's strategies.AR for one sequence): one forward per token, which
    takes next_tokens' argmax. MARS at tau = 1 must equal it token for token. use_cache=False recomputes
    the whole sequence every forward."""
    check_decode_args(model, prompt, max_new_tokens)
    t0, out, dev = time.perf_counter(), Decoded(), model.embed.weight.device
    cache = KVCache(model.config, 1, len(prompt) + max_new_tokens, dev, model.embed.weight.dtype) if use_cache else None
    known, n_cached = list(prompt), 0  # every token so far; those whose K/V the cache holds
    while len(out.tokens) < max_new_tokens:
        fed = known[n_cached:]
        slots = n_cached + torch.arange(len(fed), device=dev)[None]  # (1, T): also the positions
        mask = decode_mask(torch.tensor([n_cached], device=dev), len(fed), len(known))
        logits = model(torch.tensor([fed], device=dev), slots, mask, cache, slots, keep=slice(-1, None))[0, 0]
        if use_cache:
            cache.advance(len(fed))
            n_cached = len(known)
        span, stopped = cut([int(next_tokens(logits))], 1, stop_ids)
        out.spans.append(span)
        out.tokens += span
        known += span
        if stopped:
            break
    out.seconds = time.perf_counter() - t0
    return out

# -----------------------------------------------------------------------------
# lossless MARS: verifying a draft


def verify_draft(draft, n_draft, logits, q=None, temperature=0.0, top_k=None, generator=None):
    """Lossless acceptance of a drafted continuation: speculative decoding with AR as the target.
    draft (..., D): tokens proposed for the next D positions, of which the first n_draft (...,) are real;
    logits (..., D+1, V): AR's logits for those D positions and the one after (the outputs at the last
    known token and at each draft token); q (..., D, V): the distributions the draft was sampled from
    (sampling only). Returns y (..., D+1) and a (...,): the output is y[:a+1], the first a draft tokens
    and then one token of AR's own (the replacement of draft token a, or the bonus after a fully kept
    draft), so at least one token per call.
    Greedy: a draft token is kept while it equals AR's argmax, so y = AR's argmax and the output is
    exactly greedy AR's. Sampling: draft token x at position j is kept with probability
    min(1, p_j(x) / q_j(x)) (p = AR's sampling_dist); the first rejected one is replaced by a sample of
    max(0, p_j - q_j) renormalised; after a fully kept draft the bonus is sampled from p. Each output
    token is then distributed exactly as AR sampling's, whatever q is."""
    D = draft.shape[-1]
    real = torch.arange(D, device=draft.device) < n_draft[..., None]  # (..., D)
    if temperature == 0:
        y = next_tokens(logits)  # the very argmax AR decoding takes
        return y, (real & (draft == y[..., :D])).long().cumprod(-1).sum(-1)
    p = sampling_dist(logits, temperature, top_k)  # (..., D+1, V)
    px = p[..., :D, :].gather(-1, draft[..., None])[..., 0]
    qx = q.gather(-1, draft[..., None])[..., 0]  # > 0: x was sampled from q
    u = torch.rand(px.shape, device=px.device, generator=generator)
    a = (real & (u * qx < px)).long().cumprod(-1).sum(-1)  # P(u < p/q) = min(1, p/q)
    # the distribution of token a: the residual max(0, p_a - q_a); q_a = 0 past the draft, leaving p_a
    q = torch.cat([q * real[..., None], q.new_zeros(*q.shape[:-2], 1, q.shape[-1])], -2)  # (..., D+1, V)
    at = a[..., None, None].expand(*a.shape, 1, p.shape[-1])
    p_a, q_a = p.gather(-2, at)[..., 0, :], q.gather(-2, at)[..., 0, :]
    resid = (p_a - q_a).clamp_min(0)
    resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p_a)  # p_a == q_a: rejection impossible
    y = torch.cat([draft, draft.new_zeros(*draft.shape[:-1], 1)], -1)  # (..., D+1)
    y = y.scatter(-1, a[..., None], sample(resid, generator)[..., None])
    return y, a


@torch.no_grad()
def lossless_decode(model, prompt, max_new_tokens, mask_id, block_size=4, stop_ids=(), use_cache=True):
    """Lossless MARS, greedy: each forward feeds [pending | draft | B-1 masks]. Causal attention and masks
    last make the outputs at the last pending token and at the draft AR's own predictions for the
    draft's positions and one more: keep the draft's prefix that equals them, then AR's next token. After
    a fully kept draft (or none) this forward's mask proposals, which saw all of it, are the next draft;
    after a rejection the next forward drafts afresh. Exactly greedy AR's tokens for any model.
    With the cache the kept draft tokens' K/V are committed as they stand (fed with their real ids)."""
    check_decode_args(model, prompt, max_new_tokens, block_size)
    t0, out, dev = time.perf_counter(), Decoded(), model.embed.weight.device
    cache = KVCache(model.config, 1, len(prompt) + max_new_tokens + 2 * block_size, dev,
                    model.embed.weight.dtype) if use_cache else None
    pending, draft = list(prompt), []  # pending: real tokens not in the cache (all of them without one)
    while len(out.tokens) < max_new_tokens:
        fed = pending + draft + [mask_id] * (block_size - 1)
        start = cache.lengths if use_cache else torch.zeros(1, dtype=torch.long, device=dev)  # (1,)
        slots = start[:, None] + torch.arange(len(fed), device=dev)[None]  # (1, T): also the positions
        mask = decode_mask(start, len(fed), int(start[0]) + len(fed))
        # (D + B, V): AR's outputs for the D draft positions and one more, then the masks'
        logits = model(torch.tensor([fed], device=dev), slots, mask, cache, slots,
                       keep=slice(len(pending) - 1, None))[0]
        D = len(draft)
        y, kept = verify_draft(torch.tensor(draft, dtype=torch.long, device=dev), torch.tensor(D, device=dev),
                               logits[:D + 1])  # AR's tokens (D+1,), how many of the draft it agrees with
        y, kept = y.tolist(), int(kept)
        span = draft[:kept] + [y[kept]]
        draft = next_tokens(logits[D + 1:]).tolist() if kept == D else []  # the masks' proposals
        if use_cache:
            cache.advance(len(pending) + kept)
            pending = [y[kept]]
        else:
            pending = pending + span
        span, stopped = cut(span, max_new_tokens - len(out.tokens), stop_ids)
        out.spans.append(span)
        out.tokens += span
        if stopped:
            break
    out.seconds = time.perf_counter() - t0
    return out


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


class Spans:
    """A decoded answer that Jupyter draws with each forward's accepted tokens on alternating colours (a
    cell that ends with Spans(tok, row.spans) shows it); print() gives show_spans' [brackets]."""
    colors = ("#ffe08a", "#9be7f0")  # the terminal's yellow and cyan

    def __init__(self, tok, spans):
        self.tok, self.spans = tok, spans

    def __str__(self):
        return show_spans(self.tok, self.spans)

    __repr__ = __str__  # what a text-only view of a notebook shows

    def _repr_html_(self):
        cells = []
        for i, span in enumerate(self.spans):
            text = "".join(self.tok.decode_tokens([t for t in span if t not in self.tok.stop_ids]))
            if text:
                cells.append(f'<span style="background:{self.colors[i % 2]};white-space:pre">'
                             f"{html.escape(text)}</span>")
        return '<span style="font-family:monospace;color:#000">' + "".join(cells) + "</span>"
