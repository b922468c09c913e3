"""
Decoding many prompts at once: the engine's core (docs/mars.md, "Decoding" and "Caches").

Each row of the batch is one prompt and what has been generated for it. The first cache.lengths[i] of
those tokens are committed (their K/V are in row i's cache); the rest are pending: real tokens whose K/V
are still to be computed (without a cache, every token is pending in every step). One step is one
forward for every row:

    x[i] = [pending tokens | what the strategy feeds]   left-aligned, padded to the widest row,
           written at cache slots (= positions) cache.lengths[i], cache.lengths[i] + 1, ...

The strategy (the Strategy interface below; MARS's own are in strategies.py) decides what is fed after
the pending tokens (MARS: B-1 masks; Jacobi: its guesses; lossless MARS: a draft, then masks), reads the
logits from the last pending token on and says how many tokens each row accepts. Fed tokens follow each
other as a chain unless Fed.parents says they form a tree (each sees only its own ancestors, at the
position of its depth). The core does the rest, the same for every strategy: one forward, commit real
tokens to the cache, cut each row at its stop token or budget, record the accepted span, drop finished
rows (and their rows of the strategy's state). Nothing here knows which strategy it runs.

What is committed is the cache policy's call. PerRequestCache: every real token fed is committed at
once (it was fed with its real id after real tokens only, so its K/V are exactly AR's); no row ever
waits for another. NoCache: nothing is; every step recomputes each row's whole sequence. A policy may also make rows
wait (a baseline's block-level cache, compare/block_cache.py): a waiting row is fed but takes nothing,
and the core puts its rows of the strategy's state back as they were, so no strategy ever sees one. Masks, guesses and padding are
never committed: they sit past the row's length, hidden from every later query by the mask, and are
overwritten. Padding sits after each row's fed tokens, so no real query sees it either.
"""
import time
from dataclasses import dataclass
from typing import NamedTuple, Optional, Protocol

import torch

from .decode import Decoded, check_decode_args
from .masks import decode_mask, tree_window
from .model import KVCache

PAD = 0  # any real id: padding is never attended by a real query


@dataclass
class BatchDecoded:
    rows: list  # one decode.Decoded per prompt; a row's forwards = the forwards in which it accepted tokens
    forwards: int = 0  # model calls for the whole batch
    seconds: float = 0.0
    windows: list = None  # per row: how many proposals each forward that made one of its spans offered

    @property
    def tokens(self):
        return sum(len(r.tokens) for r in self.rows)

    @property
    def tokens_per_forward(self):
        """Generated tokens (up to the stop token) / the forwards that produced them, over all rows."""
        return self.tokens / max(1, sum(r.forwards for r in self.rows))


def splice(a, na, b, nb, skip=0):
    """Per row i: [a[i, skip_i:na_i] | b[i, :nb_i]], left-aligned and padded with PAD.
    a: (n, Pa), b: (n, Pb), na, nb, skip: (n,) or int. Returns (n, W) and the row lengths (n,)."""
    n = a.shape[0]
    skip = torch.as_tensor(skip, device=a.device).expand(n)
    na = na - skip
    out_len = na + nb
    col = torch.arange(max(1, int(out_len.max())), device=a.device)[None]  # (1, W)
    src = torch.cat([a, b, a.new_full((n, 1), PAD)], 1)  # the last column is the pad
    idx = torch.where(col < na[:, None], col + skip[:, None], a.shape[1] + col - na[:, None])
    idx = torch.where(col < out_len[:, None], idx, src.shape[1] - 1)
    return src.gather(1, idx), out_len


def forward_window(model, x, start, n_real, width, cache=None, parents=None, hidden=False):
    """x: (n, W) rows of [real tokens | fed tokens | padding] written from slot start[i] (the row's cache
    length; 0 without a cache). Returns the logits (n, width, V) read from each row's last real token on:
    its output proposes the next token, exactly as AR; the next width-1 are the fed tokens' outputs
    (columns past what a row fed hold whatever follows it: they must not be used).
    parents: None, the fed tokens form a chain (slots are the positions, each token sees its row up to
    itself); or (n, F), they form a tree (masks.tree_window).
    Returns (logits, None), or with hidden=True (logits, the final-norm outputs (n, width, C) they were
    read from)."""
    n, W = x.shape
    slots = start[:, None] + torch.arange(W, device=x.device)  # (n, W)
    if parents is None:  # slots are the positions too; each token sees its own row's slots up to itself
        pos, mask = slots, decode_mask(start, W, int(start.max()) + W)  # mask (n, W, S)
    else:
        pos, mask = tree_window(start, n_real, parents, W, int(start.max()) + W)
    # padding may run past the context; nothing attends it, so its position only has to be legal
    pos = pos.clamp(max=model.config.max_seq_len - 1)
    cols = n_real[:, None] - 1 + torch.arange(width, device=x.device)  # (n, width)
    keep = cols.clamp(0, W - 1)  # logits only there
    if not hidden:
        return model(x, pos, mask, cache, slots, keep=keep), None
    h = model.hidden(x, pos, mask, cache, slots, keep=keep)
    return model.lm_head(h).float(), h


