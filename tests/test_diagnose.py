import torch

from conftest import random_model
from nanomars.decode import ar_decode, gate, n_accepted, propose
from nanomars.compare.diagnose import format_gate_errors, gate_errors
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


def copy_model(mask_as, logit=3.0):
    """Vocabulary of 8 (id 7 is the mask): every output predicts the token fed at its position, the mask
    standing for token `mask_as`, with probability e^3 / (e^3 + 7) = 0.74 (one-hot embeddings, attention
    and MLP outputs zeroed, so the residual stream is the embedding alone). Greedy AR repeats the prompt's
    last token for ever, and every mask proposes `mask_as`."""
    model = random_model(vocab_size=8, tie_embeddings=False)
    C = model.config.n_embd
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
        model.embed.weight.copy_(torch.eye(8, C))
        model.embed.weight[7] = torch.eye(8, C)[mask_as]
        model.lm_head.weight.copy_(torch.eye(8, C) * logit / C ** 0.5)  # the final norm scales e_x by sqrt(C)
        model.lm_head.weight[7] = 0
    return model


def test_gate_errors_on_a_constructed_case():
    """Three prompts of 3 tokens, 6 new tokens, B = 4: AR's answers are 2 2 2 2 2 2, 6 6 6 6 6 6 and
    5 5 5 5 5 5; every mask proposes 2 with p = 0.74. Windows start at c = 3..8 (c mod B = 3, 0, 1, 2, 3, 0)
    and proposal j is counted where c + j < 9, so per prompt, by [c mod B, j]: c = 4 and 5 give j = 1, 2, 3;
    c = 6 gives j = 1, 2; c = 3 and 7 give j = 1, 2, 3 and j = 1; c = 8 gives nothing. At tau 0.5 all
    pass; those of the first prompt are right, the others' wrong. At tau 0.8 none pass."""
    model, B = copy_model(mask_as=2), 4
    prompts = [[1, 5, 2], [4, 3, 6], [0, 1, 5]]
    per_prompt = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 0], [0, 2, 1, 1]])
    counts = gate_errors(model, prompts, 7, B, 0.5, max_new_tokens=6)
    assert counts["windows"].tolist() == [6, 3, 3, 6]
    assert torch.equal(counts["passed"], 3 * per_prompt) and torch.equal(counts["wrong"], 2 * per_prompt)
    table = format_gate_errors(counts).splitlines()
    assert table[4].split() == ["3", "6", "4/6", "2/3", "2/3", "8/12", "66.7%"]  # c mod B = 3
    strict = gate_errors(model, prompts, 7, B, 0.8, max_new_tokens=6)
    assert strict["passed"].sum() == 0 and torch.equal(strict["windows"], counts["windows"])


def test_tau_one_passes_nothing():
    counts = gate_errors(random_model(vocab_size=16), [[1, 2, 3]], MASK, 4, 1.0, max_new_tokens=8)
    assert counts["passed"].sum() == 0 and counts["wrong"].sum() == 0
