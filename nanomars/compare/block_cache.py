"""
Decoding baselines, for comparison with the paper (beside block_diffusion.py, the paper's BD3LM): the
two block-level caches. Neither is needed to decode MARS well: the engine's per-request caches are.

BlockCache, nanoMARS's block-level cache (a cache policy for engine.Engine, like the paper's Table 5):
the prompt is committed by the first forward; after that a row commits cache_block (B_cache) tokens at
once, when EVERY row holds that many uncommitted tokens; a row that has filled its block waits (it is
fed, but accepts nothing). The commit rides on the next forward: no extra call.

PaperBlockEngine, the released block sampler (MARSBlockCachedSampler), faithfully; the engine's own step
with ReleasedBlocks as its strategy and cache policy, and the sampler's stop rule and counts in take():
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

from ..engine import PAD, Accepted, BatchDecoded, Engine, Fed, first_stop, splice
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


class ReleasedBlocks(MarsGate):
    """The released sampler's windows and commits (module docstring): MARS's gate, as its strategy, and
    its block structure, as its cache policy (one object: the window is the rest of the block the cache
    commits). The next forward is a commit (`committing`: the prefill first) or an inner forward of the
    block of `size` tokens that starts `base` tokens into the answer."""
    cached = True
    rows = ("win", "before")  # before (n, V): the output at each row's last committed token

    def __init__(self, mask_id, cache_block, tau, metric, temperature, top_k, seed):
        if cache_block < 1:
            raise ValueError(f"cache_block must be >= 1, got {cache_block}")
        super().__init__(mask_id, cache_block, tau, metric, temperature, top_k, seed)
        self.ahead, self.room = 1, cache_block  # windows end at the token budget: no context room past it
        self.committing, self.base, self.size, self.before = True, 0, 0, None

    def waiting(self, eng):
        return None  # a row whose block is full is offered a window of 0: it takes nothing

    def commit(self, eng, n_verified):
        return eng.n_pend if self.committing else torch.zeros_like(eng.n_pend)

    def feed(self, eng):
        n = len(eng.active)
        if self.committing:  # the pending tokens alone; the output at the last one is kept
            self.width = 1
            return Fed(eng.pending[:, :0], torch.zeros_like(eng.n_pend))
        self.width, self.size = self.B, min(self.B, eng.max_new - self.base)  # the last block ends at the budget
        self.w = (self.size - eng.n_pend).clamp(min=0)  # (n,) the rest of the block
        return Fed(eng.pending.new_full((n, max(1, self.B - 1)), self.mask_id), (self.w - 1).clamp(min=0))

    def accept(self, eng, logits, hidden):
        zero = torch.zeros_like(eng.n_pend)
        if self.committing:
            self.before = logits[:, 0]
            return Accepted(eng.pending.new_full((len(eng.active), 1), PAD), zero, zero, zero)
        # a row with no block token yet fed no real token: its first proposal is the commit's output
        first = (eng.n_pend == 0)[:, None, None] & (torch.arange(self.B, device=eng.dev) == 0)[None, :, None]
        logits = torch.where(first, self.before[:, None].to(logits.dtype), logits)
        y, n_acc = self.gate_rows(eng, logits, self.w)
        return Accepted(y, torch.where(self.w > 0, n_acc, 0), zero, self.w)

    def next_forward(self, eng):
        """After a commit the next block starts; after an inner forward, commit once every row's block
        is full."""
        if self.committing:
            self.base, self.committing = self.base + self.size, False
        else:
            self.committing = bool((eng.n_pend == self.size).all())


class PaperBlockEngine(Engine):
    """The released block sampler (module docstring): the engine's step with ReleasedBlocks as strategy
    and cache policy; take() keeps the sampler's stop rule and counts. tau, metric, temperature, top_k,
    seed: MarsGate's."""

    def __init__(self, model, prompts, max_new_tokens, mask_id, cache_block=32, tau=0.95, stop_ids=(),
                 metric="prob", temperature=0.0, top_k=None, seed=None):
        if mask_id is None:
            raise ValueError("the released block sampler needs the mask token id")
        blocks = ReleasedBlocks(mask_id, cache_block, tau, metric, temperature, top_k, seed)
        super().__init__(model, prompts, max_new_tokens, blocks, stop_ids, blocks)
        n = len(prompts)
        self.out = PaperBlockDecoded(self.out.rows, windows=self.out.windows, paper_tokens=[0] * n,
                                     paper_forwards=[0] * n)
        self.stopped = torch.zeros_like(self.n_pend, dtype=torch.bool)  # (n,) rows that took a stop token

    def take(self, y, n_acc, n_verified, offered):
        """A row feeds all it accepts, post-stop tokens too (they fill its block), but its output ends at
        the stop; a commit takes nothing, commits every pending token, and the rows that stopped or
        reached the budget leave."""
        blocks, committing = self.strategy, self.strategy.committing
        k, hit = first_stop(y, torch.where(self.stopped, 0, n_acc), self.stop_ids)  # the output's part
        self.stopped |= hit
        commit = blocks.commit(self, n_verified)
        self.cache.advance(commit)
        self.pending, self.n_pend = splice(self.pending, self.n_pend, y, n_acc, skip=commit)
        self.generated = self.generated + k
        blocks.next_forward(self)
        if not committing:
            for row, a, w in torch.stack([self.active, n_acc, offered], 1).tolist():
                self.out.paper_tokens[row] += a
                self.out.paper_forwards[row] += w > 0  # not the forwards it waits in
            return self.record(y, k, offered, torch.zeros_like(hit))[0]
        finished = self.stopped | (blocks.base >= self.max_new)
        for row, fin in zip(self.active.tolist(), finished.tolist()):
            self.out.paper_forwards[row] += 1
            if not fin:  # a forward this row needs for its next tokens: an empty span
                self.out.rows[row].spans.append([])
                self.out.windows[row].append(0)
        self.out.seconds = time.perf_counter() - self.t0
        if finished.any():
            self.drop(~finished)
        return {}

    def drop(self, keep):
        super().drop(keep)
        self.stopped = self.stopped[keep]


def batch_paper_block(model, prompts, max_new_tokens, mask_id, cache_block=32, tau=0.95, stop_ids=(), **kw):
    """MARS with the released block sampler: windows are the rest of the current cache_block-token block,
    one extra forward commits each block. out.tokens_per_forward counts up to the stop token,
    out.paper_tokens_per_forward as the paper does. kw: metric, temperature, top_k, seed."""
    return PaperBlockEngine(model, prompts, max_new_tokens, mask_id, cache_block, tau, stop_ids, **kw).run()
