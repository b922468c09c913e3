"""nanomars/scale/memory.py against torch's own counts on tiny models (CPU): parameter counts, the bytes of
weights, gradients and AdamW state, the tensors autograd saves, and the peak of a forward + backward."""
import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nanomars.dual_track import dual_track_loss
from nanomars.scale.memory import PAPER_MODELS, activation_bytes, memory_table, num_params, training_memory
from nanomars.model import Config, Decoder

TINY = dict(vocab_size=256, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=128)


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False}, {"qkv_bias": False, "n_kv_head": 1},
                                       {"n_kv_head": 4, "n_layer": 3}])
def test_num_params_counts_the_decoder(overrides):
    config = Config(**{**TINY, **overrides})
    assert num_params(config) == Decoder(config).num_params()


def test_paper_models_have_qwen25_sizes():
    sizes = {name: num_params(c) for name, c in PAPER_MODELS.items()}
    assert sizes == {"0.5B": 494_032_768, "1.5B": 1_543_714_304, "3B": 3_085_938_688, "7B": 7_615_616_512}


def random_batch(config, N, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, config.vocab_size - 1, (N, L), generator=g)
    targets = torch.randint(0, config.vocab_size, (N, L), generator=g)  # every output has one, as memory.py
    return x, torch.ones(N, L, dtype=torch.bool), targets


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("tie", [True, False])
def test_weights_grads_and_adamw_state_are_torchs(tie):
    config = Config(**TINY, tie_embeddings=tie)
    model = Decoder(config)
    opt = model.configure_optimizer(lr=1e-3)
    dual_track_loss(model, *random_batch(config, 2, 16), 4, config.vocab_size - 1)[0].backward()
    opt.step()
    mem = training_memory(config, 1, "ddp", compute_bytes=4)
    assert mem["weights"] == nbytes(model.parameters())
    assert mem["grads"] == nbytes(p.grad for p in model.parameters())
    assert mem["optimizer"] == nbytes(s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    assert mem["bf16"] == 0  # all-fp32 compute keeps no copies


class LiveBytes(TorchDispatchMode):
    """The most bytes alive at once in tensors that ops create (parameters and gradients excluded)."""

    def __init__(self, exclude):
        super().__init__()
        self.exclude, self.live, self.peak = exclude, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}  # before an address is reused
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.exclude:
                s = t.untyped_storage()
                self.live.setdefault(s.data_ptr(), (StorageWeakRef(s), s.nbytes()))
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def measure(config, mode, ckpt, N=1, L=64, loss_chunk=2 ** 26):
    """(saved, peak) bytes of one dual_track_loss forward + backward, as torch counts them. mode: fp32,
    bf16 (Decoder.to(bfloat16): FSDP2's gathered params) or autocast (fp32 weights, bf16 compute: DDP)."""
    torch.manual_seed(0)
    model = Decoder(config).train()
    model.grad_checkpointing, model.loss_chunk = ckpt, loss_chunk
    if mode == "bf16":
        model.to(torch.bfloat16)
    for p in model.parameters():  # gradients already there, as after the first micro-step
        p.grad = torch.zeros_like(p)
    exclude = {t.untyped_storage().data_ptr() for p in model.parameters() for t in (p, p.grad)}
    saved = {}

    def pack(t):  # count each saved storage once (views share it), parameters not at all
        if t.untyped_storage().data_ptr() not in exclude:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    live = LiveBytes(exclude)
    with live:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", torch.bfloat16, enabled=mode == "autocast"):
            loss = dual_track_loss(model, *random_batch(config, N, L), 4, config.vocab_size - 1)[0]
        loss.backward()
    return sum(saved.values()), live.peak


MODES = {"fp32": ("ddp", 4, 4), "bf16": ("fsdp", 2, 2), "autocast": ("ddp", 4, 2)}  # strategy, residual, compute


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ckpt", [False, True])
def test_saved_tensors_are_torchs(mode, ckpt):
    config = Config(**TINY)
    strategy, r, a = MODES[mode]
    saved = activation_bytes(config, 2, 128, ckpt, r, a)[0]
    if mode == "autocast" and not ckpt:  # the blocks' bf16 weight copies are saved too (the loss's are not)
        saved += training_memory(config, 1, strategy, 2, 128, ckpt, a)["bf16"] - a * config.vocab_size * config.n_embd
    assert saved == pytest.approx(measure(config, mode, ckpt, N=2)[0], rel=0.01)


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("shape", [dict(vocab_size=4096, n_embd=128, intermediate_size=352),  # several loss chunks
                                   dict(vocab_size=512, n_embd=256, intermediate_size=704),  # the blocks dominate
                                   dict(vocab_size=512, n_embd=256, intermediate_size=704, tie_embeddings=False)])
