"""Lossless MARS: the masks draft, AR verifies. Greedy output must be greedy AR's token for token for any
model; sampled output must be distributed as AR sampling (checked with a chi-square test that is also
shown to reject wrong acceptance rules)."""
import pytest

import nanomars.strategies as strategies_module
from conftest import (K, N_SAMPLES, PROMPTS, SMALL_PROMPTS, assert_cache_is_a_fresh_prefill,
                      chi_square_pvalue, exact_ar_distribution, held_out_prompts, keep_every_draft, random_model,
                      replace_from_p, small_vocab_model)
from nanomars.compare.block_cache import BlockCache
from nanomars.batch_decode import batch_ar, batch_decode, batch_lossless
from nanomars.engine import Engine
from nanomars.strategies import Lossless
from nanomars.decode import ar_decode, lossless_decode

STRATEGIES = [dict(cache=None), dict(cache="request"), dict(cache=BlockCache(4))]


def check_spans(out, B, max_new):
    for row in out.rows:
        assert sum(row.spans, []) == row.tokens and len(row.tokens) <= max_new
        assert all(1 <= len(s) <= B for s in row.spans)


@pytest.mark.parametrize("kw", STRATEGIES, ids=lambda kw: str(kw["cache"]))
@pytest.mark.parametrize("B", [2, 4, 8])
def test_greedy_lossless_is_greedy_ar_on_random_models(kw, B):
    kept_drafts = False
    for model, prompts, mask_id in ((random_model(), PROMPTS, 96), (small_vocab_model(), SMALL_PROMPTS, 7)):
        ar = batch_ar(model, prompts, 30)
        out = batch_lossless(model, prompts, 30, mask_id, B, **kw)
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
        check_spans(out, B, 30)
        kept_drafts |= any(len(s) > 1 for r in out.rows for s in r.spans)
        one = batch_lossless(model, prompts[1:2], 30, mask_id, B, **kw)  # a batch of one, 1-token prompt
        assert one.rows[0].tokens == ar.rows[1].tokens
    assert kept_drafts  # the small-vocabulary model's drafts were kept at times, not only rejected


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("B", [2, 4, 8])
def test_single_sequence_lossless_is_greedy_ar(use_cache, B):
    for model, prompt, mask_id in ((random_model(seed=B), PROMPTS[0], 96), (small_vocab_model(B), [1, 2, 3], 7)):
        out = lossless_decode(model, prompt, 40, mask_id, B, use_cache=use_cache)
        assert out.tokens == ar_decode(model, prompt, 40).tokens
        assert sum(out.spans, []) == out.tokens and out.seconds > 0


@pytest.mark.parametrize("kw", STRATEGIES, ids=lambda kw: str(kw["cache"]))
def test_greedy_lossless_is_greedy_ar_on_the_trained_model(tok, trained, kw):
    prompts = held_out_prompts(tok) + [tok.prompt_ids("Hi")]
    ar = batch_ar(trained, prompts, 48, tok.stop_ids)
    for B in (2, 4, 8):
        out = batch_lossless(trained, prompts, 48, tok.mask_id, B, tok.stop_ids, **kw)
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
        check_spans(out, B, 48)
    for prompt, row in zip(prompts[:2], ar.rows):
        single = lossless_decode(trained, prompt, 48, tok.mask_id, 4, tok.stop_ids, kw["cache"] is not None)
        assert single.tokens == row.tokens


def test_trained_model_keeps_several_tokens_per_forward(tok, trained):
    """Measured (7 held-out prompts, 48 tokens, seeded fixture): 1.28 tokens/forward at B=2, 1.16 at B=4
    and B=8 (MARS at tau=0.95 gets 1.14, Jacobi 1.06-1.09). The fixture is small and unsure: a span of
    B tokens needs B-1 right guesses in a row, and every rejection costs a forward without a draft."""
    prompts = held_out_prompts(tok)
    ar = batch_ar(trained, prompts, 48, tok.stop_ids)
    for B, least in ((2, 1.15), (4, 1.08)):
        out = batch_lossless(trained, prompts, 48, tok.mask_id, B, tok.stop_ids)
        assert out.tokens_per_forward > least
        assert any(len(s) > 1 for r in out.rows for s in r.spans)
        assert sum(r.forwards for r in out.rows) < sum(r.forwards for r in ar.rows)


def test_stop_tokens_and_budget_cut_like_ar():
    model = small_vocab_model()
    free = batch_ar(model, SMALL_PROMPTS, 30)
    # row 3 keeps the span [2, 0] (draft 2, then AR's 0): stopping on 2 cuts inside it, on 0 at its end
    for stop in (free.rows[0].tokens[2], free.rows[0].tokens[3]):
        for kw in STRATEGIES:
            ar = batch_ar(model, SMALL_PROMPTS, 30, stop_ids={stop}, **kw)
            out = batch_lossless(model, SMALL_PROMPTS, 30, 7, 4, stop_ids={stop}, **kw)
            assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
            assert len({len(r.tokens) for r in out.rows}) > 2  # rows leave at different steps
            assert all(r.tokens[-1] == stop and r.spans[-1][-1] == stop for r in out.rows)
        for n in (1, 2, 3, 5, 7):  # budgets that end inside a multi-token span
            short = batch_lossless(model, SMALL_PROMPTS, n, 7, 4, **kw)
            assert [r.tokens for r in short.rows] == [r.tokens[:n] for r in free.rows]


