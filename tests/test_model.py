import torch

from conftest import random_model
from nanomars.masks import causal_mask, decode_mask, mars_train_mask
from nanomars.model import Config, KVCache

import pytest


def forward_causal(model, idx):
    B, T = idx.shape
    return model(idx, torch.arange(T).expand(B, T), causal_mask(T))


def test_sdpa_and_manual_attention_agree():
    model = random_model()
    idx = torch.randint(0, 97, (2, 24))
    pos = torch.arange(12).repeat(2).expand(2, 24)
    for mask in (causal_mask(24), mars_train_mask(12, 4)):
        model.set_attention(True)
        a = model(idx, pos, mask)
        model.set_attention(False)
        b = model(idx, pos, mask)
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_cached_forward_equals_full_forward():
    model = random_model(n_kv_head=1)
    idx = torch.randint(0, 97, (2, 20))
    full = forward_causal(model, idx)
    cache = KVCache(model.config, 2, 32, "cpu", torch.float32)
    outs = []
    for a, b in [(0, 7), (7, 8), (8, 15), (15, 20)]:  # prefill, then steps of 1 and several tokens
        start = cache.lengths.clone()
        slots = start[:, None] + torch.arange(b - a)[None]
        outs.append(model(idx[:, a:b], slots, decode_mask(start, b - a, b), cache, slots))
        cache.lengths += b - a
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)


def test_later_tokens_never_change_earlier_outputs():
    model = random_model()
    idx = torch.randint(0, 97, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 97
    a, b = forward_causal(model, idx), forward_causal(model, changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_position_ids_drive_rope():
    # the same tokens at shifted positions give different outputs (RoPE is relative, so a shift of the
    # whole sequence does not change them; a shift of one token relative to the others does)
    model = random_model()
    idx = torch.randint(0, 97, (1, 8))
    pos = torch.arange(8)[None]
    mask = causal_mask(8)
    assert torch.allclose(model(idx, pos, mask), model(idx, pos + 5, mask), atol=1e-4)
    moved = pos.clone()
    moved[0, -1] += 3
    assert not torch.allclose(model(idx, pos, mask)[0, -1], model(idx, moved, mask)[0, -1], atol=1e-4)


def test_tied_embeddings_share_one_tensor():
    tied, untied = random_model(), random_model(tie_embeddings=False)
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    assert untied.num_params() - tied.num_params() == 97 * 32


def test_bad_config_errors():
    with pytest.raises(ValueError, match="unknown config field"):
        Config.from_dict({"n_layer": 2, "n_layers": 3})
    with pytest.raises(ValueError, match="n_head % n_kv_head"):
        Config(n_head=4, n_kv_head=3)


def test_activation_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        model = random_model().train()
        model.grad_checkpointing = checkpointing
        idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
        forward_causal(model, idx).logsumexp(-1).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_rope_frequencies_stay_float32_after_a_dtype_cast():
    model = random_model()
    ref = model.inv_freq.clone()
    model.to(torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16  # the weights were cast ...
    assert model.inv_freq.dtype == torch.float32 and torch.equal(model.inv_freq, ref)  # ... the angles were not
    model.half().float()
    assert torch.equal(model.inv_freq, ref)


def test_optimizer_decays_matrices_only():
    model = random_model(tie_embeddings=False)
    decay, no_decay = model.configure_optimizer(lr=1e-3, weight_decay=0.1).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
