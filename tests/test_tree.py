"""Tree verification (nanomars/compare/tree.py) for lossless MARS and for Medusa's heads: each node computed as if
its own path had been fed alone (no leak from a sibling or a later token), the deepest right path kept,
greedy output identical to AR for any model, single and batched, with and without caches, a committed
cache equal to a fresh prefill, and more tokens per forward than the chain."""
from types import SimpleNamespace

import pytest
import torch

import nanomars.compare.tree as tree_module
from conftest import (PROMPTS, SMALL_PROMPTS, assert_cache_is_a_fresh_prefill, held_out_prompts, path,
                      random_model, small_vocab_model)
from nanomars.compare.block_cache import BlockCache
from nanomars.batch_decode import batch_ar, batch_lossless
from nanomars.engine import Engine, NoCache, PerRequestCache, forward_window
from nanomars.masks import causal_mask
from nanomars.model import KVCache
from nanomars.compare.medusa import MedusaHeads
from nanomars.compare.medusa import MedusaTree
from nanomars.compare.tree import TreeLossless, best_tree
from conftest import random_heads

POLICIES = [PerRequestCache, NoCache]


def tree_decode(model, prompts, max_new, mask_id, B=4, nodes=8, top_k=3, stop_ids=(), policy=PerRequestCache):
    return Engine(model, prompts, max_new, TreeLossless(mask_id, B, nodes, top_k), stop_ids, policy()).run()


def fed_tree(N, B, seed=0, V=13):
    """A tree of N nodes as TreeLossless builds it (best_tree on random mask logits) and the fed layout
    of one forward: (tokens (F,), parents (F,)), F = N + (N+1)(B-1)."""
    g = torch.Generator().manual_seed(seed)
    strategy = TreeLossless(V - 1, B, N, 3)
    strategy.tokens, strategy.up = best_tree(torch.randn(1, B - 1, V, generator=g), N, 3)
    eng = SimpleNamespace(active=torch.zeros(1), dev=torch.device("cpu"), n_pend=torch.zeros(1, dtype=torch.long))
    fed = strategy.feed(eng)  # what feed() reads of the engine
    return fed.tokens[0], fed.parents[0]


@torch.no_grad()
def test_each_node_is_computed_as_its_own_path_alone():
    """The output at every fed token (node or mask) equals AR's output at the end of prompt + its own
    root-to-token path, fed alone with a causal mask: the tree layout (mask and positions) is exact."""
    model, prompt = random_model(vocab_size=13), [3, 5, 1, 2]
    fed, parents = fed_tree(6, 3)
    x = torch.tensor([prompt + fed.tolist()])
    out = forward_window(model, x, torch.tensor([0]), torch.tensor([4]), 1 + len(fed), None, parents[None])[0][0]
    assert len({len(path(parents, f)) for f in range(len(fed))}) > 2  # several depths, several branches
    for f in range(len(fed)):
        seq = prompt + fed[path(parents, f)].tolist()
        alone = model(torch.tensor([seq]), torch.arange(len(seq))[None], causal_mask(len(seq)))[0, -1]
        torch.testing.assert_close(out[1 + f], alone, atol=1e-5, rtol=0)


@torch.no_grad()
def test_no_node_sees_a_sibling_or_a_later_token():
    """Perturbing fed token p changes the output at fed token q iff p is q or one of q's ancestors:
    siblings, other branches and descendants leave it unchanged, and ancestors do change it (so the
    test can fail). Real tokens never depend on the fed ones. One forward, with a committed cache."""
    model, prompt = random_model(vocab_size=13), [3, 5, 1, 2, 9]
    fed, parents = fed_tree(5, 3, seed=1)
    F = len(fed)
    rows = [fed]
    for p in range(F):  # row p + 1: fed token p changed
        changed = fed.clone()
        changed[p] = (changed[p] + 1) % 12
        rows.append(changed)
    n = len(rows)
    cache = KVCache(model.config, n, 64, "cpu", torch.float32)
    model(torch.tensor([prompt[:3]] * n), torch.arange(3)[None].expand(n, -1), causal_mask(3), cache,
          torch.arange(3)[None].expand(n, -1))
    cache.lengths += 3  # the first three prompt tokens are committed, two are pending
    x = torch.cat([torch.tensor([prompt[3:]] * n), torch.stack(rows)], 1)
    out, _ = forward_window(model, x, cache.lengths, torch.full((n,), 2), 1 + F, cache, parents.expand(n, -1))
    for p in range(F):
        for q in range(F):
            diff = (out[p + 1, 1 + q] - out[0, 1 + q]).abs().max().item()
            assert (diff > 1e-4) if p in path(parents, q) else (diff < 1e-6), (p, q, diff)
        assert (out[p + 1, 0] - out[0, 0]).abs().max().item() < 1e-6  # the last real token's output


