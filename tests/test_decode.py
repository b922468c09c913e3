import os

import pytest
import torch

from conftest import held_out_prompts, random_model
from nanomars.util.checkpoint import load_checkpoint, save_checkpoint
from nanomars.decode import accept, ar_decode, lossless_decode, mars_decode, mars_decode_plain, show_spans
from nanomars.masks import causal_mask

MASK = 96
MARS = {True: mars_decode, False: mars_decode_plain}  # use_cache -> the decoder


def reference_greedy(model, prompt, n):
    """The slowest possible greedy AR: a full causal forward per token, nothing shared with decode.py."""
    ids = list(prompt)
    for _ in range(n):
        T = len(ids)
        logits = model(torch.tensor([ids]), torch.arange(T)[None], causal_mask(T))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("use_cache", [True, False])
def test_ar_decode_equals_reference_greedy(use_cache):
    model = random_model()
    prompt = [5, 17, 3, 44, 2]
    assert ar_decode(model, prompt, 30, use_cache=use_cache).tokens == reference_greedy(model, prompt, 30)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_tau_one_is_greedy_ar_on_a_random_model(use_cache, block_size):
    model = random_model(seed=block_size)
    prompt = [5, 17, 3, 44, 2, 9]
    out = MARS[use_cache](model, prompt, 40, MASK, block_size, tau=1.0)
    assert out.tokens == ar_decode(model, prompt, 40).tokens
    assert out.forwards == 40 and all(len(s) == 1 for s in out.spans)


def test_tau_one_is_greedy_ar_on_a_trained_model(tok, trained):
    for prompt in held_out_prompts(tok, 3):
        ar = ar_decode(trained, prompt, 48, tok.stop_ids)
        for use_cache in (True, False):
            out = MARS[use_cache](trained, prompt, 48, tok.mask_id, 4, 1.0, tok.stop_ids)
            assert out.tokens == ar.tokens and out.forwards == ar.forwards


def test_trained_model_accepts_several_tokens_and_cache_changes_nothing(tok, trained):
    total_tokens = total_forwards = 0
    for prompt in held_out_prompts(tok, 3):
        for tau in (0.9, 0.5):
            cached = mars_decode(trained, prompt, 48, tok.mask_id, 4, tau, tok.stop_ids)
            uncached = mars_decode_plain(trained, prompt, 48, tok.mask_id, 4, tau, tok.stop_ids)
            assert cached.tokens == uncached.tokens and cached.spans == uncached.spans
            assert sum(cached.spans, []) == cached.tokens
            total_tokens, total_forwards = total_tokens + len(cached.tokens), total_forwards + cached.forwards
    assert total_tokens / total_forwards > 1.2  # several tokens per forward do happen


def test_cached_equals_uncached_for_low_tau_on_a_random_model():
    model = random_model()
    # a random model is unsure (p near 1/97): only a tau this low accepts extra tokens. At 0.017 and 0.0165
    # some windows are cut part way, leaving masks' K/V beyond the cache length; at 0.01 all are taken whole
    for tau, part_way in ((0.017, True), (0.0165, True), (0.01, False)):
        a = mars_decode(model, [1, 2, 3], 40, MASK, 4, tau)
        b = mars_decode_plain(model, [1, 2, 3], 40, MASK, 4, tau)
        assert a.spans == b.spans, tau
        assert a.forwards < 40, tau  # extra tokens were accepted at this tau
        assert any(1 < len(s) < 4 for s in a.spans) == part_way, tau


def test_accept_stops_at_first_failure_and_tau_one_keeps_one():
    logits = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 0.0], [10.0, 0.0]])  # conf ~1, 0.5, ~1 after y_0
    assert accept(logits, 0.9) == [0, 0]  # mask 2 fails (0.5) -> mask 3 is never looked at
    assert accept(logits, 0.4) == [0, 0, 0, 0]
    sure = torch.tensor([[0.0, 200.0], [0.0, 200.0]])  # softmax rounds to exactly 1.0 in float32
    assert accept(sure, 1.0) == [1]


