"""MARS's peers (nanomars/compare/speculative.py): prompt lookup and a draft model, engine strategies that draft and let
the target verify. Greedy output must be greedy AR's token for token (random and trained models, every
cache policy, batched or alone); sampled output must be distributed as AR sampling (the chi-square test
of test_lossless.py, also shown to reject wrong rules); drafts must actually be kept."""
import copy

import pytest
import torch

import nanomars.compare.speculative as peers_module
from conftest import (K, N_SAMPLES, POLICIES, PROMPTS, SMALL_PROMPTS, assert_cache_is_a_fresh_prefill,
                      chi_square_pvalue, constant_model, decode, exact_ar_distribution, held_out_prompts,
                      keep_every_draft, random_model, replace_from_p, small_vocab_model, spans, tokens, train_briefly)
from nanomars.batch_decode import batch_ar
from nanomars.engine import Engine
from nanomars.model import Config, Decoder
from nanomars.compare.speculative import DraftModel, PromptLookup, lookup



@pytest.fixture(scope="session")
def draft(tok):
    """A 1-layer, width-32 AR model trained 40 steps on the suite: it agrees with `trained` at times."""
    from nanomars.dual_track import ar_loss
    torch.manual_seed(1)
    model = Decoder(Config(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_kv_head=1, n_embd=32,
                           intermediate_size=64, max_seq_len=256))
    model.init_weights()
    return train_briefly(model, tok, 1, 40, lambda m, step, x, response, targets: ar_loss(m, x, targets))


def reference_lookup(seq, ngram, draft_len):
    """lookup() for one row, in plain Python: find, then copy token by token (into the copy itself)."""
    for n in range(min(ngram, len(seq) - 1), 0, -1):
        for i in range(len(seq) - n - 1, -1, -1):  # the most recent earlier occurrence first
            if seq[i:i + n] == seq[-n:]:
                out = list(seq)
                for j in range(draft_len):
                    out.append(out[i + n + j])
                return out[len(seq):]
    return []


def test_lookup_copies_after_the_most_recent_earlier_occurrence_of_the_longest_tail():
    rows = [[1, 2, 3, 9, 1, 2, 4, 1, 2],  # [4 1 2] never before; [1 2] last at 4: 4 1 2, then on: 4
            [5, 6, 7, 8],  # no token repeats: no draft
            [3, 1, 3, 2, 3],  # only [3] occurs before, last at 2: 2 3 2 3
            [7, 7],  # the tail [7] at 0, followed by the tail itself: 7 7 7 7
            [2, 5, 9, 2, 5, 1, 2, 5]]  # [2 5] twice before: the most recent wins (1, not 9)
    L = max(map(len, rows))
    known = torch.tensor([r + [0] * (L - len(r)) for r in rows])  # padding 0: never part of a match
    draft, count = lookup(known, torch.tensor([len(r) for r in rows]), 3, 4)
    assert [d[:c] for d, c in zip(draft.tolist(), count.tolist())] == \
        [[4, 1, 2, 4], [], [2, 3, 2, 3], [7, 7, 7, 7], [1, 2, 5, 1]]
    gen = torch.Generator().manual_seed(0)
    for ngram, draft_len in ((1, 1), (2, 4), (3, 10)):
        seqs = [torch.randint(4, (int(n),), generator=gen).tolist() for n in torch.randint(1, 30, (50,), generator=gen)]
        L = max(map(len, seqs))
        known = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
        draft, count = lookup(known, torch.tensor([len(s) for s in seqs]), ngram, draft_len)
        got = [d[:c] for d, c in zip(draft.tolist(), count.tolist())]
        assert got == [reference_lookup(s, ngram, draft_len) for s in seqs]
        assert sum(map(len, got)) > 0 and [] in got  # both cases occur