def test_peak_is_torchs(mode, ckpt, shape):
    config = Config(**{**TINY, **shape, "n_layer": 3})
    _, r, a = MODES[mode]
    peak = activation_bytes(config, 1, 128, ckpt, r, a, loss_chunk=4096 * 32)[1]
    assert peak == pytest.approx(measure(config, mode, ckpt, loss_chunk=4096 * 32)[1], rel=0.05)


@pytest.mark.parametrize("ckpt", [False, True])
def test_autocast_peak_is_torchs(ckpt):
    # DDP's case. A big tied embedding: the peak comes last, summing fp32 embedding and lm_head gradients
    # once autocast's weight copies are gone; small blocks: the copies come on top, erring on the high side
    embedding = Config(**{**TINY, "vocab_size": 8192, "n_embd": 48, "intermediate_size": 96, "n_layer": 3})
    peak = activation_bytes(embedding, 1, 128, ckpt, 4, 2, loss_chunk=8192 * 16)[1]
    assert peak == pytest.approx(measure(embedding, "autocast", ckpt, loss_chunk=8192 * 16)[1], rel=0.05)
    blocks = Config(**{**TINY, "vocab_size": 2048, "intermediate_size": 176, "n_layer": 3})
    mem = training_memory(blocks, 1, "ddp", 1, 128, ckpt, 2)
    measured = measure(blocks, "autocast", ckpt)[1]
    assert 0.95 * measured <= mem["activations"] + mem["bf16"] <= 1.25 * measured


def test_adamw_step_temporary_is_torchs():
    config = Config(**TINY)
    model = Decoder(config)
    opt = model.configure_optimizer(lr=1e-3)
    for group in opt.param_groups:
        group["foreach"] = True  # CUDA's default; the CPU's is a loop over parameters
    for _ in range(2):  # the first step creates the state, the second is a steady one
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        kept = [*model.parameters(), *(p.grad for p in model.parameters()),
                *(t for s in opt.state.values() for t in s.values())]
        live = LiveBytes({t.untyped_storage().data_ptr() for t in kept})
        with live:
            opt.step()
    # sqrt(v), one parameter group at a time: memory.py counts all parameters, the decayed ones come close
    assert training_memory(config, 1, "ddp", compute_bytes=4)["after_backward"] == pytest.approx(live.peak, rel=0.01)


def test_checkpointing_keeps_less():
    for config in [Config(**TINY), *PAPER_MODELS.values()]:
        for r, a in [(4, 4), (4, 2), (2, 2)]:
            plain, ckpt = (activation_bytes(config, 8, 1024, g, r, a) for g in (False, True))
            assert ckpt[0] < plain[0] and ckpt[1] < plain[1]


def test_fsdp_shards_what_ddp_replicates():
    for config in PAPER_MODELS.values():
        single = training_memory(config, 1, "ddp")
        for n in (1, 2, 4, 8):
            fsdp, ddp = training_memory(config, n, "fsdp"), training_memory(config, n, "ddp")
            for k in ("weights", "grads", "optimizer"):
                assert fsdp[k] == single[k] // n
            assert ddp["weights"] == single["weights"] and ddp["optimizer"] == single["optimizer"]
            assert ddp["grads"] == single["grads"] * (2 if n > 1 else 1)  # + DDP's all-reduce buckets
            assert fsdp["total"] < ddp["total"] or n == 1


def test_table_has_every_combination():
    rows = [r.strip("| ").split(" | ") for r in memory_table().splitlines()[2:]]
    assert [tuple(r[:3]) for r in rows] == [(m, s, str(n)) for m in PAPER_MODELS for s in ("DDP", "FSDP2")
                                            for n in (1, 2, 4, 8)]
    assert all(len(r) == 13 and set(r[-3:]) <= {"yes", "ckpt", "no"} for r in rows)
    fits = {(r[0], r[1], r[2]): r[-3:] for r in rows}
    assert fits["0.5B", "FSDP2", "8"] == ["yes", "yes", "yes"] and fits["7B", "DDP", "8"] == ["no", "no", "no"]
