import math

import pytest
import torch

from conftest import PROMPTS, assert_cache_is_a_fresh_prefill, constant_model, held_out_prompts, random_model
from nanomars.compare.block_cache import BlockCache
from nanomars.batch_decode import batch_ar, batch_decode, batch_jacobi, mars_engine, splice
from nanomars.engine import Engine
from nanomars.strategies import AR
from nanomars.decode import ar_decode, gate, mars_decode, propose
from nanomars.masks import causal_mask

MASK = 96
STRATEGIES = [dict(cache=None), dict(cache="request"), dict(cache=BlockCache(4)),
              dict(cache=BlockCache(8))]
# very different lengths, a 1-token prompt


def test_splice_aligns_rows():
    a = torch.tensor([[1, 2, 3], [4, 0, 0]])
    b = torch.tensor([[7, 8], [9, 9]])
    x, n = splice(a, torch.tensor([3, 1]), b, torch.tensor([1, 2]))
    assert x.tolist() == [[1, 2, 3, 7], [4, 9, 9, 0]] and n.tolist() == [4, 3]
    x, n = splice(a, torch.tensor([3, 1]), b, torch.tensor([2, 0]), skip=torch.tensor([2, 1]))
    assert x.tolist() == [[3, 7, 8], [0, 0, 0]]
    assert n.tolist() == [3, 0]


@pytest.mark.parametrize("kw", STRATEGIES, ids=lambda kw: str(kw["cache"]))
@pytest.mark.parametrize("tau", [0.9, 0.6])
def test_every_strategy_gives_each_row_its_single_row_decoding(tok, trained, kw, tau):
    prompts = held_out_prompts(tok) + [tok.prompt_ids("Hi")]
    out = batch_decode(trained, prompts, 40, tok.mask_id, 4, tau, tok.stop_ids, **kw)
    for prompt, row in zip(prompts, out.rows):
        ref = mars_decode(trained, prompt, 40, tok.mask_id, 4, tau, tok.stop_ids)
        assert row.spans == ref.spans and row.tokens == ref.tokens
    assert any(len(s) > 1 for r in out.rows for s in r.spans)  # multi-token spans did happen


def test_cache_strategies_equal_uncached_and_block_cache_waits(tok, trained):
    prompts = held_out_prompts(tok)
    runs = {str(kw): batch_decode(trained, prompts, 40, tok.mask_id, 4, 0.8, (), **kw) for kw in STRATEGIES}
    spans = [[r.spans for r in out.rows] for out in runs.values()]
    assert all(s == spans[0] for s in spans)
    # no stop tokens: every row runs to the budget, and under the block cache a row that is ahead waits
    request, block = runs[str(STRATEGIES[1])], runs[str(STRATEGIES[2])]
    assert block.forwards > request.forwards == max(r.forwards for r in request.rows)


@pytest.mark.parametrize("cache", [None, "request", BlockCache(4)], ids=str)
def test_batched_ar_equals_single_ar_on_a_random_model(cache):
    model = random_model()
    out = batch_ar(model, PROMPTS, 30, cache=cache)
    for prompt, row in zip(PROMPTS, out.rows):
        assert row.tokens == ar_decode(model, prompt, 30).tokens and row.forwards == 30
    assert out.forwards == 30
    one = batch_ar(model, [[7]], 30, cache=cache)  # a batch of one, 1-token prompt
    assert one.rows[0].tokens == out.rows[1].tokens


def test_tau_one_batched_mars_equals_batched_ar(tok, trained):
    prompts = held_out_prompts(tok)
    ar = batch_ar(trained, prompts, 48, tok.stop_ids)
    for kw in STRATEGIES:
        mars = batch_decode(trained, prompts, 48, tok.mask_id, 4, 1.0, tok.stop_ids, **kw)
        assert [r.tokens for r in mars.rows] == [r.tokens for r in ar.rows]
        assert all(len(s) == 1 for r in mars.rows for s in r.spans)


