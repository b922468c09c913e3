"""
Decoding baselines, for comparison with the paper (beside block_diffusion.py, the paper's BD3LM): the
two block-level caches. Neither is needed to decode MARS well: the engine's per-request caches are.

BlockCache, nanoMARS's block-level cache (a cache policy for engine.Engine, like the paper's Table 5):
the prompt is committed by the first forward; after that a row commits cache_block (B_cache) tokens at
once, when EVERY row holds that many uncommitted tokens; a row that has filled its block waits (it is
fed, but accepts nothing). The commit rides on the next forward: no extra call.

PaperBlockEngine, the released block sampler (MARSBlockCachedSampler), faithfully:
- the first forward is the prompt alone (prefill): it commits the prompt and keeps the output at the
  last prompt token, which proposes the first token of the first block;
- the answer is cut into blocks of B_cache tokens counted from each row's FIRST GENERATED position (as the
  released code appends blocks to the prompts; not from position 0); the last block is cut at the
  token budget. All rows work on the same block index;
- window = the REST of the current block: a row that has filled j of the block's b tokens feeds [its j
  block tokens | b-j-1 masks] after its committed cache and is offered b-j proposals: the output at its
  last real token (for j = 0, the stored output of the previous commit) and the masks'. It accepts the
  usual tau prefix of them. A row whose block is full waits until every row has filled it;
- then ONE extra forward commits the block: it feeds the block's tokens, writes their K/V and keeps the
  output at the last one (the first proposal of the next block). It is counted;
- a row that accepts a stop token keeps filling its block (the tokens after it are fed and accepted like
  any other) and leaves the batch after the block's commit; its output (rows[i].tokens) ends at the stop.
Two tokens/forward counts (BatchDecoded):
- the paper's (paper_tokens_per_forward): every accepted token, post-stop ones included, over the
  prefill, every inner forward in which the row took tokens and every commit, the one after its last
  block included. At batch 1 exactly the released code's statistic (total_tokens_accepted /
  total_forward_passes; for a batch the released code divides all rows' tokens by the batch's forwards,
  a per-batch figure that grows with the batch);
- up to the stop token (tokens_per_forward, as for every other strategy): rows[i].tokens over the
  forwards the row needed for them: the prefill, the commits before its last block and the inner
  forwards in which it accepted tokens. The prefill and the commits accept nothing: they are recorded as
  empty spans, so rows[i].forwards counts them and sum(spans) is still the tokens.
"""
import time
from dataclasses import dataclass

import torch

from ..engine import BatchDecoded, Engine, first_stop, forward_window, splice
from ..strategies import MarsGate


class BlockCache:
    """nanoMARS's block-level cache (module docstring): commit cache_block tokens per row when all rows
    have them, the prompt first."""
    cached = True

    def __init__(self, cache_block=16):
        if cache_block < 1:
            raise ValueError(f"cache_block must be >= 1, got {cache_block}")
        self.cache_block, self.room = cache_block, cache_block

    def __repr__(self):
        return f"BlockCache({self.cache_block})"

    def waiting(self, eng):
        """None (nobody waits this step) or (n,) bool: the rows that wait (the engine's interface)."""
        if eng.out.forwards == 0:  # the prompt is committed by the first forward
            self.n = eng.n_pend
            return None
        filled = eng.n_pend >= self.cache_block  # rows holding a whole block of uncommitted tokens
        everyone = filled.all()  # the last row filled it: commit the block everywhere, all go on
        self.n = torch.full_like(eng.n_pend, self.cache_block) if everyone else torch.zeros_like(eng.n_pend)
        return None if everyone else filled

    def commit(self, eng, n_verified):
        return self.n  # verified draft tokens wait for their block like any pending token


@dataclass
class PaperBlockDecoded(BatchDecoded):
    """BatchDecoded and the released sampler's own count (module docstring), per row."""
    paper_tokens: list = None
    paper_forwards: list = None

    @property
    def paper_tokens_per_forward(self):
        return sum(self.paper_tokens) / max(1, sum(self.paper_forwards))


