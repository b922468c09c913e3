"""
Tree verification for lossless MARS: the masks draft a TREE of candidate continuations, AR verifies all
of its branches in one forward, and whatever it accepts, the next tree is already drafted.

Chain lossless MARS (strategies.Lossless) verifies one draft, the masks' top-1 tokens, and loses the rest
of it at its first wrong token, though the masks also put probability on second and third choices; and
after a partial rejection its masks (they followed the rejected tokens) are of no use, so the next
forward has no draft. Here each forward feeds, after the row's pending tokens,

    [N tree nodes | B-1 masks after the root | B-1 masks after node 1 | ... | B-1 masks after node N]

as ONE tree (masks.tree_window): every fed token sees the cache, the pending tokens and its own
ancestors, nothing else, at position (last real token's) + its depth. So the output at a node is AR's
prediction after its root-to-node path, and the masks after a node are the masks chain MARS would feed
after that path.

The tree (best_tree), from B-1 masks' distributions p_1..p_{B-1} over the next B-1 tokens: the candidates
at depth d are p_d's top_k tokens, a path scores the product of its tokens' probabilities (the masks'
own estimate that the whole path is right), and the tree is the `nodes` best paths of the full
top_k-ary tree. No path scores above its prefix (ties go to the shorter), so the chosen paths hold all
their prefixes: a tree of N nodes whose shape the probabilities choose, per row and per step (a sure
row grows a deep chain, an unsure one a bushy first level).

Verification (greedy): node u is right iff its token is AR's argmax at its parent (the root's: the last
real token's); it is kept iff it and all its ancestors are right. Siblings hold different tokens, so
the kept nodes form one path: the row takes its tokens, then AR's own token after its deepest node,
whose masks' proposals are the next tree (the root's masks' when nothing was kept): a draft is always
ready. The kept nodes' K/V are AR's (real ids, their own path only, the right positions) but sit at
scattered slots: they are moved to the slots right after the pending tokens, where the engine's commit
(the pending tokens and the verified ones) counts them; the rest lies past the length, hidden.

Greedy only: with several candidates for one position, keeping each with probability min(1, p/q) as
decode.verify_draft does would not give AR's distribution; sampling needs a rule over siblings
(recursive rejection, SpecInfer). Cost per row: N + (N+1)(B-1) fed tokens per forward.

The verification (verify_tree) and the layout (with_masks, masks_after) serve other drafts too:
stack.py hangs prompt lookup's chain on the masks' tree, and medusa.MedusaTree verifies the same kind of
tree drawn from Medusa's heads instead of the masks, so the two are compared like for like.
"""
import torch

from ..decode import next_tokens
from ..engine import Accepted, Fed, PerRequestCache, Strategy
from ..masks import tree_mask


