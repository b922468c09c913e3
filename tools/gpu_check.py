"""
One prepared GPU check, meant to be run once on a GPU (an H200: a few minutes in all):
  python tools/gpu_check.py                          # cuda, Qwen2.5-0.5B shape
  python tools/gpu_check.py --small --device cpu     # the same code on a tiny shape, in seconds (CI runs it)
1. parity: a tiny random transformers Qwen2 vs our load_qwen, bf16 and float32 logits on the device, and
   greedy 32-token generations (HF generate vs our ar_decode and mars_decode at tau = 1). The token
   comparisons are exact in float32 only: in bf16 HF, AR and MARS feed different query widths, so their
   kernels can round differently and flip an argmax that is a near-tie (docs/mars.md, "float32 and bf16").
2. train: MARS dual-track step vs AR step on a random model of Qwen2.5-0.5B's shape, bf16 autocast over
   float32 AdamW master weights as train.py does: step time, tokens/s, peak memory, MFU, and the SDPA
   kernel the dispatcher actually picks for the MARS training mask (and which kernels could run it).
3. decode: AR vs MARS (tau 0.95, block 4) with the KV cache, the same weights cast to bf16, and the SDPA
   kernel a cached decode step takes.
4. fsdp: section 2's MARS step on a fresh model sharded by FSDP2 as train.py --fsdp shards it, over a world
   of one process: step time, peak memory and MFU, next to the unsharded step's time.
MFU is measured against --peak_flops, by default the dense bf16 datasheet figure of the GPU model
(PEAK_BF16_FLOPS); for a GPU not in that table MFU is reported as unknown unless --peak_flops is given.
Prints a compact report and writes it as JSON to --out.
"""
import sys
import json
import os
import re
import tempfile
import time
import traceback
import warnings

import torch
import torch.nn.functional as F


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as python tools/gpu_check.py

from nanomars.decode import ar_decode, mars_decode
from nanomars.dual_track import IGNORE, ar_loss, collate, dual_track_loss
from nanomars.masks import causal_mask, mars_train_mask
from nanomars.util.cli import ArgumentParser, device_name, positive_float, run
from nanomars.model import Config, Decoder, rope_cos_sin

BLOCK = 4
QWEN05 = Config(vocab_size=151936, n_layer=24, n_head=14, n_kv_head=2, n_embd=896, intermediate_size=4864,
                max_seq_len=1024, rope_theta=1e6, tie_embeddings=True)
TINY = Config(vocab_size=512, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, intermediate_size=128,
              max_seq_len=256, rope_theta=1e6, tie_embeddings=True)

# Dense (no sparsity) bf16 tensor-core FLOP/s from NVIDIA's datasheets, by a pattern searched in
# torch.cuda.get_device_name; the first match wins, None = not known here (pass --peak_flops).
PEAK_BF16_FLOPS = (
    (r"NVL", None),  # H100 / H200 NVL: lower clocks and power than SXM, a different figure
    (r"H100 PCIe", 756e12),
    (r"H100|H200", 989e12),  # SXM: "NVIDIA H100 80GB HBM3", "NVIDIA H200", GH200
    (r"A100", 312e12),  # SXM and PCIe alike
    (r"\bL4$", 121e12),  # "NVIDIA L4", not L40 / L40S
    (r"RTX 4090$", 165e12),  # GeForce: the bf16 figure WITH fp32 accumulate, which torch's matmuls use
)


def peak_bf16_flops(name):
    """Dense bf16 FLOP/s of the GPU called `name` (torch.cuda.get_device_name), or None if unknown."""
    return next((flops for pattern, flops in PEAK_BF16_FLOPS if re.search(pattern, name.strip())), None)


