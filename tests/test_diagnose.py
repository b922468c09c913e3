import torch

from conftest import random_model
from nanomars.decode import ar_decode, gate, n_accepted, propose
from nanomars.diagnose import format_gate_errors, gate_errors
from nanomars.masks import causal_mask

MASK = 15


def window_by_window(model, prompts, B, tau, max_new_tokens):
    """The same counts, one uncached forward per window, straight from the definition."""
    passed, wrong = torch.zeros(B, B, dtype=torch.long), torch.zeros(B, B, dtype=torch.long)
    for prompt in prompts:
        seq = prompt + ar_decode(model, prompt, max_new_tokens).tokens
        for c in range(len(prompt), len(seq)):
            x = torch.tensor([seq[:c] + [MASK] * (B - 1)])
            logits = model(x, torch.arange(x.shape[1])[None], causal_mask(x.shape[1]))[0, c - 1:]
            y, p = propose(logits)
            for j in range(1, int(n_accepted(gate(p, y, tau)))):
                if c + j < len(seq):
                    passed[c % B, j] += 1
                    wrong[c % B, j] += int(y[j]) != seq[c + j]
    return passed, wrong


def test_gate_errors_equal_the_window_by_window_count():
    model, B, tau = random_model(seed=1, vocab_size=16), 4, 0.112
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10], [11]]
    counts = gate_errors(model, prompts, MASK, B, tau, max_new_tokens=12)
    passed, wrong = window_by_window(model, prompts, B, tau, 12)
    assert passed.sum() > 0 and wrong.sum() > 0  # some of the random model's guesses pass at tau 0.112, many wrong
    assert torch.equal(counts["passed"], passed) and torch.equal(counts["wrong"], wrong)
    assert counts["windows"].sum() == 3 * 12 and (counts["passed"][:, 0] == 0).all()
    assert "c mod B" in format_gate_errors(counts)


def test_tau_one_passes_nothing():
    counts = gate_errors(random_model(vocab_size=16), [[1, 2, 3]], MASK, 4, 1.0, max_new_tokens=8)
    assert counts["passed"].sum() == 0 and counts["wrong"].sum() == 0
