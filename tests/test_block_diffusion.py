"""The paper's block-diffusion baseline: its loss scores no output on a token that output can see, its
normalisations and 1/t weights are the released ones, and the sampler feeds what training shows."""
import pytest
import torch
import torch.nn.functional as F

from conftest import random_model
from nanomars.compare.block_diffusion import (EPS, bd3lm_mask, block_diffusion_decode, block_diffusion_loss,
                                              block_diffusion_mask, diffusion_times)
from nanomars.dual_track import IGNORE, collate, dual_track_loss

B, MASK = 4, 259


def batch(vocab=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    examples = []
    for n_prompt, n_reply in ((3, 6), (5, 9), (2, 4)):
        ids = torch.randint(0, vocab, (n_prompt + n_reply,), generator=g).tolist()
        examples.append((ids, [0] * n_prompt + [1] * n_reply))
    return collate(examples, B, eos_id=1)


def test_the_loss_never_scores_a_token_its_output_can_see():
    """Replace every hidden token by another id (targets unchanged): if any scored output could read a
    hidden token, through either stream, the loss would change."""
    model = random_model(vocab_size=300)
    x, response, targets = batch()
    loss = block_diffusion_loss(model, x, response, targets, B, MASK, torch.Generator().manual_seed(3))[0]
    g = torch.Generator().manual_seed(3)  # the same draws as inside the loss
    t = EPS + (1 - EPS) * torch.rand(x.shape[0], generator=g)
    hidden = response & (torch.rand(x.shape, generator=g) < t[:, None])
    assert hidden.any() and (response & ~hidden).any()  # some hidden, some not: a real test
    x2 = torch.where(hidden, (x + 7) % 200, x)
    loss2 = block_diffusion_loss(model, x2, response, targets, B, MASK, torch.Generator().manual_seed(3))[0]
    assert torch.allclose(loss, loss2, atol=1e-6)
    x3 = torch.where(response & ~hidden, (x + 7) % 200, x)  # a visible response token does matter
    loss3 = block_diffusion_loss(model, x3, response, targets, B, MASK, torch.Generator().manual_seed(3))[0]
    assert not torch.allclose(loss, loss3, atol=1e-4)


@pytest.mark.parametrize("norm", ["sequence", "token"])
def test_weights_and_normalisation_are_the_released_ones(norm):
    model = random_model(vocab_size=300)
    x, response, targets = batch()
    N, L = x.shape
    loss = block_diffusion_loss(model, x, response, targets, B, MASK, torch.Generator().manual_seed(5),
                                loss_norm=norm)[0]
    g = torch.Generator().manual_seed(5)
    t = EPS + (1 - EPS) * torch.rand(N, generator=g)
    hidden = response & (torch.rand(x.shape, generator=g) < t[:, None])
    noisy = torch.where(hidden, MASK, x)
    pos = torch.arange(L).repeat(2)[None].expand(N, -1)
    logits = model(torch.cat([x, noisy], 1), pos, bd3lm_mask(L, B))[:, L:]
    total, per_seq = 0.0, []
    for n in range(N):
        terms = [F.cross_entropy(logits[n, p], targets[n, p]) / t[n] for p in range(L - 1)
                 if targets[n, p] != IGNORE and hidden[n, p + 1]]
        per_seq.append(sum(terms) / (targets[n] != IGNORE).sum())
        total = total + sum(terms)
    want = sum(per_seq) / N if norm == "sequence" else total / (targets != IGNORE).sum()
    assert torch.allclose(loss, want, rtol=1e-5)


def test_decoding_feeds_what_training_shows():
    """The sampler's output for a target equals the training forward's noisy output there, when the same
    tokens are hidden: decode a few tokens, then check every forward's first choice against training."""
    torch.manual_seed(0)
    model = random_model(vocab_size=300)
    prompt = [5, 6, 7, 8, 9, 10]  # c = 6: block k = 1 (positions 4..7), targets 6..8
    out = block_diffusion_decode(model, prompt, 3, MASK, B, tau=1.0)
    assert len(out.tokens) == 3 and out.tokens_per_forward == 1.0
    seq = prompt + out.tokens  # 9 tokens; the training input with positions 6, 7 hidden (8 is the target)
    L = 8
    noisy = seq[:6] + [MASK, MASK]
    logits = model(torch.tensor([seq[:8] + noisy]), torch.arange(L).repeat(2)[None], bd3lm_mask(L, B))[0, L:]
    p, y = logits[5:8].softmax(-1).max(-1)  # outputs at 5, 6, 7 predict 6, 7, 8
    first = int(p.argmax())  # the first forward fills the most confident target
    assert out.spans[0] == [int(y[first])] and seq[6 + first] == int(y[first])


def test_lower_tau_fills_several_per_forward_and_stops():
    torch.manual_seed(0)
    model = random_model(vocab_size=300)
    out = block_diffusion_decode(model, [5, 6, 7], 12, MASK, B, tau=1e-6)  # everything passes
    assert out.tokens_per_forward > 1.0
    stop = out.tokens[2]
    cut = block_diffusion_decode(model, [5, 6, 7], 12, MASK, B, tau=1e-6, stop_ids={stop})
    assert cut.tokens == out.tokens[:out.tokens.index(stop) + 1]


def test_a_batch_with_nothing_hidden_still_backpropagates():
    model = random_model(vocab_size=300).train()
    x, response, targets = batch()
    loss, _ = block_diffusion_loss(model, x, response & False, targets, B, MASK, torch.Generator().manual_seed(0))
    loss.backward()
    assert loss.item() == 0.0


def test_block_diffusion_mask_changes_the_noisy_loss_only():
    """--objective csbd: MARS's loss under block_diffusion_mask. Only the noisy stream's mask differs."""
    model = random_model(vocab_size=300)
    x, response, targets = collate([([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 1, 1, 1, 1])], 4, 90)
    _, n1, c1 = dual_track_loss(model, x, response, targets, 4, MASK)
    _, n2, c2 = dual_track_loss(model, x, response, targets, 4, MASK, make_mask=block_diffusion_mask)
    assert torch.allclose(c1, c2) and not torch.allclose(n1, n2)


def test_diffusion_times_are_the_released_ones():
    t = diffusion_times(100000, torch.Generator().manual_seed(0))
    assert t.min() >= 1e-3 and t.max() < 1
    assert abs((1 / t).mean() - 6.9) < 0.3  # E[1/t] = ln(1/eps) / (1 - eps) = 6.91: heavy-tailed weights
