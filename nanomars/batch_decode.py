"""
Decoding a batch of prompts of any lengths at once, each row accepting its own number of tokens per
forward (docs/mars.md, "Decoding" and "Caches"). One engine, one step:

    every row feeds [its pending tokens | B-1 window tokens], left-aligned and padded to the step's width,
    at cache slots (= positions) starting from its own cache length; the mask is decode_mask(lengths, ...)

Pending tokens are real tokens whose K/V are not committed to the cache yet (the whole sequence without a
cache). Window tokens are MASKs for MARS, the current guesses for Jacobi. What differs between the
strategies is only how many pending tokens each step commits (advances the row's cache length over):
- cache=None:      nothing; every step recomputes every row's whole sequence.
- cache="request": everything fed, every step: per-request caches, no row ever waits for another.
- cache="block":   the paper's block-level cache (Table 5): the prompt, then B_cache (cache_block) tokens
                   per row at once, when every row holds that many; a row that has filled the block waits
                   (it is fed, but accepts nothing). The commit rides on the next forward: no extra call.
Window tokens and padding are never committed: they sit beyond the row's length, hidden from every later
query by the mask and overwritten. Padding sits after each row's window, so no real query sees it either.
Finished rows (stop token or budget) leave the batch, cache rows included.
AR is the same engine with B = 1 (no window); tau can differ per row and change between steps.

Lossless MARS (lossless=True): MARS drafts for itself and AR verifies, so the output is AR's (greedy: token
for token; sampled: in distribution) for any model. Each row feeds [pending | draft | B-1 masks]; the draft
is the masks' proposals from the row's previous forward, or nothing. Attention is causal and the masks come
last, so the outputs at the last pending token and at the draft tokens are AR's own predictions for the
draft's positions and one more: the row keeps the draft's verified prefix plus AR's next token
(decode.verify_draft). After a fully kept draft the masks' proposals of this forward, which saw all of it,
are the next draft; after a rejection the next forward drafts afresh. The kept draft tokens were fed with
their real ids after the pending ones, so with cache="request" their K/V are committed as they stand and
only AR's own token is left pending; the other strategies recompute them like any pending token.
"""
import time
from dataclasses import dataclass

import torch

from .decode import (Decoded, check_decode_args, check_tau, gate, n_accepted, propose, sample, sampling_dist,
                     verify_draft)
from .masks import decode_mask
from .model import KVCache

PAD = 0  # any real id: padding is never attended by a real query


@dataclass
class BatchDecoded:
    rows: list  # one decode.Decoded per prompt; a row's forwards = the forwards in which it accepted tokens
    forwards: int = 0  # model calls for the whole batch
    seconds: float = 0.0

    @property
    def tokens(self):
        return sum(len(r.tokens) for r in self.rows)

    @property
    def tokens_per_forward(self):
        """The paper's count, per row: generated tokens / forwards that produced them, over all rows."""
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


def forward_windows(model, x, start, n_real, B, cache=None):
    """x: (n, W) rows of [real tokens | window | padding] written from slot start[i] (the row's cache
    length; 0 without a cache). Returns the logits (n, B, V) of each row's window: the last real token's
    output (it proposes the next token, exactly as AR) and the outputs of the B-1 window tokens (a row
    whose window is shorter than B-1 gets its last column repeated past its end)."""
    n, W = x.shape
    slots = start[:, None] + torch.arange(W, device=x.device)  # (n, W): slots are the positions too
    mask = decode_mask(start, W, int(start.max()) + W)  # (n, W, S): own row's slots up to itself
    # padding may run past the context; nothing attends it, so its position only has to be legal
    pos = slots.clamp(max=model.config.max_seq_len - 1)
    logits = model(x, pos, mask, cache, slots)  # (n, W, V)
    cols = (n_real[:, None] - 1 + torch.arange(B, device=x.device)).clamp(max=W - 1)  # (n, B)
    return logits.gather(1, cols[..., None].expand(n, B, logits.shape[-1]))