def peers_of(model, other):
    """Fresh strategies: prompt lookup (default and short), a draft model that is another random model
    of the same vocabulary, and the model as its own draft model."""
    return {"lookup": lambda: PromptLookup(), "lookup-2-3": lambda: PromptLookup(2, 3),
            "draft": lambda: DraftModel(other, 3), "self-draft": lambda: DraftModel(model, 2)}


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_peers_are_greedy_ar_on_random_models(policy):
    kept = set()
    for model, other, prompts in ((random_model(), random_model(seed=3), PROMPTS),
                                  (small_vocab_model(), small_vocab_model(seed=1), SMALL_PROMPTS)):
        free = batch_ar(model, prompts, 30)
        stop = {free.rows[0].tokens[3]}  # rows stop at different steps, some inside a drafted span
        ar = batch_ar(model, prompts, 30, stop)
        for name, peer in peers_of(model, other).items():
            out = decode(model, prompts, 30, peer(), stop, policy)
            assert tokens(out) == tokens(ar), name
            assert all(sum(r.spans, []) == r.tokens and all(r.spans) for r in out.rows)
            for prompt, row in zip(prompts, out.rows):  # batched == alone, span for span
                assert spans(decode(model, [prompt], 30, peer(), stop, policy)) == [row.spans]
            if any(len(s) > 1 for r in out.rows for s in r.spans):
                kept.add(name)
    assert kept == {"lookup", "lookup-2-3", "draft", "self-draft"}


def test_greedy_peers_are_greedy_ar_on_the_trained_model(tok, trained, draft):
    """Measured (7 held-out prompts and "Hi", 48 tokens): prompt lookup 1.20 tokens/forward (ngram 3,
    draft_len 10 and ngram 1, draft_len 4), the 40-step draft model 1.15 (k = 2 and 4)."""
    prompts = held_out_prompts(tok, greeting=True)
    ar = batch_ar(trained, prompts, 48, tok.stop_ids)
    for peer in (lambda: PromptLookup(), lambda: PromptLookup(1, 4), lambda: DraftModel(draft, 2),
                 lambda: DraftModel(draft, 4)):
        out = {p: decode(trained, prompts, 48, peer(), tok.stop_ids, p) for p in POLICIES}
        assert tokens(out["request"]) == tokens(ar)
        assert spans(out["none"]) == spans(out["request"]) == spans(out["block"])  # cached == uncached
        for prompt, row in zip(prompts[:3], out["request"].rows):
            assert spans(decode(trained, [prompt], 48, peer(), tok.stop_ids)) == [row.spans]
        assert out["request"].tokens_per_forward > 1.1
        assert out["request"].forwards < ar.forwards


def test_prompt_lookup_keeps_whole_drafts_when_the_text_repeats():
    """A model that always predicts 5, prompts where 5 follows 5: every lookup hits and is kept (the copy
    runs on past the text), so each forward gives draft_len + 1 tokens (the last one cut at the budget);
    budgets cut inside spans."""
    model = constant_model(5)
    prompts = [[5, 5, 5], [1, 2, 5, 5], [3, 5, 5]]
    for draft_len in (1, 4, 10):
        for n in (1, 2, 3, 5, 7, 12, 30):
            out = decode(model, prompts, n, PromptLookup(2, draft_len))
            assert tokens(out) == [[5] * n] * 3
            for row in out.rows:
                assert [len(s) for s in row.spans[:-1]] == [draft_len + 1] * (len(row.spans) - 1)
    # nothing repeats in the prompt: plain AR steps until the generated text repeats, then it is copied
    late = decode(model, [[1, 2, 3]], 20, PromptLookup(2, 4))
    assert [len(s) for s in late.rows[0].spans] == [1, 1, 5, 5, 5, 3]


def test_the_target_as_its_own_draft_model_keeps_every_draft(tok, trained):
    """The same model drafts and verifies: every draft is kept, k + 1 tokens per target forward up to the
    end (where the budget or a stop token cuts), and k draft forwards per target forward."""
    for model, prompts, stop, k in ((random_model(), PROMPTS, (), 3), (small_vocab_model(), SMALL_PROMPTS, (), 4),
                                    (trained, held_out_prompts(tok), tok.stop_ids, 3)):
        strategy = DraftModel(model, k)
        out = decode(model, prompts, 40, strategy, stop)
        assert tokens(out) == tokens(batch_ar(model, prompts, 40, stop))
        for row in out.rows:
            assert [len(s) for s in row.spans[:-1]] == [k + 1] * (len(row.spans) - 1)
        assert strategy.draft_forwards == k * out.forwards and strategy.draft_seconds > 0