def test_stops_at_eos_and_respects_the_budget():
    model = random_model()
    free = mars_decode(model, [1, 2, 3], 30, MASK, 4, 0.01)
    stop = free.tokens[7]
    out = mars_decode(model, [1, 2, 3], 30, MASK, 4, 0.01, stop_ids={stop})
    assert out.tokens == free.tokens[:free.tokens.index(stop) + 1]
    assert len(mars_decode(model, [1, 2, 3], 5, MASK, 4, 0.01).tokens) == 5


def test_show_spans_brackets_each_forward(tok):
    spans = [tok.encode("Hello"), tok.encode(" world") + [tok.eos_id]]
    assert show_spans(tok, spans) == "[Hello][ world]"
    assert "\x1b[" in show_spans(tok, spans, color=True)


def test_bad_inputs_give_clear_errors(tmp_path):
    model = random_model(max_seq_len=32)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        mars_decode(model, [1], 4, MASK, block_size=0)
    for tau in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"tau must be in \(0, 1\]"):
            mars_decode(model, [1], 4, MASK, tau=tau)
    with pytest.raises(ValueError, match="exceeds the model context of 32 tokens"):
        mars_decode(model, list(range(30)), 4, MASK)
    with pytest.raises(ValueError, match="prompt is empty"):
        ar_decode(model, [], 4)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(str(tmp_path / "missing.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        load_checkpoint(str(tmp_path / "junk.pt"))


def test_checkpoint_round_trip_and_compile_prefix(tmp_path):
    model = random_model()
    path = str(tmp_path / "m.pt")
    save_checkpoint(path, model, None, 7, {"block_size": 4})
    loaded, ckpt = load_checkpoint(path)
    assert ckpt["step"] == 7 and ckpt["args"]["block_size"] == 4
    assert not list(tmp_path.glob("*.tmp*"))  # the temp file was renamed away
    x = torch.tensor([[1, 2, 3]])
    mask = causal_mask(3)
    assert torch.equal(loaded(x, torch.arange(3)[None], mask), model(x, torch.arange(3)[None], mask))
    # a checkpoint written from a torch.compile'd model has '_orig_mod.' keys: they load too
    ckpt["model"] = {"_orig_mod." + k: v for k, v in ckpt["model"].items()}
    torch.save(ckpt, path)
    loaded, _ = load_checkpoint(path)
    assert torch.equal(loaded(x, torch.arange(3)[None], mask), model(x, torch.arange(3)[None], mask))


NEAR_TIE = 0.25  # logits: twice the largest bf16-vs-float32 margin shift the trained fixture shows (~0.13)


def assert_near_greedy(model, prompt, spans):
    """Every span's first token must be float32 greedy AR's choice after the tokens before it, or within
    NEAR_TIE logits of it: where float32's top two are further apart than bf16 rounding can move them,
    a bf16 decoder must pick exactly float32's argmax. (The tokens a span accepts after its first are
    the masks' proposals, not AR's: only their validity is checked.)"""
    tokens = sum(spans, [])
    seq = torch.tensor([list(prompt) + tokens])
    logits = model(seq, torch.arange(seq.shape[1])[None], causal_mask(seq.shape[1]))[0]  # float32
    c = len(prompt)
    for span in spans:
        gap = logits[c - 1].max() - logits[c - 1, span[0]]
        assert gap <= NEAR_TIE, (c, float(gap))
        c += len(span)
    assert all(0 <= t < model.config.vocab_size for t in tokens)


def test_decoders_run_under_bf16_autocast_and_stay_greedy_up_to_near_ties(tok, trained):
    """float32 weights under torch.autocast(bf16): K leaves RoPE in float32, V its Linear in bf16, and the
    KV cache casts both on write. Every decoder runs, and each forward's first token is float32 greedy AR's
    choice up to a near-tie (assert_near_greedy): bf16 may flip an argmax whose top two are within
    rounding, never one with a clear margin. Exact equality is a float32 property (docs/mars.md)."""
    from nanomars.batch_decode import batch_ar, batch_decode, batch_lossless
    from nanomars.compare.block_cache import BlockCache
    prompts = held_out_prompts(tok)
    with torch.no_grad():
        a = trained(torch.tensor([prompts[0]]), torch.arange(len(prompts[0]))[None], causal_mask(len(prompts[0])))
        with torch.autocast("cpu", torch.bfloat16):
            b = trained(torch.tensor([prompts[0]]), torch.arange(len(prompts[0]))[None], causal_mask(len(prompts[0])))
    assert (a - b).abs().max() < NEAR_TIE / 2  # the premise: bf16 moves each logit by less than half of it
    with torch.autocast("cpu", torch.bfloat16):
        outs = []
        for p in prompts[:3]:
            outs.append((p, ar_decode(trained, p, 32, tok.stop_ids)))
            outs.append((p, ar_decode(trained, p, 32, tok.stop_ids, use_cache=False)))
            for use_cache in (True, False):
                outs.append((p, MARS[use_cache](trained, p, 32, tok.mask_id, 4, 0.9, tok.stop_ids)))
            outs.append((p, mars_decode(trained, p, 32, tok.mask_id, 4, 1.0, tok.stop_ids)))
            outs.append((p, lossless_decode(trained, p, 32, tok.mask_id, 4, stop_ids=tok.stop_ids)))
        batches = [batch_decode(trained, prompts, 32, tok.mask_id, 4, 0.9, tok.stop_ids, cache=c)
                   for c in ("request", BlockCache(16), None)]
        batches += [batch_ar(trained, prompts, 32, tok.stop_ids), batch_lossless(trained, prompts, 32, tok.mask_id, 4,
                                                                                  tok.stop_ids)]
    outs += [(p, row) for out in batches for p, row in zip(prompts, out.rows)]
    for p, out in outs:
        assert 1 <= len(out.tokens) <= 32 and sum(out.spans, []) == out.tokens
        assert_near_greedy(trained, p, out.spans)
    assert any(len(span) > 1 for _, out in outs[2::6] for span in out.spans)  # MARS tau 0.9 took several


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="finds memory mappings in Linux's /proc")
def test_loaded_checkpoint_survives_its_file_being_rewritten_in_place(tmp_path):
    """load_checkpoint memory-maps the file, then copies the weights off the mapping: rewriting the file in
    place (what cp does) must not make the model or ckpt["model"] fault (SIGBUS) when used afterwards.
    Only the optimizer state still maps the file until an optimizer loads it (the docstring says so)."""
    def mapped_from(t):  # the file a tensor's memory is mapped from, or None
        ptr = t.data_ptr()
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(a, 16) for a in line.split()[0].split("-"))
                if lo <= ptr < hi:
                    return line.split()[-1] if len(line.split()) >= 6 else None
    model = random_model()
    opt = model.configure_optimizer(lr=1e-3)
    x, pos, mask = torch.tensor([[1, 2, 3]]), torch.arange(3)[None], causal_mask(3)
    model.train()
    model(x, pos, mask).sum().backward()
    opt.step()
    path = str(tmp_path / "m.pt")
    save_checkpoint(path, model, opt, 1, {"block_size": 4})
    want = model.eval()(x, pos, mask)
    loaded, ckpt = load_checkpoint(path)
    assert loaded.lm_head.weight is loaded.embed.weight  # still tied after the copy
    assert all(mapped_from(t) != path for t in list(loaded.parameters()) + list(ckpt["model"].values()))
    assert any(mapped_from(t) == path for t in ckpt["optimizer"]["state"][0].values())  # lazy, as documented
    del ckpt["optimizer"]
    with open(path, "r+b") as f:  # rewrite in place: truncate, write other bytes
        f.truncate(0)
        f.write(b"\0" * 100)
    assert torch.equal(loaded(x, pos, mask), want)
    torch.save(ckpt, str(tmp_path / "again.pt"))  # reads every tensor ckpt still holds
