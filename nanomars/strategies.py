"""
MARS's decoding strategies for the engine (engine.py), each a small part behind its Strategy interface:

    ahead, width       how far one forward reaches past a row's known tokens; logits columns read per row
    rows               names of the per-row state (the engine drops finished rows from it)
    start(eng)         per-row state for the engine's rows
    feed(eng)          -> Fed(tokens (n, F), counts (n,)): what each row feeds after its pending tokens
    accept(eng, logits (n, width, V), hidden)
                       -> Accepted(tokens, accepted, verified, offered): the row takes tokens[:accepted]

AR (the baseline), MarsGate (MARS), Jacobi and Lossless are independent: adding a strategy touches no
other (the peers' strategies are in compare/). MARS's window policies (FixedWindow, AlignedWindow,
AdaptiveWindow) say how many proposals each row is offered per forward.
"""
import torch

from .decode import check_tau, gate, n_accepted, next_tokens, propose, sample, sampling_dist, verify_draft
from .engine import PAD, Accepted, Fed, Strategy, splice


def check_sampling(temperature, top_k):
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"need temperature >= 0 (0 = greedy) and top_k >= 1, got {temperature}, {top_k}")


def generator(eng, seed):
    return torch.Generator(eng.dev).manual_seed(seed) if seed is not None else None


# ------------------------------------------------------------------------------------------------ AR
class AR(Strategy):
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
        return Fed(eng.pending[:, :0], torch.zeros_like(eng.n_pend))

    def accept(self, eng, logits, hidden):
        y = next_tokens(logits, self.temperature, self.top_k, self.gen)  # (n, 1)
        one = torch.ones_like(eng.n_pend)
        return Accepted(y, one, torch.zeros_like(one), one)


# -------------------------------------------------------------------------------------- MARS windows
class FixedWindow:
    """w = B proposals for every row and every forward: the last real token's, then one per mask."""

    def __call__(self, gate, eng):
        return torch.full_like(eng.n_pend, gate.B)

    def update(self, gate, accepted):
        pass  # nothing carried from one forward to the next (AdaptiveWindow carries gate.win)


def aligned_windows(known, B):
    """(n,) proposals of the aligned window for rows with `known` (n,) known tokens: the last real
    token's, plus the masks at positions p >= known in its block (p // B == known // B), at most B-1.
    A mask then never sees a mask of an earlier block, a context training with blocks from position 0
    never shows (docs/mars.md, "Decoding")."""
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

    def update(self, gate, accepted):
        gate.win = adapt_windows(gate.w, accepted, gate.B)


# ---------------------------------------------------------------------------------------------- MARS
class MarsGate(Strategy):
    """MARS: feed w-1 masks; the last real token's output and the masks' propose w tokens, accepted in
    order while each passes the gate (prob: p >= tau; entropy; margin), the first always. tau: one float
    or one per prompt; engine.set_tau(row, x) changes a row's between steps. With B = 1 and tau = 1 this
    is AR."""
    rows = ("win",)  # tau stays indexed by prompt (eng.active): set_tau names a prompt, not a batch row

    def __init__(self, mask_id, B, tau=0.95, metric="prob", temperature=0.0, top_k=None, seed=None,
                 window=None):
        if B > 1 and mask_id is None:
            raise ValueError("MARS decoding (block_size > 1) needs the mask token id")
        check_sampling(temperature, top_k)
        check_tau(tau, metric)
        self.mask_id, self.B, self.ahead, self.width = PAD if mask_id is None else mask_id, B, B, B
        self.tau, self.metric, self.temperature, self.top_k, self.seed = tau, metric, temperature, top_k, seed
        self.window = window or FixedWindow()

    def start(self, eng):
        n, tau = len(eng.active), torch.as_tensor(self.tau, dtype=torch.float32)
        if tau.dim() and len(tau) != n:
            raise ValueError(f"got {len(tau)} taus for {n} prompts")
        self.tau = tau.expand(n).clone()  # (n,) one per prompt, on the host: set_tau writes it
        self.gen, self.win = generator(eng, self.seed), torch.full_like(eng.n_pend, self.B)

    def set_tau(self, row, tau):
        check_tau(tau, self.metric)
        self.tau[row] = tau

    def feed(self, eng):
        self.w = self.window(self, eng)  # (n,) proposals offered: w-1 masks
        return Fed(eng.pending.new_full((len(eng.active), self.B - 1), self.mask_id), self.w - 1)

    def accept(self, eng, logits, hidden):
        y, n_acc = self.gate_rows(eng, logits, self.w)
        self.window.update(self, n_acc)
        return Accepted(y, n_acc, torch.zeros_like(n_acc), self.w)

    def gate_rows(self, eng, logits, w):
        """Proposals y (n, width) and how many each row accepts: the gate's prefix within its window w."""
        y, p = propose(logits, self.temperature, self.top_k, self.gen)  # (n, width), (n, width, V)
        ok = gate(p, y, self.tau.to(eng.dev)[eng.active][:, None], self.metric)
        ok &= torch.arange(y.shape[1], device=eng.dev) < w[:, None]  # nothing past the row's window
        return y, n_accepted(ok)


