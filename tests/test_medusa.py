"""Medusa-style heads (nanomars/compare/medusa.py): the heads' shape and parameter count, their training loss
(against a plain computation, and that it falls), the checkpoint, and decoding. Verified decoding must be
greedy AR token for token (random and trained heads, every cache policy, batched or alone) and follow a
plain one-prompt reference span for span, so the heads are read at the right column; the tau gate must be
AR at tau 1 and follow its own plain reference below it."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import (K, N_SAMPLES, POLICIES, PROMPTS, ROOT, SMALL_PROMPTS, TINY, chi_square_pvalue, decode,
                      exact_ar_distribution, held_out_prompts, keep_every_draft, random_heads,
                      random_model, replace_from_p, run_train, small_vocab_model, spans, tokens)
from nanomars.batch_decode import batch_ar
from nanomars.util.checkpoint import save_checkpoint
from nanomars.dual_track import IGNORE, collate
from nanomars.engine import Engine
from nanomars.masks import causal_mask
from nanomars.compare.medusa import Medusa, MedusaGate, MedusaHeads, head_targets, load_medusa, medusa_loss
from nanomars.model import Config, Decoder
from nanomars.util.tasks import held_out_split



def held_out_batch(tok):
    return collate([tok.render(ex["messages"]) for ex in held_out_split(4)], 4, tok.eos_id)


@torch.no_grad()
def reference_heads(medusa, prompt, n):
    """Verified Medusa decoding of one prompt in plain Python, no cache: each step is one causal forward
    over [known | draft]; keep the draft while it equals the base's argmax, then the base's own token; the
    next draft is each head's argmax at the last kept position (the one whose base output was that
    token). Returns the spans."""
    known, draft, out = list(prompt), [], []
    while sum(map(len, out)) < n:
        x = torch.tensor([known + draft])
        T = x.shape[1]
        h = medusa.base.hidden(x, torch.arange(T)[None], causal_mask(T))[0]  # (T, C)
        y = medusa.base.lm_head(h).argmax(-1).tolist()[len(known) - 1:]  # the base at the last known on
        kept = next((i for i in range(len(draft)) if draft[i] != y[i]), len(draft))
        span = (draft[:kept] + [y[kept]])[:n - sum(map(len, out))]
        draft = medusa.head_logits(h[len(known) - 1 + kept]).argmax(-1).tolist()
        out.append(span)
        known += span
    return out


@torch.no_grad()
def reference_gate(medusa, prompt, n, tau):
    """The tau gate for one prompt in plain Python: one causal forward over the known tokens; the base's
    argmax at the last one, then head k's argmax while its probability >= tau."""
    known, out = list(prompt), []
    while sum(map(len, out)) < n:
        T = len(known)
        h = medusa.base.hidden(torch.tensor([known]), torch.arange(T)[None], causal_mask(T))[0, -1]
        span = [int(medusa.base.lm_head(h).argmax())]
        for p in medusa.head_logits(h).softmax(-1):  # (V,) head by head
            if p.max() < tau:
                break
            span.append(int(p.argmax()))
        span = span[:n - sum(map(len, out))]
        out.append(span)
        known += span
    return out


# --------------------------------------------------------------------------------- the model and its loss
def test_hidden_states_are_what_the_lm_head_reads():
    model = random_model()
    x = torch.randint(97, (3, 10))
    pos, mask = torch.arange(10).expand(3, 10), causal_mask(10)
    cols = torch.tensor([[0, 4], [9, 2], [5, 5]])
    for keep in (None, slice(6, None), cols, x % 3 == 0):
        h = model.hidden(x, pos, mask, keep=keep)
        assert h.shape[-1] == 32
        assert torch.equal(model.lm_head(h).float(), model(x, pos, mask, keep=keep))  # logits unchanged
    last = model.hidden(x, pos, mask)[:, -1]
    assert torch.allclose(last.pow(2).mean(-1), torch.ones(3), atol=0.01)  # RMS-normalised (up to eps)


