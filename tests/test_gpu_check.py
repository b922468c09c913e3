"""
The prepared GPU check runs once on a borrowed GPU, so every line of it must already work: run it here on
the tiny shape on CPU, end to end, and check its JSON report. Its MFU arithmetic is checked on the real
Qwen2.5-0.5B shape without allocating it (meta device).
"""
import json

import pytest
import torch

from tools.gpu_check import QWEN05, main, peak_bf16_flops, sdpa_kernel_used, train_flops
from nanomars.dual_track import ar_loss, collate, dual_track_loss
from nanomars.model import Config, Decoder


def test_small_cpu_run(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    main(["--small", "--device", "cpu", "--out", str(out)])
    r = json.loads(out.read_text())
    assert "ERROR" not in capsys.readouterr().out
    assert {"parity", "train", "decode"} <= set(r) and not any("error" in r[k] for k in ("parity", "train", "decode"))
    f = r["fsdp"]  # the FSDP2-sharded step ran, over a one-process group
    assert "error" not in f and f["world"] == 1 and f["processed_seq"] == 2 * f["seq"]
    # rates and ratios are what their names say, from the measured step times
    assert f["tokens_per_s"] == pytest.approx(f["batch"] * f["seq"] / f["step_s"])
    assert f["over_unsharded_step_time"] == pytest.approx(f["step_s"] / r["train"]["mars"]["step_s"])
    assert f["peak_mem_gib"] is None and f["mfu"] is None  # CUDA-only numbers

    pytest.importorskip("transformers")  # parity is skipped (and says so) without it
    for dtype, tol in (("fp32", 1e-4), ("bf16", 0.05)):
        p = r["parity"][dtype]
        assert p["max_abs_logit_diff"] < tol, (dtype, p)
    # token equality is exact in fp32 only: in bf16 MARS's wider forwards may round a near-tie the other way
    assert r["parity"]["fp32"]["ar_equals_hf"] and r["parity"]["fp32"]["mars_tau1_equals_hf"], r["parity"]["fp32"]

    t = r["train"]
    assert t["tokens_per_step"] == 2 * 64
    for name, seq in (("mars", 128), ("ar", 64)):
        s = t[name]
        assert s["processed_seq"] == seq and s["tokens_per_s"] == pytest.approx(t["tokens_per_step"] / s["step_s"])
        assert s["peak_mem_gib"] is None and s["mfu"] is None  # CUDA-only numbers: n/a on CPU
    assert t["mars_over_ar_step_time"] == pytest.approx(t["mars"]["step_s"] / t["ar"]["step_s"])
    assert t["sdpa_backends_for_mars_mask"]["math"]
    # the kernel the dispatcher actually took, found by the profiler (on a CPU: the flash-cpu or math one)
    assert t["sdpa_kernel_for_mars_mask"] in ("flash-cpu", "math")
    assert r["decode"]["sdpa_kernel"] in ("flash-cpu", "math", "flash-cpu+math")
    assert r["peak_flops"] is None  # no GPU: no peak, no MFU

    d = r["decode"]
    for name in ("ar", "mars"):
        s = d[name]
        # the rates are counts over the run's seconds: all new_tokens (no stop token), and the forwards
        # they took, a whole number from new_tokens / block (every window accepted) to new_tokens
        assert s["tokens_per_s"] * s["seconds"] == pytest.approx(d["new_tokens"])
        forwards = s["forwards_per_s"] * s["seconds"]
        assert forwards == pytest.approx(round(forwards))
        assert d["new_tokens"] / d["block"] <= round(forwards) <= d["new_tokens"]
        assert s["tokens_per_forward"] == pytest.approx(s["tokens_per_s"] / s["forwards_per_s"])
    assert d["ar"]["tokens_per_forward"] == 1.0  # AR: one token per forward, by definition
    for k in ("tokens_per_s", "forwards_per_s", "tokens_per_forward"):
        assert d[f"mars_over_ar_{k}"] == pytest.approx(d["mars"][k] / d["ar"][k])


def test_qwen05_shape_has_qwen05s_parameter_count():
    with torch.device("meta"):
        n = Decoder(QWEN05).num_params()
    assert n == 494_032_768  # Qwen2.5-0.5B, tied embeddings counted once


@pytest.mark.parametrize("stage", ["ar", "mars"])
def test_train_flops_formula_matches_torchs_flop_counter(stage):
    """MFU's numerator, checked against torch's own count of every matmul in a forward + backward. The
    plain attention path is used because the counter does not see inside the fused SDPA call."""
    from torch.utils.flop_counter import FlopCounterMode
    config = Config(vocab_size=512, n_layer=2, n_head=4, n_kv_head=2, n_embd=128, intermediate_size=256,
                    max_seq_len=256)
    model = Decoder(config)
    model.init_weights()
    model.set_attention(False)
    N, L = 2, 64
    g = torch.Generator().manual_seed(0)
    x, response, targets = collate([(torch.randint(0, 511, (L,), generator=g).tolist(), [0] * 8 + [1] * (L - 8))
                                    for _ in range(N)], 4, eos_id=0)
    loss = (lambda: ar_loss(model, x, targets)) if stage == "ar" else (
        lambda: dual_track_loss(model, x, response, targets, 4, mask_id=511)[0])
    with FlopCounterMode(display=False) as counter:
        loss().backward()
    fed = L if stage == "ar" else 2 * L  # MARS feeds [clean | noisy]
    n_logits = int((targets != -100).sum()) * (1 if stage == "ar" else 2)  # logits only where there is a target
    recomputed = 2 * config.vocab_size * config.n_embd * n_logits  # the chunked loss's lm_head, again in backward
    # the formula also counts norm weights and biases as 6 FLOPs a token: a fraction of a percent here
    assert train_flops(config, model.num_params(), N, fed, n_logits) + recomputed == pytest.approx(
        counter.get_total_flops(), rel=0.01)


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12), ("NVIDIA GH200 480GB", 989e12),
    ("NVIDIA H100 PCIe", 756e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA L4", 121e12), ("NVIDIA GeForce RTX 4090", 165e12),
    ("NVIDIA L40S", None), ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA A10G", None),
    ("NVIDIA GeForce RTX 4090 D", None), ("Tesla T4", None),
])
def test_peak_flops_by_gpu_model(name, flops):
    assert peak_bf16_flops(name) == flops


def test_sdpa_kernel_used_names_the_kernel_the_dispatcher_took():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(1, 2, 8, 16)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    call = lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_kernel_used(call) == "math"
    assert sdpa_kernel_used(call) in ("flash-cpu", "math")
    assert sdpa_kernel_used(lambda: q + 1) == "none seen"
