"""
The paper's block-diffusion baseline (BD3LM), as the released code trains it, and a sampler to score it.
It is here to be compared with MARS, which keeps attention left to right; docs/mars.md, "Baselines".
Also what the baselines share with MARS's ablations: their masks (block_diffusion_mask, bd3lm_mask, on
masks.dual_track_grid) and MDLM's diffusion times (diffusion_times). It registers three objectives of
train.py --stage mars (dual_track.OBJECTIVES): bd3lm, csbd (MARS's loss, the noisy stream bidirectional
inside a block) and no_sft_released (MARS with no clean loss, as the released code ran it: the noisy terms
weighted by 1/t).

Training (block_diffusion_loss), against MARS's dual_track_loss:
- each sequence draws a time t = eps + (1 - eps) * U(0, 1) and hides each response token with
  probability t (not all of them): MDLM's linear schedule;
- the noisy stream attends in both directions inside its block; the clean stream is block-causal
  (bd3lm_mask);
- only the noisy stream has a loss, on the hidden tokens, each weighted by 1/t (MDLM's weight for the
  linear schedule), over the sequence's target count ("sequence") or the batch's ("token").
nanoMARS keeps its one shift here too: the output at position p predicts x_{p+1} (the released trainer
predicts x_p at p unless told to right-shift its logits, as its MARS samplers do). A target counts when
the token it predicts was hidden, so no output is ever scored on a token it can see.

Decoding (block_diffusion_decode; variant="csbd" for a model trained with train.py --objective csbd,
whose clean stream is token-causal) follows what training shows the model. The outputs of noisy block
k = positions kB..kB+B-1 predict x_{kB+1}..x_{kB+B}. With c known tokens, k = (c-1) // B is the block of
the last one: feed x_0..x_{kB-1} as the clean stream (blocks < k), then block k in the noisy role (its
known tokens real, the rest masks), and fill the unknown targets c..kB+B: each forward fills the most
confident one (the released sampler's "low_confidence" order, one token per forward) and, with tau < 1,
also every other one whose probability is >= tau. Then the next block. No cache: every forward
recomputes the whole sequence (a baseline, kept short).
"""
import torch

from ..decode import Decoded, check_decode_args, cut
from ..dual_track import IGNORE, OBJECTIVES, dual_track_objective
from ..masks import dual_track_grid

EPS = 1e-3  # the released trainers' time_epsilon: a diffusion time t is never below it, so 1/t <= 1000


def diffusion_times(N, generator):
    """(N,) times t = eps + (1 - eps) * U(0, 1), one per sequence, as the released diffusion-style trainers
    draw them (MDLM with a linear schedule: hide each token with probability t, weight its loss by 1/t)."""
    return EPS + (1 - EPS) * torch.rand(N, device=generator.device, generator=generator)


def block_diffusion_mask(L, block_size, device=None, offset=0):
    """Block diffusion, causal-clean variant (the released code's csbd_mask): like mars_train_mask (same
    blocks, same offset argument), but a noisy token sees EVERY noisy token of its block, later ones
    included. That breaks the left-to-right attention of AR (docs/mars.md, section 1, difference 2)."""
    (qn, qt, qk), (kn, kt, kk) = dual_track_grid(L, block_size, offset, device)
    clean_clean = ~qn & ~kn & (kt <= qt)
    noisy_noisy = qn & kn & (kk == qk)
    noisy_clean = qn & ~kn & (kk < qk)
    return clean_clean | noisy_noisy | noisy_clean


def bd3lm_mask(L, block_size, device=None):
    """Block diffusion as the paper's BD3LM baseline ran it (the released code's block_diff_mask, in
    nanoMARS's [clean | noisy] order):
    clean t -> clean s  iff k(s) <= k(t)      (BLOCK-causal: a clean token sees all of its own block)
    noisy t -> noisy s  iff k(s) == k(t)      (both directions inside its block)
    noisy t -> clean s  iff k(s) <  k(t)
    clean t -> noisy s  never
    The clean stream carries no loss there (only the noisy one does), so seeing later tokens of its own
    block leaks nothing: a noisy query reads clean tokens of earlier blocks only."""
    (qn, qt, qk), (kn, kt, kk) = dual_track_grid(L, block_size, 0, device)
    clean_clean = ~qn & ~kn & (kk <= qk)
    noisy_noisy = qn & kn & (kk == qk)
    noisy_clean = qn & ~kn & (kk < qk)
    return clean_clean | noisy_noisy | noisy_clean