def test_zero_heads_start_as_the_base_next_token_head_and_parameters_are_counted():
    base = random_model()
    medusa = Medusa(base, 3)
    h = torch.randn(5, 32)
    logits = medusa.head_logits(h)  # (5, 3, V)
    assert torch.equal(medusa.residual(h), h[:, None].expand(5, 3, 32))  # zero heads: exactly the identity
    for k in range(3):  # so each head's logits are the base's next-token logits (a GEMM of another shape
        # may round differently on some CPUs: 15 rows against 5)
        torch.testing.assert_close(logits[:, k], base.lm_head(h).float(), rtol=0, atol=1e-6)
    assert medusa.extra_params() == 3 * (32 * 32 + 32)
    assert medusa.num_params() == base.num_params() + medusa.extra_params()
    assert not any(p.requires_grad for p in base.parameters())  # frozen
    assert {id(p) for g in medusa.configure_optimizer(1e-3).param_groups for p in g["params"]} == \
        {id(p) for p in medusa.heads.parameters()}  # only the heads train
    default = Medusa(Decoder(Config()), 3)  # the default model (width 128) and B = 4: K = 3 heads
    assert default.extra_params() == 49_536 == 3 * (128 * 128 + 128)


def test_head_targets_are_the_tokens_k_after_the_next(tok):
    t = torch.tensor([[10, 11, 12, IGNORE, 14, IGNORE]])
    assert head_targets(t, 2).tolist() == [[[11, 12, IGNORE, 14, IGNORE, IGNORE]],
                                           [[12, IGNORE, 14, IGNORE, IGNORE, IGNORE]]]
    x, response, targets = held_out_batch(tok)
    heads = head_targets(targets, 3)
    for k in range(1, 4):
        n, t = (heads[k - 1] != IGNORE).nonzero(as_tuple=True)
        assert len(n) > 0 and torch.equal(heads[k - 1][n, t], x[n, t + 1 + k]) and response[n, t + 1 + k].all()
        assert (heads[k - 1] != IGNORE).sum() == response[:, 1 + k:].sum()  # every response token a target


def test_loss_is_the_weighted_sum_of_the_heads_mean_cross_entropies(tok, trained):
    medusa = random_heads(trained, 3)
    x, response, targets = held_out_batch(tok)
    loss, per_head = medusa_loss(medusa, x, targets, 3)
    N, L = x.shape
    with torch.no_grad():  # plain: every head's logits at every position
        h = trained.hidden(x, torch.arange(L).expand(N, L), causal_mask(L))  # (N, L, C)
        logits = medusa.head_logits(h)  # (N, L, K, V)
    want = []
    for k in range(1, 4):  # head k at t: x_{t+1+k} where that is a response token
        t = torch.where(response[:, 1 + k:], x[:, 1 + k:], IGNORE)  # (N, L-1-k) for t = 0 .. L-2-k
        want.append(F.cross_entropy(logits[:, :L - 1 - k, k - 1].flatten(0, 1), t.flatten()))
    torch.testing.assert_close(per_head, torch.stack(want))
    torch.testing.assert_close(loss, 0.8 * want[0] + 0.64 * want[1] + 0.512 * want[2])


def test_training_lowers_every_head_loss_and_leaves_the_base(tok, trained, zero_heads, medusa):
    x, _, targets = held_out_batch(tok)
    with torch.no_grad():
        before = medusa_loss(zero_heads, x, targets, 3)[1]
        after = medusa_loss(medusa, x, targets, 3)[1]
    assert (after < before - 0.3).all(), (before, after)  # measured 5.2 5.2 4.6 -> 1.8 2.0 2.1
    assert all(torch.equal(p, q) for p, q in zip(medusa.base.state_dict().values(), trained.state_dict().values()))


# -------------------------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("policy", POLICIES)
def test_verified_heads_are_greedy_ar_and_follow_the_reference(policy):
    kept = False
    for model, prompts in ((random_model(), PROMPTS), (small_vocab_model(), SMALL_PROMPTS)):
        free = batch_ar(model, prompts, 30)
        stop = {free.rows[0].tokens[3]}  # rows stop at different steps, some inside a drafted span
        ar = batch_ar(model, prompts, 30, stop)
        for n_heads in (1, 3):
            medusa = random_heads(model, n_heads, seed=n_heads)
            out = decode(medusa, prompts, 30, MedusaHeads(medusa), stop, policy)
            assert tokens(out) == tokens(ar)
            assert all(sum(r.spans, []) == r.tokens and all(1 <= len(s) <= n_heads + 1 for s in r.spans)
                       for r in out.rows)
            for prompt, row in zip(prompts, out.rows):  # batched == alone, span for span
                assert spans(decode(medusa, [prompt], 30, MedusaHeads(medusa), stop, policy)) == [row.spans]
            nonstop = decode(medusa, prompts, 30, MedusaHeads(medusa), (), policy)
            assert spans(nonstop) == [reference_heads(medusa, p, 30) for p in prompts]
            kept |= any(len(s) > 1 for r in out.rows for s in r.spans)
    assert kept  # the small-vocabulary model's random heads are right at times