def test_best_tree_is_the_most_probable_paths():
    """Brute force over every path of the full top-k tree: the chosen nodes are the N most probable
    (product of the masks' probabilities), every prefix of a chosen path is chosen, siblings differ,
    parents come first."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 3, 11, generator=g) * 2
    logits[0] = 0  # all ties: the prefixes must still come first
    for N in (1, 4, 9, 39, 50):
        toks, up = best_tree(logits, N, 3)
        assert toks.shape == up.shape == (3, min(N, 39))
        for i in range(3):
            logp = logits[i].log_softmax(-1)
            paths = [tuple(toks[i, path(up[i], u)].tolist()) for u in range(toks.shape[1])]
            assert len(set(paths)) == len(paths)  # one node per path: siblings differ
            assert all(int(up[i, u]) < u for u in range(len(paths)))  # parents first
            assert all(p[:-1] in paths for p in paths if len(p) > 1)  # a tree: prefixes are in
            top3 = logp.topk(3, -1).indices
            every = [(a,) for a in top3[0].tolist()] + [(a, b) for a in top3[0].tolist() for b in top3[1].tolist()] \
                + [(a, b, c) for a in top3[0].tolist() for b in top3[1].tolist() for c in top3[2].tolist()]
            score = {p: sum(float(logp[d, t]) for d, t in enumerate(p)) for p in every}
            worst_in = min(score[p] for p in paths)
            best_out = max([score[p] for p in every if p not in paths], default=-1e9)
            assert worst_in >= best_out - 1e-6, (N, i)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
@pytest.mark.parametrize("B, nodes, top_k", [(2, 3, 3), (4, 8, 3), (4, 4, 1), (8, 12, 2)])
def test_greedy_tree_is_greedy_ar_on_random_models(policy, B, nodes, top_k):
    kept_paths = False
    for model, prompts, mask_id in ((random_model(), PROMPTS, 96), (small_vocab_model(), SMALL_PROMPTS, 7)):
        ar = batch_ar(model, prompts, 30)
        out = tree_decode(model, prompts, 30, mask_id, B, nodes, top_k, policy=policy)
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
        for row in out.rows:
            assert sum(row.spans, []) == row.tokens and all(1 <= len(s) <= B for s in row.spans)
        kept_paths |= any(len(s) > 1 for r in out.rows for s in r.spans)
        one = tree_decode(model, prompts[1:2], 30, mask_id, B, nodes, top_k, policy=policy)  # batch of one
        assert one.rows[0].tokens == ar.rows[1].tokens
    assert kept_paths  # the small-vocabulary model's trees were kept at times, not only rejected


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_greedy_tree_is_greedy_ar_on_the_trained_model_batched_or_alone(tok, trained, policy):
    prompts = held_out_prompts(tok, greeting=True)
    ar = batch_ar(trained, prompts, 40, tok.stop_ids)
    for B, nodes, top_k in ((4, 8, 3), (3, 5, 2)):
        out = tree_decode(trained, prompts, 40, tok.mask_id, B, nodes, top_k, tok.stop_ids, policy)
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
        assert any(len(s) == B for r in out.rows for s in r.spans)  # whole paths were kept
        for prompt, row in zip(prompts[::3], out.rows[::3]):  # batched == alone, span for span
            alone = tree_decode(trained, [prompt], 40, tok.mask_id, B, nodes, top_k, tok.stop_ids, policy)
            assert alone.rows[0].spans == row.spans
    for n in (1, 2, 3, 5):  # budgets that end inside a multi-token span
        short = tree_decode(trained, prompts, n, tok.mask_id, stop_ids=tok.stop_ids, policy=policy)
        assert [r.tokens for r in short.rows] == [r.tokens[:n] for r in ar.rows]


def test_cache_holds_only_the_accepted_paths(tok, trained, monkeypatch):
    """After every step each row's cache, up to its length, equals a fresh prefill of its real tokens:
    the kept nodes' K/V were moved from their scattered slots into place, the rest left past the length.
    Some steps must have moved K/V (a kept node that was not at its depth's own column)."""
    moves = []

    def recording_move(cache, src, dst):
        moves.append(bool((src != dst).any()))
        return move(cache, src, dst)

    move = KVCache.move
    monkeypatch.setattr(KVCache, "move", recording_move)
    prompts = held_out_prompts(tok)[:5]
    eng = Engine(trained, prompts, 40, TreeLossless(tok.mask_id, 4), tok.stop_ids, PerRequestCache())
    for _ in range(10):
        eng.step()
        for i, row in enumerate(eng.active.tolist()):
            L = int(eng.cache.lengths[i])
            assert int(eng.n_pend[i]) == 1 and L == len(prompts[row]) + int(eng.generated[i]) - 1
            assert_cache_is_a_fresh_prefill(trained, eng.cache, i, (prompts[row] + eng.out.rows[row].tokens)[:L])
    assert any(moves)


def test_the_tree_takes_more_tokens_per_forward_than_the_chain(tok, trained):
    """Measured (15 prompts, 48 tokens): chain lossless 1.15 tokens/forward, tree (8 nodes, top 3) 1.65;
    with as few as 3 nodes, one chain of top-1 tokens, 1.34: the always-ready draft alone."""
    prompts = held_out_prompts(tok, 2, greeting=True)
    chain = batch_lossless(trained, prompts, 48, tok.mask_id, 4, tok.stop_ids)
    always_ready = tree_decode(trained, prompts, 48, tok.mask_id, 4, 3, 1, tok.stop_ids)
    tree = tree_decode(trained, prompts, 48, tok.mask_id, 4, 8, 3, tok.stop_ids)
    assert [r.tokens for r in tree.rows] == [r.tokens for r in chain.rows]
    assert chain.tokens_per_forward < always_ready.tokens_per_forward < tree.tokens_per_forward


def test_bad_inputs_give_clear_errors():
    model = random_model()
    with pytest.raises(ValueError, match="needs the mask token id"):
        TreeLossless(None, 4)
    with pytest.raises(ValueError, match="block_size >= 2"):
        TreeLossless(96, 1)
    with pytest.raises(ValueError, match="per-request cache or none"):
        Engine(model, [[1, 2]], 4, TreeLossless(96, 4), (), BlockCache(4))


@torch.no_grad()
def test_the_next_tree_is_drafted_after_the_accepted_path(tok, trained):
    """After every step, whatever was accepted, each row's next tree is best_tree of the masks that
    follow its accepted path: the proposals of B-1 masks fed after its known tokens but the last (AR's
    own token, whose place the first mask takes), computed here by a plain causal forward."""
    prompts, B, M = held_out_prompts(tok)[:4], 4, 3
    strategy = TreeLossless(tok.mask_id, B)
    eng = Engine(trained, prompts, 40, strategy, tok.stop_ids, PerRequestCache())
    partial = 0
    for _ in range(8):
        spans = eng.step()
        partial += sum(len(s) < B for s in spans.values())
        for i, row in enumerate(eng.active.tolist()):
            seq = prompts[row] + eng.out.rows[row].tokens[:-1] + [tok.mask_id] * M
            T = len(seq)
            masks = trained(torch.tensor([seq]), torch.arange(T)[None], causal_mask(T), keep=slice(T - M, T))
            tokens, up = best_tree(masks, strategy.nodes, strategy.top_k)
            assert strategy.tokens[i].tolist() == tokens[0].tolist() and strategy.up[i].tolist() == up[0].tolist()
    assert partial > 0  # some steps rejected part of their tree, and still a tree was ready


@torch.no_grad()
def test_verify_tree_keeps_the_deepest_right_path():
    """verify_tree (shared by every tree here) against a plain walk down the tree: from the root, go to
    the valid child holding AR's token while there is one; then AR's token. Random trees, random AR
    logits over 5 tokens (so paths are often right), random invalid nodes."""
    g = torch.Generator().manual_seed(0)
    eng = SimpleNamespace(cache=None)
    deep = 0
    for trial in range(30):
        tokens, up = best_tree(torch.randn(6, 3, 5, generator=g), 1 + trial % 13, 3)
        N = tokens.shape[1]
        logits = torch.randn(6, 1 + N, 5, generator=g)
        valid = torch.rand(6, N, generator=g) > 0.2
        y, n_kept, end = tree_module.verify_tree(eng, tokens, up, logits, 3, valid)
        for i in range(6):
            at, walk = -1, []  # the node reached (-1: the root), the tokens taken
            while True:
                a = int(logits[i, at + 1].argmax())
                child = [u for u in range(N) if up[i, u] == at and tokens[i, u] == a and valid[i, u]]
                if not child:
                    break
                at, walk = child[0], walk + [a]
            assert y[i, :len(walk) + 1].tolist() == walk + [a] and int(n_kept[i]) == len(walk)
            assert int(end[i]) == at + 1
            deep += len(walk) > 1
    assert deep > 5


# ------------------------------------------------------------------------------------- Medusa's tree
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_medusa_tree_is_greedy_ar_on_random_heads(policy):
    """Random heads on random models: greedy AR of the base, batched == alone; and a tree of K nodes of
    top-1 tokens is MedusaHeads' chain, span for span (the heads read at the same node)."""
    kept = False
    for model, prompts in ((random_model(), PROMPTS), (small_vocab_model(), SMALL_PROMPTS)):
        stop = {batch_ar(model, prompts, 30).rows[0].tokens[3]}  # rows stop at different steps
        ar = batch_ar(model, prompts, 30, stop)
        for K in (1, 3):
            medusa = random_heads(model, K, seed=K)
            for nodes, top_k in ((8, 3), (4, 2)):
                out = Engine(medusa, prompts, 30, MedusaTree(medusa, nodes, top_k), stop, policy()).run()
                assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
                assert all(1 <= len(s) <= K + 1 for r in out.rows for s in r.spans)
                for prompt, row in zip(prompts, out.rows):
                    alone = Engine(medusa, [prompt], 30, MedusaTree(medusa, nodes, top_k), stop, policy()).run()
                    assert alone.rows[0].spans == row.spans
                kept |= any(len(s) > 1 for r in out.rows for s in r.spans)
            chain = Engine(medusa, prompts, 30, MedusaTree(medusa, K, 1), stop, policy()).run()
            heads = Engine(medusa, prompts, 30, MedusaHeads(medusa), stop, policy()).run()
            assert [r.spans for r in chain.rows] == [r.spans for r in heads.rows]
    assert kept


def test_medusa_tree_on_trained_heads_is_exact_and_takes_more_than_the_chain(tok, medusa):
    """Trained heads (test_medusa's fixture): greedy AR of the base, cached == uncached, batched == alone,
    more tokens per forward than the verified chain, and a tree of 3 top-1 nodes is that chain. Measured (7 held-out prompts and "Hi", 48
    tokens): chain (MedusaHeads) 1.47 (a tree of 3 top-1 nodes: the same), tree 4/2 1.66, 8/3 1.83,
    16/3 1.89."""
    prompts = held_out_prompts(tok, greeting=True)
    ar = batch_ar(medusa.base, prompts, 48, tok.stop_ids)
    chain = Engine(medusa, prompts, 48, MedusaHeads(medusa), tok.stop_ids).run()
    tree = {p: Engine(medusa, prompts, 48, MedusaTree(medusa, 8, 3), tok.stop_ids, p()).run() for p in POLICIES}
    assert [r.tokens for r in tree[PerRequestCache].rows] == [r.tokens for r in ar.rows]
    assert [r.spans for r in tree[NoCache].rows] == [r.spans for r in tree[PerRequestCache].rows]
    for prompt, row in zip(prompts[::3], tree[PerRequestCache].rows[::3]):
        assert Engine(medusa, [prompt], 48, MedusaTree(medusa, 8, 3), tok.stop_ids).run().rows[0].spans == row.spans
    assert tree[PerRequestCache].tokens_per_forward > chain.tokens_per_forward + 0.2
    top1 = Engine(medusa, prompts, 48, MedusaTree(medusa, 3, 1), tok.stop_ids).run()  # the chain as a tree
    assert [r.spans for r in top1.rows] == [r.spans for r in chain.rows]


def test_medusa_tree_cache_holds_only_the_accepted_paths(tok, medusa):
    prompts = held_out_prompts(tok)[:5]
    eng = Engine(medusa, prompts, 40, MedusaTree(medusa, 8, 3), tok.stop_ids, PerRequestCache())
    longest = 0
    for _ in range(10):
        eng.step()
        for i, row in enumerate(eng.active.tolist()):
            L = int(eng.cache.lengths[i])
            assert int(eng.n_pend[i]) == 1 and L == len(prompts[row]) + int(eng.generated[i]) - 1
            assert_cache_is_a_fresh_prefill(medusa.base, eng.cache, i, (prompts[row] + eng.out.rows[row].tokens)[:L])
            longest = max(longest, len(eng.out.rows[row].spans[-1]))
    assert longest > 2  # paths of several nodes were moved into place


def test_medusa_tree_bad_inputs_give_clear_errors():
    base = random_model()
    medusa = random_heads(base, 2)
    with pytest.raises(ValueError, match="need nodes >= 1 and top_k >= 1"):
        MedusaTree(medusa, 0)
    with pytest.raises(ValueError, match="run the engine on that Medusa"):
        Engine(base, [[1, 2]], 4, MedusaTree(medusa))
    with pytest.raises(ValueError, match="per-request cache or none"):
        Engine(medusa, [[1, 2]], 4, MedusaTree(medusa), (), BlockCache(4))
    with pytest.raises(ValueError, match="exceeds the model context"):  # the tree reaches K ahead
        Engine(medusa, [[1] * 126], 2, MedusaTree(medusa))