def sync(device):
    # GPU kernels run asynchronously: wait for them before reading the clock
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(fn, device, warmup, iters):
    """Mean seconds per call of fn after `warmup` untimed calls (first-call allocations, kernel choice)."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / iters


# ------------------------------------------------------------------------------------- 1. parity
@torch.no_grad()
def parity(device, n_new=32):
    try:
        import transformers
    except ImportError:
        return {"skipped": "transformers is not installed"}
    from nanomars.util.qwen import load_qwen
    from nanomars.scale.tiny_qwen import tiny_hf_folder  # the parity tests' tiny random Qwen2 folder
    transformers.utils.logging.disable_progress_bar()  # keep the report compact
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        tiny_hf_folder(folder)
        idx = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1)).to(device)
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            hf = transformers.Qwen2ForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
            ours, tok = load_qwen(folder, device, dtype=dtype)
            pos = torch.arange(idx.shape[1], device=device).expand_as(idx)
            diff = (ours(idx, pos, causal_mask(idx.shape[1], device=device)) - hf(idx).logits.float()).abs().max()
            prompt = idx[:1, :8]
            ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new,
                              min_new_tokens=n_new, do_sample=False, pad_token_id=0)[0, 8:].tolist()
            ar = ar_decode(ours, prompt[0].tolist(), n_new).tokens
            mars = mars_decode(ours, prompt[0].tolist(), n_new, tok.mask_id, BLOCK, tau=1.0).tokens
            out[name] = {"max_abs_logit_diff": diff.item(), "ar_equals_hf": ar == ref,
                         "mars_tau1_equals_hf": mars == ref, "mars_tau1_equals_ar": mars == ar}
    out["note"] = ("token equality is exact in fp32; in bf16 a mismatch at a near-tie argmax is rounding "
                   "(different query widths, different kernels), not a bug")
    return out


# -------------------------------------------------------------------------------------- 2. train
def random_batch(config, batch, seq, device):
    """Random ids with a fake response mask: the first seq/8 tokens are prompt, the rest response.
    The last id is kept out of the data and serves as the mask token."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size - 1, (batch, seq), generator=g).tolist()
    n_prompt = seq // 8
    examples = [(row, [0] * n_prompt + [1] * (seq - n_prompt)) for row in ids]
    return collate(examples, BLOCK, eos_id=0, device=device)  # seq % BLOCK == 0: no padding added


def train_flops(config, n_params, batch, seq, n_logits=None):
    # per processed token: 6N for the matmuls over all N weights but the lm_head (the tied embedding is
    # counted once: it is the lm_head matmul; the lookup is free) + 12 * n_layer * n_embd * seq for
    # attention scores and values (QK^T and AV, 2 * 2 * seq * n_embd forward per layer, x3 with backward),
    # counting the full seq x seq score matrix as nanoGPT/PaLM do (a dense masked kernel computes every
    # score); plus 6 * V * C per output that gets logits: n_logits of them (the losses compute logits only
    # where there is a target; None = every output). Model FLOPs: the chunked loss's recomputed lm_head
    # forward is not counted (MFU, not hardware FLOPs utilisation).
    head = config.vocab_size * config.n_embd
    n_logits = batch * seq if n_logits is None else n_logits
    return (6 * (n_params - head) + 12 * config.n_layer * config.n_embd * seq) * batch * seq + 6 * head * n_logits


SDPA_KERNELS = {  # the aten op that scaled_dot_product_attention dispatches to -> its kernel family
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash-cpu",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}


def sdpa_kernel_used(fn):
    """The SDPA kernel(s) the dispatcher actually picks while fn() runs, as 'efficient', 'flash-cpu', ...
    (joined by '+' if several calls pick differently): read from the aten ops the profiler records on the
    host, so no CUDA tracing is needed. If it says math, every layer materializes its full fp32 scores."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return "+".join(sorted({SDPA_KERNELS[e.name] for e in prof.events() if e.name in SDPA_KERNELS})) or "none seen"


def train_attention_call(model, seq, device):
    """One call of the model's own attention (layer 0, training mode, bf16 autocast over float32 weights as
    train.py) on a [clean | noisy] input of length seq under the MARS training mask."""
    c = model.config
    x = torch.randn(1, seq, c.n_embd, device=device, requires_grad=True)
    pos = torch.arange(seq // 2, device=device).repeat(2)[None]
    cos, sin = rope_cos_sin(pos, model.inv_freq, x.dtype)
    mask = mars_train_mask(seq // 2, BLOCK, device=device)

    def call():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return model.blocks[0].attn(x, cos, sin, mask)
    return call


def sdpa_backends(call):
    """Which SDPA kernels CAN run this call when forced to (the dispatcher picks the first that can, in
    its own order: sdpa_kernel_used says which one it took)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ok = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        try:
            with warnings.catch_warnings(), sdpa_kernel(getattr(SDPBackend, name)):
                warnings.simplefilter("ignore")  # each refusing kernel warns why: the bool says enough
                call()
            ok[name.lower()] = True
        except Exception:  # RuntimeError "No available kernel", or any refusal
            ok[name.lower()] = False
    return ok