def first_stop(y, n_acc, stop_ids):
    """Cut each row's accepted span after its first stop token: (n_acc (n,), hit (n,) bool).
    stop_ids: a 1-D tensor of ids."""
    j = torch.arange(y.shape[1], device=y.device)
    is_stop = torch.isin(y, stop_ids) & (j < n_acc[:, None])
    hit = is_stop.any(1)
    return torch.where(hit, is_stop.long().argmax(1) + 1, n_acc), hit


class BatchEngine:
    """Step-wise batched decoder. engine.tau[row] = x between steps changes that row's threshold.
    cache: None | "request" | "block"; jacobi: verify guesses instead of MARS masks (exact for greedy);
    lossless: MARS drafts, AR verifies (exactly AR for greedy and sampling; tau and metric unused)."""

    def __init__(self, model, prompts, max_new_tokens, mask_id=None, block_size=4, tau=0.95, stop_ids=(),
                 cache="request", cache_block=16, metric="prob", temperature=0.0, top_k=None, seed=None,
                 jacobi=False, lossless=False):
        if cache not in (None, "request", "block"):
            raise ValueError(f"cache must be None, 'request' or 'block', got {cache!r}")
        if jacobi and lossless:
            raise ValueError("choose one of jacobi and lossless")
        if block_size > 1 and mask_id is None and not jacobi:
            raise ValueError("MARS decoding (block_size > 1) needs the mask token id")
        if cache == "block" and cache_block < 1:
            raise ValueError(f"cache_block must be >= 1, got {cache_block}")
        if temperature < 0 or (top_k is not None and top_k < 1):
            raise ValueError(f"need temperature >= 0 (0 = greedy) and top_k >= 1, got {temperature}, {top_k}")
        if not prompts:
            raise ValueError("no prompts to decode")
        for prompt in prompts:
            check_decode_args(model, prompt, max_new_tokens, block_size, 1.0, metric)
        n, self.dev = len(prompts), model.embed.weight.device
        self.model, self.B, self.max_new = model, block_size, max_new_tokens
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=self.dev)
        self.mask_id = PAD if mask_id is None else mask_id  # None: AR or Jacobi, no masks fed
        self.strategy, self.cache_block, self.metric = cache, cache_block, metric
        self.temperature, self.top_k, self.jacobi, self.lossless = temperature, top_k, jacobi, lossless
        self.gen = torch.Generator(self.dev).manual_seed(seed) if seed is not None else None
        self.tau = torch.tensor([float(tau)] * n if isinstance(tau, (int, float)) else [float(t) for t in tau])
        if len(self.tau) != n:
            raise ValueError(f"got {len(self.tau)} taus for {n} prompts")
        check_tau(self.tau, metric)
        self.out = BatchDecoded(rows=[Decoded() for _ in prompts])
        with torch.inference_mode():
            L = max(len(p) for p in prompts)
            lens = torch.tensor([len(p) for p in prompts], device=self.dev)
            padded = torch.tensor([list(p) + [PAD] * (L - len(p)) for p in prompts], device=self.dev)  # (n, L)
            # per row (n,): the rows still decoding (index into prompts), pending tokens and their count,
            # tokens generated so far; Jacobi's current guesses (n, B-1) start as any token; lossless: the
            # draft (n, B-1), how much of it is real (n,) (B-1 or 0: none yet) and, when sampling, the
            # distributions (n, B-1, V) it was drawn from
            self.active = torch.arange(n, device=self.dev)
            self.pending, self.n_pend, self.generated = padded, lens, torch.zeros_like(lens)
            self.guesses = torch.full((n, block_size - 1), PAD, device=self.dev)
            self.draft, self.n_draft = self.guesses.clone(), torch.zeros_like(lens)
            self.draft_q = torch.zeros(n, block_size - 1, model.config.vocab_size, device=self.dev) \
                if lossless and temperature > 0 else None
            # window (+ draft) + padding room
            extra = (3 if lossless else 2) * block_size + (cache_block if cache == "block" else 0)
            self.cache = KVCache(model.config, n, L + max_new_tokens + extra, self.dev,
                                 model.embed.weight.dtype) if cache else None
        self.t0 = time.perf_counter()

    @property
    def done(self):
        return len(self.active) == 0

    def schedule(self, first):
        """(commit (n,), waiting (n,) bool): how many pending tokens each row commits to its cache after
        this step's forward (all of them are fed by it), and which rows sit this step out."""
        none, nobody = torch.zeros_like(self.n_pend), torch.zeros_like(self.n_pend, dtype=torch.bool)
        if self.cache is None:
            return none, nobody
        if self.strategy == "request" or first:  # every cached strategy commits the prompt
            return self.n_pend, nobody
        filled = self.n_pend >= self.cache_block  # rows holding a whole block of uncommitted tokens
        if filled.all():  # the last row filled it: commit the block everywhere, and everyone goes on
            return torch.full_like(self.n_pend, self.cache_block), nobody
        return none, filled

    @torch.inference_mode()
    def step(self):
        """One forward for every active row; returns the spans it accepted as {row: [ids]}."""
        if self.done:
            return {}
        check_tau(self.tau, self.metric)  # engine.tau may have been changed between steps
        n, B, first = len(self.active), self.B, self.out.forwards == 0
        window = self.guesses if self.jacobi else self.pending.new_full((n, B - 1), self.mask_id)
        x, n_fed = self.pending, self.n_pend
        if self.lossless:  # the draft goes between the pending tokens and the masks
            x, n_fed = splice(x, n_fed, self.draft, self.n_draft)
        x, _ = splice(x, n_fed, window, torch.full_like(self.n_pend, B - 1))  # (n, W)
        start = self.cache.lengths if self.cache is not None else torch.zeros_like(self.n_pend)
        width = 2 * B - 1 if self.lossless else B  # lossless: AR's outputs at the draft, then the masks'
        logits = forward_windows(self.model, x, start, self.n_pend, width, self.cache)  # (n, width, V)
        self.out.forwards += 1

        if self.lossless:
            y, n_kept, proposal = self.verify(logits)
            n_acc = n_kept + 1  # the kept draft tokens, then AR's own
        else:
            y, p = propose(logits, self.temperature, self.top_k, self.gen)  # (n, B), (n, B, V)
            if self.jacobi:  # y_j is exact iff every guess before it matched: the converged prefix
                ok = torch.cat([torch.ones_like(y[:, :1], dtype=torch.bool), window == y[:, :-1]], 1)
            else:
                ok = gate(p, y, self.tau.to(self.dev)[self.active][:, None], self.metric)
            n_acc = n_accepted(ok)
        commit, waiting = self.schedule(first)
        n_acc = torch.minimum(n_acc, self.max_new - self.generated)  # (n,)
        n_acc, hit = first_stop(y, torch.where(waiting, 0, n_acc), self.stop_ids)
        finished = hit | (self.generated + n_acc >= self.max_new)
        if self.lossless:
            self.next_draft(n_kept, waiting, *proposal)
            if self.strategy == "request":  # the kept draft tokens' K/V are right: commit them as well
                commit = commit + torch.minimum(n_kept, n_acc)

        if self.cache is not None:
            self.cache.lengths += commit  # real tokens only; the window's K/V fall beyond the length
        self.pending, self.n_pend = splice(self.pending, self.n_pend, y, n_acc, skip=commit)
        self.generated = self.generated + n_acc
        if self.jacobi:  # next guesses: the unverified outputs, shifted past the accepted ones
            cols = (n_acc[:, None] + torch.arange(B - 1, device=self.dev)).clamp(max=B - 1)
            self.guesses = y.gather(1, cols)

        spans, any_finished = {}, False
        host = torch.cat([self.active[:, None], n_acc[:, None], finished[:, None], y], 1).tolist()  # one copy
        for row, k, fin, *ys in host:
            any_finished |= bool(fin)
            if k:
                spans[row] = ys[:k]
                self.out.rows[row].spans.append(ys[:k])
                self.out.rows[row].tokens += ys[:k]
        if any_finished:
            self.drop(~finished)
        self.out.seconds = time.perf_counter() - self.t0
        return spans

    def verify(self, logits):
        """Lossless step from the logits (n, 2B-1, V) read from each row's last pending token on: AR's
        outputs for the draft's positions and one more (columns 0..n_draft), then the masks' (columns
        n_draft+1 .. n_draft+B-1). Returns y (n, B) of which y[:n_kept+1] are taken, n_kept (n,) (how
        many draft tokens passed) and the masks' proposals: tokens (n, B-1) and, when sampling, the
        distributions (n, B-1, V) they were drawn from."""
        B = self.B
        y, n_kept = verify_draft(self.draft, self.n_draft, logits[:, :B], self.draft_q, self.temperature,
                                 self.top_k, self.gen)
        cols = self.n_draft[:, None] + 1 + torch.arange(B - 1, device=self.dev)  # (n, B-1)
        masks = logits.gather(1, cols[..., None].expand(-1, -1, logits.shape[-1]))  # (n, B-1, V)
        if self.temperature == 0:
            return y, n_kept, (propose(masks)[0], None)
        q = sampling_dist(masks, self.temperature, self.top_k)
        return y, n_kept, (sample(q, self.gen), q)

    def next_draft(self, n_kept, waiting, proposal, proposal_q):
        """After a fully kept draft (or none) the masks' proposals are the next one; after a rejection
        there is none. A waiting row (block cache) took nothing and keeps its draft."""
        full = n_kept == self.n_draft
        self.draft = torch.where(waiting[:, None], self.draft, proposal)
        self.n_draft = torch.where(waiting, self.n_draft, torch.where(full, self.B - 1, 0))
        if self.draft_q is not None:
            self.draft_q = torch.where(waiting[:, None, None], self.draft_q, proposal_q)

    def drop(self, keep):
        """Finished rows leave the batch: every per-row tensor and the cache rows are compacted."""
        self.active, self.pending, self.n_pend = self.active[keep], self.pending[keep], self.n_pend[keep]
        self.generated, self.guesses = self.generated[keep], self.guesses[keep]
        self.draft, self.n_draft = self.draft[keep], self.n_draft[keep]
        if self.draft_q is not None:
            self.draft_q = self.draft_q[keep]
        if self.cache is not None:
            c = self.cache
            c.k, c.v, c.lengths = c.k[:, keep], c.v[:, keep], c.lengths[keep]

    def run(self, on_step=None):
        """Step until every row is finished. on_step(engine, spans) is called after each step (it may
        change engine.tau). Returns the BatchDecoded."""
        while not self.done:
            spans = self.step()
            if on_step is not None:
                on_step(self, spans)
        for r in self.out.rows:
            r.seconds = self.out.seconds
        return self.out


