"""Per-row decoding windows, the window policies of nanomars/strategies.py (aligned, adaptive, and one written
here, CappedWindow), and the released block-level cache sampler (nanomars/compare/block_cache.py,
batch_paper_block). Each is checked against a plain reference decoder written here without a cache (one full
causal forward per step), against greedy AR at tau = 1, batched against one row at a time, and for its own rule
(window sizes, caps, block boundaries, counted forwards)."""
import pytest
import torch

from conftest import PROMPTS, SMALL_PROMPTS, assert_cache_is_a_fresh_prefill, held_out_prompts, random_model, small_vocab_model
from nanomars.batch_decode import batch_ar, batch_decode, mars_engine
from nanomars.compare.block_cache import BlockCache, PaperBlockEngine, batch_paper_block
from nanomars.decode import accept, cut
from nanomars.masks import causal_mask

CACHES = [dict(cache=None), dict(cache="request"), dict(cache=BlockCache(4)),
          dict(cache=BlockCache(8))]
OPTIONS = [dict(align=True), dict(adaptive=True)]


def cache_id(kw):
    return str(kw["cache"])


def option_id(kw):
    return next(iter(kw))


def peaked_model():
    """small_vocab_model with its head scaled up: its proposals' probabilities spread over about 0.25 to
    0.7, so tau = 0.35 takes multi-token spans and rejects often, with no value close to the threshold."""
    model = small_vocab_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(16)
    return model


PEAKED_TAU = 0.35


# --- plain references: no cache, the whole sequence every forward -------------------------------------

def aligned_rule(B):
    return lambda known, w, last: min(B, B - known % B + 1)


def adaptive_rule(B):
    def rule(known, w, last):
        if w is None:
            return B
        if len(last) == w:
            return min(B, w + 1)
        return max(2, w - 1) if 2 * len(last) < w else w
    return rule


@torch.no_grad()
def logits_of(model, ids):
    T = len(ids)
    return model(torch.tensor([ids]), torch.arange(T)[None], causal_mask(T))[0]  # (T, V)


@torch.no_grad()
def reference(model, prompt, n_new, mask_id, tau, stop_ids, rule):
    """MARS with window w = rule(known tokens, previous w, previous span): feed [known | w-1 masks], take
    the accepted prefix of the w proposals. Returns (spans, windows)."""
    known, spans, windows, w = list(prompt), [], [], None
    while sum(map(len, spans)) < n_new:
        w = rule(len(known), w, spans[-1] if spans else None)
        logits = logits_of(model, known + [mask_id] * (w - 1))
        span, stopped = cut(accept(logits[len(known) - 1:], tau), n_new - sum(map(len, spans)), stop_ids)
        spans.append(span)
        windows.append(w)
        known += span
        if stopped:
            break
    return spans, windows


@torch.no_grad()
def paper_reference(model, prompt, n_new, mask_id, Bc, tau, stop_ids):
    """The released block-cached sampler for one row, by its description: a prefill forward, then blocks
    of Bc tokens from the first generated one (the last cut at the budget), each filled by forwards over
    [everything known | masks to the block's end] taking the left-to-right tau prefix of the rest of the
    block, then one commit forward. Returns (spans up to the stop token with [] for the prefill and the
    commits a later token needs, all accepted tokens, forwards)."""
    known, spans, every, forwards, stopped = list(prompt), [[]], [], 1, False
    while len(every) < n_new and not stopped:
        size, filled = min(Bc, n_new - len(every)), 0
        while filled < size:
            logits = logits_of(model, known + [mask_id] * (size - filled - 1))
            span = accept(logits[len(known) - 1:], tau)
            assert 1 <= len(span) <= size - filled
            forwards += 1
            if not stopped:
                kept, stopped = cut(span, n_new, stop_ids)
                spans.append(kept)
            known, every, filled = known + span, every + span, filled + len(span)
        forwards += 1  # the commit
        if not stopped and len(every) < n_new:
            spans.append([])
    return spans, every, forwards


