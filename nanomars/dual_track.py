"""
The training batch and the two losses: plain AR-SFT (stage 1) and the MARS dual-track loss (stage 2), and
the objectives train.py looks up by name (OBJECTIVES, at the end). docs/mars.md sections 2-5 explain the
method; the masks come from masks.py.
"""
import torch

from .masks import causal_mask, mars_train_mask

IGNORE = -100  # cross_entropy's ignore_index


def collate(examples, block_size, eos_id, device="cpu", offsets=None, pad_targets=True):
    """examples: list of (ids, loss_mask) from ChatTokenizer.render. Returns x (N, L) token ids,
    response (N, L) bool (the tokens the noisy stream hides) and targets (N, L) with targets[:, t] =
    x[:, t+1] where x[:, t+1] is a response token, else IGNORE.
    Each example is padded with EOS up to the end of the block holding its last token and those pads ARE
    response tokens (the model learns to keep emitting EOS after the end); the batch is then right-padded
    to its longest example with EOS that are NOT targets. Right padding needs no key masking: nothing real
    looks right. offsets: None (blocks from position 0: each example padded to a multiple of B) or the
    (N,) block offsets that dual_track_loss will get (random_offsets). pad_targets=False (train.py
    --no-pad_targets): the end-of-block pads are still there (the blocks need them) but are not response
    tokens, so no output is trained to predict them and the noisy stream shows them as they are (nothing
    real looks right, so no target sees them); the reply's own stop token stays a target. The released
    code (dllm's AppendEOSBlockWrapper) trains them, hence the default."""
    padded = []
    for n, (ids, loss_mask) in enumerate(examples):
        # With offset r, block k spans positions kB - r .. kB - r + B - 1, so the example is padded until
        # (length + r) is a multiple of B: its last block is complete, as with r = 0 (where this is the
        # multiple-of-B padding). Padding to a multiple of B regardless would leave that block only r
        # positions long, and its noisy outputs would lose the EOS-pad targets that teach the model to
        # keep stopping. Pads stay under B, as before (train.py's --max_len filter still holds); with
        # offsets the batch length need not be a multiple of B, and the masks do not need it to be.
        r = 0 if offsets is None else int(offsets[n])
        n_pad = -(len(ids) + r) % block_size
        padded.append((list(ids) + [eos_id] * n_pad, list(loss_mask) + [int(pad_targets)] * n_pad))
    L = max(len(ids) for ids, _ in padded)
    x = torch.full((len(padded), L), eos_id, dtype=torch.long)
    response = torch.zeros((len(padded), L), dtype=torch.bool)
    for i, (ids, loss_mask) in enumerate(padded):
        x[i, :len(ids)] = torch.tensor(ids)
        response[i, :len(ids)] = torch.tensor(loss_mask, dtype=torch.bool)
    targets = torch.full_like(x, IGNORE)
    targets[:, :-1] = torch.where(response[:, 1:], x[:, 1:], IGNORE)  # output at t predicts x_{t+1}
    return x.to(device), response.to(device), targets.to(device)


def random_offsets(N, block_size, generator):
    """N block offsets drawn uniformly from 0..B-1 with the caller's torch.Generator (so a run is
    deterministic from its seed). A (N,) long tensor on the generator's device, for collate and
    dual_track_loss."""
    return torch.randint(block_size, (N,), generator=generator, device=generator.device)


def ar_loss(model, x, targets):
    """Stage 1 (AR-SFT): next-token cross-entropy on response targets under a causal mask. Logits are
    computed only at the outputs that have a target (model.forward's keep), chunk by chunk."""
    N, L = x.shape
    pos = torch.arange(L, device=x.device).expand(N, L)
    keep = targets != IGNORE  # (N, L)
    return model(x, pos, causal_mask(L, device=x.device), keep=keep, targets=targets[keep]).mean()


def reduce_loss(ce, rows, N, loss_norm="token", weights=None):
    """ce (K,): per-target losses, rows (K,): their example. "token": one mean over all K targets (a long
    reply weighs in proportion to its length); "sequence": each example's mean, then the mean over the N
    examples (the released MARS trainer's default: a short reply weighs as much as a long one).
    weights (N,): each example's terms are multiplied by its weight first."""
    if weights is not None:
        ce = ce * weights[rows]
    if loss_norm == "token":
        return ce.sum() / max(1, ce.numel())
    if loss_norm != "sequence":
        raise ValueError(f"loss_norm must be 'token' or 'sequence', got {loss_norm!r}")
    per_row = torch.zeros(N, device=ce.device).index_add(0, rows, ce.float())
    count = torch.zeros(N, device=ce.device).index_add(0, rows, torch.ones_like(ce, dtype=torch.float32))
    return (per_row / count.clamp_min(1)).mean()


