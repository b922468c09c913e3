"""Why tokens/forward falls with B, and the competent pilot: train.py's --no-pad_targets, b_sweep's teacher-forced proposals and decision rules,
and competent's pass rule, on constructed data with known answers."""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import b_sweep, competent  # noqa: E402
from nanomars.batch_decode import batch_ar  # noqa: E402
from nanomars.dual_track import IGNORE, collate  # noqa: E402
from nanomars.model import Config, Decoder  # noqa: E402
from nanomars.util.train_args import parse_args  # noqa: E402

E = 0


@pytest.mark.parametrize("offsets", [None, torch.tensor([1, 2])])
def test_pads_are_targets_only_with_pad_targets(offsets):
    # prompt 3 tokens, reply 3 (its last one the stop token): the last block is filled with EOS pads
    examples = [([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1]), ([1, 2, 3, 4, 5], [0, 0, 0, 1, 1])]
    x_on, resp_on, tgt_on = collate(examples, 4, E, offsets=offsets)
    x_off, resp_off, tgt_off = collate(examples, 4, E, offsets=offsets, pad_targets=False)
    assert torch.equal(x_on, x_off)  # the same blocks: the pads are there either way
    for n, (ids, mask) in enumerate(examples):
        pads = slice(len(ids), x_on.shape[1])
        assert (tgt_off[n, len(ids) - 1:] == IGNORE).all()  # nothing is trained to predict a pad
        assert not resp_off[n, pads].any()  # and the noisy stream does not hide them
        assert tgt_off[n, len(ids) - 2] == ids[-1]  # the reply's own stop token is still a target
        r = 0 if offsets is None else int(offsets[n])
        n_pad = -(len(ids) + r) % 4
        assert n_pad > 0 and (tgt_on[n, len(ids) - 1:len(ids) - 1 + n_pad] == E).all()  # pads on: targets
        assert torch.equal(tgt_on[n, :len(ids) - 1], tgt_off[n, :len(ids) - 1])  # the rest unchanged


def test_pad_targets_flag():
    assert parse_args([]).pad_targets is True
    assert parse_args(["--stage", "mars", "--no-pad_targets"]).pad_targets is False


@torch.no_grad()
def test_teacher_forced_proposals_along_the_greedy_output():
    torch.manual_seed(0)
    model = Decoder(Config(vocab_size=50, n_layer=1, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64,
                           max_seq_len=64))
    model.init_weights()
    model.eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    greedy = [list(r.tokens) for r in batch_ar(model, prompts, 9).rows]
    B = 4
    tf = b_sweep.teacher_forced(model, prompts, greedy, 49, B, (0.0, 1.1), batch=5)
    for i, y in enumerate(greedy):
        assert tf["n"][i] == [max(0, len(y) - d + 1) for d in range(1, B + 1)]  # every target that exists
        assert tf["agree"][i][0] == tf["n"][i][0]  # distance 1 is the greedy token itself
        assert tf["0"]["pass"][i] == tf["n"][i] and tf["1.1"]["pass"][i] == [0] * B
    # a distance-2 proposal is the first mask's output after prompt + y[:p]
    y = greedy[0]
    x = torch.tensor([prompts[0] + y[:2] + [49]])
    logits = model(x, torch.arange(x.shape[1])[None], torch.ones(x.shape[1], x.shape[1]).tril().bool())
    assert tf["agree"][0][1] >= int(logits[0, -1].argmax() == y[3])


def runs(tpf, share, seeds=(1, 2, 3), P=60, window4=None):
    """Constructed results: tpf {(cond, row): tokens per forward}, share {(cond, row): pass share at d 1..4}."""
    rng = np.random.default_rng(0)
    out = []
    for (cond, row), r in tpf.items():
        for s in seeds:
            forwards = rng.integers(8, 12, P)
            tokens = np.round(forwards * (r + rng.normal(0, 0.02, P))).astype(int)
            sweep = {"0.95": {"tokens": tokens.tolist(), "forwards": forwards.tolist()}}
            n = np.full((P, 4), 20)
            passed = np.stack([round(20 * share[cond, row][d]) + np.arange(P) % 3 - 1 for d in range(4)], 1)  # exact shares
            rec = {"condition": cond, "row": row, "seed": s, "sweep": sweep,
                   "ar": {"right": "".join(rng.choice(["0", "1"], P))},
                   "teacher_forced": {"n": n.tolist(), "agree": n.tolist(), "0.95": {"pass": passed.tolist()}}}
            if window4 and (cond, row) in window4:
                w = window4[cond, row]
                rec["window4"] = {"0.95": {"tokens": np.round(forwards * w).astype(int).tolist(),
                                           "forwards": forwards.tolist()}}
            out.append(rec)
    return out


