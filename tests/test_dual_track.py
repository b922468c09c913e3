import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import random_model
from nanomars.util.checkpoint import load_checkpoint
from nanomars.compare.block_diffusion import block_diffusion_mask
from nanomars.dual_track import IGNORE, ar_loss, collate, dual_track_loss, random_offsets
from nanomars.masks import causal_mask, mars_train_mask

EOS, MASK = 90, 96


def test_collate_pads_with_eos_targets_to_a_block_multiple():
    # prompt 3 tokens, response 3 tokens (loss 1) -> padded with 2 EOS (targets) to length 8 = 2 blocks
    x, response, targets = collate([([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1]), ([7, 8, 9, 10], [0, 0, 1, 1])],
                                   4, EOS)
    assert x.tolist() == [[1, 2, 3, 4, 5, 6, EOS, EOS], [7, 8, 9, 10, EOS, EOS, EOS, EOS]]
    assert response.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0, 0]]
    I = IGNORE
    assert targets.tolist() == [[I, I, 4, 5, 6, EOS, EOS, I], [I, 9, 10, I, I, I, I, I]]


def test_collate_with_offsets_completes_each_shifted_last_block():
    # block k of an example with offset r spans kB - r .. kB - r + B - 1: pad until (length + r) % B == 0
    ex = ([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1])
    x, response, targets = collate([ex, ex, ex, ex], 4, EOS, offsets=torch.tensor([0, 1, 2, 3]))
    E, I = EOS, IGNORE
    assert x.tolist() == [[1, 2, 3, 4, 5, 6, E, E, E],   # r 0: 6 + 2 pads = 8, a multiple of 4
                          [1, 2, 3, 4, 5, 6, E, E, E],   # r 1: 6 + 1 = 7, blocks 0-2 3-6; batch padding after
                          [1, 2, 3, 4, 5, 6, E, E, E],   # r 2: 6 + 0 = 6, blocks 0-1 2-5; batch padding after
                          [1, 2, 3, 4, 5, 6, E, E, E]]   # r 3: 6 + 3 = 9, blocks 0 1-4 5-8
    assert response.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 0, 0],
                                 [0, 0, 0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1, 1]]
    assert targets.tolist() == [[I, I, 4, 5, 6, E, E, I, I], [I, I, 4, 5, 6, E, I, I, I],
                                [I, I, 4, 5, 6, I, I, I, I], [I, I, 4, 5, 6, E, E, E, I]]
    # offsets all 0 pad exactly as without offsets
    plain = collate([ex, ([7, 8, 9], [0, 1, 1])], 4, EOS)
    zeros = collate([ex, ([7, 8, 9], [0, 1, 1])], 4, EOS, offsets=torch.zeros(2, dtype=torch.long))
    assert all(torch.equal(a, b) for a, b in zip(plain, zeros))


def test_random_offsets_are_seeded_and_in_range():
    a = random_offsets(1000, 4, torch.Generator().manual_seed(5))
    b = random_offsets(1000, 4, torch.Generator().manual_seed(5))
    assert a.shape == (1000,) and a.dtype == torch.long and torch.equal(a, b)
    assert set(a.tolist()) == {0, 1, 2, 3}
    assert not torch.equal(a, random_offsets(1000, 4, torch.Generator().manual_seed(6)))
    assert set(random_offsets(50, 1, torch.Generator().manual_seed(0)).tolist()) == {0}  # B = 1: nothing to shift


