"""train.py end to end as a user runs it: both stages, resume, DistributedDataParallel on 2 CPU processes
(gloo), and fine-tuning a Hugging Face Qwen2 folder into a folder transformers can load."""
import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, TINY, run_train
from nanomars.util.checkpoint import load_checkpoint

def test_every_stage_and_objective_flag_has_its_registered_objective():
    """train.py looks the objective up by name (--stage, or --objective for stage mars): each name the flags
    accept is registered, by dual_track or by the comparison that owns it, and nothing else is."""
    import nanomars.compare  # noqa: F401  (registers theirs, as train.py does)
    from nanomars.dual_track import OBJECTIVES, STARTS
    from nanomars.util.train_args import train_parser
    choices = {a.dest: set(a.choices) for a in train_parser(None)._actions if a.choices}
    assert set(OBJECTIVES) == (choices["stage"] - {"mars"}) | choices["objective"]
    assert set(STARTS) <= choices["stage"] - {"ar", "mars"}


@pytest.mark.slow
def test_two_stages_and_resume(tmp_path):
    out = str(tmp_path)
    log = run_train(["--stage", "ar", "--max_iters", "3", "--out_dir", out, *TINY])
    assert "held-out ar" in log
    first = log.splitlines()[0]  # what the stage trains: stage 1 has no objective, alpha or blocks
    assert first.startswith("stage ar: AR-SFT (next-token loss); ") and not re.search("objective|alpha|block", first)
    log = run_train(["--stage", "mars", "--max_iters", "3", "--out_dir", out, *TINY])
    assert "held-out noisy" in log and "clean" in log
    assert log.splitlines()[0].startswith("stage mars: MARS dual-track (objective mars), alpha 1.0, block_size 4, "
                                          "random block offsets, loss_norm token; ")
    ar, _ = load_checkpoint(f"{out}/ar.pt")
    mars, ckpt = load_checkpoint(f"{out}/mars.pt")
    assert ckpt["step"] == 3 and ckpt["args"]["stage"] == "mars"
    assert not torch.equal(ar.embed.weight, mars.embed.weight)  # stage 2 started from stage 1 and moved
    run_train(["--stage", "mars", "--max_iters", "5", "--resume", "--out_dir", out, *TINY])
    assert load_checkpoint(f"{out}/mars.pt")[1]["step"] == 5
    # the README's sample command on what was just trained: spans, stats, the AR comparison, per-row taus
    sample = [sys.executable, "sample.py", "--ckpt", f"{out}/mars.pt", "--max_new_tokens", "8", "--brackets"]
    proc = subprocess.run([*sample, "--compare_ar"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "MARS (tau 0.9, block 4): [" in proc.stdout and "tokens/forward" in proc.stdout
    assert "MARS vs AR:" in proc.stdout and "(both warmed up)" in proc.stdout
    assert "too short for the wall-clock ratio" in proc.stdout  # 8 new tokens at most
    proc = subprocess.run([*sample, "--taus", "1", "0.5"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "tau 1 " in proc.stdout and "tau 0.5 " in proc.stdout


@pytest.mark.slow
def test_ddp_two_processes_end_with_identical_weights(tmp_path):
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    log = run_train(["--stage", "ar", "--max_iters", "3", "--out_dir", str(tmp_path), *TINY], launcher)
    digests = dict(re.findall(r"rank (\d): weights sha256 ([0-9a-f]{16})", log))
    assert set(digests) == {"0", "1"}, log
    assert digests["0"] == digests["1"]
    # the same global batch (2 processes x 4 = 1 process x 2 micro-steps of 4) trains to the same weights
    run_train(["--stage", "ar", "--max_iters", "3", "--grad_accum", "2", "--out_dir", str(tmp_path / "one"), *TINY])
    ddp = load_checkpoint(f"{tmp_path}/ar.pt")[0].state_dict()
    one = load_checkpoint(f"{tmp_path}/one/ar.pt")[0].state_dict()
    assert max((ddp[k] - one[k]).abs().max().item() for k in ddp) < 1e-6  # float32 sums in another order


@pytest.mark.slow
def test_finetune_a_hugging_face_folder(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers loads the result as the reference")
    from test_qwen import tiny_hf
    from nanomars.util.qwen import load_qwen
    tiny_hf(tmp_path / "hf", n_kv_head=2, tie=True)
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"add {i} {i}"},
                                                       {"role": "assistant", "content": str(2 * i)}]})
                              for i in range(60)))
    out = str(tmp_path / "out")
    common = ["--data", str(data), "--max_iters", "2", "--batch_size", "4", "--eval_interval", "2",
              "--eval_batches", "1", "--lr", "1e-3", "--out_dir", out, "--device", "cpu"]
    run_train(["--stage", "ar", "--init_from", str(tmp_path / "hf"), *common])
    run_train(["--stage", "mars", *common])  # from out/ar.pt, still a Qwen2 model with its tokenizer
    for stage in ("ar", "mars"):
        ours, tok = load_qwen(f"{out}/{stage}_hf", device="cpu", dtype=torch.float32)
        hf = transformers.AutoModelForCausalLM.from_pretrained(f"{out}/{stage}_hf", dtype=torch.float32).eval()
        idx = torch.tensor([tok.prompt_ids("add 3 3")])
        T = idx.shape[1]
        with torch.no_grad():
            ref = hf(idx).logits
        from nanomars.masks import causal_mask
        assert torch.allclose(ours(idx, torch.arange(T)[None], causal_mask(T)), ref, atol=1e-4)
    original, _ = load_qwen(tmp_path / "hf", device="cpu", dtype=torch.float32)
    assert not torch.equal(original.embed.weight, ours.embed.weight)  # training changed the weights


