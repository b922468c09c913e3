"""
Every attention mask of MARS, written by hand over index grids. True = the query (row) may attend the key
(column). The model takes these as they are; nothing else decides who sees whom. (The block-diffusion
baselines' masks are built on the same grid, dual_track_grid, in compare/block_diffusion.py.)

The MARS training input is one sequence of length 2L: [clean x_0..x_{L-1} | noisy n_0..n_{L-1}], where the
noisy stream has MASK in place of response tokens. B is the block size (and nothing else); token t is in
block k(t) = (t + r) // B, where r is the example's block offset.
Default alignment: in training, blocks are counted from a random per-example offset. train.py's stage mars
draws r uniformly in [0, B) for every example at every step (dual_track.random_offsets), because with
r = 0 the clean context a noisy prediction sees always ends at a multiple of B, while a decoder's window
starts wherever the answer has got to; random offsets show the model every alignment. --no-random_offsets
trains with r = 0, blocks counted from position 0, as the released code does.
The functions below take offset=0 unless given one: the released mask, drawn in docs/mars.md, section
"The mask", which explains the rules.
"""
import torch


def causal_mask(T, device=None):
    """Ordinary causal mask (T, T): query t sees keys 0..t. Batches are right-padded, so no real token
    ever has padding on its left and one mask serves every row."""
    q = torch.arange(T, device=device)[:, None]
    k = torch.arange(T, device=device)[None, :]
    return k <= q  # (T, T)


def dual_track_grid(L, block_size, offset=0, device=None):
    """For each of the 2L rows (queries) and columns (keys) of [clean | noisy]: is it noisy, its position t,
    its block k(t) = (t + offset) // B. offset: an int, or an (N,) tensor of per-example offsets; then the
    block grids get a leading N dimension and so does every mask built from them. Only offset mod B
    matters (adding B renumbers every block by one and changes no comparison)."""
    if isinstance(offset, torch.Tensor):
        if offset.dim() != 1:
            raise ValueError(f"offset must be an int or an (N,) tensor, got shape {tuple(offset.shape)}")
        device = offset.device if device is None else device
        offset = offset.to(device)[:, None]  # (N, 1): broadcasts against t (2L,) to (N, 2L)
    i = torch.arange(2 * L, device=device)
    noisy, t = i >= L, i % L
    blk = (t + offset) // block_size  # (2L,) or (N, 2L)
    return (noisy[:, None], t[:, None], blk[..., :, None]), (noisy[None, :], t[None, :], blk[..., None, :])


def mars_train_mask(L, block_size, device=None, offset=0):
    """The MARS dual-track mask, with k(t) = (t + offset) // B:
    clean t -> clean s  iff s <= t                     (ordinary causal)
    noisy t -> noisy s  iff k(s) == k(t) and s <= t    (causal, only inside its own block)
    noisy t -> clean s  iff k(s) <  k(t)               (all clean tokens of earlier blocks)
    clean t -> noisy s  never
    offset: an int -> one (2L, 2L) mask; an (N,) tensor -> (N, 2L, 2L), row n's blocks shifted by
    offset[n]. A nonzero offset makes the first block (and usually the last) shorter than B, so the known
    context of a noisy prediction can end anywhere, as it does when decoding. offset 0 = blocks from
    position 0, the released mask; train.py passes random per-example offsets by default."""
    (qn, qt, qk), (kn, kt, kk) = dual_track_grid(L, block_size, offset, device)
    clean_clean = ~qn & ~kn & (kt <= qt)
    noisy_noisy = qn & kn & (kk == qk) & (kt <= qt)
    noisy_clean = qn & ~kn & (kk < qk)
    return clean_clean | noisy_noisy | noisy_clean


