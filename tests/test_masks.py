import torch

from conftest import random_model
from nanomars.masks import block_diffusion_mask, causal_mask, decode_mask, mars_train_mask, render_mask

# the picture in docs/mars.md, L=8, B=4
SPEC_PICTURE = """\
            C0 C1 C2 C3 C4 C5 C6 C7 | N0 N1 N2 N3 N4 N5 N6 N7
    C0       1  .  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C3       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C7       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    N0       .  .  .  .  .  .  .  . |  1  .  .  .  .  .  .  .
    N2       .  .  .  .  .  .  .  . |  1  1  1  .  .  .  .  .
    N4       1  1  1  1  .  .  .  . |  .  .  .  .  1  .  .  .
    N6       1  1  1  1  .  .  .  . |  .  .  .  .  1  1  1  ."""


def test_mars_mask_matches_the_spec_picture():
    assert render_mask(mars_train_mask(8, 4), L=8, rows=[0, 3, 7, 8, 10, 12, 14]) == SPEC_PICTURE


def test_mars_mask_all_rows_by_rule():
    L, B = 12, 4
    m = mars_train_mask(L, B)
    for q in range(2 * L):
        for k in range(2 * L):
            qn, t, kn, s = q >= L, q % L, k >= L, k % L
            if not qn and not kn:
                want = s <= t
            elif qn and kn:
                want = s // B == t // B and s <= t
            elif qn:
                want = s // B < t // B
            else:
                want = False
            assert bool(m[q, k]) == want, (q, k)


def test_block_size_one_noisy_sees_all_earlier_clean():
    # B = 1: noisy t sees clean 0..t-1 and itself -> a plain one-step-ahead predictor from masks
    m = mars_train_mask(5, 1)
    assert torch.equal(m[5:, :5], torch.ones(5, 5, dtype=torch.bool).tril(-1))
    assert torch.equal(m[5:, 5:], torch.eye(5, dtype=torch.bool))


def test_block_diffusion_is_bidirectional_inside_a_block_only():
    L, B = 8, 4
    bd, mars = block_diffusion_mask(L, B), mars_train_mask(L, B)
    blocks = torch.arange(L) // B
    assert torch.equal(bd[L:, L:], blocks[:, None] == blocks[None, :])
    assert torch.equal(bd[:, :L], mars[:, :L]) and torch.equal(bd[:L], mars[:L])


def test_decode_mask_sees_cache_and_earlier_new_tokens_only():
    m = decode_mask(torch.tensor([3, 1]), 2, 6)
    assert m[0].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert m[1].tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]


def dual_track_outputs(model, x, noisy, L):
    inputs = torch.cat([x, noisy])[None]
    pos = torch.arange(L).repeat(2)[None]
    return model(inputs, pos, mars_train_mask(L, 4))[0]  # (2L, V)


def test_no_leak_from_the_future():
    """Changing a clean token in block >= k leaves every noisy output of block k unchanged; changing a clean
    token of block k-1 changes them. Clean outputs never depend on the noisy stream."""
    model, L, B, k = random_model(), 16, 4, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 96, (L,), generator=g)
    noisy = x.clone()
    noisy[4:] = 96  # mask id; the first block is "prompt"
    base = dual_track_outputs(model, x, noisy, L)
    block_k = slice(L + k * B, L + (k + 1) * B)
    for t in range(k * B, L):  # any clean token in block k or later
        changed = x.clone()
        changed[t] = (changed[t] + 1) % 96
        out = dual_track_outputs(model, changed, noisy, L)
        assert torch.allclose(out[block_k], base[block_k], atol=1e-6), t
    changed = x.clone()
    changed[k * B - 1] = (changed[k * B - 1] + 1) % 96  # a clean token of block k-1
    assert not torch.allclose(dual_track_outputs(model, changed, noisy, L)[block_k], base[block_k], atol=1e-4)
    other = noisy.clone()
    other[4:] = 95  # a different noisy stream: every clean output must stay the same
    assert torch.allclose(dual_track_outputs(model, x, other, L)[:L], base[:L], atol=1e-6)