# -------------------------------------------------------------------------------------------- Jacobi
class Jacobi(Strategy):
    """Jacobi decoding of a plain AR model (greedy, exact): feed guesses for the next window-1 tokens;
    output j is AR's exact prediction iff every guess before it matched, so the converged prefix is
    accepted; the outputs after it are the next guesses. No mask token is ever fed."""

    rows = ("guesses",)

    def __init__(self, window=4):
        if window < 1:
            raise ValueError(f"Jacobi's window must be >= 1, got {window}")
        self.window, self.ahead, self.width = window, window, window

    def start(self, eng):
        self.guesses = torch.full((len(eng.active), self.window - 1), PAD, device=eng.dev)  # any token

    def feed(self, eng):
        return Fed(self.guesses, torch.full_like(eng.n_pend, self.window - 1))

    def accept(self, eng, logits, hidden):
        y = next_tokens(logits)  # (n, window)
        ok = torch.cat([torch.ones_like(y[:, :1], dtype=torch.bool), self.guesses == y[:, :-1]], 1)
        n_acc = n_accepted(ok)
        # next guesses: the unverified outputs past what was taken
        cols = (n_acc[:, None] + torch.arange(self.window - 1, device=eng.dev)).clamp(max=self.window - 1)
        self.guesses = y.gather(1, cols)
        return Accepted(y, n_acc, torch.zeros_like(n_acc), torch.full_like(n_acc, self.window))


# ------------------------------------------------------------------------------------------ lossless
class Lossless(Strategy):
    """Lossless MARS: the masks draft, AR verifies (speculative decoding with the model as its own
    drafter), so the output is AR's (greedy: token for token; sampled: in distribution) for any model.
    Each row feeds [draft | B-1 masks]: causal attention and masks last make the outputs at the last
    pending token and at the draft AR's own predictions for the draft's positions and one more
    (decode.verify_draft keeps the agreeing prefix plus AR's next token). After a fully kept draft (or
    none) this forward's mask proposals, which saw all of it, are the next draft; after a rejection the
    next forward drafts afresh. The kept draft tokens were fed with their real ids: verified."""
    rows = ("draft", "n_draft", "q")

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
        return Fed(*splice(self.draft, self.n_draft, masks, self.B - 1))

    def accept(self, eng, logits, hidden):
        """logits (n, 2B-1, V) from the last pending token on: AR's at the draft's positions and one more
        (columns 0..n_draft), then the masks' (columns n_draft+1 .. n_draft+B-1)."""
        B = self.B
        y, n_kept = verify_draft(self.draft, self.n_draft, logits[:, :B], self.q, self.temperature,
                                 self.top_k, self.gen)
        cols = self.n_draft[:, None] + 1 + torch.arange(B - 1, device=eng.dev)  # (n, B-1)
        masks = logits.gather(1, cols[..., None].expand(-1, -1, logits.shape[-1]))  # (n, B-1, V)
        q = None if self.temperature == 0 else sampling_dist(masks, self.temperature, self.top_k)
        proposal = next_tokens(masks) if q is None else sample(q, self.gen)
        self.draft, self.n_draft = proposal, torch.where(n_kept == self.n_draft, B - 1, 0)
        self.q = q
        return Accepted(y, n_kept + 1, n_kept, torch.full_like(n_kept, B))