def test_trained_heads_keep_drafts_and_stay_exact(tok, zero_heads, medusa):
    """Measured (7 held-out prompts and "Hi", 48 tokens): 1.47 tokens/forward (1 for AR), every head's
    token kept at times; the zero heads they started from (each repeats the base's next token) 1.10."""
    prompts = held_out_prompts(tok, greeting=True)
    ar = batch_ar(medusa.base, prompts, 48, tok.stop_ids)
    out = {p: decode(medusa, prompts, 48, MedusaHeads(medusa), tok.stop_ids, p) for p in POLICIES}
    assert tokens(out["request"]) == tokens(ar)
    assert spans(out["none"]) == spans(out["request"]) == spans(out["block"])  # cached == uncached
    for prompt, row in zip(prompts[:3], out["request"].rows):
        assert spans(decode(medusa, [prompt], 48, MedusaHeads(medusa), tok.stop_ids)) == [row.spans]
        assert row.spans == reference_heads(medusa, prompt, len(row.tokens))  # cut where the stop token cut
    assert out["request"].tokens_per_forward > 1.35
    assert max(len(s) for r in out["request"].rows for s in r.spans) == 4  # all three heads' drafts kept
    assert decode(zero_heads, prompts, 48, MedusaHeads(zero_heads), tok.stop_ids).tokens_per_forward < \
        out["request"].tokens_per_forward - 0.2


@pytest.mark.parametrize("policy", POLICIES)
def test_the_gate_at_tau_1_is_greedy_ar(tok, medusa, policy):
    for model, prompts, stop in ((random_heads(random_model(), 3), PROMPTS, ()),
                                 (medusa, held_out_prompts(tok), tok.stop_ids)):
        out = decode(model, prompts, 40, MedusaGate(model, 1.0), stop, policy)
        assert tokens(out) == tokens(batch_ar(model.base, prompts, 40, stop))
        assert all(len(s) == 1 for r in out.rows for s in r.spans)


def test_the_gate_below_1_follows_its_reference_and_accepts_unverified_tokens(tok, medusa):
    prompts = held_out_prompts(tok)
    for tau in (0.5, 0.9):
        out = {p: decode(medusa, prompts, 40, MedusaGate(medusa, tau), (), p) for p in POLICIES}
        assert spans(out["none"]) == spans(out["request"]) == spans(out["block"])
        assert spans(out["request"]) == [reference_gate(medusa, p, 40, tau) for p in prompts]
        for prompt, row in zip(prompts[:3], out["request"].rows):
            assert spans(decode(medusa, [prompt], 40, MedusaGate(medusa, tau))) == [row.spans]
        assert out["request"].tokens_per_forward > 1.3  # measured: 3.37 at tau 0.5, 1.85 at 0.9


def test_bad_inputs_give_clear_errors(tmp_path):
    base = random_model()
    medusa = random_heads(base, 2)
    with pytest.raises(ValueError, match="run the engine on that Medusa"):
        Engine(base, [[1, 2]], 4, MedusaHeads(medusa))
    with pytest.raises(ValueError, match="run the engine on that Medusa"):
        Engine(random_heads(base, 2), [[1, 2]], 4, MedusaGate(medusa))
    with pytest.raises(ValueError, match="need n_heads >= 1"):
        Medusa(base, 0)
    with pytest.raises(ValueError, match="tau must be in"):
        MedusaGate(medusa, 1.5)
    with pytest.raises(ValueError, match="exceeds the model context"):  # the draft needs context room
        Engine(medusa, [[1] * 126], 2, MedusaHeads(medusa))
    save_checkpoint(tmp_path / "ar.pt", base, None, 1, {})
    with pytest.raises(ValueError, match="holds no Medusa heads"):
        load_medusa(tmp_path / "ar.pt")
    (tmp_path / "junk.pt").write_text("junk")
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        load_medusa(tmp_path / "junk.pt")
    with pytest.raises(FileNotFoundError, match="train the heads first"):
        load_medusa(tmp_path / "none.pt")