def dual_track_loss(model, x, response, targets, block_size, mask_id, alpha=1.0, make_mask=mars_train_mask,
                    offsets=None, loss_norm="token", noisy_weights=None):
    """Stage 2 (MARS): one forward over [clean | noisy] of length 2L.
    clean c_t = x_t; noisy n_t = MASK where x_t is a response token, else x_t (prompt tokens stay real).
    Both halves use position ids 0..L-1, so noisy token t sits exactly where clean token t does.
    The output at position t of EITHER stream predicts x_{t+1} (AR's shift, kept everywhere): so both
    halves share one target row. How far ahead of the last real token it can see each output predicts
    (docs/mars.md, section 5):
      clean output at t:              distance 1 (plain next-token prediction)
      noisy output at t = s + j, in a response block starting at s: has seen clean x_0..x_{s-1} and
                                      j+1 masks, predicts x_{s+j+1}: distance j+2, so 2..B+1 over the block
      noisy outputs of the block where the prompt ends: its prompt tokens are real in the noisy stream,
                                      so the output at the last prompt token predicts the first response
                                      token at distance 1, and the masks after it 2, 3, ... to the block's
                                      end: one distance-1 noisy target per example (per trained turn)
      the decoder uses 1..B: distance 1 from the last real token, 2..B from its B-1 masks; a full
      block's last noisy output (distance B+1) is trained but never used.
    The paper counts one AR-like prediction in B, taking a block's predictions as distances 1..B; with the
    shift, a block's distance-1 prediction is the clean output just before it (section 5 reconciles the two).
    offsets: None (blocks from position 0, s = kB: the released alignment, --no-random_offsets), or an
    (N,) long tensor of per-example block offsets r (random_offsets, train.py's default; pass the same
    ones to collate): row n's blocks are k(t) = (t + r) // B, so block k starts at s = kB - r and the
    known context above can end anywhere, not only at multiples of B. Distances are unchanged.
    loss = mean CE(noisy) + alpha * mean CE(clean), each mean over the response targets (logits are
    computed only at the outputs that have one), taken as reduce_loss's loss_norm says; alpha = 0 is the
    paper's "no SFT loss" ablation in its plain form; noisy_weights (N,) multiply each example's noisy
    terms (the ablation as the released code ran it weights them by MDLM's 1/t: compare/block_diffusion.py).
    make_mask(L, block_size, device=, offset=) -> the (2L, 2L) or (N, 2L, 2L) mask: MARS's by default
    (the comparisons swap in theirs).
    Returns (loss, noisy_ce, clean_ce), the last two plain unweighted means, for logging."""
    N, L = x.shape
    if offsets is None and L % block_size:
        raise ValueError(f"sequence length {L} must be a multiple of block_size {block_size}: use collate()")
    if offsets is not None and tuple(offsets.shape) != (N,):
        raise ValueError(f"offsets must have shape ({N},), one per example, got {tuple(offsets.shape)}")
    noisy = torch.where(response, torch.full_like(x, mask_id), x)
    inputs = torch.cat([x, noisy], dim=1)  # (N, 2L)
    pos = torch.arange(L, device=x.device).repeat(2).expand(N, 2 * L)  # (N, 2L): 0..L-1, 0..L-1
    # (2L, 2L), or (N, 2L, 2L) with per-example offsets
    mask = make_mask(L, block_size, device=x.device, offset=0 if offsets is None else offsets)
    both = targets.repeat(1, 2)  # (N, 2L): the two streams share one target row
    keep = both != IGNORE
    ce = model(inputs, pos, mask, keep=keep, targets=both[keep])  # (K,), row by row in order
    noisy = torch.arange(2 * L, device=x.device).expand(N, 2 * L)[keep] >= L  # (K,) the noisy stream's
    rows = torch.arange(N, device=x.device)[:, None].expand(N, 2 * L)[keep]  # (K,) each target's example
    loss = (reduce_loss(ce[noisy], rows[noisy], N, loss_norm, noisy_weights) +
            alpha * reduce_loss(ce[~noisy], rows[~noisy], N, loss_norm))
    return loss, ce[noisy].mean().detach(), ce[~noisy].mean().detach()


# ------------------------------------------------------------------------------ train.py's objectives
# An objective, given train.py's arguments and the tokenizer's MASK id, returns (what it trains, in words,
# loss), loss(model, x, response, targets, offsets, gen) -> (loss, {name: detached loss}) for one micro-batch
# from collate (gen: a torch.Generator seeded per micro-step, for objectives that draw at random). train.py
# looks them up here by name; the module that owns an objective registers it, the comparisons' own in
# nanomars/compare/ (importing that package registers them).
def next_token_objective(args, mask_id):
    """Stage 1: ar_loss."""
    def loss(model, x, response, targets, offsets, gen):
        ce = ar_loss(model, x, targets)
        return ce, {"ar": ce.detach()}
    return "AR-SFT (next-token loss)", loss


def dual_track_objective(args, mask_id, alpha=None, make_mask=mars_train_mask, noisy_weights=None):
    """Stage 2: dual_track_loss with args' alpha (unless given), block_size and loss_norm. The variants that
    others register swap the mask (make_mask) or weight each example's noisy terms (noisy_weights(N, gen)
    -> (N,))."""
    B, norm = args.block_size, args.loss_norm
    alpha = args.alpha if alpha is None else alpha
    def loss(model, x, response, targets, offsets, gen):
        weights = None if noisy_weights is None else noisy_weights(len(x), gen)
        total, noisy, clean = dual_track_loss(model, x, response, targets, B, mask_id, alpha, make_mask, offsets,
                                              norm, weights)
        return total, {"noisy": noisy, "clean": clean}
    blocks = "random block offsets" if args.random_offsets else "blocks from position 0"
    return (f"MARS dual-track (objective {args.objective}), alpha {alpha}, block_size {B}, {blocks}, "
            f"loss_norm {norm}"), loss


OBJECTIVES = {"ar": next_token_objective, "mars": dual_track_objective}  # name -> objective(args, mask_id)
STARTS = {}  # stage -> start(args, init_from): a stage whose model train.py does not build (see train.py)