def first_stop(y, n_acc, stop_ids):
    """Cut each row's accepted span after its first stop token: (n_acc (n,), hit (n,) bool).
    stop_ids: a 1-D tensor of ids."""
    j = torch.arange(y.shape[1], device=y.device)
    is_stop = torch.isin(y, stop_ids) & (j < n_acc[:, None])
    hit = is_stop.any(1)
    return torch.where(hit, is_stop.long().argmax(1) + 1, n_acc), hit


class Fed(NamedTuple):
    """What a strategy feeds after each row's pending tokens."""
    tokens: torch.Tensor  # (n, F)
    counts: torch.Tensor  # (n,) how many of them each row feeds
    parents: Optional[torch.Tensor] = None  # (n, F) each fed token's parent (-1: the last pending token)
    # when they form a tree; None: a chain


class Accepted(NamedTuple):
    """What a strategy takes from one forward's logits, per row."""
    tokens: torch.Tensor  # (n, width') the row takes tokens[:accepted]
    accepted: torch.Tensor  # (n,)
    verified: torch.Tensor  # (n,) the first `verified` fed tokens are real tokens it took: their K/V, fed
    # with their real ids after real tokens only, may be committed as they stand
    offered: torch.Tensor  # (n,) the proposals it was offered (recorded per span: BatchDecoded.windows)


class Strategy(Protocol):
    """The interface every decoding strategy implements (MARS's in strategies.py, the peers' in
    compare/). Subclass it to inherit the defaults of `rows` and `reads_hidden`."""
    ahead: int  # how far past a row's known tokens one forward reaches (the context room it needs)
    width: int  # logits columns read per row, from its last pending token on
    rows: tuple = ()  # names of the per-row state attributes (tensors, dim 0 = the rows; or anything
    # with keep_rows, like a KVCache). The engine drops finished rows from them and puts back the rows
    # of rows that waited. A strategy replaces them, it never writes into them in place.
    reads_hidden: bool = False  # accept() also gets the final-norm outputs the logits were read from

    def start(self, eng) -> None:
        """Set up the per-row state for the engine's rows."""

    def feed(self, eng) -> Fed:
        """What each row feeds after its pending tokens."""

    def accept(self, eng, logits, hidden) -> Accepted:
        """logits (n, width, V) from the last pending token on (hidden (n, width, C), or None): what
        each row takes."""


class PerRequestCache:
    """Commit every real token fed, at once: each row's cache grows by its own amount every step."""
    cached, room = True, 0

    def waiting(self, eng):
        return None  # nobody ever waits (a policy that makes rows wait returns (n,) bool)

    def commit(self, eng, n_verified):
        return eng.n_pend + n_verified  # the pending tokens, and fed tokens the strategy verified as real


class NoCache(PerRequestCache):
    """Commit nothing: every forward recomputes each row's whole sequence."""
    cached = False

    def commit(self, eng, n_verified):
        return torch.zeros_like(eng.n_pend)


def cache_policy(cache):
    """None, "request" or a policy object (anything with PerRequestCache's methods) -> the policy."""
    if cache is None or cache == "request":
        return NoCache() if cache is None else PerRequestCache()
    if isinstance(cache, str) or not hasattr(cache, "commit"):
        raise ValueError(f"cache must be None, 'request' or a cache policy object, got {cache!r}")
    return cache