def test_rows_that_stop_leave_while_the_others_go_on():
    model = random_model()
    free = batch_ar(model, PROMPTS, 30)
    # a token row 0 generates early but some other row never does
    stop = next(t for t in free.rows[0].tokens[3:] if any(t not in r.tokens for r in free.rows[1:]))
    for kw in STRATEGIES:
        out = batch_decode(model, PROMPTS, 30, MASK, 4, 0.5, stop_ids={stop}, **kw)  # 0.5: AR here
        for f, r in zip(free.rows, out.rows):
            cut = f.tokens.index(stop) + 1 if stop in f.tokens else len(f.tokens)
            assert r.tokens == f.tokens[:cut]
        assert len(out.rows[0].tokens) < 30 and any(len(r.tokens) == 30 for r in out.rows)


def test_cache_holds_only_real_tokens(tok, trained):
    """After every step each row's cache, up to its length, equals a fresh prefill of its real tokens:
    no mask K/V was kept, and the length counts exactly the committed tokens."""
    prompts = held_out_prompts(tok)[:4]
    for kw in STRATEGIES[1:]:
        eng = mars_engine(trained, prompts, 40, tok.mask_id, 4, 0.7, tok.stop_ids, **kw)
        for _ in range(6):
            eng.step()
            for i, row in enumerate(eng.active.tolist()):
                L = int(eng.cache.lengths[i])
                assert L == len(prompts[row]) + int(eng.generated[i]) - int(eng.n_pend[i])
                assert_cache_is_a_fresh_prefill(trained, eng.cache, i, (prompts[row] + eng.out.rows[row].tokens)[:L])


def test_per_row_tau_is_a_real_time_knob(tok, trained):
    prompt = held_out_prompts(tok)[0]
    ar = ar_decode(trained, prompt, 48, tok.stop_ids)
    out = batch_decode(trained, [prompt, prompt], 48, tok.mask_id, 4, [1.0, 0.5], tok.stop_ids)
    assert out.rows[0].tokens == ar.tokens and out.rows[0].forwards == ar.forwards
    assert max(len(s) for s in out.rows[1].spans) > 1
    # changed between steps: row 1 goes back to one token per forward from step 3 on
    eng = mars_engine(trained, [prompt, prompt], 48, tok.mask_id, 4, [0.5, 0.5], tok.stop_ids)

    def turn_knob(engine, spans):
        if engine.out.forwards == 2:
            engine.set_tau(1, 1.0)

    eng.run(on_step=turn_knob)
    assert all(len(s) == 1 for s in eng.out.rows[1].spans[2:])
    assert max(len(s) for s in eng.out.rows[0].spans[2:]) > 1


@pytest.mark.parametrize("model_name", ["random", pytest.param("trained", marks=pytest.mark.trained)])
def test_jacobi_equals_greedy_ar(tok, request, model_name):
    if model_name == "random":  # the trained model is requested (and trained) only where it is used
        model, prompts, stops = random_model(), PROMPTS, ()
    else:
        model, prompts, stops = request.getfixturevalue("trained"), held_out_prompts(tok), tok.stop_ids
    ar = batch_ar(model, prompts, 40, stops)
    for window in (2, 4):
        jac = batch_jacobi(model, prompts, 40, window, stops)
        assert [r.tokens for r in jac.rows] == [r.tokens for r in ar.rows]