def decode_mask(start, T, S):
    """Mask (N, T, S) for T new tokens per row written at cache slots start[n] .. start[n]+T-1, attending
    the first S cache slots: slot s is visible to new token i iff s <= start[n] + i, i.e. everything the
    row has cached plus the new tokens up to itself. Stale slots beyond that (K/V of masks fed by an
    earlier step, or another row's longer window) are hidden. Without a cache start = 0: plain causal."""
    q_slot = start[:, None, None] + torch.arange(T, device=start.device)[None, :, None]  # (N, T, 1)
    k_slot = torch.arange(S, device=start.device)[None, None, :]  # (1, 1, S)
    return k_slot <= q_slot


def tree_mask(parents):
    """Tree attention among N fed tokens (tree verification, tree.py): parents (..., N) long gives each
    node's parent, an earlier node, or -1 for a node that hangs from the last known token (the root).
    Returns (..., N, N) bool: node i sees node j iff j is i or an ancestor of i; never a sibling, another
    branch or a descendant. A chain (parents -1, 0, 1, ...) gives the causal mask. Built as reachability:
    step[i, j] = (j is i or i's parent); its boolean square reaches two levels up, squaring s times 2^s."""
    N = parents.shape[-1]
    node = torch.arange(N, device=parents.device)
    reach = (node[:, None] == node) | (parents[..., :, None] == node)  # (..., N, N) itself or its parent
    for _ in range(max(1, N - 1).bit_length()):  # until 2^s >= N - 1, the deepest possible ancestor
        reach = (reach.float() @ reach.float()) > 0
    return reach


def tree_window(start, n_real, parents, W, S):
    """Positions (n, W) and mask (n, W, S) for rows of [n_real[i] real tokens | F fed tokens forming a
    tree | padding] written at cache slots start[i], start[i]+1, ... (decode_mask's setting); parents
    (n, F) as tree_mask's, per row. The real tokens and the padding are laid out as decode_mask has
    them (position = slot). Fed token f sees the cache, every real token of its row, and its ancestors
    and itself (tree_mask); its position is the last real token's plus its depth (siblings share one),
    so each node is computed exactly as if its root-to-node path had been fed alone."""
    n, F = parents.shape
    dev = start.device
    tree = tree_mask(parents)  # (n, F, F)
    fed_q = torch.arange(W, device=dev)[None] - n_real[:, None]  # (n, W) fed index of a column: < 0 real
    fed_k = torch.arange(S, device=dev)[None] - (start + n_real)[:, None]  # (n, S) the same for key slots
    is_fed_q, is_fed_k = (fed_q >= 0) & (fed_q < F), (fed_k >= 0) & (fed_k < F)
    rows = torch.arange(n, device=dev)[:, None, None]
    seen = tree[rows, fed_q.clamp(0, F - 1)[:, :, None], fed_k.clamp(0, F - 1)[:, None, :]]  # (n, W, S)
    mask = torch.where(is_fed_q[:, :, None] & is_fed_k[:, None, :], seen, decode_mask(start, W, S))
    depth = tree.sum(-1)  # (n, F) a node sees itself and its ancestors: as many as its depth
    slots = start[:, None] + torch.arange(W, device=dev)  # (n, W)
    fed_pos = (start + n_real - 1)[:, None] + depth.gather(1, fed_q.clamp(0, F - 1))
    return torch.where(is_fed_q, fed_pos, slots), mask


def render_mask(mask, L=None, rows=None):
    """Text picture of a (T, S) mask, as drawn in docs/mars.md. With L given it is a dual-track mask and
    rows/cols are labelled C0..C{L-1} | N0..N{L-1}. `rows` optionally selects which query rows to print."""
    T, S = mask.shape
    names = [f"C{i}" for i in range(L)] + [f"N{i}" for i in range(L)] if L else [str(i) for i in range(S)]

    def line(label, cells):  # cells right-aligned under 2-wide column names; " |" splits clean | noisy
        cells = [c.rjust(2) for c in cells]
        body = " ".join(cells) if not L else " ".join(cells[:L]) + " | " + " ".join(cells[L:])
        return f"    {label:<8}" + body

    lines = [line("", names)]
    for r in rows if rows is not None else range(T):
        lines.append(line(names[r], ["1" if mask[r, c] else "." for c in range(S)]))
    return "\n".join(lines)