class Engine:
    """Step-wise batched decoder: engine.step() runs one forward for every unfinished row and returns the
    spans it accepted, {row: [ids]}; engine.run() steps to the end and returns the BatchDecoded.
    strategy: a Strategy (strategies.py, or a peer's from compare/); cache: "request" (per-request KV
    caches), None (no cache) or a policy object (compare.block_cache.BlockCache(16))."""

    def __init__(self, model, prompts, max_new_tokens, strategy, stop_ids=(), cache="request"):
        if not prompts:
            raise ValueError("no prompts to decode")
        for prompt in prompts:
            check_decode_args(model, prompt, max_new_tokens, strategy.ahead)
        n, self.dev = len(prompts), model.embed.weight.device
        self.model, self.max_new, self.strategy = model, max_new_tokens, strategy
        self.policy = cache_policy(cache)
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=self.dev)
        self.out = BatchDecoded(rows=[Decoded() for _ in prompts], windows=[[] for _ in prompts])
        L = max(len(p) for p in prompts)
        # per row (n,): the rows still decoding (index into prompts), the pending tokens (n, P) and their
        # count, the tokens generated so far
        self.active = torch.arange(n, device=self.dev)
        self.pending = torch.tensor([list(p) + [PAD] * (L - len(p)) for p in prompts], device=self.dev)
        self.n_pend = torch.tensor([len(p) for p in prompts], device=self.dev)
        self.generated = torch.zeros_like(self.n_pend)
        size = L + max_new_tokens + strategy.ahead + strategy.width + self.policy.room  # + fed, padding
        with torch.inference_mode():  # like every tensor step() makes: a compiled model sees one kind
            self.cache = KVCache(model.config, n, size, self.dev, model.embed.weight.dtype) \
                if self.policy.cached else None
        strategy.start(self)
        self.t0 = time.perf_counter()

    @property
    def done(self):
        return len(self.active) == 0

    @property
    def start(self):
        """(n,) each row's first slot this step: its committed tokens (0 without a cache)."""
        return self.cache.lengths if self.cache is not None else torch.zeros_like(self.n_pend)

    @property
    def known(self):
        """(n,) tokens each row knows: its prompt and what it has generated, committed or pending."""
        return self.start + self.n_pend

    @torch.inference_mode()
    def step(self):
        """One forward for every active row; returns the spans it accepted as {row: [ids]}."""
        if self.done:
            return {}
        s = self.strategy
        waiting = self.policy.waiting(self)  # None, or (n,) bool: rows that take nothing this step
        fed = s.feed(self)
        x, _ = splice(self.pending, self.n_pend, fed.tokens, fed.counts)  # (n, W)
        logits, hidden = forward_window(self.model, x, self.start, self.n_pend, s.width, self.cache,
                                        fed.parents, s.reads_hidden)
        self.out.forwards += 1
        before = {name: getattr(s, name) for name in s.rows} if waiting is not None else None
        y, n_acc, n_verified, offered = s.accept(self, logits, hidden)  # (n, width'), (n,) x3
        if waiting is not None:  # a waiting row takes nothing and keeps its state
            self.put_back(before, waiting)
            n_acc = torch.where(waiting, 0, n_acc)
        return self.take(y, n_acc, n_verified, offered)

    def take(self, y, n_acc, n_verified, offered):
        """Each row takes y[:n_acc], cut after its first stop token and at the budget: its output, the
        cache's commit and its pending tokens; finished rows leave. Returns the spans, {row: [ids]}."""
        n_acc = torch.minimum(n_acc, self.max_new - self.generated)
        n_acc, hit = first_stop(y, n_acc, self.stop_ids)
        finished = hit | (self.generated + n_acc >= self.max_new)
        commit = self.policy.commit(self, torch.minimum(n_verified, n_acc))
        if self.cache is not None:
            self.cache.advance(commit)  # real tokens only; the rest falls beyond the length
        self.pending, self.n_pend = splice(self.pending, self.n_pend, y, n_acc, skip=commit)
        self.generated = self.generated + n_acc
        spans, any_finished = self.record(y, n_acc, offered, finished)
        if any_finished:
            self.drop(~finished)
        return spans

    def record(self, y, n_acc, offered, finished):
        """Append each row's accepted tokens y[:n_acc] (and how many proposals the forward offered it) to
        the output, with one copy to the host. Returns ({row: span}, whether any row finished)."""
        spans, any_finished = {}, False
        host = torch.cat([self.active[:, None], n_acc[:, None], offered[:, None], finished[:, None], y], 1)
        for row, k, w, fin, *ys in host.tolist():
            any_finished |= bool(fin)
            if k:
                spans[row] = ys[:k]
                self.out.rows[row].spans.append(ys[:k])
                self.out.rows[row].tokens += ys[:k]
                self.out.windows[row].append(w)
        self.out.seconds = time.perf_counter() - self.t0
        return spans, any_finished

    def put_back(self, before, waiting):
        """The strategy's rows of the rows that waited go back to what they were before accept(). A state
        that grew along dim 1 (known tokens, left-aligned) is padded to its new width; every other shape
        stays as it was."""
        for name, old in before.items():
            new = getattr(self.strategy, name)
            if isinstance(old, torch.Tensor):
                if old.dim() > 1 and old.shape[1] != new.shape[1]:  # wider rows hold only PAD past the old
                    old = torch.nn.functional.pad(old, (0, new.shape[1] - old.shape[1]), value=PAD)
                setattr(self.strategy, name, torch.where(waiting.view(-1, *[1] * (old.dim() - 1)), old, new))

    def drop(self, keep):
        """Finished rows leave the batch: the core's per-row tensors, the cache rows and the strategy's."""
        self.active, self.pending, self.n_pend = self.active[keep], self.pending[keep], self.n_pend[keep]
        self.generated = self.generated[keep]
        if self.cache is not None:
            self.cache.keep_rows(keep)
        for name in self.strategy.rows:
            state = getattr(self.strategy, name)
            if isinstance(state, torch.Tensor):
                setattr(self.strategy, name, state[keep])
            elif state is not None:
                state.keep_rows(keep)  # e.g. a draft model's own KVCache

    def set_tau(self, row, tau):
        """Change prompt `row`'s threshold from the next step on (MARS's gate; any strategy with set_tau)."""
        if not hasattr(self.strategy, "set_tau"):
            raise ValueError(f"{type(self.strategy).__name__} has no tau: only MARS's gate has one")
        self.strategy.set_tau(row, tau)

    def run(self, on_step=None):
        """Step until every row is finished. on_step(engine, spans) is called after each step (it may
        call engine.set_tau). Returns the BatchDecoded."""
        while not self.done:
            spans = self.step()
            if on_step is not None:
                on_step(self, spans)
        for r in self.out.rows:
            r.seconds = self.out.seconds
        return self.out
