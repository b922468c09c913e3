"""
Per-GPU memory of MARS training, from the model's shape alone: which Qwen2.5 size trains on which card.
  python -m nanomars.scale.memory        # prints the README's table
"""
from ..model import Config

GiB = 2 ** 30
PAPER_MODELS = {  # Qwen2.5 shapes, from each model's config.json (all have q/k/v biases)
    name: Config(vocab_size=V, n_layer=L, n_head=nh, n_kv_head=nkv, n_embd=C, intermediate_size=I,
                 max_seq_len=32768, rope_theta=1e6, tie_embeddings=tied)
    for name, V, L, nh, nkv, C, I, tied in [("0.5B", 151936, 24, 14, 2, 896, 4864, True),
                                            ("1.5B", 151936, 28, 12, 2, 1536, 8960, True),
                                            ("3B", 151936, 36, 16, 2, 2048, 11008, True),
                                            ("7B", 152064, 28, 28, 4, 3584, 18944, False)]
}


def num_params(c: Config):
    """Decoder(c).num_params(), counted without building the model."""
    kv = c.n_kv_head * (c.n_embd // c.n_head)  # width of k and of v
    attn = 2 * c.n_embd * c.n_embd + 2 * c.n_embd * kv + (c.n_embd + 2 * kv) * c.qkv_bias
    block = attn + 3 * c.n_embd * c.intermediate_size + 2 * c.n_embd  # + MLP + two RMSNorm weights
    return c.n_layer * block + c.n_embd + c.vocab_size * c.n_embd * (1 if c.tie_embeddings else 2)


def activation_bytes(c: Config, micro_batch, seq_len, grad_checkpointing, residual_bytes, compute_bytes,
                     loss_chunk=2 ** 26):
    """(saved, peak) for one forward + backward of dual_track_loss over seq_len = 2L tokens: the bytes
    autograd saves, and the most alive at once (saved + the largest transient). residual_bytes: the
    residual stream, norm outputs, RoPE tables; compute_bytes: what the Linears and SDPA produce;
    loss_chunk: Decoder.loss_chunk. Every output is taken to have a target (K = N * 2L): the most."""
    N, T, C, V, I, L = micro_batch, seq_len, c.n_embd, c.vocab_size, c.intermediate_size, c.n_layer
    r, a, hs, rep = residual_bytes, compute_bytes, C // c.n_head, c.n_head // c.n_kv_head
    kv, K = c.n_kv_head * hs, N * T
    casts = a != r  # autocast casts a norm output once per Linear reading it, and each copy is saved
    # per token, per block: 2 RMSNorms (fp32 input and rstd, normalised x) | q/k/v input(s) | SDPA's q, k, v,
    # output, fp32 logsumexp (a fused kernel: no (T, T) scores) | o_proj's input (a copy) | gate/up
    # input(s) | gate, silu, up, their product
    per_layer = (2 * (4 * C + 4 + r * C) + (3 if casts else 1) * a * C + 2 * a * C + 2 * a * kv + 4 * c.n_head
                 + a * C + (2 if casts else 1) * a * C + 4 * a * I)
    mask_bias = a * rep * T * T  # SDPA turns the (rep * 2L, 2L) tiled bool mask into an additive one
    # per token: ids (int64), the keep mask, RoPE cos and sin shared by all layers; per kept output: its
    # gathered fp32 state, the final norm (rstd, normalised x, output = the loss chunks' input), its int64
    # target, two bools (clean or noisy). No logits: each loss chunk is checkpointed.
    head = N * T * (8 + 1 + 2 * hs * r) + K * (4 * C + 4 + 2 * r * C + 8 + 2)
    if grad_checkpointing:  # each block keeps only its input (and the bool mask); backward recomputes one
        saved = L * N * T * r * C + T * T + head  # block at a time, which then saves all of its tensors
    else:
        saved = L * (N * T * per_layer + mask_bias) + head
    # Transients, as measured on CPU. At the head, in backward: a loss chunk of `rows` outputs holds fp32
    # log-probs and two gradients of them; lm_head's a-byte weight gradient is summed over the chunks (old
    # sum, new one, their sum). In a block (the head's tensors gone): a weight gradient (+ its fp32 copy
    # under autocast), the gradients flowing through, under checkpointing the block's recomputed tensors,
    # and a tied lm_head's gradient, waiting to be summed with the embedding's at the very end.
    rows = max(1, min(K, loss_chunk // V))
    summed = K > rows
    at_head = max(3 * 4 * rows * V + summed * a * V * C, (1 + 2 * summed) * a * V * C)
    in_block = ((a + 4 * casts) * C * I + N * T * (a * I + r * C) + c.tie_embeddings * r * V * C
                + (N * T * per_layer + mask_bias if grad_checkpointing else 0))
    at_embedding = (3 if c.tie_embeddings else 1) * r * V * C
    return saved, max(saved + at_head, saved - head + in_block, at_embedding)


def training_memory(c: Config, n_gpus=1, strategy="ddp", micro_batch=8, seq_len=1024, grad_checkpointing=False,
                    compute_bytes=2, loss_chunk=2 ** 26):
    """Per-GPU bytes of one MARS training step as train.py runs it: fp32 master weights, AdamW's two fp32
    moments, bf16 compute (compute_bytes=4: all fp32). A dict: weights, grads, optimizer, bf16 (compute
    copies of the weights), activations (saved tensors + transients, at their peak), after_backward (the
    largest transient once activations are freed), total = the first three + max(bf16 + activations,
    after_backward).
      ddp:  all on every GPU; n_gpus=1 is plain train.py. Autocast keeps a bf16 copy of each Linear
            weight through the forward; embedding, norms, residual stream and RoPE stay fp32. n_gpus > 1
            adds DDP's all-reduce buckets, one more fp32 gradient (gradient_as_bucket_view=False).
      fsdp: FSDP2, fully_shard on each block and on the root, MixedPrecisionPolicy(param_dtype=bf16,
            reduce_dtype=fp32): weights, grads, AdamW state split n_gpus ways; resident bf16 params of
            the root (embedding, lm_head: not resharded) and of two blocks (this one, the prefetched
            next); an all-bf16 forward (as Decoder.to(bfloat16)). A unit's bf16 gradients and their fp32
            reduce-scatter input are alive together at its post-backward (the root's comes last).
    The optimizer step (foreach AdamW, CUDA's default) allocates sqrt(v): 4 bytes per (sharded) parameter.
    Approximate: a fused SDPA kernel (memory-efficient / cuDNN; the math fallback would add the fp32
    scores, 4 * n_head * (2L)^2 bytes per layer and sequence); under DDP bf16 + activations errs high, up
    to the smaller of the two, as autocast frees some weight copies before backward's peak. Not counted:
    CUDA context, NCCL buffers, allocator fragmentation, the AdamW step counters (on the CPU)."""
    a = compute_bytes
    r = 4 if strategy == "ddp" else a  # the residual stream's dtype: the embedding weight's
    C, V, L = c.n_embd, c.vocab_size, c.n_layer
    kv = c.n_kv_head * (C // c.n_head)
    P, shard = num_params(c), (n_gpus if strategy == "fsdp" else 1)
    P_root = C + V * C * (1 if c.tie_embeddings else 2)  # final norm, embedding, lm_head
    P_block = (P - P_root) // L
    saved, activations = activation_bytes(c, micro_batch, seq_len, grad_checkpointing, r, a, loss_chunk)
    after_backward = 4 * P // shard  # the optimizer step's sqrt(v)
    if strategy == "ddp":
        P_linear = L * (P_block - 2 * C - (C + 2 * kv) * c.qkv_bias) + V * C  # lm_head is cast when tied too
        bf16 = a * P_linear * (a < 4)
    else:
        bf16 = a * (P_root + 2 * P_block)
        activations = max(activations, saved + (a + 4) * P_block)
        after_backward = max(after_backward, (a + 4) * P_root)
    mem = {"weights": 4 * P // shard, "grads": 4 * P // shard + (4 * P if strategy == "ddp" and n_gpus > 1 else 0),
           "optimizer": 8 * P // shard, "bf16": bf16, "activations": activations, "after_backward": after_backward}
    mem["total"] = mem["weights"] + mem["grads"] + mem["optimizer"] + max(bf16 + activations, after_backward)
    return mem


CARDS_GIB = (24, 80, 141)
HEADROOM = 0.9  # usable share of a card: the CUDA context, NCCL and fragmentation take the rest


def memory_table(micro_batch=8, seq_len=1024):
    """The README's markdown table, in GiB: Qwen2.5 0.5B..7B x DDP / FSDP2 x 1, 2, 4, 8 GPUs, without /
    with gradient checkpointing, and whether it fits a card: yes, only with checkpointing (ckpt), or no."""
    out = ["| model | strategy | GPUs | weights | grads | AdamW | bf16 | activations | after bwd | total | "
           + " | ".join(f"{g} GB" for g in CARDS_GIB) + " |", "|" + " --- |" * (10 + len(CARDS_GIB))]
    for name, c in PAPER_MODELS.items():
        for strategy in ("ddp", "fsdp"):
            for n in (1, 2, 4, 8):
                plain, ckpt = (training_memory(c, n, strategy, micro_batch, seq_len, g) for g in (False, True))
                fits = ["yes" if plain["total"] <= HEADROOM * g * GiB else
                        "ckpt" if ckpt["total"] <= HEADROOM * g * GiB else "no" for g in CARDS_GIB]
                cell = {k: f"{plain[k] / GiB:.1f}" + (f" / {ckpt[k] / GiB:.1f}" if k in ("activations", "total")
                                                      else "") for k in plain}  # in the header's order
                row = [name, "DDP" if strategy == "ddp" else "FSDP2", str(n), *cell.values(), *fits]
                out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(memory_table())