@pytest.mark.parametrize("window", [2, 4])
def test_jacobi_accepts_whole_windows_once_the_guesses_converge(window):
    """Greedy AR of a constant model is token, token, ... The first forward checks guesses of an unrelated
    token and keeps only its first output; from then on every guess is the model's output, so each forward
    accepts its whole window: 1 + ceil(29 / window) forwards for 30 tokens, where AR takes 30."""
    model, token = constant_model(3), 3
    out = batch_jacobi(model, PROMPTS, 30, window)
    for row in out.rows:
        assert row.tokens == [token] * 30
        assert [len(s) for s in row.spans] == [1] + [window] * (29 // window) + ([29 % window] if 29 % window else [])
    assert out.forwards == 1 + math.ceil(29 / window)


def test_jacobi_accepts_more_than_one_token_per_forward_on_the_trained_model(tok, trained):
    prompts = held_out_prompts(tok)
    ar = batch_ar(trained, prompts, 40, tok.stop_ids)
    jac = batch_jacobi(trained, prompts, 40, 4, tok.stop_ids)
    assert [r.tokens for r in jac.rows] == [r.tokens for r in ar.rows]
    assert any(len(s) > 1 for r in jac.rows for s in r.spans)
    assert sum(r.forwards for r in jac.rows) < sum(r.forwards for r in ar.rows)
    # past the stop token the trained model repeats itself: guesses converge and whole windows are accepted
    free = batch_jacobi(trained, prompts, 40, 4)
    assert free.tokens_per_forward > 2


def test_sampling_is_reproducible_and_top1_is_greedy(tok, trained):
    prompts = held_out_prompts(tok)[:3]
    for run in (lambda **kw: batch_decode(trained, prompts, 32, tok.mask_id, 4, 0.8, tok.stop_ids, **kw),
                lambda **kw: batch_ar(trained, prompts, 32, tok.stop_ids, **kw)):
        a, b, c = (run(temperature=1.5, top_k=50, seed=s) for s in (1, 1, 2))
        assert [r.spans for r in a.rows] == [r.spans for r in b.rows]
        assert [r.tokens for r in a.rows] != [r.tokens for r in c.rows]
        greedy, top1 = run(), run(temperature=1.0, top_k=1, seed=0)  # same gate p as greedy
        assert [r.spans for r in greedy.rows] == [r.spans for r in top1.rows]


@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.5, top_k=50, seed=3)], ids=["greedy", "sampled"])
def test_ar_baseline_is_mars_at_block_1_draw_for_draw(tok, trained, sampling):
    """batch_ar (strategies.AR: no softmax, no gate) takes the very tokens MARS with B = 1 takes, greedy and
    sampled from the same seed, on both models."""
    for model, prompts in ((trained, held_out_prompts(tok)), (random_model(), PROMPTS)):
        ar = batch_ar(model, prompts, 32, tok.stop_ids, **sampling)
        mars = mars_engine(model, prompts, 32, None, 1, 1.0, tok.stop_ids, **sampling).run()
        assert [r.spans for r in ar.rows] == [r.spans for r in mars.rows]
        assert ar.forwards == mars.forwards


def test_acceptance_metrics():
    # after y_0: sure, unsure, sure, so sure that float32 softmax rounds to exactly 1.0
    logits = torch.tensor([[0.0, 0.0, 0.0], [9.0, 0.0, 0.0], [2.0, 1.5, 0.0], [9.0, 0.0, 0.0], [200.0, 0, 0]])
    y, p = propose(logits)
    assert p[4].max() == 1.0
    assert gate(p, y, 0.9, "prob").tolist()[1:] == [True, False, True, True]
    assert gate(p, y, 0.1, "entropy").tolist()[1:] == [True, False, True, True]
    assert gate(p, y, 0.5, "margin").tolist()[1:] == [True, False, True, True]
    for metric, exact in (("prob", 1.0), ("margin", 1.0), ("entropy", 0.0)):  # exactly AR: nothing passes
        assert not gate(p, y, exact, metric).any()
    with pytest.raises(ValueError, match="unknown acceptance metric"):
        gate(p, y, 0.5, "vibes")


def test_exact_ar_settings_of_every_metric(tok, trained):
    prompts = held_out_prompts(tok)[:4]
    ar = [r.tokens for r in batch_ar(trained, prompts, 32, tok.stop_ids).rows]
    for metric, exact, loose in (("entropy", 0.0, 0.5), ("margin", 1.0, 0.5)):
        out = batch_decode(trained, prompts, 32, tok.mask_id, 4, exact, tok.stop_ids, metric=metric)
        assert [r.tokens for r in out.rows] == ar
        assert batch_decode(trained, prompts, 32, tok.mask_id, 4, loose, tok.stop_ids,
                            metric=metric).tokens_per_forward > 1.1


