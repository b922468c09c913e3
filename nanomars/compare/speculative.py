"""
MARS's peers as strategies of the decoding engine (engine.py, with its Strategy interface), for
comparing on one model, one data set, one machine. Both draft a continuation, feed it as real tokens
after the pending ones and let the target model verify it in the same forward (decode.verify_draft: the
kept draft tokens and one token of the target's own), so their output is the target's AR output:
greedy token for token, sampled in distribution.

    PromptLookup   prompt lookup decoding (training-free): the draft is what followed the most recent
                   earlier occurrence of the row's last n tokens, in its prompt or what it generated
    DraftModel     speculative decoding with a second, small AR model that drafts k tokens one at a
                   time with its own KV cache; its forwards are counted (draft_forwards) and timed

The draft model: an AR model trained by train.py on the same data and tokenizer as the target, e.g.
(1 layer, width 64, 4 heads of 16, 2 KV heads, the default MLP ratio; writes out/draft/ar.pt):
    python train.py --stage ar --n_layer 1 --n_embd 64 --n_head 4 --n_kv_head 2 --intermediate_size 176 \
        --out_dir out/draft
then checkpoint.load_model("out/draft/ar.pt") gives the model to pass as DraftModel(draft_model).
"""
import time

import torch
import torch.nn.functional as F

from ..decode import next_tokens, sample, sampling_dist, verify_draft
from ..engine import Accepted, Fed, Strategy, forward_window, splice
from ..model import KVCache
from ..strategies import check_sampling, generator


class Verified(Strategy):
    """What both peers share: each row's known tokens (the lookup reads them, the draft model feeds
    them) and the verification of the draft that feed() left in self.draft (n, D), self.n_draft (n,)
    (its real tokens) and, when sampling, self.q (n, D, V) (the distributions it was drawn from)."""
    rows = ("known", "n_known")

    def __init__(self, D, temperature, top_k, seed):
        check_sampling(temperature, top_k)
        self.ahead, self.width = D + 1, D + 1  # D draft tokens fed; the logits at them and one more
        self.temperature, self.top_k, self.seed = temperature, top_k, seed

    def start(self, eng):
        # (n, L) each row's prompt and accepted tokens, left-aligned, and their count (n,)
        self.known, self.n_known = eng.pending.clone(), eng.n_pend.clone()
        self.gen = generator(eng, self.seed)

    def accept(self, eng, logits, hidden):
        """logits (n, D+1, V): the target's outputs at the last pending token and at each draft token."""
        y, kept = verify_draft(self.draft, self.n_draft, logits, self.q, self.temperature, self.top_k, self.gen)
        # the engine may cut the span at a stop token or the budget: only for rows it then drops
        self.known, self.n_known = splice(self.known, self.n_known, y, kept + 1)
        return Accepted(y, kept + 1, kept, self.n_draft + 1)


def lookup(known, n_known, ngram, draft_len):
    """Per row, draft_len tokens copied from after the most recent earlier occurrence of its last n
    tokens, trying n = ngram, ngram-1, ..., 1 (the longest that occurs wins, as prompt lookup decoding
    does). Past the end of the known text the copy runs on into what it has just copied: text that
    repeats with period P drafts draft_len tokens, not P (the most recent occurrence is P back).
    known (n, L), n_known (n,) -> draft (n, draft_len), count (n,) (draft_len, or 0: nothing occurs)."""
    L = known.shape[1]
    col = torch.arange(L, device=known.device)
    follow = torch.full_like(n_known, -1)  # (n,) where the copy starts in known; -1: no occurrence yet
    for n in range(min(ngram, L - 1), 0, -1):
        tail = known.gather(1, (n_known[:, None] - n + col[:n]).clamp(min=0))  # (n, n) the last n tokens
        hit = (known.unfold(1, n, 1) == tail[:, None]).all(-1)  # (n, L-n+1): known[i:i+n] == tail
        hit &= col[:L - n + 1] + n < n_known[:, None]  # an EARLIER occurrence: a known token follows it
        last = torch.where(hit, col[:L - n + 1], -1).max(1).values  # the most recent one
        follow = torch.where((follow < 0) & (last >= 0), last + n, follow)
    period = torch.where(follow >= 0, n_known - follow, 1)  # (n,) the copy's source is this far back
    cols = follow.clamp(min=0)[:, None] + torch.arange(draft_len, device=known.device) % period[:, None]
    return known.gather(1, cols), torch.where(follow >= 0, draft_len, 0)