# --- tau = 1: every option is greedy AR -------------------------------------------------------------

@pytest.mark.parametrize("kw", CACHES[:3], ids=cache_id)
@pytest.mark.parametrize("option", OPTIONS, ids=option_id)
def test_tau_one_is_greedy_ar_on_random_models(option, kw):
    for model, prompts, mask_id in ((random_model(), PROMPTS, 96), (small_vocab_model(), SMALL_PROMPTS, 7)):
        ar = batch_ar(model, prompts, 30)
        out = batch_decode(model, prompts, 30, mask_id, 4, 1.0, **option, **kw)
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
        assert all(len(s) == 1 for r in out.rows for s in r.spans)


@pytest.mark.parametrize("Bc", [1, 3, 8, 32])
def test_paper_block_tau_one_is_greedy_ar_on_random_models(Bc):
    for model, prompts, mask_id in ((random_model(), PROMPTS, 96), (small_vocab_model(), SMALL_PROMPTS, 7)):
        ar = batch_ar(model, prompts, 30)
        out = batch_paper_block(model, prompts, 30, mask_id, Bc, 1.0)
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
        # one token per inner forward; 30 tokens in ceil(30 / Bc) blocks, each with its commit
        blocks = -(-30 // Bc)
        assert out.forwards == 1 + 30 + blocks
        assert out.paper_forwards == [1 + 30 + blocks] * 4 and out.paper_tokens == [30] * 4


def test_tau_one_is_greedy_ar_on_the_trained_model(tok, trained):
    prompts = held_out_prompts(tok, greeting=True)
    ar = [r.tokens for r in batch_ar(trained, prompts, 48, tok.stop_ids).rows]
    for kw in CACHES[:3]:
        for option in OPTIONS:
            assert [r.tokens for r in batch_decode(trained, prompts, 48, tok.mask_id, 4, 1.0, tok.stop_ids,
                                                   **option, **kw).rows] == ar
    for Bc in (4, 32):
        out = batch_paper_block(trained, prompts, 48, tok.mask_id, Bc, 1.0, tok.stop_ids)
        assert [r.tokens for r in out.rows] == ar
        assert sum(out.paper_tokens) > out.tokens  # blocks are filled past the stop token


# --- each option equals its plain reference, batched and one row at a time -------------------------

@pytest.mark.parametrize("option", OPTIONS, ids=option_id)
def test_options_equal_their_reference_on_a_random_model(option):
    model, B, tau = peaked_model(), 4, PEAKED_TAU
    rule = aligned_rule(B) if "align" in option else adaptive_rule(B)
    refs = [reference(model, p, 30, 7, tau, (), rule) for p in SMALL_PROMPTS]
    assert any(len(s) > 1 for spans, _ in refs for s in spans)
    for kw in CACHES:
        out = batch_decode(model, SMALL_PROMPTS, 30, 7, B, tau, **option, **kw)
        assert [r.spans for r in out.rows] == [spans for spans, _ in refs]
        assert out.windows == [windows for _, windows in refs]


@pytest.mark.parametrize("option", OPTIONS, ids=option_id)
@pytest.mark.parametrize("tau", [0.9, 0.5])
def test_options_batched_equal_one_by_one_and_reference_on_the_trained_model(tok, trained, option, tau):
    prompts = held_out_prompts(tok, greeting=True)
    rule = aligned_rule(4) if "align" in option else adaptive_rule(4)
    refs = [reference(trained, p, 40, tok.mask_id, tau, tok.stop_ids, rule) for p in prompts]
    for kw in CACHES:
        out = batch_decode(trained, prompts, 40, tok.mask_id, 4, tau, tok.stop_ids, **option, **kw)
        assert [r.spans for r in out.rows] == [spans for spans, _ in refs]
        assert out.windows == [windows for _, windows in refs]
    for prompt, (spans, windows) in zip(prompts[:3], refs):
        one = batch_decode(trained, [prompt], 40, tok.mask_id, 4, tau, tok.stop_ids, **option)
        assert one.rows[0].spans == spans and one.windows[0] == windows
    assert any(len(s) > 1 for spans, _ in refs for s in spans)


@pytest.mark.parametrize("Bc", [2, 5, 16])
def test_paper_block_equals_its_reference_on_a_random_model(Bc):
    model, tau = peaked_model(), PEAKED_TAU
    free = batch_ar(model, SMALL_PROMPTS, 30)
    stop = free.rows[0].tokens[4]  # a token some rows take early, some late or never
    for stops in ((), (stop,)):
        out = batch_paper_block(model, SMALL_PROMPTS, 30, 7, Bc, tau, stops)
        for i, prompt in enumerate(SMALL_PROMPTS):
            spans, every, forwards = paper_reference(model, prompt, 30, 7, Bc, tau, stops)
            assert out.rows[i].spans == spans and out.rows[i].tokens == sum(spans, [])
            assert out.paper_tokens[i] == len(every) and out.paper_forwards[i] == forwards
            one = batch_paper_block(model, [prompt], 30, 7, Bc, tau, stops)  # one row: no waiting
            assert one.rows[0].spans == spans and one.forwards == forwards == one.paper_forwards[0]
        assert any(len(s) > 1 for r in out.rows for s in r.spans)
    assert any(len(r.tokens) < 30 for r in out.rows)  # the stop token was hit


@pytest.mark.parametrize("tau", [0.9, 0.5])
def test_paper_block_batched_equals_one_by_one_and_reference_on_the_trained_model(tok, trained, tau):
    prompts = held_out_prompts(tok, greeting=True)
    out = batch_paper_block(trained, prompts, 40, tok.mask_id, 8, tau, tok.stop_ids)
    for i, prompt in enumerate(prompts):
        spans, every, forwards = paper_reference(trained, prompt, 40, tok.mask_id, 8, tau, tok.stop_ids)
        assert out.rows[i].spans == spans
        assert out.paper_tokens[i] == len(every) and out.paper_forwards[i] == forwards
        if i < 3:
            one = batch_paper_block(trained, [prompt], 40, tok.mask_id, 8, tau, tok.stop_ids)
            assert one.rows[0].spans == spans and one.forwards == forwards
    assert any(len(s) > 1 for r in out.rows for s in r.spans)


# --- the rules themselves -------------------------------------------------------------------------------

@pytest.mark.parametrize("B", [3, 4, 8])
def test_aligned_windows_never_cross_a_block_boundary(tok, trained, B):
    """Every accepted token after a span's first was proposed by a mask at a position p with
    p // B == c // B (c: the known tokens before the span), the window offered is exactly the masks
    left in that block (B - c % B, at most B-1) plus one, and the plain window does cross."""
    prompts = held_out_prompts(tok, greeting=True)
    aligned = batch_decode(trained, prompts, 48, tok.mask_id, B, 0.3, tok.stop_ids, align=True)
    plain = batch_decode(trained, prompts, 48, tok.mask_id, B, 0.3, tok.stop_ids)
    bound_hit, crossed = False, False
    for prompt, row, windows, free in zip(prompts, aligned.rows, aligned.windows, plain.rows):
        c = len(prompt)
        for span, w in zip(row.spans, windows):
            masks = range(c, c + len(span) - 1)  # the positions of the masks that proposed span[1:]
            assert all(p // B == c // B for p in masks)
            assert w == min(B, B - c % B + 1) and len(span) <= w
            bound_hit |= len(span) == w < B  # a window shortened by the boundary was filled
            c += len(span)
        c = len(prompt)
        for span in free.spans:
            crossed |= any(p // B != c // B for p in range(c, c + len(span) - 1))
            c += len(span)
    assert bound_hit and crossed


@pytest.mark.parametrize("kw", CACHES, ids=cache_id)
def test_adaptive_windows_follow_the_rule(tok, trained, kw):
    """Recorded per forward: the first window is B; after a full window it grows by one (to B at most),
    after fewer than half accepted it shrinks by one (to 2 at least), else it stays; never wider than
    what was accepted allows. Both moves happen."""
    prompts, B = held_out_prompts(tok, greeting=True), 4
    out = batch_decode(trained, prompts, 48, tok.mask_id, B, 0.5, tok.stop_ids, adaptive=True, **kw)
    grew = shrank = False
    for row, windows in zip(out.rows, out.windows):
        assert len(windows) == len(row.spans) and windows[0] == B
        assert all(2 <= w <= B and len(s) <= w for s, w in zip(row.spans, windows))
        for (span, w), w_next in zip(zip(row.spans, windows), windows[1:]):
            expect = min(B, w + 1) if len(span) == w else max(2, w - 1) if 2 * len(span) < w else w
            assert w_next == expect
            grew |= w_next > w
            shrank |= w_next < w
    assert grew and shrank


def test_adaptive_window_grows_back_to_b_and_waiting_rows_keep_theirs(tok, trained):
    """A window that shrank grows back to B. Under the block cache a row that waits accepts nothing, and
    its window does not move."""
    prompts = held_out_prompts(tok)[:4]
    eng = mars_engine(trained, prompts, 40, tok.mask_id, 4, 0.3, tok.stop_ids, cache=BlockCache(8),
                      adaptive=True)
    waited = False
    while not eng.done:
        before = dict(zip(eng.active.tolist(), eng.strategy.win.tolist()))
        spans = eng.step()
        for row, w in zip(eng.active.tolist(), eng.strategy.win.tolist()):
            if row not in spans:
                waited = True
                assert w == before[row]
    assert waited
    # some row's window shrank below B, and after its smallest it was B again
    assert any(min(ws) < 4 and 4 in ws[ws.index(min(ws)):] for ws in eng.out.windows)


def test_plain_windows_are_b_for_every_forward(tok, trained):
    prompts = held_out_prompts(tok)[:3]
    out = batch_decode(trained, prompts, 32, tok.mask_id, 4, 0.7, tok.stop_ids)
    assert all(w == 4 for ws in out.windows for w in ws)
    assert [len(ws) for ws in out.windows] == [r.forwards for r in out.rows]


def test_paper_block_counts_the_commit_forwards_and_post_stop_tokens():
    """One row, a stop token taken inside a block: the row keeps filling that block (post-stop tokens
    are accepted and counted by the paper), then one commit forward ends it. Forwards = prefill + inner
    forwards + one commit per block; the to-stop count leaves out the tokens after the stop token and
    the forwards spent on them and on the last commit."""
    model = peaked_model()
    prompt, Bc = SMALL_PROMPTS[0], 3
    free = batch_paper_block(model, [prompt], 30, 7, Bc, 1.0)  # no stop: 1 token per inner forward
    assert free.forwards == 1 + 30 + 10 and free.rows[0].forwards == 1 + 30 + 9
    toks = free.rows[0].tokens
    stop_at = next(i for i, t in enumerate(toks) if i >= Bc and i % Bc < Bc - 1 and t != 7
                   and t not in toks[:i])  # a first occurrence after the first block, not at a block's end
    stop = free.rows[0].tokens[stop_at]
    out = batch_paper_block(model, [prompt], 30, 7, Bc, 1.0, [stop])
    assert out.rows[0].tokens == free.rows[0].tokens[:stop_at + 1]
    blocks = stop_at // Bc + 1  # the block holding the stop token is the last one
    assert out.paper_tokens == [blocks * Bc]  # filled to its end
    assert out.forwards == out.paper_forwards[0] == 1 + blocks * Bc + blocks
    assert out.rows[0].forwards == 1 + (stop_at + 1) + (blocks - 1)
    assert out.rows[0].spans[0] == [] and sum(out.rows[0].spans, []) == out.rows[0].tokens
    assert out.paper_tokens_per_forward == blocks * Bc / out.forwards
    assert out.tokens_per_forward == (stop_at + 1) / out.rows[0].forwards


def test_paper_block_cache_holds_only_committed_blocks(tok, trained):
    """After each commit every row left (rows that took a stop token leave at the commit) has a cache
    length of its prompt plus the committed blocks, and K/V equal to a fresh prefill of those tokens."""
    prompts = held_out_prompts(tok)[:4]
    eng = PaperBlockEngine(trained, prompts, 40, tok.mask_id, 8, 0.6, tok.stop_ids)
    commits = 0
    while not eng.done:
        was_commit = eng.strategy.committing
        eng.step()
        if not was_commit:
            continue
        commits += 1
        for i, row in enumerate(eng.active.tolist()):
            L = int(eng.cache.lengths[i])
            assert L == len(prompts[row]) + eng.strategy.base and int(eng.n_pend[i]) == 0
            assert_cache_is_a_fresh_prefill(trained, eng.cache, i, prompts[row] + eng.out.rows[row].tokens)
    assert commits >= 3


def test_bad_combinations_give_clear_errors():
    model = random_model()
    with pytest.raises(ValueError, match="give one of them"):
        mars_engine(model, [[1]], 4, 96, 4, align=True, adaptive=True)
    with pytest.raises(ValueError, match="give one of them"):
        batch_decode(model, [[1]], 4, 96, 4, window=CappedWindow(2), align=True)
    with pytest.raises(ValueError, match="cache_block must be"):
        batch_paper_block(model, [[1]], 4, 96, 0)
    with pytest.raises(ValueError, match="needs the mask token id"):
        batch_paper_block(model, [[1]], 4, None)


# --- a window policy written here, as a student adds one: one class, one argument -------------------------

class CappedWindow:
    """At most `cap` proposals per forward (the last real token's and cap - 1 masks): MARS with a cap."""

    def __init__(self, cap):
        self.cap = cap

    def __call__(self, gate, eng):
        return torch.full_like(eng.n_pend, min(self.cap, gate.B))

    def update(self, gate, accepted):
        pass


def test_a_window_written_in_a_test_runs_through_batch_decode_at_tau_one_as_greedy_ar():
    model = random_model()
    ar = batch_ar(model, PROMPTS, 30)
    for cap in (1, 2, 4):
        out = batch_decode(model, PROMPTS, 30, 96, 4, 1.0, window=CappedWindow(cap))
        assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_a_window_written_in_a_test_keeps_its_cap_and_equals_its_reference(cap):
    model, B, tau = peaked_model(), 4, PEAKED_TAU
    refs = [reference(model, p, 30, 7, tau, (), lambda known, w, last: cap) for p in SMALL_PROMPTS]
    for kw in CACHES:
        out = batch_decode(model, SMALL_PROMPTS, 30, 7, B, tau, window=CappedWindow(cap), **kw)
        assert [r.spans for r in out.rows] == [spans for spans, _ in refs]
        assert all(len(s) <= cap for r in out.rows for s in r.spans)
        assert out.windows == [[cap] * len(spans) for spans, _ in refs]
    if cap > 1:  # the cap is what binds: the fixed window of B takes longer spans on the same prompts
        assert any(len(s) == cap for r in out.rows for s in r.spans)
        fixed = batch_decode(model, SMALL_PROMPTS, 30, 7, B, tau)
        assert max(len(s) for r in fixed.rows for s in r.spans) > cap
    engine = mars_engine(model, SMALL_PROMPTS, 30, 7, B, tau, window=CappedWindow(cap))  # the engine to step
    assert [r.spans for r in engine.run().rows] == [spans for spans, _ in refs]
