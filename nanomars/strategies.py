"""
The decoding strategies the engine (engine.py) runs, each a small part behind one interface:

    ahead        how far past a row's known tokens one forward reaches (context room)
    width        logits columns read per row, from its last pending token on
    start(eng)   per-row state for the engine's rows
    feed(eng)    -> tokens (n, F), counts (n,): what each row feeds after its pending tokens
    accept(eng, logits (n, width, V), waiting (n,) bool)
                 -> y (n, width'), accepted (n,), verified (n,), offered (n,): the row takes y[:accepted];
                    the first `verified` of its fed tokens are real tokens it took (their K/V may be
                    committed as they stand); offered = proposals it was offered (recorded per span);
                    a waiting row (block-level cache) takes nothing and keeps its state
    drop(keep)   finished rows leave: compact the per-row state

AR (the baseline), MarsGate (MARS), Jacobi and Lossless are independent: adding a strategy touches no
other. MARS's window policies (FixedWindow, AlignedWindow, AdaptiveWindow) say how many
proposals each row is offered per forward.
"""
import torch

from .decode import check_tau, gate, n_accepted, next_tokens, propose, sample, sampling_dist, verify_draft
from .engine import PAD, splice


def check_sampling(temperature, top_k):
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"need temperature >= 0 (0 = greedy) and top_k >= 1, got {temperature}, {top_k}")


def generator(eng, seed):
    return torch.Generator(eng.dev).manual_seed(seed) if seed is not None else None


# ------------------------------------------------------------------------------------------------ AR
class AR:
    """Plain AR decoding, the baseline every speedup is measured against: feed nothing, take the next
    token (argmax, or sampled). MarsGate with B = 1 decodes the same tokens (tested), but pays each step
    for a softmax over the vocabulary and a gate that can only accept that one token."""
    ahead, width = 1, 1

    def __init__(self, temperature=0.0, top_k=None, seed=None):
        check_sampling(temperature, top_k)
        self.temperature, self.top_k, self.seed = temperature, top_k, seed

    def start(self, eng):
        self.gen = generator(eng, self.seed)

    def feed(self, eng):
        return eng.pending[:, :0], torch.zeros_like(eng.n_pend)

    def accept(self, eng, logits, waiting):
        y = next_tokens(logits, self.temperature, self.top_k, self.gen)  # (n, 1)
        one = torch.ones_like(eng.n_pend)
        return y, one, torch.zeros_like(one), one

    def drop(self, keep):
        pass


# -------------------------------------------------------------------------------------- MARS windows
class FixedWindow:
    """w = B proposals for every row and every forward: the last real token's, then one per mask."""

    def __call__(self, gate, eng):
        return torch.full_like(eng.n_pend, gate.B)

    def update(self, gate, accepted, waiting):
        pass  # nothing carried from one forward to the next (AdaptiveWindow carries gate.win)


def aligned_windows(known, B):
    """(n,) proposals of the aligned window for rows with `known` (n,) known tokens: the last real
    token's, plus the masks at positions p >= known in its block (p // B == known // B), at most B-1.
    A mask then never sees a mask of an earlier block, a context training with blocks from position 0
    never shows (docs/mars.md, "Windows")."""
    return torch.clamp(B - known % B + 1, max=B)


class AlignedWindow(FixedWindow):
    """Windows that never cross a training block boundary (for models trained as released)."""

    def __call__(self, gate, eng):
        return aligned_windows(eng.known, gate.B)


def adapt_windows(w, accepted, B):
    """The adaptive rule: grow by one after a full window (the window was the limit), shrink by one (to 2
    at least: one mask stays to notice when the text gets easy again) after fewer than half were
    accepted (the masks at the end were wasted work). w, accepted: (n,)."""
    grown = torch.where(accepted >= w, (w + 1).clamp(max=B), w)
    return torch.where(2 * accepted < w, (w - 1).clamp(min=min(2, B)), grown)


