"""
The training batch and the two losses: plain AR-SFT (stage 1) and the MARS dual-track loss (stage 2).
docs/mars.md sections 2-5 explain the method; the masks come from masks.py.
"""
import torch
import torch.nn.functional as F

from .masks import block_diffusion_mask, causal_mask, mars_train_mask

IGNORE = -100  # cross_entropy's ignore_index


def collate(examples, block_size, eos_id, device="cpu"):
    """examples: list of (ids, loss_mask) from ChatTokenizer.render. Returns x (N, L) token ids,
    response (N, L) bool (the tokens the noisy stream hides) and targets (N, L) with targets[:, t] =
    x[:, t+1] where x[:, t+1] is a response token, else IGNORE.
    Each example is padded with EOS up to a multiple of block_size and those pads ARE response tokens
    (the model learns to keep emitting EOS after the end); the batch is then right-padded to its longest
    example with EOS that are NOT targets. Right padding needs no key masking: nothing real looks right."""
    padded = []
    for ids, loss_mask in examples:
        n_pad = -len(ids) % block_size
        padded.append((list(ids) + [eos_id] * n_pad, list(loss_mask) + [1] * n_pad))
    L = max(len(ids) for ids, _ in padded)
    x = torch.full((len(padded), L), eos_id, dtype=torch.long)
    response = torch.zeros((len(padded), L), dtype=torch.bool)
    for i, (ids, loss_mask) in enumerate(padded):
        x[i, :len(ids)] = torch.tensor(ids)
        response[i, :len(ids)] = torch.tensor(loss_mask, dtype=torch.bool)
    targets = torch.full_like(x, IGNORE)
    targets[:, :-1] = torch.where(response[:, 1:], x[:, 1:], IGNORE)  # output at t predicts x_{t+1}
    return x.to(device), response.to(device), targets.to(device)


def ar_loss(model, x, targets):
    """Stage 1 (AR-SFT): next-token cross-entropy on response targets under a causal mask."""
    N, L = x.shape
    pos = torch.arange(L, device=x.device).expand(N, L)
    logits = model(x, pos, causal_mask(L, device=x.device))  # (N, L, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def dual_track_loss(model, x, response, targets, block_size, mask_id, alpha=1.0, bidirectional=False):
    """Stage 2 (MARS): one forward over [clean | noisy] of length 2L.
    clean c_t = x_t; noisy n_t = MASK where x_t is a response token, else x_t (prompt tokens stay real).
    Both halves use position ids 0..L-1, so noisy token t sits exactly where clean token t does.
    The output at position t of EITHER stream predicts x_{t+1} (AR's shift, kept everywhere): so both
    halves share one target row. How far ahead of the known context each output predicts:
      clean output at t:              distance 1 (plain next-token prediction)
      noisy output at t = k*B + j:    has seen clean x_0..x_{kB-1} and j+1 noisy inputs, predicts
                                      x_{kB+j+1}: distance j+2, so 2..B+1 over the block
      the decoder uses 1..B: distance 1 from the last real token, 2..B from its B-1 masks; the
      block's last noisy output (distance B+1) is trained but never used.
    loss = mean CE(noisy) + alpha * mean CE(clean); alpha = 0 is the paper's "no SFT loss" ablation;
    bidirectional=True swaps in the block-diffusion mask (the paper's BD3LM baseline).
    Returns (loss, noisy_ce, clean_ce)."""
    N, L = x.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} must be a multiple of block_size {block_size}: use collate()")
    noisy = torch.where(response, torch.full_like(x, mask_id), x)
    inputs = torch.cat([x, noisy], dim=1)  # (N, 2L)
    pos = torch.arange(L, device=x.device).repeat(2).expand(N, 2 * L)  # (N, 2L): 0..L-1, 0..L-1
    make_mask = block_diffusion_mask if bidirectional else mars_train_mask
    logits = model(inputs, pos, make_mask(L, block_size, device=x.device))  # (N, 2L, V)
    clean_ce = F.cross_entropy(logits[:, :L].flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    noisy_ce = F.cross_entropy(logits[:, L:].flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    return noisy_ce + alpha * clean_ce, noisy_ce, clean_ce
