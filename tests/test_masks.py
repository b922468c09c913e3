import pytest
import torch

from conftest import random_model
from nanomars.compare.block_diffusion import bd3lm_mask, block_diffusion_mask
from nanomars.masks import causal_mask, decode_mask, mars_train_mask, render_mask, tree_mask, tree_window

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


# the same mask with every block boundary shifted by an offset r: block k(t) = (t + r) // B
OFFSET_1_PICTURE = """\
            C0 C1 C2 C3 C4 C5 C6 C7 | N0 N1 N2 N3 N4 N5 N6 N7
    C0       1  .  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C1       1  1  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C2       1  1  1  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C3       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C4       1  1  1  1  1  .  .  . |  .  .  .  .  .  .  .  .
    C5       1  1  1  1  1  1  .  . |  .  .  .  .  .  .  .  .
    C6       1  1  1  1  1  1  1  . |  .  .  .  .  .  .  .  .
    C7       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    N0       .  .  .  .  .  .  .  . |  1  .  .  .  .  .  .  .
    N1       .  .  .  .  .  .  .  . |  1  1  .  .  .  .  .  .
    N2       .  .  .  .  .  .  .  . |  1  1  1  .  .  .  .  .
    N3       1  1  1  .  .  .  .  . |  .  .  .  1  .  .  .  .
    N4       1  1  1  .  .  .  .  . |  .  .  .  1  1  .  .  .
    N5       1  1  1  .  .  .  .  . |  .  .  .  1  1  1  .  .
    N6       1  1  1  .  .  .  .  . |  .  .  .  1  1  1  1  .
    N7       1  1  1  1  1  1  1  . |  .  .  .  .  .  .  .  1"""

OFFSET_3_PICTURE = """\
            C0 C1 C2 C3 C4 C5 C6 C7 | N0 N1 N2 N3 N4 N5 N6 N7
    C0       1  .  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C1       1  1  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C2       1  1  1  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C3       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C4       1  1  1  1  1  .  .  . |  .  .  .  .  .  .  .  .
    C5       1  1  1  1  1  1  .  . |  .  .  .  .  .  .  .  .
    C6       1  1  1  1  1  1  1  . |  .  .  .  .  .  .  .  .
    C7       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    N0       .  .  .  .  .  .  .  . |  1  .  .  .  .  .  .  .
    N1       1  .  .  .  .  .  .  . |  .  1  .  .  .  .  .  .
    N2       1  .  .  .  .  .  .  . |  .  1  1  .  .  .  .  .
    N3       1  .  .  .  .  .  .  . |  .  1  1  1  .  .  .  .
    N4       1  .  .  .  .  .  .  . |  .  1  1  1  1  .  .  .
    N5       1  1  1  1  1  .  .  . |  .  .  .  .  .  1  .  .
    N6       1  1  1  1  1  .  .  . |  .  .  .  .  .  1  1  .
    N7       1  1  1  1  1  .  .  . |  .  .  .  .  .  1  1  1"""


def test_offset_masks_match_their_pictures():
    # offset 1: blocks {0,1,2} {3,4,5,6} {7}; offset 3: blocks {0} {1,2,3,4} {5,6,7}
    assert render_mask(mars_train_mask(8, 4, offset=1), L=8) == OFFSET_1_PICTURE
    assert render_mask(mars_train_mask(8, 4, offset=3), L=8) == OFFSET_3_PICTURE


def sees(q, k, L, B, r=0):
    """The rule of docs/mars.md, section 3, with blocks k(t) = (t + r) // B: may query q see key k?"""
    qn, t, kn, s = q >= L, q % L, k >= L, k % L
    if not qn and not kn:
        return s <= t
    if qn and kn:
        return (s + r) // B == (t + r) // B and s <= t
    if qn:
        return (s + r) // B < (t + r) // B
    return False