class AdaptiveWindow:
    """A per-row window in [2, B] that follows what the row accepts (adapt_windows). Causal attention
    makes proposal j independent of the masks after it, so a smaller window accepts min(w, what the full
    one would): it saves compute, it never raises tokens/forward."""

    def __call__(self, gate, eng):
        return gate.win

    def update(self, gate, accepted, waiting):  # a waiting row (block-level cache) keeps its window
        gate.win = torch.where(waiting, gate.win, adapt_windows(gate.w, accepted, gate.B))


# ---------------------------------------------------------------------------------------------- MARS
class MarsGate:
    """MARS: feed w-1 masks; the last real token's output and the masks' propose w tokens, accepted in
    order while each passes the gate (prob: p >= tau; entropy; margin), the first always. tau: one per
    prompt, changeable between steps (engine.tau[row] = x). With B = 1 and tau = 1 this is AR."""

    def __init__(self, mask_id, B, tau=0.95, metric="prob", temperature=0.0, top_k=None, seed=None,
                 window=None):
        if B > 1 and mask_id is None:
            raise ValueError("MARS decoding (block_size > 1) needs the mask token id")
        check_sampling(temperature, top_k)
        self.mask_id, self.B, self.ahead, self.width = PAD if mask_id is None else mask_id, B, B, B
        self.tau0, self.metric, self.temperature, self.top_k, self.seed = tau, metric, temperature, top_k, seed
        self.window = window or FixedWindow()

    def start(self, eng):
        n = len(eng.active)
        self.tau = torch.tensor([float(self.tau0)] * n if isinstance(self.tau0, (int, float))
                                else [float(t) for t in self.tau0])
        if len(self.tau) != n:
            raise ValueError(f"got {len(self.tau)} taus for {n} prompts")
        check_tau(self.tau, self.metric)
        self.checked = self.tau._version  # in-place writes (engine.tau[row] = x) raise the version
        self.gen, self.win = generator(eng, self.seed), torch.full_like(eng.n_pend, self.B)

    def feed(self, eng):
        self.w = self.window(self, eng)  # (n,) proposals offered: w-1 masks
        return eng.pending.new_full((len(eng.active), self.B - 1), self.mask_id), self.w - 1

    def accept(self, eng, logits, waiting):
        y, n_acc = self.gate_rows(eng, logits, self.w)
        self.window.update(self, n_acc, waiting)
        return y, n_acc, torch.zeros_like(n_acc), self.w

    def gate_rows(self, eng, logits, w):
        """Proposals y (n, width) and how many each row accepts: the gate's prefix within its window w."""
        if self.tau._version != self.checked:  # engine.tau was changed between steps: check it again
            check_tau(self.tau, self.metric)
            self.checked = self.tau._version
        y, p = propose(logits, self.temperature, self.top_k, self.gen)  # (n, width), (n, width, V)
        ok = gate(p, y, self.tau.to(eng.dev)[eng.active][:, None], self.metric)
        ok &= torch.arange(y.shape[1], device=eng.dev) < w[:, None]  # nothing past the row's window
        return y, n_accepted(ok)

    def drop(self, keep):
        self.win = self.win[keep]


# -------------------------------------------------------------------------------------------- Jacobi
class Jacobi:
    """Jacobi decoding of a plain AR model (greedy, exact): feed guesses for the next window-1 tokens;
    output j is AR's exact prediction iff every guess before it matched, so the converged prefix is
    accepted; the outputs after it are the next guesses. No mask token is ever fed."""

    def __init__(self, window=4):
        self.window, self.ahead, self.width = window, window, window

    def start(self, eng):
        self.guesses = torch.full((len(eng.active), self.window - 1), PAD, device=eng.dev)  # any token

    def feed(self, eng):
        return self.guesses, torch.full_like(eng.n_pend, self.window - 1)

    def accept(self, eng, logits, waiting):
        y = next_tokens(logits)  # (n, window)
        ok = torch.cat([torch.ones_like(y[:, :1], dtype=torch.bool), self.guesses == y[:, :-1]], 1)
        n_acc = n_accepted(ok)
        took = torch.where(waiting, 0, n_acc)  # next guesses: the unverified outputs past what was taken
        cols = (took[:, None] + torch.arange(self.window - 1, device=eng.dev)).clamp(max=self.window - 1)
        self.guesses = y.gather(1, cols)
        return y, n_acc, torch.zeros_like(n_acc), torch.full_like(n_acc, self.window)

    def drop(self, keep):
        self.guesses = self.guesses[keep]