def train(model, device, batch, seq, peak_flops, warmup=2, iters=5):
    x, response, targets = random_batch(model.config, batch, seq, device)
    mask_id = model.config.vocab_size - 1
    opt = model.configure_optimizer(lr=1e-4)  # as train.py
    losses = {"mars": lambda: dual_track_loss(model, x, response, targets, BLOCK, mask_id)[0],
              "ar": lambda: ar_loss(model, x, targets)}
    processed = {"mars": 2 * seq, "ar": seq}  # MARS feeds [clean | noisy]: twice the sequence
    model.train()
    n_logits = {"mars": 2 * int((targets != IGNORE).sum()), "ar": int((targets != IGNORE).sum())}
    attention = train_attention_call(model, 2 * seq, device)
    out = {"batch": batch, "seq": seq, "tokens_per_step": batch * seq,
           "note": "tokens/s counts the batch*seq real tokens per step for both (MARS processes 2x that)",
           "sdpa_kernel_for_mars_mask": sdpa_kernel_used(attention),
           "sdpa_backends_for_mars_mask": sdpa_backends(attention)}
    for name, loss_fn in losses.items():
        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):  # bf16 compute, float32 master weights
                loss = loss_fn()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":  # the peak still counts the fp32 weights, grads and AdamW state
            torch.cuda.reset_peak_memory_stats(device)
        dt = timed(step, device, warmup, iters)
        flops = train_flops(model.config, model.num_params(), batch, processed[name], n_logits[name])
        cuda = device.type == "cuda"
        out[name] = {"step_s": dt, "tokens_per_s": batch * seq / dt, "processed_seq": processed[name],
                     "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
                     "mfu": flops / dt / peak_flops if cuda and peak_flops else None}
    out["mars_over_ar_step_time"] = out["mars"]["step_s"] / out["ar"]["step_s"]
    opt.zero_grad(set_to_none=True)
    return out


# ------------------------------------------------------------------------------------- 3. decode
@torch.no_grad()
def decode(model, device, n_prompt=64, n_new=128, tau=0.95):
    model.to(torch.bfloat16).eval()  # the RoPE frequencies stay float32 (Decoder._apply)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.config.vocab_size - 1, (n_prompt,), generator=g).tolist()
    runs = {"ar": lambda n: ar_decode(model, prompt, n),
            "mars": lambda n: mars_decode(model, prompt, n, model.config.vocab_size - 1, BLOCK, tau)}
    out = {"prompt": n_prompt, "new_tokens": n_new, "tau": tau, "block": BLOCK,
           "note": "random weights are rarely confident, so MARS accepts ~1 token/forward: forwards/s is the fair per-forward figure",
           "sdpa_kernel": sdpa_kernel_used(lambda: runs["mars"](2))}  # the prefill and one cached step
    for name, run in runs.items():
        run(8)  # warm-up: first-call allocations and kernel selection
        sync(device)
        t0 = time.perf_counter()
        d = run(n_new)
        sync(device)
        dt = time.perf_counter() - t0
        out[name] = {"tokens_per_s": len(d.tokens) / dt, "forwards_per_s": d.forwards / dt,
                     "tokens_per_forward": d.tokens_per_forward, "seconds": dt}
    for k in ("tokens_per_s", "forwards_per_s", "tokens_per_forward"):
        out[f"mars_over_ar_{k}"] = out["mars"][k] / out["ar"][k]
    return out


# ------------------------------------------------------------------------------------- 4. fsdp
def fsdp_train(config, device, batch, seq, peak_flops, unsharded_step_s, warmup=1, iters=2):
    """The MARS step of section 2 on a model sharded by nanomars.scale.distributed.shard, as train.py --fsdp does
    (CUDA: bf16 compute from fp32 master shards, fp32 gradient reduction; CPU: fp32 weights), over a
    one-process group: shows the sharded path runs here and what its hooks and casts cost (on several GPUs
    the all-gathers and reduce-scatters come on top)."""
    import torch.distributed as dist
    from nanomars.scale.distributed import shard
    own_group = not dist.is_initialized()
    if own_group:  # a group of one, its rendezvous in memory: no torchrun, no port
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = Decoder(config)
        model.init_weights()
        n_params = model.num_params()
        shard(model, device.type)
        x, response, targets = random_batch(config, batch, seq, device)
        opt = model.configure_optimizer(lr=1e-4)  # over the DTensor shards, as train.py

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = dual_track_loss(model, x, response, targets, BLOCK, config.vocab_size - 1)[0]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # a global norm over DTensors
            opt.step()
            opt.zero_grad(set_to_none=True)
        model.train()
        cuda = device.type == "cuda"
        if cuda:  # the peak also counts what the decode section left on the GPU (its bf16 weights)
            torch.cuda.reset_peak_memory_stats(device)
        dt = timed(step, device, warmup, iters)
        flops = train_flops(config, n_params, batch, 2 * seq, 2 * int((targets != IGNORE).sum()))
        return {"world": 1, "batch": batch, "seq": seq, "processed_seq": 2 * seq, "step_s": dt,
                "tokens_per_s": batch * seq / dt,
                "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
                "mfu": flops / dt / peak_flops if cuda and peak_flops else None,
                "over_unsharded_step_time": dt / unsharded_step_s if unsharded_step_s else None}
    finally:
        if own_group:
            dist.destroy_process_group()


# --------------------------------------------------------------------------------------- report
def fmt(v, spec, unit=""):
    return "n/a" if v is None else format(v, spec) + unit


