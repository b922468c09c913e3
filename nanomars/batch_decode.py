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

Per-row windows. A row's window is w proposals (the last real token's, then one per mask: w-1 masks); the
plain window is w = B for every row and every forward. Each row feeds its own number of masks (splice takes
per-row lengths) and proposals past a row's window are never accepted (they fail the gate by construction).
Three options use this (MARS only, not with jacobi or lossless):
- align=True (aligned windows). Training counts blocks from position 0 (block k = positions kB..kB+B-1);
  a noisy token of block k sees the real text of blocks < k and its own block's tokens up to itself: real
  where they are prompt tokens, masks where they are response tokens. So in training a mask never sees a
  mask of an EARLIER block. With c known tokens (prompt + answer so far, positions 0..c-1) the plain window
  puts masks at positions c..c+B-2, which can run into block c//B + 1: those masks would see the masks
  of block c//B before them, a context training never shows. The aligned window keeps only the masks at
  positions p with p // B == c // B:
      masks m = min(B-1, B - c % B),  proposals w = m + 1 = min(B, B - c % B + 1),
  proposing the tokens at positions c .. c+m. Every mask then sees a context training shows: real
  tokens, then masks of its own block only (as the noisy tokens of the block in which the prompt ends
  see: the prompt's real tokens, then masks). The last mask of block
  c//B, at position B(c//B)+B-1, proposes position B(c//B+1), the first of the next block: that is its
  training target (distance B+1 from the block start, trained, otherwise unused by decoding). The
  window is full (w = B) when c % B is 0 or 1 and shrinks to w = 2 at c % B = B-1 (one mask).
- adaptive=True (adaptive windows, the paper's open question of a dynamic block size). A model trained at
  B decodes with a per-row window w in [2, B] (w in [1, 1] when B = 1), starting at w = B. After each
  forward in which the row took tokens: it accepted all w proposals -> w = min(B, w + 1) (the window was
  the limit: offer one more); it accepted fewer than half (2 * accepted < w) -> w = max(2, w - 1) (the
  masks at the end are wasted work: feed one fewer); otherwise w stays. w never drops below 2, so one
  mask is always there to show when the text gets easy again. Causal attention makes proposal j
  independent of the masks after it, so a smaller window accepts min(w, what the full window would);
  it saves the compute of the masks it does not feed, never raises tokens/forward. A forward in which
  the row waits (block cache) leaves w as it is.
- cache="paper_block": the paper's released block-level cache sampler (MARSBlockCachedSampler), below.
BatchDecoded.windows[row][f] records the w offered in the forward that produced rows[row].spans[f].

cache="paper_block" (the released sampler, faithfully; cache_block = B_cache, its "block_size"):
- the first forward is the prompt alone (prefill): it commits the prompt and keeps the output at the
  last prompt token, which proposes the first token of the first block;
- the answer is cut into blocks of B_cache tokens counted from each row's FIRST GENERATED position (as in
  the released code, which appends blocks of block_size to the prompts; not from position 0); the last
  block is cut at the token budget. All rows work on the same block index;
- window = the REST of the current block, not a B-token window: a row that has filled j of the block's
  b tokens feeds [its j block tokens | b-j-1 masks] after its committed cache, and is offered b-j
  proposals: the output at its last real token (or, for j = 0, the stored output of the previous
  commit) and the masks'. It accepts the usual left-to-right tau prefix of them (y_0 always). A row
  whose block is full waits (fed its block, accepting nothing) until every row has filled it;
- then ONE extra forward commits the block: it feeds the block's tokens, writes their K/V to the cache
  and keeps the output at the last one (the first proposal of the next block). It is counted;
- a row that accepts a stop token keeps filling its block (the tokens after it are fed and accepted like
  any other) and leaves the batch after the block's commit; its output (rows[i].tokens) ends at the stop.
Two tokens/forward counts (BatchDecoded):
- the paper's (paper_tokens_per_forward): every accepted token, those after the stop token included, over
  the prefill, every inner forward in which the row took tokens (after the stop token too) and every
  commit, the one after its last block included. At batch 1 this is exactly the released code's
  statistic (total_tokens_accepted / total_forward_passes). For a batch the released code divides all
  rows' tokens by the batch's forwards (sum(paper_tokens) / forwards here), a per-batch figure that
  grows with the batch; per row, the forwards a row waits in are left out, as for cache="block";
- up to the stop token (tokens_per_forward, like every other strategy): rows[i].tokens (cut at the stop
  token or budget) over the forwards the row needed for them: the prefill, the commits before its last
  block and the inner forwards in which it accepted tokens (not those it waited in, as for cache="block").
  The prefill and the commits accept nothing: they are recorded as empty spans, so rows[i].forwards counts
  them and sum(spans) is still the tokens.
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
    windows: list = None  # per row: the proposals w offered in each forward that made one of its spans
    paper_tokens: list = None  # cache="paper_block", per row: every accepted token, post-stop ones included
    paper_forwards: list = None  # cache="paper_block", per row: prefill, commits, forwards it took tokens in

    @property
    def tokens(self):
        return sum(len(r.tokens) for r in self.rows)

    @property
    def tokens_per_forward(self):
        """The paper's count, per row: generated tokens / forwards that produced them, over all rows."""
        return self.tokens / max(1, sum(r.forwards for r in self.rows))

    @property
    def paper_tokens_per_forward(self):
        """cache="paper_block" only (else None): the released sampler's count, per row: all accepted tokens
        (after the stop token too) / the prefill, every commit and the forwards it took tokens in."""
        if self.paper_tokens is None:
            return None
        return sum(self.paper_tokens) / max(1, sum(self.paper_forwards))


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


def forward_windows(model, x, start, n_real, B, cache=None, before=None):
    """x: (n, W) rows of [real tokens | window | padding] written from slot start[i] (the row's cache
    length; 0 without a cache). Returns the logits (n, B, V) of each row's window: the last real token's
    output (it proposes the next token, exactly as AR) and the outputs of the B-1 window tokens (columns
    past a row's window hold whatever follows it: they must not be used). before (n, V): the output at
    the last committed token, used as column 0 of rows that feed no real token (n_real = 0)."""
    n, W = x.shape
    slots = start[:, None] + torch.arange(W, device=x.device)  # (n, W): slots are the positions too
    mask = decode_mask(start, W, int(start.max()) + W)  # (n, W, S): own row's slots up to itself
    # padding may run past the context; nothing attends it, so its position only has to be legal
    pos = slots.clamp(max=model.config.max_seq_len - 1)
    cols = n_real[:, None] - 1 + torch.arange(B, device=x.device)  # (n, B); -1: the output before x
    out = model(x, pos, mask, cache, slots, keep=cols.clamp(0, W - 1))  # (n, B, V): logits only there
    if before is not None:
        out = torch.where((cols < 0)[..., None], before[:, None].to(out.dtype), out)
    return out


def first_stop(y, n_acc, stop_ids):
    """Cut each row's accepted span after its first stop token: (n_acc (n,), hit (n,) bool).
    stop_ids: a 1-D tensor of ids."""
    j = torch.arange(y.shape[1], device=y.device)
    is_stop = torch.isin(y, stop_ids) & (j < n_acc[:, None])
    hit = is_stop.any(1)
    return torch.where(hit, is_stop.long().argmax(1) + 1, n_acc), hit


CACHES = (None, "request", "block", "paper_block")


def aligned_windows(known, B):
    """(n,) proposals of the aligned window for rows with `known` (n,) known tokens: the last real token's,
    plus the masks at positions p >= known with p // B == known // B, at most B-1 (module docstring)."""
    return torch.clamp(B - known % B + 1, max=B)


def adapt_windows(w, accepted, B):
    """The adaptive rule (module docstring): grow by one after a full window, shrink by one (to 2 at
    least) after fewer than half accepted. w, accepted: (n,)."""
    grown = torch.where(accepted >= w, (w + 1).clamp(max=B), w)
    return torch.where(2 * accepted < w, (w - 1).clamp(min=min(2, B)), grown)


class BatchEngine:
    """Step-wise batched decoder. engine.tau[row] = x between steps changes that row's threshold.
    cache: None | "request" | "block" | "paper_block"; jacobi: verify guesses instead of MARS masks (exact
    for greedy); lossless: MARS drafts, AR verifies (exactly AR for greedy and sampling; tau and metric
    unused); align / adaptive: per-row windows (module docstring)."""

    def __init__(self, model, prompts, max_new_tokens, mask_id=None, block_size=4, tau=0.95, stop_ids=(),
                 cache="request", cache_block=16, metric="prob", temperature=0.0, top_k=None, seed=None,
                 jacobi=False, lossless=False, align=False, adaptive=False):
        if cache not in CACHES:
            raise ValueError(f"cache must be None, 'request', 'block' or 'paper_block', got {cache!r}")
        if jacobi and lossless:
            raise ValueError("choose one of jacobi and lossless")
        n_windows = bool(align) + bool(adaptive) + (cache == "paper_block")
        if n_windows > 1 or (n_windows and (jacobi or lossless)):
            raise ValueError("align, adaptive and cache='paper_block' are MARS windows: use one at a time, "
                             "and not with jacobi or lossless")
        if block_size > 1 and mask_id is None and not jacobi:
            raise ValueError("MARS decoding (block_size > 1) needs the mask token id")
        if cache == "paper_block" and mask_id is None:
            raise ValueError("cache='paper_block' needs the mask token id")
        if cache in ("block", "paper_block") and cache_block < 1:
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
        self.align, self.adaptive = align, adaptive
        self.gen = torch.Generator(self.dev).manual_seed(seed) if seed is not None else None
        self.tau = torch.tensor([float(tau)] * n if isinstance(tau, (int, float)) else [float(t) for t in tau])
        if len(self.tau) != n:
            raise ValueError(f"got {len(self.tau)} taus for {n} prompts")
        check_tau(self.tau, metric)
        self.out = BatchDecoded(rows=[Decoded() for _ in prompts], windows=[[] for _ in prompts])
        if cache == "paper_block":
            self.out.paper_tokens, self.out.paper_forwards = [0] * n, [0] * n
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
            self.prompt_len, self.win = lens.clone(), torch.full_like(lens, block_size)  # align, adaptive
            # paper_block: is the next forward a commit (the prefill first), tokens per row in committed
            # blocks, rows that took a stop token, the output at each row's last committed token
            self.commit_next, self.base, self.before = True, 0, None
            self.stopped = torch.zeros_like(lens, dtype=torch.bool)
            # window (+ draft) + padding room
            extra = (3 if lossless else 2) * block_size + {"block": 1, "paper_block": 2}.get(cache, 0) * cache_block
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
        if self.strategy == "paper_block":
            return self.paper_block_step()
        n, B, first = len(self.active), self.B, self.out.forwards == 0
        w = self.windows()  # (n,) proposals offered to each row: its last real token's, then one per mask
        window = self.guesses if self.jacobi else self.pending.new_full((n, B - 1), self.mask_id)
        x, n_fed = self.pending, self.n_pend
        if self.lossless:  # the draft goes between the pending tokens and the masks
            x, n_fed = splice(x, n_fed, self.draft, self.n_draft)
        x, _ = splice(x, n_fed, window, w - 1)  # (n, W)
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
            ok &= torch.arange(B, device=self.dev) < w[:, None]  # nothing past the row's window
            n_acc = n_accepted(ok)
        commit, waiting = self.schedule(first)
        if self.adaptive:
            self.win = torch.where(waiting, self.win, adapt_windows(w, n_acc, B))
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
        host = torch.cat([self.active[:, None], n_acc[:, None], finished[:, None], w[:, None], y], 1).tolist()
        for row, k, fin, wi, *ys in host:  # one copy to the host
            any_finished |= bool(fin)
            if k:
                spans[row] = ys[:k]
                self.out.rows[row].spans.append(ys[:k])
                self.out.rows[row].tokens += ys[:k]
                self.out.windows[row].append(wi)
        if any_finished:
            self.drop(~finished)
        self.out.seconds = time.perf_counter() - self.t0
        return spans

    def windows(self):
        """(n,) proposals w offered to each active row by this forward (w-1 masks are fed)."""
        if self.align:
            return aligned_windows(self.prompt_len + self.generated, self.B)
        if self.adaptive:
            return self.win
        return torch.full_like(self.n_pend, self.B)

    def paper_block_step(self):
        """One forward of the released block-level cache sampler (module docstring): a commit (the prefill
        first) when every row has filled the block, else every row's try at the rest of its block."""
        n, Bc, first = len(self.active), self.cache_block, self.out.forwards == 0
        size = min(Bc, self.max_new - self.base)  # this block's length: the last one is cut at the budget
        start = self.cache.lengths
        if self.commit_next:  # feed the pending tokens (the prompt, or the full block), commit them
            self.before = forward_windows(self.model, self.pending, start, self.n_pend, 1, self.cache)[:, 0]
            self.out.forwards += 1
            self.cache.lengths += self.n_pend
            self.pending, self.n_pend = self.pending[:, :1], torch.zeros_like(self.n_pend)
            if not first:
                self.base += size
            finished = self.stopped | (self.base >= self.max_new)
            for row, fin in zip(self.active.tolist(), finished.tolist()):
                self.out.paper_forwards[row] += 1
                if not fin:  # a forward this row needs for its next tokens: an empty span
                    self.out.rows[row].spans.append([])
                    self.out.windows[row].append(0)
            self.commit_next = False
            if finished.any():
                self.drop(~finished)
            self.out.seconds = time.perf_counter() - self.t0
            return {}

        w = (size - self.n_pend).clamp(min=0)  # the rest of the block (0: filled, the row waits)
        masks = self.pending.new_full((n, max(1, Bc - 1)), self.mask_id)
        x, _ = splice(self.pending, self.n_pend, masks, (w - 1).clamp(min=0))
        logits = forward_windows(self.model, x, start, self.n_pend, Bc, self.cache, self.before)  # (n, Bc, V)
        self.out.forwards += 1
        y, p = propose(logits, self.temperature, self.top_k, self.gen)  # (n, Bc)
        ok = gate(p, y, self.tau.to(self.dev)[self.active][:, None], self.metric)
        ok &= torch.arange(Bc, device=self.dev) < w[:, None]
        n_acc = torch.where(w > 0, n_accepted(ok), 0)  # all of it is fed from now on, post-stop tokens too
        k, hit = first_stop(y, torch.where(self.stopped, 0, n_acc), self.stop_ids)  # the output's part
        self.stopped |= hit
        self.pending, self.n_pend = splice(self.pending, self.n_pend, y, n_acc)
        self.generated = self.generated + k
        self.commit_next = bool((self.n_pend == size).all())

        spans = {}
        host = torch.cat([self.active[:, None], n_acc[:, None], k[:, None], w[:, None], y], 1).tolist()
        for row, a, ki, wi, *ys in host:
            self.out.paper_tokens[row] += a
            self.out.paper_forwards[row] += wi > 0  # not the forwards it waits in
            if ki:
                spans[row] = ys[:ki]
                self.out.rows[row].spans.append(ys[:ki])
                self.out.rows[row].tokens += ys[:ki]
                self.out.windows[row].append(wi)
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
        self.prompt_len, self.win, self.stopped = self.prompt_len[keep], self.win[keep], self.stopped[keep]
        if self.before is not None:
            self.before = self.before[keep]
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
    top_k, seed, align, adaptive (see BatchEngine)."""
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


def batch_paper_block(model, prompts, max_new_tokens, mask_id, cache_block=32, tau=0.95, stop_ids=(), **kw):
    """MARS with the paper's released block-level cache sampler: windows are the rest of the current
    cache_block-token block, one extra forward commits each block (module docstring). out.tokens_per_forward
    counts up to the stop token, out.paper_tokens_per_forward as the paper does. kw: metric, temperature,
    top_k, seed."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, 1, tau, stop_ids, "paper_block", cache_block,
                       **kw).run()