def hand_loss(model, x, response, targets, B, alpha, offsets=None):
    """The dual-track loss computed the slow way: every prediction is an ordinary causal forward over the
    context that prediction is allowed to see, exactly as the decoder will present it. With offset r, the
    block holding t starts at ((t + r) // B) * B - r (at 0 for the first, shorter block)."""
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
            # noisy: clean x_0..x_{k0-1}, then the noisy tokens k0..t (masks where response), k0 = its block start
            r = 0 if offsets is None else int(offsets[row])
            k0 = max(0, ((t + r) // B) * B - r)
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


@pytest.mark.parametrize("offsets", [[1, 1], [3, 3], [2, 0], [1, 3]])
def test_dual_track_loss_with_offsets_equals_hand_computed(offsets):
    model = random_model()
    offsets = torch.tensor(offsets)
    x, response, targets = collate([([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 1, 1, 1, 1]),
                                    ([11, 12, 13, 14, 15, 16, 17, 18, 19], [0, 0, 0, 0, 0, 1, 1, 1, 1])], 4, EOS,
                                   offsets=offsets)
    loss, noisy, clean = dual_track_loss(model, x, response, targets, 4, MASK, 0.5, offsets=offsets)
    want, want_noisy, want_clean = hand_loss(model, x, response, targets, 4, 0.5, offsets)
    assert torch.allclose(noisy, want_noisy, atol=1e-5)
    assert torch.allclose(clean, want_clean, atol=1e-5)
    assert torch.allclose(loss, want, atol=1e-5)


def test_offsets_change_the_noisy_loss_only():
    # same batch (collated as for offset 0), blocks shifted: the clean stream is plain causal, untouched;
    # the noisy stream sees different known contexts
    model = random_model()
    x, response, targets = collate([([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 1, 1, 1, 1]),
                                    ([9, 10, 11, 12], [0, 0, 1, 1])], 4, EOS)
    _, n0, c0 = dual_track_loss(model, x, response, targets, 4, MASK)
    _, z0, d0 = dual_track_loss(model, x, response, targets, 4, MASK, offsets=torch.zeros(2, dtype=torch.long))
    assert torch.equal(n0, z0) and torch.equal(c0, d0)
    for r in (1, 2, 3):
        for make_mask in (mars_train_mask, block_diffusion_mask):
            _, n1, c1 = dual_track_loss(model, x, response, targets, 4, MASK, make_mask=make_mask,
                                        offsets=torch.full((2,), r))
            _, n2, _ = dual_track_loss(model, x, response, targets, 4, MASK, make_mask=make_mask)
            assert torch.allclose(c1, c0, atol=1e-6) and not torch.allclose(n1, n2, atol=1e-4), (r, make_mask)


def test_block_size_one_offsets_are_irrelevant():
    model = random_model()
    examples = [([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 1, 1, 1]), ([8, 9, 10], [0, 1, 1])]
    plain = collate(examples, 1, EOS)
    want = dual_track_loss(model, *plain, 1, MASK)
    for offsets in (random_offsets(2, 1, torch.Generator().manual_seed(0)), torch.tensor([3, 1])):
        batch = collate(examples, 1, EOS, offsets=offsets)
        assert all(torch.equal(a, b) for a, b in zip(batch, plain))
        got = dual_track_loss(model, *batch, 1, MASK, offsets=offsets)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))


def test_offsets_must_be_one_per_example():
    x, response, targets = collate([([1, 2, 3, 4], [0, 0, 1, 1])] * 2, 4, EOS)
    with pytest.raises(ValueError, match="one per example"):
        dual_track_loss(random_model(), x, response, targets, 4, MASK, offsets=torch.zeros(3, dtype=torch.long))


def test_random_offsets_are_the_default_for_dual_track_training_only():
    from nanomars.util.train_args import parse_args
    assert parse_args(["--stage", "mars"]).random_offsets is True
    assert parse_args(["--stage", "mars", "--no-random_offsets"]).random_offsets is False
    assert parse_args(["--stage", "mars", "--objective", "bd3lm"]).random_offsets is False  # one stream: no blocks to shift
    assert parse_args(["--stage", "ar"]).random_offsets is False
    with pytest.raises(SystemExit):
        parse_args(["--stage", "ar", "--random_offsets"])