def test_the_draft_cache_holds_only_the_known_tokens(tok, trained, draft):
    """After every step each row's draft cache, up to what the next feed keeps (its length, at most the
    known tokens but the last), is a fresh prefill of the row's known tokens (prompt and accepted ones):
    what the next feed keeps holds no rejected draft token and misses none; only the last known token (or
    the kept draft's last ones) is left for it to feed. Past that lie the last draft's tokens, which that
    feed rolls back (under the block cache also a waiting row's, whose known tokens the engine put back)."""
    prompts = held_out_prompts(tok)[:4]
    for policy in ("request", "block"):
        strategy = DraftModel(draft, 3)
        eng = Engine(trained, prompts, 40, strategy, tok.stop_ids, POLICIES[policy]())
        rolled_back = kept = False
        for _ in range(8):
            eng.step()
            for i, row in enumerate(eng.active.tolist()):
                known = prompts[row] + eng.out.rows[row].tokens
                kept_cache = copy.copy(strategy.cache)  # its K/V, with the next feed's roll-back
                kept_cache.roll_back(strategy.n_known - 1)
                L = int(kept_cache.lengths[i])
                assert 1 <= len(known) - L <= 2  # AR's token, and d_k after a fully kept draft
                assert_cache_is_a_fresh_prefill(draft, kept_cache, i, known[:L])
                rolled_back |= len(eng.out.rows[row].spans[-1]) < 4
                kept |= len(eng.out.rows[row].spans[-1]) > 1
        assert rolled_back and kept


def test_bad_inputs_give_clear_errors():
    model = random_model()  # vocabulary of 97
    with pytest.raises(ValueError, match=r"draft model's vocabulary \(8 ids\) must be the target's \(97 ids\)"):
        Engine(model, [[1]], 4, DraftModel(small_vocab_model(), 3))
    with pytest.raises(ValueError, match="need k >= 1"):
        DraftModel(model, 0)
    with pytest.raises(ValueError, match="need ngram >= 1 and draft_len >= 1"):
        PromptLookup(0, 4)
    with pytest.raises(ValueError, match="need temperature >= 0"):
        PromptLookup(temperature=-1.0)
    with pytest.raises(ValueError, match="exceeds the model context"):  # the draft needs context room
        Engine(random_model(max_seq_len=32), [[1] * 20], 8, PromptLookup(draft_len=10))


# --- sampling -------------------------------------------------------------------------------------------

SAMPLING = [("lookup", dict(temperature=0.05)), ("lookup", dict(temperature=0.08, top_k=4)),
            ("draft", dict(temperature=0.05)), ("draft", dict(temperature=0.08, top_k=4))]


@pytest.mark.parametrize("name,kw", SAMPLING, ids=lambda x: x if isinstance(x, str) else str(x.get("top_k")))
def test_sampling_has_ar_distribution_and_wrong_rules_fail(monkeypatch, name, kw):
    """N_SAMPLES rows of one prompt, the joint law of their first K tokens against exact AR sampling
    (test_lossless.py's test). Prompt lookup: the prompt ends in the model's own greedy text, which
    repeats, so drafts are likely; the draft model: another random model of the vocabulary. Measured
    p-values (seeds 0-2): lookup 0.02 to 0.95, draft model 0.19 to 0.81; the wrong rules (keep every
    draft; replace a rejected token from p instead of the residual) < 1e-218."""
    model = small_vocab_model()
    prompt = [1, 2, 3] + (batch_ar(model, [[1, 2, 3]], 10).rows[0].tokens if name == "lookup" else [])
    expected = exact_ar_distribution(model, prompt, kw["temperature"], kw.get("top_k"))

    def run():
        peer = PromptLookup(3, 3, seed=0, **kw) if name == "lookup" else \
            DraftModel(small_vocab_model(seed=2), 3, seed=0, **kw)
        return decode(model, [prompt] * N_SAMPLES, K, peer)

    out = run()
    assert chi_square_pvalue(out, expected) > 1e-3
    assert out.tokens_per_forward > 1.2  # drafts were kept, not only rejected
    for rule in (keep_every_draft, replace_from_p):
        monkeypatch.setattr(peers_module, "verify_draft", rule)
        assert chi_square_pvalue(run(), expected) < 1e-6
    monkeypatch.undo()


def test_sampling_is_reproducible():
    model, other = small_vocab_model(), small_vocab_model(seed=1)
    for peer in (lambda s: PromptLookup(seed=s, temperature=1.0),
                 lambda s: DraftModel(other, 3, seed=s, temperature=1.0)):
        a, b, c = (decode(model, SMALL_PROMPTS, 30, peer(s)) for s in (1, 1, 2))
        assert spans(a) == spans(b) and tokens(a) != tokens(c)