def test_decision_rules_on_constructed_results():
    tpf = {("D1", "mars_B4"): 2.0, ("D1", "mars_B16"): 1.6, ("D1", "mars_B4_nopad"): 2.0,
           ("D1", "mars_B16_nopad"): 1.6, ("D3", "mars_B4"): 2.0, ("D3", "mars_B16"): 2.4}
    low, high = [0.5, 0.3, 0.3, 0.3], [0.5, 0.5, 0.5, 0.5]
    share = {k: (low if k == ("D1", "mars_B16") or k == ("D1", "mars_B16_nopad") else high) for k in tpf}
    got = b_sweep.decide(runs(tpf, share, window4={("D1", "mars_B16"): 1.65}))
    assert got["direction"]["answer"] == "flips between D1 and D3" and not got["direction"]["preliminary"]
    assert got["direction"]["labels"] == {"D1": "falls", "D3": "rises"}
    assert got["model_or_window"]["answer"] == "the weights"
    assert got["per_distance"]["answer"] == "explains it"
    assert got["pads"]["answer"].startswith("closed")
    # the window, not the weights: the B16 model at window 4 matches the B4 model
    got = b_sweep.decide(runs(tpf, share, window4={("D1", "mars_B16"): 2.0}))
    assert got["model_or_window"]["answer"] == "the window"
    # equal confidence at d 2..4: not the per-distance signal; pads out undo the fall: pads explain it
    tpf2 = {**tpf, ("D1", "mars_B16_nopad"): 2.0}
    got = b_sweep.decide(runs(tpf2, {k: high for k in tpf2}, seeds=(1,), window4={("D1", "mars_B16"): 1.6}))
    assert got["per_distance"]["answer"] == "not explained by the per-distance signal"
    assert got["pads"]["answer"] == "pads explain it" and got["pads"]["preliminary"]
    # D1 does not fall
    got = b_sweep.decide(runs({("D1", "mars_B4"): 2.0, ("D1", "mars_B16"): 2.4}, {("D1", "mars_B4"): high,
                                                                                    ("D1", "mars_B16"): high}))
    assert got["direction"]["answer"].startswith("D1 rises")
    # a fall at D1 alone waits for the later conditions; a fall at the last condition has none to wait for
    falls = {("D1", "mars_B4"): 2.0, ("D1", "mars_B16"): 1.6}
    got = b_sweep.decide(runs(falls, {k: high for k in falls}))
    assert got["direction"]["answer"] == "no flip: falls up to D1 (no later condition measured yet)"
    falls = {**falls, ("endless", "mars_B4"): 2.0, ("endless", "mars_B16"): 1.6}
    got = b_sweep.decide(runs(falls, {k: high for k in falls}))
    assert got["direction"]["answer"] == "no flip: falls up to endless"


def pilot_row(name, arithmetic, right, steps=100, step_s=0.5):
    return {"name": name, "steps": steps, "step_seconds": step_s,
            "ar": {"accuracy": {"arithmetic": arithmetic, "all": right.count("1") / len(right)}, "right": right}}


def test_competent_pass_rule():
    P = 400
    constant = {"name": "pilot/constant", "ar": {"accuracy": {"all": 0.15}}}
    good, worse = "1" * 160 + "0" * 240, "1" * 100 + "0" * 300  # 0.40 then 0.25: overfits
    rows = [constant, pilot_row("pilot/4x128/E32", 0.3, good), pilot_row("pilot/4x128/E64", 0.3, worse),
            pilot_row("pilot/6x256/E12", 0.1, good), pilot_row("pilot/6x256/E24", 0.3, good, step_s=2.0),
            pilot_row("pilot/6x256/E48", 0.3, worse, step_s=2.0)]
    got = competent.choose(rows)
    assert got["passed"] and got["candidate"] == "P4"  # P4 and P6 pass; P4 costs less
    assert not got["why"]["P5"]["a"] and not got["why"]["P5"]["c"]  # arithmetic low, 2E not worse
    assert got["why"]["P6"]["a"] and got["why"]["P6"]["b"] and got["why"]["P6"]["c"]
    # nothing overfits: no pass, the closest named
    rows = [constant, pilot_row("pilot/4x128/E32", 0.3, worse), pilot_row("pilot/4x128/E64", 0.3, good)]
    got = competent.choose(rows)
    assert not got["passed"] and got["candidate"] == "P4" and not got["why"]["P4"]["c"]
    assert len(good) == len(worse) == P