def test_train_mars_with_random_offsets_end_to_end(tmp_path):
    """train.py --stage mars --random_offsets on a tiny model from scratch: it trains and records the flag.
    (One process: its time is torch's import; offsets come from the batch generator seeded by --seed.)"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ["--stage", "mars", "--init_from", "scratch", "--random_offsets", "--max_iters", "2", "--n_layer", "1",
            "--n_embd", "32", "--n_head", "2", "--n_kv_head", "1", "--intermediate_size", "64", "--batch_size", "4",
            "--n_train", "50", "--eval_interval", "2", "--eval_batches", "1", "--device", "cpu", "--out_dir",
            str(tmp_path)]
    proc = subprocess.run([sys.executable, os.path.join(root, "train.py"), *args], cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "held-out noisy" in proc.stdout
    _, ckpt = load_checkpoint(f"{tmp_path}/mars.pt")
    assert ckpt["step"] == 2 and ckpt["args"]["random_offsets"] is True


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


def test_length_not_multiple_of_block_is_an_error():
    with pytest.raises(ValueError, match="multiple of block_size"):
        dual_track_loss(random_model(), torch.zeros(1, 6, dtype=torch.long), torch.zeros(1, 6, dtype=torch.bool),
                        torch.zeros(1, 6, dtype=torch.long), 4, MASK)


def full_logits_losses(model, x, response, targets, B, offsets=None):
    """The losses as they were computed before model.forward's keep/targets: logits (N, 2L, V) at every
    output, then F.cross_entropy with ignore_index. Returns (ar loss, noisy_ce, clean_ce)."""
    N, L = x.shape
    logits = model(x, torch.arange(L).expand(N, L), causal_mask(L))
    ar = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    inputs = torch.cat([x, torch.where(response, MASK, x)], 1)
    mask = mars_train_mask(L, B, offset=0 if offsets is None else offsets)
    logits = model(inputs, torch.arange(L).repeat(2).expand(N, 2 * L), mask)
    clean = F.cross_entropy(logits[:, :L].flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    noisy = F.cross_entropy(logits[:, L:].flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    return ar, noisy, clean


def training_batch(offsets=None):
    g = torch.Generator().manual_seed(5)
    examples = [(torch.randint(1, 90, (n,), generator=g).tolist(), [0] * p + [1] * (n - p))
                for n, p in ((13, 4), (22, 9), (7, 2))]
    return collate(examples, 4, EOS, offsets=offsets)


@pytest.mark.parametrize("offsets", [None, torch.tensor([1, 3, 0])])
def test_chunked_losses_and_gradients_equal_the_full_logits_ones(offsets):
    """Logits only at targeted outputs, cross-entropy a few rows at a time (checkpointed chunks): the
    losses and every gradient are those of the full (N, T, V) logits, to float32 rounding."""
    x, response, targets = training_batch(offsets)
    results = []
    for chunked in (True, False):
        model = random_model().train()
        model.loss_chunk = 97 * 5  # 5 rows a chunk: many chunks, a ragged last one
        if chunked:
            ar = ar_loss(model, x, targets)
            loss, noisy, clean = dual_track_loss(model, x, response, targets, 4, MASK, 0.5, offsets=offsets)
        else:
            ar, noisy, clean = full_logits_losses(model, x, response, targets, 4, offsets)
            loss = noisy + 0.5 * clean
        (ar + loss).backward()
        results.append([ar.detach(), noisy.detach(), clean.detach()] + [p.grad for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_chunked_loss_keeps_far_less_for_backward_and_never_builds_the_full_logits():
    """Memory, measured on the CPU: (1) the bytes autograd saves for backward (saved_tensors_hooks, each
    storage counted once) drop by at least the float32 log-probabilities (K, V) the full cross-entropy
    keeps; (2) no op, forward or backward, makes a tensor as large as the (K, V) logits."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):  # the largest tensor any aten op returns
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    V = 2048  # a vocabulary large next to the width, as in real models
    x, response, targets = training_batch()
    K = 2 * int((targets != IGNORE).sum())  # outputs with a target, both streams
    saved, largest = {}, {}
    for name in ("full", "chunked"):
        model = random_model(vocab_size=V).train()
        model.loss_chunk = V * 8  # 8 rows a chunk
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with Largest() as mode:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                if name == "full":
                    _, noisy, clean = full_logits_losses(model, x, response, targets, 4)
                    loss = noisy + clean
                else:
                    loss = dual_track_loss(model, x, response, targets, 4, MASK)[0]  # alpha 1
            loss.backward()
        saved[name], largest[name] = sum(storages.values()), mode.numel
    assert saved["full"] - saved["chunked"] >= K * V * 4, saved
    # chunked, the largest are a chunk's logits (8, V) and the lm_head's gradient (V, C = 32)
    assert largest["full"] >= K * V and largest["chunked"] <= 32 * V < K * V, (largest, K * V)


def test_sequence_normalisation_and_per_example_noisy_weights():
    """loss_norm="sequence": each example's mean, then the mean over examples (short replies weigh as much
    as long ones); noisy_weights multiply each example's noisy terms (the released no-SFT ablation's 1/t).
    Checked against the per-target losses of the full logits, example by example."""
    x, response, targets = training_batch()
    model = random_model()
    N, L = x.shape
    inputs = torch.cat([x, torch.where(response, MASK, x)], 1)
    logits = model(inputs, torch.arange(L).repeat(2).expand(N, 2 * L), mars_train_mask(L, 4))
    ce = F.cross_entropy(logits.flatten(0, 1), targets.repeat(1, 2).flatten(), ignore_index=IGNORE,
                         reduction="none").view(N, 2 * L)
    valid = targets != IGNORE
    per_example = lambda half: torch.stack([half[n][valid[n]].mean() for n in range(N)])  # noqa: E731
    clean_rows, noisy_rows = per_example(ce[:, :L]), per_example(ce[:, L:])
    w = torch.tensor([1.0, 3.0, 10.0])
    loss = dual_track_loss(model, x, response, targets, 4, MASK, 0.5, loss_norm="sequence", noisy_weights=w)[0]
    torch.testing.assert_close(loss, (w * noisy_rows).mean() + 0.5 * clean_rows.mean(), rtol=1e-5, atol=1e-6)
    token = dual_track_loss(model, x, response, targets, 4, MASK, 0.5)[0]  # the default: one mean
    torch.testing.assert_close(token, ce[:, L:][valid].mean() + 0.5 * ce[:, :L][valid].mean(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(token, dual_track_loss(model, x, response, targets, 4, MASK, 0.5,
                                                     loss_norm="sequence")[0])  # replies differ in length
