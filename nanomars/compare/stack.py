"""
Stacking: MARS combined with speculative decoding (the MARS paper's open question), here with prompt
lookup (peers.py). One verified forward carries both drafts as branches of ONE tree (tree.py):

    the masks' tree   tree.best_tree of the masks that followed the last accepted path (TreeLossless's)
    lookup's chain    peers.lookup: the draft_len tokens that followed the most recent earlier occurrence
                      of the row's last n tokens, hung from the root

The stacking rule (hang_chain): the chain walks down the masks' tree while its next token is a child of
the node it has reached, and its remaining tokens become new nodes below the last node it reached. So a
lookup that agrees with the masks costs no node, siblings still differ (the path verification keeps is
unique) and the tree stays a tree. Budget: the masks' tree keeps its `nodes`, the chain adds at most
draft_len; a row whose chain adds fewer (it coincided with the masks, or nothing occurred) fills the spare
slots with placeholders that are never kept, so every row has one layout:

    [masks' tree | chain's own nodes, placeholders | B-1 masks after the root | after each node]

Masks follow the chain's nodes too (tree.with_masks): whichever path is accepted, the masks after its end
give the next masks' tree, and the lookup over the new known text the next chain.

Greedy only (tree.py says why), exactly greedy AR's output for any model (tree.verify_tree).
Cost per row and forward: N + draft_len nodes and (N + draft_len + 1)(B-1) masks. from_lookup counts the
tokens kept on the chain's own nodes: what lookup added to the masks' tree.
"""
import torch

from ..engine import Accepted, Fed, splice
from .speculative import lookup
from .tree import TreeLossless, best_tree, masks_after, verify_tree, with_masks


def hang_chain(tokens, up, chain, n_chain):
    """Merge a chain into a tree (the stacking rule, module docstring). tokens, up (n, N): the tree's nodes
    and parents (parents first, siblings different); chain (n, D): tokens continuing the root, real where
    n_chain (n,) is D (0: no chain). Returns tokens, up and valid (n, N + D): the chain's own nodes at
    columns N, N+1, ... (each the parent of the next), then placeholders (valid False)."""
    n, N = tokens.shape
    D = chain.shape[1]
    at = torch.full_like(n_chain, -1)  # (n,) the tree node the chain has reached (-1: the root)
    matched, going, node = torch.zeros_like(n_chain), n_chain > 0, torch.arange(N, device=chain.device)
    for d in range(D):  # step down while chain token d is a child of `at` (one at most: siblings differ)
        child = (up == at[:, None]) & (tokens == chain[:, d:d + 1])  # (n, N)
        going = going & child.any(1)
        at = torch.where(going, (child * node).sum(1), at)  # that child's column
        matched += going
    k = torch.arange(D, device=chain.device)
    own = (k < D - matched[:, None]) & (n_chain[:, None] > 0)  # (n, D) the chain's tokens past the tree
    new_tokens = chain.gather(1, (matched[:, None] + k).clamp(max=D - 1))
    new_up = torch.where(k == 0, at[:, None], N + k - 1)  # below the node reached, then one after another
    valid = torch.cat([torch.ones_like(up, dtype=torch.bool), own], 1)
    return torch.cat([tokens, new_tokens], 1), torch.cat([up, new_up], 1), valid


class StackedTree(TreeLossless):
    """Lossless MARS and prompt lookup in one tree (module docstring), greedy: exactly greedy AR's output.
    nodes, top_k: the masks' tree (TreeLossless's); ngram, draft_len: the lookup (PromptLookup's)."""
    rows = TreeLossless.rows + ("known", "n_known")

    def __init__(self, mask_id, B, nodes=8, top_k=3, ngram=3, draft_len=10):
        super().__init__(mask_id, B, nodes, top_k)
        if ngram < 1 or draft_len < 1:
            raise ValueError(f"need ngram >= 1 and draft_len >= 1, got {ngram}, {draft_len}")
        self.ngram, self.draft_len = ngram, draft_len
        N = self.max_nodes + draft_len  # at most: the masks' tree, then the chain's own nodes
        self.ahead, self.width = max(B, draft_len + 1), 1 + N + (N + 1) * (B - 1)

    def start(self, eng):
        super().start(eng)
        # (n, L) each row's prompt and accepted tokens, left-aligned, and their count (n,): lookup reads them
        self.known, self.n_known = eng.pending.clone(), eng.n_pend.clone()
        self.from_lookup = torch.zeros((), dtype=torch.long, device=eng.dev)

    def feed(self, eng):
        chain, n_chain = lookup(self.known, self.n_known, self.ngram, self.draft_len)
        self.nodes_fed, self.up_fed, self.valid = hang_chain(self.tokens, self.up, chain, n_chain)
        fed, parents = with_masks(self.nodes_fed, self.up_fed, self.mask_id, self.B - 1)
        return Fed(fed, torch.full_like(eng.n_pend, fed.shape[1]), parents)

    def accept(self, eng, logits, hidden):
        """logits (n, width, V) from the last pending token on: the root's and each node's (the masks'
        tree, then the chain's), then each mask group's."""
        N, N_masks = self.nodes_fed.shape[1], self.tokens.shape[1]
        y, n_kept, end = verify_tree(eng, self.nodes_fed, self.up_fed, logits[:, :N + 1],
                                     max(self.B - 1, self.draft_len), self.valid)
        # the chain's own nodes are nodes N_masks, N_masks + 1, ... one below the other: a path that ends
        # at node end - 1 among them ran through end - N_masks of them
        self.from_lookup += (end - N_masks).clamp(min=0).sum()
        self.tokens, self.up = best_tree(masks_after(logits, N, end, self.B - 1), self.nodes, self.top_k)
        self.known, self.n_known = splice(self.known, self.n_known, y, n_kept + 1)
        return Accepted(y, n_kept + 1, n_kept, self.valid.sum(1) + 1)