@pytest.mark.slow
def test_epochs_visit_a_fixed_set_and_resume_exactly(tmp_path):
    """--epochs: max_iters = epochs x (examples // batch), and a run resumed mid-epoch continues exactly
    (the epoch order is replayed from the seed)."""
    common = ["--stage", "ar", *TINY, "--n_train", "40", "--epochs", "3", "--eval_interval", "100"]
    log = run_train([*common, "--out_dir", str(tmp_path / "once")])  # 40 examples, batch 4: 10 steps an epoch
    assert "done: 30 steps" in log
    run_train([*common, "--out_dir", str(tmp_path / "twice"), "--max_iters", "14"])  # stops mid-epoch 2
    assert load_checkpoint(f"{tmp_path}/twice/ar.pt")[1]["step"] == 14
    log = run_train([*common, "--out_dir", str(tmp_path / "twice"), "--resume"])
    assert "done: 16 steps" in log
    once = load_checkpoint(f"{tmp_path}/once/ar.pt")[0].state_dict()
    twice = load_checkpoint(f"{tmp_path}/twice/ar.pt")[0].state_dict()
    assert all(torch.equal(once[k], twice[k]) for k in once)


@pytest.mark.parametrize("flags", [["--objective", "no_sft_released"], ["--objective", "bd3lm"],
                                   ["--objective", "csbd"], ["--loss_norm", "sequence", "--last_turn_only"]])
@pytest.mark.slow
def test_every_objective_trains(tmp_path, flags):
    out = str(tmp_path)
    run_train(["--stage", "ar", "--max_iters", "2", "--out_dir", out, *TINY])
    base = run_train(["--stage", "mars", "--max_iters", "2", "--out_dir", out + "/base", "--init_from", f"{out}/ar.pt", *TINY])
    log = run_train(["--stage", "mars", "--max_iters", "2", "--out_dir", out + "/other", "--init_from", f"{out}/ar.pt",
               *flags, *TINY])
    first = lambda text: re.search(r"step +1 \| loss (\S+)", text)[1]  # noqa: E731
    assert f"objective {dict(zip(flags[::2], flags[1::2])).get('--objective', 'mars')}" in log
    assert first(log) != first(base)  # a different loss on the same first batch