def block_diffusion_loss(model, x, response, targets, block_size, mask_id, generator, loss_norm="sequence"):
    """x, response, targets: (N, L) from collate (L a multiple of B). generator: a torch.Generator on
    x's device (the random times and hidden tokens). Returns (loss, noisy_ce): noisy_ce is the plain
    mean CE of the hidden targets, for logging."""
    N, L = x.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} must be a multiple of block_size {block_size}: use collate()")
    t = diffusion_times(N, generator)  # (N,)
    hidden = response & (torch.rand(N, L, device=x.device, generator=generator) < t[:, None])  # (N, L)
    noisy = torch.where(hidden, torch.full_like(x, mask_id), x)
    pos = torch.arange(L, device=x.device).repeat(2).expand(N, 2 * L)
    scored = torch.zeros_like(hidden)
    scored[:, :-1] = hidden[:, 1:] & (targets[:, :-1] != IGNORE)  # output at p, target x_{p+1}, hidden
    keep = torch.cat([torch.zeros_like(scored), scored], 1)  # (N, 2L): noisy outputs only
    ce = model(torch.cat([x, noisy], 1), pos, bd3lm_mask(L, block_size, device=x.device), keep=keep,
               targets=targets.repeat(1, 2)[keep])  # (K,)
    rows = torch.arange(N, device=x.device)[:, None].expand(N, 2 * L)[keep]  # (K,)
    weighted = ce / t[rows]  # MDLM's 1/t
    n_targets = (targets != IGNORE).sum(1).clamp_min(1)  # (N,) every target, hidden or not, as released
    if loss_norm == "sequence":
        loss = (torch.zeros(N, device=x.device).index_add(0, rows, weighted) / n_targets).mean()
    else:
        loss = weighted.sum() / n_targets.sum()
    return loss, ce.detach().mean()


@torch.no_grad()
def block_diffusion_decode(model, prompt, max_new_tokens, mask_id, block_size=4, tau=1.0, stop_ids=(),
                           variant="bd3lm"):
    """Greedy block-diffusion decoding (module docstring). Each span is the tokens one forward filled,
    in position order. At tau = 1 each forward fills one position, but tokens/forward (counted up to the
    stop token) is below 1: the forwards that fill the rest of the stop token's block count too."""
    check_decode_args(model, prompt, max_new_tokens, block_size, tau)
    B, dev, out = block_size, model.embed.weight.device, Decoded()
    make_mask = {"bd3lm": bd3lm_mask, "csbd": block_diffusion_mask}[variant]
    known = list(prompt)
    while len(out.tokens) < max_new_tokens:
        c = len(known)
        k = (c - 1) // B
        end = k * B + B  # targets c..end are unknown; inputs c..end-1 are masks
        filled = {}
        while len(filled) < end - c + 1:
            block = known[k * B:] + [filled.get(p, mask_id) for p in range(c, end)]  # noisy block k
            L = k * B + B  # the clean stream holds positions < kB; both streams are L long, as in training
            clean = known[:k * B] + [mask_id] * B  # block k of the clean stream is never seen by noisy
            pos = torch.arange(L, device=dev).repeat(2)[None]
            ids = torch.tensor([clean + known[:k * B] + block], device=dev)
            logits = model(ids, pos, make_mask(L, B, device=dev))[0, L + c - 1:L + end]  # (end-c+1, V)
            p, y = logits.softmax(-1).max(-1)
            open_ = torch.tensor([q not in filled for q in range(c, end + 1)], device=dev)
            best = int(torch.where(open_, p, -1.0).argmax())
            take = (open_ & (p >= tau)) if tau < 1 else torch.zeros_like(open_)
            take[best] = True
            span = {c + i: int(y[i]) for i in take.nonzero()[:, 0].tolist()}
            filled.update(span)
            out.spans.append([span[q] for q in sorted(span)])
        new, stopped = cut([filled[q] for q in range(c, end + 1)], max_new_tokens - len(out.tokens), stop_ids)
        out.tokens += new
        known += new
        if stopped:
            break
    return out


# ------------------------------------------------------------------------- train.py --stage mars objectives
def bd3lm_objective(args, mask_id):
    """--objective bd3lm: block_diffusion_loss (dual_track.OBJECTIVES explains objectives)."""
    B, norm = args.block_size, args.loss_norm
    def loss(model, x, response, targets, offsets, gen):
        total, noisy = block_diffusion_loss(model, x, response, targets, B, mask_id, gen, norm)
        return total, {"noisy": noisy}
    return f"the block-diffusion baseline (objective bd3lm), block_size {B}, loss_norm {norm}", loss


def csbd_objective(args, mask_id):
    """--objective csbd: MARS's dual-track loss under block_diffusion_mask."""
    return dual_track_objective(args, mask_id, make_mask=block_diffusion_mask)


def no_sft_released_objective(args, mask_id):
    """--objective no_sft_released: MARS's noisy loss alone (alpha 0), each sequence's terms weighted by
    1/t, one t = diffusion_times per sequence: MARSTrainerNoSFT keeps MDLM's weight (mean ~7) while hiding
    every response token."""
    return dual_track_objective(args, mask_id, alpha=0.0, noisy_weights=lambda N, gen: 1 / diffusion_times(N, gen))


OBJECTIVES.update(bd3lm=bd3lm_objective, csbd=csbd_objective, no_sft_released=no_sft_released_objective)