def test_bad_inputs_give_clear_errors():
    model = random_model(max_seq_len=32)
    with pytest.raises(ValueError, match=r"tau must be in"):
        batch_decode(model, [[1]], 4, MASK, tau=1.5)
    with pytest.raises(ValueError, match="got 1 taus for 2 prompts"):
        batch_decode(model, [[1], [2]], 4, MASK, tau=[0.9])
    with pytest.raises(ValueError, match="cache must be"):
        batch_decode(model, [[1]], 4, MASK, cache="paged")
    with pytest.raises(ValueError, match="needs the mask token id"):
        batch_decode(model, [[1]], 4, None)
    with pytest.raises(ValueError, match="prompt is empty"):
        batch_ar(model, [[1], []], 4)
    with pytest.raises(ValueError, match="exceeds the model context"):
        batch_decode(model, [[1], list(range(30))], 4, MASK)
    eng = mars_engine(model, [[1]], 4, MASK)
    with pytest.raises(ValueError, match="tau must be in"):
        eng.set_tau(0, 0.0)
    with pytest.raises(ValueError, match="AR has no tau"):
        Engine(model, [[1]], 4, AR()).set_tau(0, 0.5)


def test_reference_greedy_agrees_on_long_padded_batches():
    """Right padding never leaks: a long and a short prompt decoded together equal full causal forwards."""
    model = random_model(seed=3)
    prompts = [list(range(1, 60)), [4]]
    out = batch_ar(model, prompts, 20)
    for prompt, row in zip(prompts, out.rows):
        ids = list(prompt)
        for _ in range(20):
            T = len(ids)
            ids.append(int(model(torch.tensor([ids]), torch.arange(T)[None], causal_mask(T))[0, -1].argmax()))
        assert row.tokens == ids[len(prompt):]


def test_bench_quick_writes_the_table(tok, trained, tmp_path):
    """tools/bench.py end to end on a small trained checkpoint: every strategy measured against AR in one run."""
    import json
    import os
    import subprocess
    import sys
    from nanomars.util.checkpoint import save_checkpoint
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    save_checkpoint(str(tmp_path / "m.pt"), trained, None, 0, {"block_size": 4})
    proc = subprocess.run([sys.executable, "tools/bench.py", "--quick", "--ckpt", str(tmp_path / "m.pt"),
                           "--out", str(tmp_path / "bench")], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    strategies = {r["strategy"] for r in results}
    assert {"AR+cache", "MARS no cache", "MARS per-request", "Jacobi"} <= strategies
    assert any(s.startswith("MARS block") for s in strategies)
    for bs in (1, 8):
        rows = {r["strategy"]: r for r in results if r["batch_size"] == bs}
        assert rows["AR+cache"]["x_ar"] == 1.0 and rows["AR+cache"]["tokens_per_forward"] == 1.0
        assert all(r["tokens_per_s"] > 0 for r in rows.values())
        mars = [r for name, r in rows.items() if name.startswith("MARS")]
        # the trained fixture accepts several tokens in some forwards (1.14 tokens/forward measured); every
        # cache strategy decodes the very same tokens, so the counts agree exactly
        assert mars[0]["tokens_per_forward"] > 1.05
        assert len({(r["tokens"], r["tokens_per_forward"], r["accuracy"]) for r in mars}) == 1
        # Jacobi is exact: AR's tokens, hence AR's accuracy, in at most as many forwards
        assert rows["Jacobi"]["tokens"] == rows["AR+cache"]["tokens"]
        assert rows["Jacobi"]["accuracy"] == rows["AR+cache"]["accuracy"]
    assert (tmp_path / "bench.png").stat().st_size > 0