def test_save_and_load_round_trip(tmp_path, medusa):
    save_checkpoint(tmp_path / "medusa.pt", medusa, None, 150, {"stage": "medusa"})
    loaded, tok, ckpt = load_medusa(tmp_path / "medusa.pt")
    assert ckpt["step"] == 150 and loaded.n_heads == 3 and not loaded.training
    want = medusa.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items()) and set(want) == set(loaded.state_dict())
    assert loaded.base.lm_head.weight is loaded.base.embed.weight  # still tied
    prompts = held_out_prompts(tok)[:3]
    assert spans(decode(loaded, prompts, 30, MedusaHeads(loaded))) == spans(decode(medusa, prompts, 30, MedusaHeads(medusa)))


# --------------------------------------------------------------------------------------------- train.py
@pytest.mark.slow
def test_train_py_stage_medusa(tmp_path):
    """train.py --stage medusa from a stage-1 checkpoint: the heads move, the base is ar.pt's bit for bit,
    the run resumes; bad flags are one error line."""
    out = str(tmp_path)
    run_train(["--stage", "ar", "--max_iters", "2", "--out_dir", out, *TINY])
    log = run_train(["--stage", "medusa", "--max_iters", "3", "--out_dir", out, *TINY])
    assert log.splitlines()[0].startswith(f"stage medusa: Medusa-1, 3 heads on the frozen base") and "head3" in log
    medusa, _, ckpt = load_medusa(f"{out}/medusa.pt")
    ar = torch.load(f"{out}/ar.pt", weights_only=True)["model"]
    assert ckpt["step"] == 3 and ckpt["args"]["init_from"] is None  # the default: out_dir/ar.pt
    assert all(torch.equal(v, ar[k]) for k, v in medusa.base.state_dict().items())
    assert all(w.weight.abs().sum() > 0 for w in medusa.heads)  # they trained from zero
    assert medusa.extra_params() == 3 * (32 * 32 + 32)
    run_train(["--stage", "medusa", "--max_iters", "5", "--resume", "--out_dir", out, *TINY])
    assert load_medusa(f"{out}/medusa.pt")[2]["step"] == 5
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for flags, error in ((["--block_size", "1"], "need --block_size >= 2 or --medusa_heads"),
                         (["--fsdp"], "without --fsdp"),
                         (["--resume", "--medusa_heads", "2"], "has 3 heads, this run trains 2"),
                         (["--resume", "--block_size", "3"], "resume with --medusa_heads 3")):
        proc = subprocess.run([sys.executable, "train.py", "--stage", "medusa", "--out_dir", out, *TINY, *flags],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and error in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_sampled_heads_have_ar_distribution_and_wrong_rules_fail(monkeypatch):
    """MedusaHeads sampled: the draft drawn from the heads' distributions, verified by the rule prompt
    lookup and the draft model share (decode.verify_draft), so the first K tokens of N_SAMPLES rows follow
    the base's exact AR sampling law (the chi-square test of test_lossless.py). Measured p-values at
    temperature 0.5: 0.75 (random heads), 0.48 (zero heads); the wrong rules < 1e-6."""
    import nanomars.compare.speculative as speculative_module
    model = small_vocab_model()
    medusa, expected = random_heads(model, 3), exact_ar_distribution(model, [1, 2, 3], 0.5, None)

    def run():
        return decode(medusa, [[1, 2, 3]] * N_SAMPLES, K, MedusaHeads(medusa, temperature=0.5, seed=0))

    out = run()
    assert chi_square_pvalue(out, expected) > 1e-3
    assert out.tokens_per_forward > 1.2  # drafts were kept, not only rejected
    for rule in (keep_every_draft, replace_from_p):
        monkeypatch.setattr(speculative_module, "verify_draft", rule)
        assert chi_square_pvalue(run(), expected) < 1e-6
    monkeypatch.undo()