@pytest.mark.parametrize("L", [12, 10])
@pytest.mark.parametrize("r", [0, 1, 2, 3])
def test_mars_mask_all_rows_by_rule(L, r):
    B = 4
    m = mars_train_mask(L, B, offset=r)
    bd = block_diffusion_mask(L, B, offset=r)
    for q in range(2 * L):
        for k in range(2 * L):
            assert bool(m[q, k]) == sees(q, k, L, B, r), (q, k)
            t, s = q % L, k % L
            same_block_noisy = q >= L and k >= L and (s + r) // B == (t + r) // B
            assert bool(bd[q, k]) == (sees(q, k, L, B, r) or same_block_noisy), (q, k)


def test_offset_zero_is_the_unshifted_mask_and_only_offset_mod_b_matters():
    L, B = 8, 4
    for make in (mars_train_mask, block_diffusion_mask):
        assert torch.equal(make(L, B, offset=0), make(L, B))
        assert torch.equal(make(L, B, offset=torch.zeros(3, dtype=torch.long)), make(L, B).expand(3, 2 * L, 2 * L))
        for r in range(B):
            assert torch.equal(make(L, B, offset=r + B), make(L, B, offset=r))
        assert not torch.equal(make(L, B, offset=1), make(L, B))


def test_per_example_offsets_give_each_row_its_own_mask():
    L, B = 8, 4
    offsets = torch.tensor([3, 0, 1, 2, 1])
    for make in (mars_train_mask, block_diffusion_mask):
        m = make(L, B, offset=offsets)
        assert m.shape == (5, 2 * L, 2 * L)
        for n, r in enumerate(offsets.tolist()):
            assert torch.equal(m[n], make(L, B, offset=r)), (n, r)
    with pytest.raises(ValueError, match="an int or an"):
        mars_train_mask(L, B, offset=torch.zeros(2, 3, dtype=torch.long))


def test_block_size_one_noisy_sees_all_earlier_clean():
    # B = 1: noisy t sees clean 0..t-1 and itself -> a plain one-step-ahead predictor from masks
    m = mars_train_mask(5, 1)
    assert torch.equal(m[5:, :5], torch.ones(5, 5, dtype=torch.bool).tril(-1))
    assert torch.equal(m[5:, 5:], torch.eye(5, dtype=torch.bool))
    for r in (1, 2, 7):  # every block has one token whatever the offset
        assert torch.equal(mars_train_mask(5, 1, offset=r), m)


def test_block_diffusion_is_bidirectional_inside_a_block_only():
    L, B = 8, 4
    bd, mars = block_diffusion_mask(L, B), mars_train_mask(L, B)
    blocks = torch.arange(L) // B
    assert torch.equal(bd[L:, L:], blocks[:, None] == blocks[None, :])
    assert torch.equal(bd[:, :L], mars[:, :L]) and torch.equal(bd[:L], mars[:L])


# the two block-diffusion baselines, L=8, B=4: the noisy stream is the same (bidirectional inside a block,
# clean blocks strictly before its own); the clean stream is token-causal (csbd-style, nanoMARS's
# --objective csbd) or block-causal (the paper's BD3LM as released: it sees its whole block)
CSBD_PICTURE = """\
            C0 C1 C2 C3 C4 C5 C6 C7 | N0 N1 N2 N3 N4 N5 N6 N7
    C0       1  .  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C1       1  1  .  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C2       1  1  1  .  .  .  .  . |  .  .  .  .  .  .  .  .
    C3       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C4       1  1  1  1  1  .  .  . |  .  .  .  .  .  .  .  .
    C5       1  1  1  1  1  1  .  . |  .  .  .  .  .  .  .  .
    C6       1  1  1  1  1  1  1  . |  .  .  .  .  .  .  .  .
    C7       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    N0       .  .  .  .  .  .  .  . |  1  1  1  1  .  .  .  .
    N1       .  .  .  .  .  .  .  . |  1  1  1  1  .  .  .  .
    N2       .  .  .  .  .  .  .  . |  1  1  1  1  .  .  .  .
    N3       .  .  .  .  .  .  .  . |  1  1  1  1  .  .  .  .
    N4       1  1  1  1  .  .  .  . |  .  .  .  .  1  1  1  1
    N5       1  1  1  1  .  .  .  . |  .  .  .  .  1  1  1  1
    N6       1  1  1  1  .  .  .  . |  .  .  .  .  1  1  1  1
    N7       1  1  1  1  .  .  .  . |  .  .  .  .  1  1  1  1"""