class PaperBlockEngine(Engine):
    """The released block sampler (module docstring). tau, metric, temperature, top_k, seed: MarsGate's."""

    def __init__(self, model, prompts, max_new_tokens, mask_id, cache_block=32, tau=0.95, stop_ids=(),
                 metric="prob", temperature=0.0, top_k=None, seed=None):
        if mask_id is None:
            raise ValueError("the released block sampler needs the mask token id")
        gate = MarsGate(mask_id, cache_block, tau, metric, temperature, top_k, seed)
        gate.ahead = 1  # windows end at the token budget: no context room past it
        super().__init__(model, prompts, max_new_tokens, gate, stop_ids, BlockCache(cache_block))
        n = len(prompts)
        self.out = PaperBlockDecoded(self.out.rows, windows=self.out.windows, paper_tokens=[0] * n,
                                     paper_forwards=[0] * n)
        # is the next forward a commit (the prefill first); tokens per row in committed blocks; rows that
        # took a stop token; (n, V) the output at each row's last committed token
        self.commit_next, self.base, self.before = True, 0, None
        self.stopped = torch.zeros_like(self.n_pend, dtype=torch.bool)

    @torch.inference_mode()
    def step(self):
        if self.done:
            return {}
        if self.commit_next:
            self.commit_block()
            return {}
        n, Bc, gate = len(self.active), self.policy.cache_block, self.strategy
        size = min(Bc, self.max_new - self.base)  # this block's length: the last one is cut at the budget
        w = (size - self.n_pend).clamp(min=0)  # the rest of the block (0: filled, the row waits)
        masks = self.pending.new_full((n, max(1, Bc - 1)), gate.mask_id)
        x, _ = splice(self.pending, self.n_pend, masks, (w - 1).clamp(min=0))
        logits, _ = forward_window(self.model, x, self.start, self.n_pend, Bc, self.cache)  # (n, Bc, V)
        first = (self.n_pend == 0)[:, None, None] & (torch.arange(Bc, device=self.dev) == 0)[None, :, None]
        logits = torch.where(first, self.before[:, None].to(logits.dtype), logits)  # no real token fed
        self.out.forwards += 1
        y, n_acc = gate.gate_rows(self, logits, w)
        n_acc = torch.where(w > 0, n_acc, 0)  # all of it is fed from now on, post-stop tokens too
        k, hit = first_stop(y, torch.where(self.stopped, 0, n_acc), self.stop_ids)  # the output's part
        self.stopped |= hit
        self.pending, self.n_pend = splice(self.pending, self.n_pend, y, n_acc)
        self.generated = self.generated + k
        self.commit_next = bool((self.n_pend == size).all())
        for row, a, wi in torch.stack([self.active, n_acc, w], 1).tolist():
            self.out.paper_tokens[row] += a
            self.out.paper_forwards[row] += wi > 0  # not the forwards it waits in
        return self.record(y, k, w, torch.zeros_like(hit))[0]

    def commit_block(self):
        """Feed the pending tokens (the prompt, or the full block) and commit them; rows that took a stop
        token, or reached the budget, leave."""
        first = self.out.forwards == 0
        size = min(self.policy.cache_block, self.max_new - self.base)
        self.before = forward_window(self.model, self.pending, self.start, self.n_pend, 1, self.cache)[0][:, 0]
        self.out.forwards += 1
        self.cache.advance(self.n_pend)
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

    def drop(self, keep):
        super().drop(keep)
        self.stopped, self.before = self.stopped[keep], self.before[keep]


def batch_paper_block(model, prompts, max_new_tokens, mask_id, cache_block=32, tau=0.95, stop_ids=(), **kw):
    """MARS with the released block sampler: windows are the rest of the current cache_block-token block,
    one extra forward commits each block. out.tokens_per_forward counts up to the stop token,
    out.paper_tokens_per_forward as the paper does. kw: metric, temperature, top_k, seed."""
    return PaperBlockEngine(model, prompts, max_new_tokens, mask_id, cache_block, tau, stop_ids, **kw).run()
