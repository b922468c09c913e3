import pytest
import torch
import torch.nn.functional as F

from conftest import random_model
from nanomars.masks import causal_mask, decode_mask, mars_train_mask
from nanomars.model import Config, KVCache, chunked_cross_entropy


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


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])  # 4 query heads: MQA, GQA, plain multi-head
def test_grouped_query_sdpa_equals_the_plain_path(n_kv_head):
    """The SDPA path stacks each kv head's query heads along the query axis (no enable_gqa, no K/V copy);
    the plain path repeats K/V per query head. In float32 they agree for every mask shape and the cache."""
    model = random_model(n_kv_head=n_kv_head)
    L = 10
    idx = torch.randint(0, 97, (3, 2 * L), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(L).repeat(2).expand(3, 2 * L)
    masks = (causal_mask(2 * L), mars_train_mask(L, 4), mars_train_mask(L, 4, offset=torch.tensor([0, 1, 3])))
    for mask in masks:  # (T, S) shared, and (N, T, S) per row
        outs = []
        for use_sdpa in (True, False):
            model.set_attention(use_sdpa)
            outs.append(model(idx, pos, mask))
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    outs = []  # a cached decode step: per-row cache lengths, a few new tokens each
    for use_sdpa in (True, False):
        model.set_attention(use_sdpa)
        cache = KVCache(model.config, 3, 32, "cpu", torch.float32)
        start = torch.zeros(3, dtype=torch.long)
        slots = start[:, None] + torch.arange(12)
        model(idx[:, :12], slots, decode_mask(start, 12, 12), cache, slots)
        cache.lengths += torch.tensor([12, 9, 5])
        start = cache.lengths.clone()
        slots = start[:, None] + torch.arange(4)
        outs.append(model(idx[:, 12:16], slots, decode_mask(start, 4, 16), cache, slots))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_keep_computes_only_the_selected_logits():
    model = random_model()
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    pos, mask = torch.arange(12).expand(2, 12), causal_mask(12)
    full = model(idx, pos, mask)  # (N, T, V)
    close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # noqa: E731
    close(model(idx, pos, mask, keep=slice(9, None)), full[:, 9:])  # a slice: (N, k, V)
    close(model(idx, pos, mask, keep=torch.tensor([0, 5])), full[:, [0, 5]])  # 1-D positions: (N, k, V)
    cols = torch.tensor([[3, 4, 4], [0, 11, 7]])  # per-row positions (N, k): (N, k, V)
    close(model(idx, pos, mask, keep=cols), full.gather(1, cols[..., None].expand(-1, -1, 97)))
    sel = torch.rand(2, 12, generator=torch.Generator().manual_seed(3)) < 0.5  # (N, T) bool: (K, V)
    close(model(idx, pos, mask, keep=sel), full[sel])
    targets = torch.randint(0, 97, (int(sel.sum()),))  # with targets: the per-output cross-entropies
    close(model(idx, pos, mask, keep=sel, targets=targets), F.cross_entropy(full[sel], targets, reduction="none"))


@pytest.mark.parametrize("rows", [1, 3, 7, 100])  # one row a chunk, ragged last chunk, one chunk
def test_chunked_cross_entropy_equals_the_plain_one_with_gradients(rows):
    g = torch.Generator().manual_seed(4)
    h0, w0 = torch.randn(20, 16, generator=g), torch.randn(50, 16, generator=g)
    targets = torch.randint(0, 50, (20,), generator=g)
    results = []
    for chunked in (True, False):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        ce = chunked_cross_entropy(h, w, targets, chunk=rows * 50) if chunked else \
            F.cross_entropy(h @ w.T, targets, reduction="none")
        (ce * torch.linspace(0.5, 2, 20)).sum().backward()  # weighted: each term's gradient counts
        results.append((ce.detach(), h.grad, w.grad))
    for a, b in zip(*results):  # values of order 1: a 1e-5 tolerance is float32 rounding, summed in another order
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert chunked_cross_entropy(h0[:0], w0, targets[:0]).shape == (0,)  # no targets: no losses


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