BD3LM_CLEAN_ROWS = """\
            C0 C1 C2 C3 C4 C5 C6 C7 | N0 N1 N2 N3 N4 N5 N6 N7
    C0       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C1       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C2       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C3       1  1  1  1  .  .  .  . |  .  .  .  .  .  .  .  .
    C4       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    C5       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    C6       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  .
    C7       1  1  1  1  1  1  1  1 |  .  .  .  .  .  .  .  ."""


def test_block_diffusion_masks_match_their_pictures():
    assert render_mask(block_diffusion_mask(8, 4), L=8) == CSBD_PICTURE
    bd3lm = render_mask(bd3lm_mask(8, 4), L=8).splitlines()
    assert "\n".join(bd3lm[:9]) == BD3LM_CLEAN_ROWS
    assert bd3lm[9:] == CSBD_PICTURE.splitlines()[9:]  # the noisy rows are the csbd ones


def test_bd3lm_noisy_rows_see_no_clean_token_of_their_own_block_or_later():
    """The clean stream sees its whole block, so a noisy query must never read a clean token of its own
    block or a later one (that would show it the answer)."""
    L, B = 12, 4
    m, blk = bd3lm_mask(L, B), torch.arange(L) // B
    assert not (m[L:, :L] & (blk[None, :] >= blk[:, None])).any()
    assert not m[:L, L:].any()  # clean never sees noisy


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


@pytest.mark.parametrize("r", [0, 1, 2, 3])
def test_no_leak_with_offsets(r):
    """With blocks shifted by r: perturbing any token (clean or noisy) that a position may not see, by the
    rule of docs/mars.md, never changes that position's output, and perturbing one it may see does. The
    rule is closed under composition (what a visible key sees, the query sees too), so through several
    layers an output still depends on exactly the tokens its own row of the rule allows."""
    model, L, B = random_model(), 12, 4
    g = torch.Generator().manual_seed(r)
    x = torch.randint(0, 96, (L,), generator=g)
    noisy = x.clone()
    noisy[3:] = 96  # mask id; the first 3 tokens are "prompt"
    base = torch.cat([x, noisy])
    rows = [base]
    for p in range(2 * L):  # row p + 1: token p of [clean | noisy] changed
        changed = base.clone()
        changed[p] = (changed[p] + 1) % 96
        rows.append(changed)
    inputs = torch.stack(rows)  # (2L + 1, 2L)
    N = inputs.shape[0]
    pos = torch.arange(L).repeat(2).expand(N, 2 * L)
    with torch.no_grad():  # one forward, the per-example offset path: every row gets offset r
        out = model(inputs, pos, mars_train_mask(L, B, offset=torch.full((N,), r)))  # (N, 2L, V)
    for p in range(2 * L):
        for q in range(2 * L):
            diff = (out[p + 1, q] - out[0, q]).abs().max().item()
            if sees(q, p, L, B, r):
                assert diff > 1e-4, (p, q, diff)
            else:
                assert diff < 1e-6, (p, q, diff)


# tree attention (tree verification, nanomars/compare/tree.py): node i sees its ancestors and itself only. The tree:
# 0 and 1 hang from the root (the last known token); 2, 3 are children of 0; 4 of 1; 5 of 2; 6 of 5
TREE_PICTURE = """\
             0  1  2  3  4  5  6
    0        1  .  .  .  .  .  .
    1        .  1  .  .  .  .  .
    2        1  .  1  .  .  .  .
    3        1  .  .  1  .  .  .
    4        .  1  .  .  1  .  .
    5        1  .  1  .  .  1  .
    6        1  .  1  .  .  1  1"""