class PromptLookup(Verified):
    """Prompt lookup decoding: the draft is lookup()'s (defaults: ngram 3, draft_len 10, as the common
    implementation). No occurrence: the row feeds nothing, a plain AR step. Sampling: the draft is
    certain, q = one-hot, so a draft token x is kept with probability p(x)."""

    def __init__(self, ngram=3, draft_len=10, temperature=0.0, top_k=None, seed=None):
        if ngram < 1 or draft_len < 1:
            raise ValueError(f"need ngram >= 1 and draft_len >= 1, got {ngram}, {draft_len}")
        super().__init__(draft_len, temperature, top_k, seed)
        self.ngram, self.draft_len = ngram, draft_len

    def feed(self, eng):
        self.draft, self.n_draft = lookup(self.known, self.n_known, self.ngram, self.draft_len)
        V = eng.model.config.vocab_size
        self.q = F.one_hot(self.draft, V).float() if self.temperature > 0 else None
        return Fed(self.draft, self.n_draft)


def now(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # the draft's kernels are queued: wait for them to time them
    return time.perf_counter()


class DraftModel(Verified):
    """Speculative decoding with a draft model (same vocabulary): per step it feeds each row the tokens
    its cache lacks, then drafts k tokens autoregressively (k forwards of the draft model, greedy or
    sampled from its sampling_dist), the target verifies them. The draft cache keeps the known tokens
    and the draft's first k-1; the next feed first rolls its length back to what was kept (stale
    entries sit past the length, masked, overwritten). draft_forwards, draft_seconds: its own cost."""
    rows = ("known", "n_known", "cache")

    def __init__(self, draft_model, k=4, temperature=0.0, top_k=None, seed=None):
        if k < 1:
            raise ValueError(f"need k >= 1 draft tokens, got {k}")
        super().__init__(k, temperature, top_k, seed)
        self.model, self.k, self.draft_forwards, self.draft_seconds = draft_model, k, 0, 0.0

    def start(self, eng):
        V, Vd = eng.model.config.vocab_size, self.model.config.vocab_size
        if V != Vd:
            raise ValueError(f"the draft model's vocabulary ({Vd} ids) must be the target's ({V} ids): "
                             "train it with the target's tokenizer")
        super().start(eng)
        size = self.known.shape[1] + eng.max_new + 2 * self.ahead
        self.cache = KVCache(self.model.config, len(eng.active), size, eng.dev, self.model.embed.weight.dtype)

    def feed(self, eng):
        t0, c = now(eng.dev), self.cache
        # the draft cache holds the known tokens, then the last draft's d_1..d_(k-1): keep the known
        # tokens, all but the last (fed again below, its output drafts d_1; a no-op before the first draft)
        c.roll_back(self.n_known - 1)
        x, n_new = splice(self.known, self.n_known, self.known[:, :0], 0, skip=c.lengths)  # what c lacks
        drafts, qs = [], []
        for _ in range(self.k):
            logits = forward_window(self.model, x, c.lengths, n_new, 1, c)[0][:, 0]  # (n, V) the next token's
            c.advance(n_new)  # real tokens: the known ones, then the draft's (rolled back in accept)
            if self.temperature == 0:
                d = next_tokens(logits)
            else:
                qs.append(sampling_dist(logits, self.temperature, self.top_k))
                d = sample(qs[-1], self.gen)
            drafts.append(d)
            x, n_new = d[:, None], torch.ones_like(n_new)
        self.draft, self.q = torch.stack(drafts, 1), torch.stack(qs, 1) if qs else None  # (n, k), (n, k, V)
        self.n_draft = torch.full_like(self.n_known, self.k)
        self.draft_forwards += self.k
        self.draft_seconds += now(eng.dev) - t0
        return Fed(self.draft, self.n_draft)
