"""The engine's core and its parts: a strategy written here plugs in without touching any other; the
plain single-sequence decoders agree with the engine."""

import pytest
import torch

from conftest import PROMPTS, random_model
from nanomars.batch_decode import batch_ar, batch_lossless
from nanomars.decode import Spans, ar_decode, lossless_decode, mars_decode, propose
from nanomars.engine import Accepted, Engine, Fed, NoCache, PerRequestCache, Strategy



class RepeatLastToken(Strategy):
    """A toy strategy, not in the library: feed one copy of the last pending token as a draft and keep it
    when AR agrees (prompt lookup with n = 1, draft length 1). Exact for greedy by construction of the
    check, so it must equal AR; it touches no other strategy. Its per-row state (how many drafts each row
    kept) must follow the rows as finished ones leave the batch."""
    ahead, width, rows = 2, 2, ("kept",)

    def start(self, eng):
        self.kept, self.total = torch.zeros_like(eng.n_pend), {}

    def feed(self, eng):
        last = eng.pending.gather(1, (eng.n_pend - 1)[:, None])  # (n, 1)
        self.draft = last
        return Fed(last, torch.ones_like(eng.n_pend))

    def accept(self, eng, logits, hidden):
        y = propose(logits)[0]  # (n, 2): AR after the pending tokens, AR after the draft
        kept = (y[:, 0] == self.draft[:, 0]).long()
        self.kept = self.kept + kept
        self.total.update(zip(eng.active.tolist(), self.kept.tolist()))  # row -> drafts kept so far
        return Accepted(y, kept + 1, kept, torch.full_like(kept, 2))


@pytest.mark.parametrize("policy", [PerRequestCache, NoCache])
def test_a_new_strategy_plugs_into_the_core(policy):
    model = random_model(vocab_size=13)
    prompts = [[p % 12 + 1 for p in prompt] for prompt in PROMPTS]
    strategy = RepeatLastToken()
    out = Engine(model, prompts, 30, strategy, (), policy()).run()
    ar = batch_ar(model, prompts, 30)
    assert [r.tokens for r in out.rows] == [r.tokens for r in ar.rows]
    assert any(len(s) == 2 for r in out.rows for s in r.spans)  # some drafts were kept
    assert out.forwards < ar.forwards
    # the state's rows were dropped with the finished rows: each prompt's count is its own
    assert [strategy.total[i] for i in range(len(prompts))] == [sum(len(s) == 2 for s in r.spans) for r in out.rows]


@pytest.mark.parametrize("use_cache", [True, False])
def test_plain_lossless_decoder_gives_the_engines_spans(tok, trained, use_cache):
    prompts = [tok.prompt_ids(q) for q in ("Sort: 3 1 2", "Evaluate: not ( True and False )", "Hi")]
    for B in (2, 4):
        batch = batch_lossless(trained, prompts, 40, tok.mask_id, B, tok.stop_ids,
                               cache="request" if use_cache else None)
        for prompt, row in zip(prompts, batch.rows):
            one = lossless_decode(trained, prompt, 40, tok.mask_id, B, tok.stop_ids, use_cache)
            assert one.spans == row.spans
            assert one.tokens == ar_decode(trained, prompt, 40, tok.stop_ids).tokens


def test_token_ids_outside_the_vocabulary_are_rejected():
    model = random_model()  # vocabulary of 97 ids
    for decode in (lambda p: ar_decode(model, p, 4), lambda p: mars_decode(model, p, 4, 96),
                   lambda p: batch_ar(model, [[1, 2], p], 4)):
        for bad in (97, -1):
            with pytest.raises(ValueError, match=f"token id {bad} is outside the model's vocabulary of 97"):
                decode([3, bad, 5])


def test_spans_render_as_html_in_jupyter(tok):
    ids = tok.encode("a <b> & c")
    spans = [ids[:1], ids[1:], [min(tok.stop_ids)]]
    view = Spans(tok, spans)
    html = view._repr_html_()
    assert html.count("<span style=\"background:") == 2  # the stop token's span shows nothing
    assert "&lt;b&gt; &amp; c" in html and "<b>" not in html  # escaped
    assert str(view) == "[a][ <b> & c]"