# ------------------------------------------------------------------------------------------ lossless
class Lossless:
    """Lossless MARS: the masks draft, AR verifies (speculative decoding with the model as its own
    drafter), so the output is AR's (greedy: token for token; sampled: in distribution) for any model.
    Each row feeds [draft | B-1 masks]: causal attention and masks last make the outputs at the last
    pending token and at the draft AR's own predictions for the draft's positions and one more
    (decode.verify_draft keeps the agreeing prefix plus AR's next token). After a fully kept draft (or
    none) this forward's mask proposals, which saw all of it, are the next draft; after a rejection the
    next forward drafts afresh. The kept draft tokens were fed with their real ids: verified."""

    def __init__(self, mask_id, B, temperature=0.0, top_k=None, seed=None):
        if mask_id is None:
            raise ValueError("lossless MARS needs the mask token id (its masks write the draft)")
        check_sampling(temperature, top_k)
        self.mask_id, self.B, self.ahead, self.width = mask_id, B, B, 2 * B - 1
        self.temperature, self.top_k, self.seed = temperature, top_k, seed

    def start(self, eng):
        # the draft (n, B-1), how much of it is real (B-1 or 0: none yet) and, when sampling, the
        # distributions (n, B-1, V) it was drawn from
        n, V = len(eng.active), eng.model.config.vocab_size
        self.draft = torch.full((n, self.B - 1), PAD, device=eng.dev)
        self.n_draft = torch.zeros_like(eng.n_pend)
        self.q = torch.zeros(n, self.B - 1, V, device=eng.dev) if self.temperature > 0 else None
        self.gen = generator(eng, self.seed)

    def feed(self, eng):
        masks = self.draft.new_full((len(eng.active), self.B - 1), self.mask_id)
        return splice(self.draft, self.n_draft, masks, self.B - 1)

    def accept(self, eng, logits, waiting):
        """logits (n, 2B-1, V) from the last pending token on: AR's at the draft's positions and one more
        (columns 0..n_draft), then the masks' (columns n_draft+1 .. n_draft+B-1)."""
        B = self.B
        y, n_kept = verify_draft(self.draft, self.n_draft, logits[:, :B], self.q, self.temperature,
                                 self.top_k, self.gen)
        cols = self.n_draft[:, None] + 1 + torch.arange(B - 1, device=eng.dev)  # (n, B-1)
        masks = logits.gather(1, cols[..., None].expand(-1, -1, logits.shape[-1]))  # (n, B-1, V)
        q = None if self.temperature == 0 else sampling_dist(masks, self.temperature, self.top_k)
        proposal = next_tokens(masks) if q is None else sample(q, self.gen)
        # a waiting row (block-level cache) took nothing and keeps its draft
        full = n_kept == self.n_draft
        self.draft = torch.where(waiting[:, None], self.draft, proposal)
        self.n_draft = torch.where(waiting, self.n_draft, torch.where(full, B - 1, 0))
        if q is not None:
            self.q = torch.where(waiting[:, None, None], self.q, q)
        return y, n_kept + 1, n_kept, torch.full_like(n_kept, B)

    def drop(self, keep):
        self.draft, self.n_draft = self.draft[keep], self.n_draft[keep]
        if self.q is not None:
            self.q = self.q[keep]