def test_at_the_edge_of_the_context():
    """Draft and masks reach up to 2B-2 tokens past the last real one, B-1 more than MARS: positions past
    the context are clamped there, which can spoil only guesses for tokens beyond the budget."""
    model = random_model(vocab_size=8, tie_embeddings=False, max_seq_len=32)
    prompts = [[1, 2, 3] * 6, [5]]  # 18 and 1 tokens
    for B in (4, 8):
        n = 32 - 18 - (B - 1)  # the most the context allows the longer prompt
        ar = batch_ar(model, prompts, n)
        for kw in STRATEGIES:
            assert [r.tokens for r in batch_lossless(model, prompts, n, 7, B, **kw).rows] == \
                [r.tokens for r in ar.rows]


def test_cache_holds_only_real_tokens(tok, trained):
    """With cache="request" the kept draft tokens' K/V are committed as computed in the verifying forward:
    after every step each row's cache, up to its length, equals a fresh prefill of its real tokens."""
    prompts = held_out_prompts(tok)[:4]
    for kw in STRATEGIES[1:]:
        eng = Engine(trained, prompts, 40, Lossless(tok.mask_id, 4), tok.stop_ids, **kw)
        committed_drafts = False
        for _ in range(8):
            eng.step()
            for i, row in enumerate(eng.active.tolist()):
                L = int(eng.cache.lengths[i])
                assert L == len(prompts[row]) + int(eng.generated[i]) - int(eng.n_pend[i])
                if kw["cache"] == "request":
                    assert int(eng.n_pend[i]) == 1  # only AR's own last token waits
                committed_drafts |= len(eng.out.rows[row].spans[-1]) > 1
                assert_cache_is_a_fresh_prefill(trained, eng.cache, i, (prompts[row] + eng.out.rows[row].tokens)[:L])
        assert committed_drafts


def test_bad_inputs_give_clear_errors():
    model = random_model()
    with pytest.raises(ValueError, match="needs the mask token id"):
        batch_lossless(model, [[1]], 4, None, 4)


# --- sampling -------------------------------------------------------------------------------------------

SAMPLING = [dict(temperature=0.05, top_k=None, cache="request", block_size=4),
            dict(temperature=0.08, top_k=4, cache=BlockCache(2), block_size=3)]


@pytest.mark.parametrize("kw", SAMPLING, ids=lambda kw: f"T{kw['temperature']}-top{kw['top_k']}-{kw['cache']}")
def test_lossless_sampling_has_ar_distribution_and_wrong_rules_fail(monkeypatch, kw):
    """N_SAMPLES rows of one prompt, the joint law of their first K tokens against exact AR sampling.
    Measured p-values: lossless 0.89 and 0.27 (seeds 1-5: 0.11 to 0.92); the wrong rules, same test: MARS
    gating each guess on its own probability (on q) and keeping every draft ~0 (< 1e-300), replacing
    a rejected token from p instead of the residual 1e-80 and 1e-142."""
    model, prompt = small_vocab_model(), [1, 2, 3]
    kw = dict(kw)
    B, T, top_k = kw.pop("block_size"), kw["temperature"], kw["top_k"]
    expected = exact_ar_distribution(model, prompt, T, top_k)

    def run(**extra):
        return batch_lossless(model, [prompt] * N_SAMPLES, K, 7, B, seed=0, **kw, **extra)

    out = run()
    assert chi_square_pvalue(out, expected) > 1e-3
    assert out.tokens_per_forward > 1.02  # drafts were kept, not only rejected
    wrong = [batch_decode(model, [prompt] * N_SAMPLES, K, 7, B, 0.3, seed=0, **kw)]  # MARS: gate on q
    for rule in (keep_every_draft, replace_from_p):
        monkeypatch.setattr(strategies_module, "verify_draft", rule)
        wrong.append(run())
    monkeypatch.undo()
    for w in wrong:
        assert chi_square_pvalue(w, expected) < 1e-6


def test_sampling_is_reproducible(tok, trained):
    prompts = held_out_prompts(tok)[:3]
    a, b, c = (batch_lossless(trained, prompts, 32, tok.mask_id, 4, tok.stop_ids, temperature=1.0, top_k=20,
                              seed=s) for s in (1, 1, 2))
    assert [r.spans for r in a.rows] == [r.spans for r in b.rows]
    assert [r.tokens for r in a.rows] != [r.tokens for r in c.rows]
