"""train.py --fsdp (FSDP2) on 2 CPU processes over gloo, in fp32: the same losses and weights as one process
training the same global batch, an exact resume from the sharded checkpoint, and a final export that both
nanoMARS and transformers load."""
import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, TINY, run_train
from nanomars.util.checkpoint import load_checkpoint, load_model

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
# --warmup 100 > max_iters: the lr ramps the same way whatever --max_iters is, so 2 steps then --resume to 4
# follow the schedule of one 4-step run; lr 0.05 (0.5e-3 .. 2e-3 here) so the weights move measurably
COMMON = ["--stage", "ar", "--log_interval", "1", "--warmup", "100", "--lr", "0.05", *TINY]


def step_losses(log):
    return [float(v) for v in re.findall(r"^step +\d+ \| loss ([0-9.]+)", log, re.M)]


def max_weight_diff(path_a, path_b):
    a, b = load_checkpoint(path_a)[0].state_dict(), load_checkpoint(path_b)[0].state_dict()
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """4 steps, 2 processes x 4 examples (tied embeddings, from scratch): (out_dir, log)."""
    out = tmp_path_factory.mktemp("fsdp")
    return out, run_train([*COMMON, "--fsdp", "--max_iters", "4", "--out_dir", str(out)], TORCHRUN)


@pytest.mark.slow
def test_sharded_training_equals_one_process(sharded_run, tmp_path):
    out, log = sharded_run
    # the same global batch of 8 as 1 process x 2 micro-steps of 4 (train.py's draw_step)
    one = run_train([*COMMON, "--grad_accum", "2", "--max_iters", "4", "--out_dir", str(tmp_path)])
    assert len(step_losses(log)) == 4 and step_losses(log) == pytest.approx(step_losses(one), abs=1e-4)
    # only the order of float32 sums differs (reduce-scatter, the sharded gradient norm); AdamW's division by
    # sqrt(v) magnifies it for tiny gradients: measured 5e-7 after 4 steps, on weights of size ~0.02
    assert max_weight_diff(out / "ar.pt", tmp_path / "ar.pt") < 1e-5
    assert sorted(p.name for p in (out / "ar_dcp").iterdir()) == ["latest", "step_0000004"]


@pytest.mark.slow
def test_sharded_resume_continues_exactly(sharded_run, tmp_path):
    out, log = sharded_run
    run_train([*COMMON, "--fsdp", "--max_iters", "2", "--out_dir", str(tmp_path)], TORCHRUN)
    # a later save that was interrupted: a half-written folder that 'latest' does not point to
    (tmp_path / "ar_dcp" / "step_0000009").mkdir()
    (tmp_path / "ar_dcp" / "step_0000009" / "__0_0.distcp").write_bytes(b"half")
    resumed = run_train([*COMMON, "--fsdp", "--max_iters", "4", "--resume", "--out_dir", str(tmp_path)], TORCHRUN)
    assert step_losses(resumed) == step_losses(log)[2:]
    assert max_weight_diff(out / "ar.pt", tmp_path / "ar.pt") == 0.0  # measured: bit for bit
    assert sorted(p.name for p in (tmp_path / "ar_dcp").iterdir()) == ["latest", "step_0000004"]
    # the .pt export holds no optimizer state: resuming it without --fsdp says where that state is
    proc = subprocess.run([sys.executable, "train.py", *COMMON, "--max_iters", "5", "--resume",
                           "--out_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "resume with --fsdp" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_sharded_export_loads_in_nanomars_and_transformers(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers loads the export as the reference")
    from nanomars.scale.tiny_qwen import tiny_hf_folder
    tiny_hf_folder(tmp_path / "hf", tie=False)  # untied, like Qwen2.5-7B
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"add {i} {i}"},
                                                       {"role": "assistant", "content": str(2 * i)}]})
                              for i in range(60)))
    out = tmp_path / "out"
    run_train(["--fsdp", "--stage", "mars", "--init_from", str(tmp_path / "hf"), "--data", str(data), "--random_offsets",
         "--grad_checkpointing", "--max_iters", "2", "--batch_size", "2", "--eval_interval", "2",
         "--eval_batches", "1", "--lr", "1e-3", "--out_dir", str(out), "--device", "cpu"], TORCHRUN)
    ours, tok, _, _ = load_model(str(out / "mars_hf"), "cpu", torch.float32)
    from_pt = load_model(str(out / "mars.pt"), "cpu", torch.float32)[0]
    hf = transformers.Qwen2ForCausalLM.from_pretrained(out / "mars_hf", dtype=torch.float32).eval()
    idx = torch.tensor([tok.prompt_ids("add 3 3")])
    T = idx.shape[1]
    from nanomars.masks import causal_mask
    with torch.no_grad():
        ref = hf(idx).logits
        assert torch.allclose(ours(idx, torch.arange(T)[None], causal_mask(T)), ref, atol=1e-4)
        assert torch.allclose(from_pt(idx, torch.arange(T)[None], causal_mask(T)), ref, atol=1e-4)
    original = load_model(str(tmp_path / "hf"), "cpu", torch.float32)[0]
    assert not torch.equal(original.lm_head.weight, ours.lm_head.weight)  # trained, and untied kept apart
    assert not torch.equal(ours.lm_head.weight, ours.embed.weight)
