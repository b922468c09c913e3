import math

import pytest
import torch

from conftest import random_model
from nanomars.dual_track import IGNORE, ar_loss, collate, dual_track_loss
from nanomars.masks import causal_mask

EOS, MASK = 90, 96


def test_collate_pads_with_eos_targets_to_a_block_multiple():
    # prompt 3 tokens, response 3 tokens (loss 1) -> padded with 2 EOS (targets) to length 8 = 2 blocks
    x, response, targets = collate([([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1]), ([7, 8, 9, 10], [0, 0, 1, 1])],
                                   4, EOS)
    assert x.tolist() == [[1, 2, 3, 4, 5, 6, EOS, EOS], [7, 8, 9, 10, EOS, EOS, EOS, EOS]]
    assert response.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0, 0]]
    I = IGNORE
    assert targets.tolist() == [[I, I, 4, 5, 6, EOS, EOS, I], [I, 9, 10, I, I, I, I, I]]


def hand_loss(model, x, response, targets, B, alpha):
    """The dual-track loss computed the slow way: every prediction is an ordinary causal forward over the
    context that prediction is allowed to see, exactly as the decoder will present it."""
    L = x.shape[1]
    clean_terms, noisy_terms = [], []
    for row in range(x.shape[0]):
        for t in range(L):
            y = int(targets[row, t])
            if y == IGNORE:
                continue
            # clean: x_0..x_t, causal
            ctx = x[row, :t + 1]
            logp = model(ctx[None], torch.arange(t + 1)[None], causal_mask(t + 1))[0, -1].log_softmax(-1)
            clean_terms.append(-logp[y])
            # noisy: clean x_0..x_{kB-1}, then the noisy tokens kB..t (masks where response)
            k0 = (t // B) * B
            noisy_part = torch.where(response[row, k0:t + 1], MASK, x[row, k0:t + 1])
            ctx = torch.cat([x[row, :k0], noisy_part])
            logp = model(ctx[None], torch.arange(t + 1)[None], causal_mask(t + 1))[0, -1].log_softmax(-1)
            noisy_terms.append(-logp[y])
    noisy = torch.stack(noisy_terms).mean()
    clean = torch.stack(clean_terms).mean()
    return noisy + alpha * clean, noisy, clean


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.5])
def test_dual_track_loss_equals_hand_computed(alpha):
    model = random_model()
    x, response, targets = collate([([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 1, 1, 1, 1]),
                                    ([11, 12, 13, 14, 15, 16, 17, 18, 19], [0, 0, 0, 0, 0, 1, 1, 1, 1])], 4, EOS)
    loss, noisy, clean = dual_track_loss(model, x, response, targets, 4, MASK, alpha)
    want, want_noisy, want_clean = hand_loss(model, x, response, targets, 4, alpha)
    assert torch.allclose(noisy, want_noisy, atol=1e-5)
    assert torch.allclose(clean, want_clean, atol=1e-5)
    assert torch.allclose(loss, want, atol=1e-5)


def test_clean_stream_loss_is_the_ar_loss():
    model = random_model()
    x, response, targets = collate([([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1])], 4, EOS)
    _, _, clean = dual_track_loss(model, x, response, targets, 4, MASK)
    assert torch.allclose(clean, ar_loss(model, x, targets), atol=1e-5)


def test_uniform_model_gives_log_vocab():
    # a model with all-zero weights predicts uniformly: every CE term is exactly log(V)
    model = random_model()
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    x, response, targets = collate([([1, 2, 3, 4, 5], [0, 0, 1, 1, 1])], 4, EOS)
    loss, noisy, clean = dual_track_loss(model, x, response, targets, 4, MASK, alpha=1.0)
    assert math.isclose(noisy.item(), math.log(97), rel_tol=1e-6)
    assert math.isclose(loss.item(), 2 * math.log(97), rel_tol=1e-6)


def test_block_diffusion_mask_changes_the_noisy_loss_only():
    model = random_model()
    x, response, targets = collate([([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 1, 1, 1, 1])], 4, EOS)
    _, n1, c1 = dual_track_loss(model, x, response, targets, 4, MASK)
    _, n2, c2 = dual_track_loss(model, x, response, targets, 4, MASK, bidirectional=True)
    assert torch.allclose(c1, c2) and not torch.allclose(n1, n2)


def test_length_not_multiple_of_block_is_an_error():
    with pytest.raises(ValueError, match="multiple of block_size"):
        dual_track_loss(random_model(), torch.zeros(1, 6, dtype=torch.long), torch.zeros(1, 6, dtype=torch.bool),
                        torch.zeros(1, 6, dtype=torch.long), 4, MASK)
