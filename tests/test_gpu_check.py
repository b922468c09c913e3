"""
The prepared GPU check runs once on a borrowed GPU, so every line of it must already work: run it here on
the tiny shape on CPU, end to end, and check its JSON report. Its MFU arithmetic is checked on the real
Qwen2.5-0.5B shape without allocating it (meta device).
"""
import json

import pytest
import torch

from gpu_check import QWEN05, main, train_flops
from nanomars.model import Decoder


def test_small_cpu_run(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    main(["--small", "--device", "cpu", "--out", str(out)])
    r = json.loads(out.read_text())
    assert "ERROR" not in capsys.readouterr().out
    assert {"parity", "train", "decode"} <= set(r) and not any("error" in r[k] for k in ("parity", "train", "decode"))

    pytest.importorskip("transformers")  # parity is skipped (and says so) without it
    for dtype, tol in (("fp32", 1e-4), ("bf16", 0.05)):
        p = r["parity"][dtype]
        assert p["max_abs_logit_diff"] < tol, (dtype, p)
        assert p["ar_equals_hf"] and p["mars_tau1_equals_hf"], (dtype, p)

    t = r["train"]
    assert t["tokens_per_step"] == 2 * 64
    for name, seq in (("mars", 128), ("ar", 64)):
        s = t[name]
        assert s["step_s"] > 0 and s["tokens_per_s"] > 0 and s["processed_seq"] == seq
        assert s["peak_mem_gib"] is None and s["mfu"] is None  # CUDA-only numbers: n/a on CPU
    assert t["mars_over_ar_step_time"] > 0 and t["sdpa_backends_for_mars_mask"]["math"]

    d = r["decode"]
    for name in ("ar", "mars"):
        s = d[name]
        assert s["tokens_per_s"] > 0 and s["forwards_per_s"] > 0 and s["tokens_per_forward"] >= 1
    assert d["ar"]["tokens_per_forward"] == 1.0  # AR: one token per forward, by definition


def test_mfu_flops_on_qwen05_shape():
    with torch.device("meta"):
        n = Decoder(QWEN05).num_params()
    assert n == 494_032_768  # Qwen2.5-0.5B, tied embeddings counted once
    # 6N per token + 12 * layers * hidden * seq for attention, over 8 x 1024 processed tokens (MARS)
    assert train_flops(QWEN05, n, 8, 1024) == (6 * n + 12 * 24 * 896 * 1024) * 8 * 1024