def batch_decode(model, prompts, max_new_tokens, mask_id, block_size=4, tau=0.95, stop_ids=(), **kw):
    """Batched MARS. tau: one float or one per prompt. kw: cache, cache_block, metric, temperature,
    top_k, seed (see BatchEngine)."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, block_size, tau, stop_ids, **kw).run()


def batch_ar(model, prompts, max_new_tokens, stop_ids=(), cache="request", **kw):
    """Batched AR (greedy, or sampled with temperature/top_k/seed): the MARS engine with no window."""
    return BatchEngine(model, prompts, max_new_tokens, None, 1, 1.0, stop_ids, cache, **kw).run()


def batch_lossless(model, prompts, max_new_tokens, mask_id, block_size=4, stop_ids=(), cache="request", **kw):
    """Lossless MARS: the masks draft, AR verifies (speculative decoding with the model as its own drafter).
    Greedy: exactly greedy AR's tokens for any model; sampled (temperature, top_k, seed): distributed
    exactly as AR sampling. kw: cache_block, temperature, top_k, seed (see BatchEngine)."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, block_size, 1.0, stop_ids, cache,
                       lossless=True, **kw).run()


def batch_jacobi(model, prompts, max_new_tokens, window=4, stop_ids=(), cache="request"):
    """Jacobi decoding of an AR model: each forward checks a window of guesses, accepts the converged
    prefix and takes the rest of its outputs as the next guesses. Exactly greedy AR's tokens."""
    return BatchEngine(model, prompts, max_new_tokens, None, window, 1.0, stop_ids, cache, jacobi=True).run()