def print_parity(p):
    if "skipped" in p:
        print(f"parity  skipped: {p['skipped']}")
    for name in ("bf16", "fp32"):
        if name in p:
            q = p[name]
            print(f"parity  {name}: max|logit diff| {q['max_abs_logit_diff']:.2e} | greedy 32 tok == HF: "
                  f"ar {q['ar_equals_hf']}, mars tau=1 {q['mars_tau1_equals_hf']} | "
                  f"mars tau=1 == ar {q['mars_tau1_equals_ar']}")
    if "note" in p:
        print(f"parity  ({p['note']})")


def print_train(t):
    for name in ("mars", "ar"):
        s = t[name]
        print(f"train   {name:4s} {t['batch']}x{t['seq']} (seq fed {s['processed_seq']}): {s['step_s'] * 1e3:8.1f} ms/step "
              f"| {s['tokens_per_s']:9.0f} tok/s | peak {fmt(s['peak_mem_gib'], '.1f', ' GiB')} | MFU {fmt(s['mfu'], '.1%')}")
    print(f"train   MARS/AR step time {t['mars_over_ar_step_time']:.2f}x  ({t['note']})")
    print(f"train   SDPA kernel picked for the MARS mask: {t['sdpa_kernel_for_mars_mask']} (could run: " +
          ", ".join(k for k, v in t["sdpa_backends_for_mars_mask"].items() if v) + ")")


def print_decode(d):
    for name in ("ar", "mars"):
        s = d[name]
        print(f"decode  {name:4s} {s['tokens_per_s']:7.1f} tok/s | {s['forwards_per_s']:7.1f} fwd/s | "
              f"{s['tokens_per_forward']:.2f} tok/fwd")
    print(f"decode  MARS/AR: tok/s {d['mars_over_ar_tokens_per_s']:.2f}x, fwd/s {d['mars_over_ar_forwards_per_s']:.2f}x, "
          f"tok/fwd {d['mars_over_ar_tokens_per_forward']:.2f}x  ({d['note']})")
    print(f"decode  SDPA kernel picked for a cached step: {d['sdpa_kernel']}")


def print_fsdp(f):
    print(f"fsdp    mars {f['batch']}x{f['seq']} sharded over {f['world']} process: {f['step_s'] * 1e3:8.1f} ms/step "
          f"| {f['tokens_per_s']:9.0f} tok/s | peak {fmt(f['peak_mem_gib'], '.1f', ' GiB')} | MFU {fmt(f['mfu'], '.1%')} "
          f"| {fmt(f['over_unsharded_step_time'], '.2f', 'x')} the unsharded step's time")


def main(argv=None):
    ap = ArgumentParser(__doc__)
    ap.add_argument("--device", type=device_name, default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shape (2 layers, hidden 64, vocab 512, batch 2x64)")
    ap.add_argument("--out", default="out/gpu_check.json")
    ap.add_argument("--peak_flops", type=positive_float, default=None,
                    help="dense bf16 FLOP/s that MFU is measured against; default: the GPU model's datasheet "
                         "figure (H100 SXM / H200 989e12, H100 PCIe 756e12, A100 312e12, L4 121e12, RTX 4090 "
                         "165e12 with fp32 accumulate); another GPU gets no MFU unless this is given")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    config, batch, seq = (TINY, 2, 64) if args.small else (QWEN05, 8, 512)
    r = {"device": str(device), "torch": torch.__version__, "shape": "tiny" if args.small else "qwen2.5-0.5b",
         "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}
    print(f"device {r['device']} ({r['device_name']}), torch {r['torch']}, shape {r['shape']}")
    r["peak_flops"] = args.peak_flops or (peak_bf16_flops(r["device_name"]) if device.type == "cuda" else None)
    if device.type == "cuda" and r["peak_flops"] is None:
        print(f"MFU unknown: no dense bf16 peak known for {r['device_name']}; pass --peak_flops")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)

    def section(name, printer, fn, *fn_args):
        # one run on a borrowed GPU: a failing section is recorded and the next still runs, and the JSON
        # is rewritten after every section so a timeout still leaves what was measured
        try:
            r[name] = fn(*fn_args)
            printer(r[name])
        except Exception as e:
            traceback.print_exc()
            r[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name:7s} ERROR {r[name]['error']}")
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)

    section("parity", print_parity, parity, device)
    torch.manual_seed(0)
    with torch.device(device):  # build straight on the device: no 2 GB host copy
        model = Decoder(config)
    model.init_weights()
    r["n_params"] = model.num_params()
    section("train", print_train, train, model, device, batch, seq, r["peak_flops"])
    section("decode", print_decode, decode, model, device)
    section("fsdp", print_fsdp, fsdp_train, config, device, batch, seq, r["peak_flops"],
            r["train"].get("mars", {}).get("step_s"))
    print(f"wrote {args.out}")
    return r


if __name__ == "__main__":
    run(main)