# a window of tree lossless MARS (B = 3) without a cache: prompt tokens 0, 1 | tree nodes a = 2, b = 3 (both
# children of the root, token 1) | the root's 2 masks 4, 5 | a's masks 6, 7 | b's masks 8, 9
TREE_WINDOW_PICTURE = """\
             0  1  2  3  4  5  6  7  8  9
    0        1  .  .  .  .  .  .  .  .  .
    1        1  1  .  .  .  .  .  .  .  .
    2        1  1  1  .  .  .  .  .  .  .
    3        1  1  .  1  .  .  .  .  .  .
    4        1  1  .  .  1  .  .  .  .  .
    5        1  1  .  .  1  1  .  .  .  .
    6        1  1  1  .  .  .  1  .  .  .
    7        1  1  1  .  .  .  1  1  .  .
    8        1  1  .  1  .  .  .  .  1  .
    9        1  1  .  1  .  .  .  .  1  1"""


def test_tree_masks_match_their_pictures():
    assert render_mask(tree_mask(torch.tensor([-1, -1, 0, 0, 1, 2, 5]))) == TREE_PICTURE
    parents = torch.tensor([[-1, -1, -1, 2, 0, 4, 1, 6]])  # the fed tokens a, b, masks; -1: the root
    pos, mask = tree_window(torch.tensor([0]), torch.tensor([2]), parents, 10, 10)
    assert render_mask(mask[0]) == TREE_WINDOW_PICTURE
    assert pos.tolist() == [[0, 1, 2, 2, 2, 3, 3, 4, 3, 4]]  # a fed token: the root's position + its depth


def test_a_chain_is_the_causal_mask_and_the_decode_window():
    for N in (1, 2, 5, 9):
        chain = torch.arange(N) - 1  # each node's parent is the one before it
        assert torch.equal(tree_mask(chain), causal_mask(N))
    start, n_real, W = torch.tensor([3, 0, 5]), torch.tensor([1, 4, 2]), 9  # 3 rows, padded to 9 columns
    chain = (torch.arange(W - 1) - 1).expand(3, -1)  # enough fed tokens for the row with the fewest real ones
    pos, mask = tree_window(start, n_real, chain, W, int(start.max()) + W)
    assert torch.equal(mask, decode_mask(start, W, int(start.max()) + W))
    assert torch.equal(pos, start[:, None] + torch.arange(W))


def test_tree_window_with_a_cache_and_padding():
    """Two rows: 3 cached slots + 1 real token, 0 cached + 2 real; 3 fed tokens (0 -> root, 1 -> root,
    2 -> 0); window 6 wide, so row 0 has 2 padding columns. Rule by rule."""
    start, n_real, parents = torch.tensor([3, 0]), torch.tensor([1, 2]), torch.tensor([[-1, -1, 0]] * 2)
    W, S = 6, 9
    pos, mask = tree_window(start, n_real, parents, W, S)
    sees = {0: [0], 1: [1], 2: [0, 2]}  # fed token -> the fed tokens it sees: its ancestors and itself
    for i in range(2):
        s0, r = int(start[i]), int(n_real[i])
        for q in range(W):
            allowed = set(range(s0 + q + 1))  # decode_mask: the cache and the window up to itself
            f = q - r
            if 0 <= f < 3:  # a fed token: the cache, the real tokens, its ancestors and itself
                allowed = set(range(s0 + r)) | {s0 + r + a for a in sees[f]}
                assert int(pos[i, q]) == s0 + r - 1 + len(sees[f])
            else:
                assert int(pos[i, q]) == s0 + q
            assert {s for s in range(S) if mask[i, q, s]} == allowed, (i, q)