def best_tree(logits, nodes, top_k):
    """logits (n, D, V): the masks' outputs for the next D tokens. Returns tokens (n, N) and parents
    (n, N) (-1: the root), N = min(nodes, k + k^2 + ... + k^D), k = min(top_k, V), breadth first."""
    n, D, V = logits.shape
    k = min(top_k, V)
    logp, ids = logits.float().log_softmax(-1).topk(k, -1)  # (n, D, k) the candidates at each depth
    # the full k-ary tree, breadth first: path j of depth d+1 is path j // k of depth d, then candidate
    # j % k; `first` is the flat index of the first path of a depth, `prev` of the depth above
    score, toks, scores, parent, prev, first = logp.new_zeros(n, 1), [], [], [], -1, 0
    for d in range(D):
        j = torch.arange(k ** (d + 1), device=logits.device)
        score = score[:, j // k] + logp[:, d, j % k]  # (n, k^(d+1)) log-probability of each path
        toks.append(ids[:, d, j % k])
        scores.append(score)
        parent.append(prev + j // k if d else torch.full_like(j, -1))
        prev, first = first, first + k ** (d + 1)
    score, toks, parent = torch.cat(scores, 1), torch.cat(toks, 1), torch.cat(parent)  # (n, T) x2, (T,)
    # the N best; a stable sort keeps breadth-first order among ties: a prefix before its extensions
    pick = score.sort(dim=1, descending=True, stable=True).indices[:, :nodes].sort(1).values  # (n, N)
    up = parent[pick]  # (n, N) each node's parent as a flat index; its column among the picked:
    return toks.gather(1, pick), torch.where(up < 0, -1, torch.searchsorted(pick, up.clamp(min=0)))


def verify_tree(eng, tokens, up, logits, D, valid=None):
    """Greedy verification of a tree fed right after the pending tokens (module docstring): tokens, up
    (n, N) its nodes and their parents (parents first, siblings different); logits (n, 1+N, V) AR's at
    the root (the last pending token) and at each node; D >= the deepest node's depth; valid (n, N) bool:
    the nodes that may be kept (None: all). Moves the kept path's K/V into place. Returns y (n, D'+1),
    D' = min(D, N), the kept path's tokens then AR's own; n_kept (n,); end (n,) the kept path's last
    node's column in logits (0: the root, u+1: node u), whose output AR's own token is."""
    n, N = tokens.shape
    ar = next_tokens(logits)  # (n, 1+N) AR's argmax after the root and after each node
    tree = tree_mask(up)  # (n, N, N) each node's ancestors and itself
    right = tokens == ar.gather(1, up + 1)  # (n, N) AR's token after the node's parent
    if valid is not None:
        right &= valid
    kept = ~(tree & ~right[:, None, :]).any(-1)  # the whole path to the node is right
    depth = torch.cat([ar.new_zeros(n, 1), kept * tree.sum(-1)], 1)  # (n, 1+N) root 0, kept nodes'
    n_kept, end = depth.max(1)  # the deepest kept node's depth and column (0: the root, u+1: node u)
    path = torch.cat([tree.new_zeros(n, 1, N), tree], 1)[torch.arange(n), end]  # (n, N) its ancestors
    j = torch.arange(N, device=tokens.device)
    cols = torch.where(path, j, N).sort(1).values[:, :D]  # (n, D') the path's nodes, root to end
    y = torch.cat([tokens.gather(1, cols.clamp(max=N - 1)), ar[:, :1]], 1)  # (n, D'+1)
    y = y.scatter(1, n_kept[:, None], ar.gather(1, end[:, None]))  # then AR's own next token
    if eng.cache is not None:  # the kept nodes' K/V to the slots after the pending tokens, in order
        first, d = (eng.start + eng.n_pend)[:, None], j[:cols.shape[1]]
        eng.cache.move(first + torch.where(d < n_kept[:, None], cols, d), first + d)
    return y, n_kept, end


def with_masks(tokens, up, mask_id, M):
    """The fed layout [N nodes | M masks after the root | M masks after node 1 | ... | after node N] as
    one tree: tokens (n, N + (N+1)M) and parents (n, N + (N+1)M) (mask group g follows node g-1)."""
    n, N = tokens.shape
    j = torch.arange((N + 1) * M, device=tokens.device)  # the masks: group j // M follows node j // M - 1
    mask_up = torch.where(j % M == 0, j // M - 1, N + j - 1)  # its node (-1: the root), or the mask before
    masks = torch.full((n, len(j)), mask_id, device=tokens.device)
    return torch.cat([tokens, masks], 1), torch.cat([up, mask_up.expand(n, -1)], 1)


def masks_after(logits, N, end, M):
    """logits (n, 1+N+(N+1)M, V) of with_masks' layout from the root on -> (n, M, V) the outputs of the M
    masks that follow node column `end` (n,) (0: the root, u+1: node u)."""
    group = 1 + N + end[:, None] * M + torch.arange(M, device=end.device)  # (n, M)
    return logits.gather(1, group[..., None].expand(-1, -1, logits.shape[-1]))


def check_policy(eng):
    if not isinstance(eng.policy, PerRequestCache):
        raise ValueError("tree verification runs with a per-request cache or none")


class TreeLossless(Strategy):
    """Lossless MARS with tree verification (module docstring), greedy: exactly greedy AR's output for
    any model. nodes: the tree's budget N; top_k: candidates per depth. Runs with the per-request cache
    or none (engine.PerRequestCache, NoCache)."""
    rows = ("tokens", "up")

    def __init__(self, mask_id, B, nodes=8, top_k=3):
        if mask_id is None:
            raise ValueError("lossless MARS needs the mask token id (its masks write the draft)")
        if B < 2 or nodes < 1 or top_k < 1:
            raise ValueError(f"need block_size >= 2, nodes >= 1 and top_k >= 1, got {B}, {nodes}, {top_k}")
        N = min(nodes, sum(top_k ** d for d in range(1, B)))  # at most (fewer when V < top_k)
        self.mask_id, self.B, self.nodes, self.top_k, self.max_nodes = mask_id, B, nodes, top_k, N
        self.ahead, self.width = B, 1 + N + (N + 1) * (B - 1)  # positions reach 2B-2 ahead, as Lossless's

    def start(self, eng):
        check_policy(eng)
        # the tree: tokens (n, N) and parents (n, N); none before the first forward (the root's masks only)
        none = eng.pending.new_zeros(len(eng.active), 0)
        self.tokens, self.up = none, none

    def feed(self, eng):
        fed, parents = with_masks(self.tokens, self.up, self.mask_id, self.B - 1)
        return Fed(fed, torch.full_like(eng.n_pend, fed.shape[1]), parents)

    def accept(self, eng, logits, hidden):
        """logits (n, width, V) from the last pending token on: the root's and each node's, then each mask
        group's (module docstring)."""
        N = self.tokens.shape[1]
        y, n_kept, end = verify_tree(eng, self.tokens, self.up, logits[:, :N + 1], self.B - 1)
        self.tokens, self.up = best_tree(masks_after(logits, N, end, self.B - 1), self.nodes, self.top_k)
        return Accepted(y, n_kept + 1, n_kept, torch.full_like(n_kept, N + 1))

