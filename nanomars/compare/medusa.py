"""
Medusa-style heads (Cai et al. 2024, Medusa-1): the peer of MARS that adds parameters. K small heads sit
on a FROZEN base model; head k (k = 1..K) reads the base's last hidden state h_t (its final-norm output,
what its lm_head reads) and predicts the token k places after the next one, x_{t+1+k} (the base's own
lm_head predicts x_{t+1}):

    head_k(h) = lm_head(h + SiLU(W_k h + b_k))       W_k: (C, C), b_k: (C,); lm_head: the base's, shared

W_k and b_k start at zero, so every head starts as the base's own next-token head (SiLU(0) = 0). Only they
train (train.py --stage medusa: loss sum_k 0.8^k CE(head_k, x_{t+1+k}) over response targets, Medusa's
decaying weights): K x (C^2 + C) parameters, 49,536 for the default model (C = 128, K = 3, train.py's default --medusa_heads = block_size-1). Medusa
itself gives each head its own copy of the lm_head to train (K x V x C more: 394,752 for the default
model's V = 1028); sharing the frozen one is the cheaper variant, the one built here.

How the heads get h, with no Medusa branch in the engine: the Medusa strategies say reads_hidden (the
engine's Strategy interface), so the engine reads the model's final-norm outputs (model.hidden) and
hands them to accept() beside the logits it computes from them (model.lm_head). The strategy applies the
heads at the one column per row where it needs them (K lm_head rows per row and forward, not K at every
column).

Decoding, as strategies of the engine (engine.py), on the Medusa itself:
Engine(medusa, prompts, n, MedusaHeads(medusa)).run().
    MedusaHeads  verified: the heads' tokens at the last accepted fed token are the next draft, fed as
                 real tokens and verified by the base (speculative.Verified): greedy (each head's top-1),
                 exactly greedy AR; sampled (temperature, top_k, seed: the draft drawn from the heads'
                 sampling_dist), distributed exactly as AR sampling, by verify_draft's rule
    MedusaGate   MARS's tau gate with the heads in place of the masks: a head's token is accepted without
                 verification while its probability >= tau. NOT exact for tau < 1 (tau = 1: greedy AR).
                 Greedy only
MedusaTree (below) verifies a tree of each head's top choices with tree attention, as Medusa does.
Greedy only (as tree.py's trees).

The checkpoint: train.py writes out/medusa.pt with checkpoint.save_checkpoint (atomic): the base's and the
heads' weights ('base.*', 'heads.*'), the base's config, the step and the run's arguments (init_from: the
base it started from, None for out_dir/ar.pt). load_medusa reads it with weights_only=True.
"""
import os
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..util.checkpoint import load_model
from ..decode import check_tau, gate, n_accepted, next_tokens, propose, sample, sampling_dist
from ..engine import Accepted, Fed, Strategy
from ..dual_track import IGNORE, OBJECTIVES, STARTS, reduce_loss
from ..masks import causal_mask
from ..model import Config, Decoder, chunked_cross_entropy
from .speculative import Verified
from .tree import best_tree, check_policy, verify_tree
from ..util.tokenizer import load_default_tokenizer

DECAY = 0.8  # head k's loss weight is DECAY^k (Medusa-1's lambda_k)


class Medusa(nn.Module):
    """A frozen base Decoder (frozen in place) and K heads. forward takes Decoder.forward's arguments and
    returns the base's float32 logits at the kept outputs; with targets, the heads' cross-entropies
    (training, see forward). hidden and lm_head as Decoder's."""

    def __init__(self, base, n_heads):
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"need n_heads >= 1, got {n_heads}")
        C = base.config.n_embd
        self.base = base.requires_grad_(False)
        self.heads = nn.ModuleList(nn.Linear(C, C) for _ in range(n_heads))  # W_k, b_k
        for w in self.heads:  # zero: each head starts as the base's next-token head
            nn.init.zeros_(w.weight)
            nn.init.zeros_(w.bias)
        self.config = base.config  # the engine reads the context, vocabulary and cache shape off it

    @property
    def embed(self):  # the engine reads the device and dtype off it
        return self.base.embed

    @property
    def n_heads(self):
        return len(self.heads)

    def extra_params(self):
        """What the heads add to the base: K x (C^2 + C)."""
        return sum(p.numel() for p in self.heads.parameters())

    def num_params(self):
        return self.base.num_params() + self.extra_params()

    def residual(self, h):
        """h (..., C) -> (..., K, C): what each head feeds the shared lm_head, h + SiLU(W_k h + b_k)."""
        return torch.stack([h + F.silu(w(h)) for w in self.heads], -2)

    def head_logits(self, h):
        """h (..., C) -> float32 logits (..., K, V): row k-1 is head k's, for the token k after the next."""
        return self.base.lm_head(self.residual(h)).float()

    @property
    def lm_head(self):  # the base's (the engine computes logits from hidden with it)
        return self.base.lm_head

    def hidden(self, idx, pos, mask, cache=None, slots=None, keep=None):
        """The frozen base's final-norm outputs at the kept positions (Decoder.hidden)."""
        with torch.no_grad():  # the base is frozen: nothing of it is kept for backward
            return self.base.hidden(idx, pos, mask, cache, slots, keep)

    def forward(self, idx, pos, mask, cache=None, slots=None, keep=None, targets=None):
        """The base's float32 logits; with targets (K, n), head k's target ids at the n kept outputs (keep:
        an (N, T) bool tensor), IGNORE where it has none: the heads' float32 cross-entropies (K, n), 0
        where ignored."""
        h = self.hidden(idx, pos, mask, cache, slots, keep)
        if targets is None:
            return self.base.lm_head(h).float()
        z = self.residual(h)  # (n, K, C)
        W = self.base.lm_head.weight
        return torch.stack([chunked_cross_entropy(z[:, k], W, t, self.base.loss_chunk) for k, t in enumerate(targets)])

    def configure_optimizer(self, lr, weight_decay=0.01, betas=(0.9, 0.95)):
        """AdamW over the heads only: the matrices decay, the biases do not."""
        return torch.optim.AdamW([{"params": [w.weight for w in self.heads], "weight_decay": weight_decay},
                                  {"params": [w.bias for w in self.heads], "weight_decay": 0.0}], lr=lr, betas=betas)


# ------------------------------------------------------------------------------------------- training
def head_targets(targets, K):
    """(K, N, L): head k's target at output t is x_{t+1+k} where that is a response token, i.e. the
    next-token target k outputs later (targets (N, L) from dual_track.collate), IGNORE past the end."""
    return torch.stack([F.pad(targets[:, k:], (0, k), value=IGNORE) for k in range(1, K + 1)])


def medusa_loss(model, x, targets, K, loss_norm="token"):
    """Medusa-1's loss: sum_k 0.8^k CE_k, CE_k = head k's cross-entropy over its targets, reduced as
    dual_track.reduce_loss does (loss_norm). model: a Medusa with K heads (or DDP around one).
    Returns (loss, (K,) the CE_k, detached)."""
    N, L = x.shape
    t = head_targets(targets, K)  # (K, N, L)
    keep = (t != IGNORE).any(0)  # (N, L) the outputs where some head has a target
    pos = torch.arange(L, device=x.device).expand(N, L)
    t = t[:, keep]  # (K, n)
    ce = model(x, pos, causal_mask(L, device=x.device), keep=keep, targets=t)  # (K, n)
    rows = keep.nonzero()[:, 0]  # (n,) each kept output's example (row-major, as keep selects)
    per_head = torch.stack([reduce_loss(ce[k][t[k] != IGNORE], rows[t[k] != IGNORE], N, loss_norm)
                            for k in range(K)])
    weights = torch.tensor([DECAY ** k for k in range(1, K + 1)], device=x.device)
    return (weights * per_head).sum(), per_head.detach()


def medusa_objective(args, mask_id):
    """train.py --stage medusa's objective (dual_track.OBJECTIVES explains objectives): medusa_loss with
    --medusa_heads heads."""
    K, loss_norm = args.medusa_heads, args.loss_norm
    def heads(model, x, response, targets, offsets, gen):
        loss, per_head = medusa_loss(model, x, targets, K, loss_norm)
        return loss, {f"head{k + 1}": ce for k, ce in enumerate(per_head)}
    return (f"Medusa-1, {K} heads on the frozen base, only they train (K x (C^2 + C) parameters; loss sum_k "
            f"{DECAY}^k CE(head k, x_(t+1+k))), loss_norm {loss_norm}"), heads


def medusa_start(args, init_from):
    """Where train.py --stage medusa starts (dual_track.STARTS), as its load_start returns it: (model,
    tokenizer, hf_folder, step, what restore loads). Fresh: the model at init_from (default out_dir/ar.pt),
    frozen, and --medusa_heads zero heads; --resume: out_dir/medusa.pt and its AdamW state."""
    K = args.medusa_heads
    if args.resume:
        medusa, tok, ckpt = load_medusa(os.path.join(args.out_dir, "medusa.pt"), args.device)
        if medusa.n_heads != K:
            raise ValueError(f"{args.out_dir}/medusa.pt has {medusa.n_heads} heads, this run trains {K} "
                             f"(--medusa_heads, default block_size-1): resume with --medusa_heads {medusa.n_heads}")
        return medusa, tok, None, ckpt["step"], ckpt["optimizer"]
    base, tok, _, ckpt = load_model(init_from, args.device, torch.float32)
    if ckpt is None or ckpt["args"].get("hf_folder"):
        raise ValueError(f"--stage medusa trains heads on a nanoMARS checkpoint with the built-in tokenizer; "
                         f"{init_from} is (or was fine-tuned from) a Hugging Face folder")
    return Medusa(base, K), tok, None, 0, None


def load_medusa(path, device="cpu"):
    """out/medusa.pt (train.py --stage medusa) -> (Medusa in eval mode, tokenizer, checkpoint dict).
    Every problem is one FileNotFoundError / ValueError naming the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no Medusa checkpoint at {path}: train the heads first (python train.py "
                                "--stage medusa)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"cannot read checkpoint {path} ({type(e).__name__}): the file is truncated or not a "
                         "torch checkpoint") from None
    state = ckpt.get("model", {}) if isinstance(ckpt, dict) else {}
    K = sum(1 for k in state if re.fullmatch(r"heads\.\d+\.weight", k))
    if not K or "config" not in ckpt:
        raise ValueError(f"{path} holds no Medusa heads: not a checkpoint of train.py --stage medusa")
    medusa = Medusa(Decoder(Config.from_dict(ckpt["config"])), K)
    medusa.load_state_dict(state)  # strict: a missing or unexpected weight is an error
    return medusa.to(device).eval(), load_default_tokenizer(), ckpt


OBJECTIVES["medusa"] = medusa_objective
STARTS["medusa"] = medusa_start


# ------------------------------------------------------------------------------------------- decoding
def check_engine(eng, medusa):
    if eng.model is not medusa:
        raise ValueError("a Medusa strategy reads the hidden states its Medusa returns: run the engine on "
                         "that Medusa, Engine(medusa, prompts, ..., MedusaHeads(medusa))")


class MedusaHeads(Verified):
    """Medusa decoding, verified: the output is the base's AR output (greedy: token for token; sampled:
    in distribution). Each forward feeds [pending | draft] and keeps the draft's prefix the base agrees
    with, plus the base's own next token (speculative.Verified). That token is the base's output at the
    last accepted fed token (the last pending token when nothing of the draft was kept, else the last kept
    draft token), so the heads at that same column propose the K tokens after it: the next draft, always K
    tokens (none before the first forward)."""
    rows = Verified.rows + ("draft", "n_draft", "q")
    reads_hidden = True

    def __init__(self, medusa, temperature=0.0, top_k=None, seed=None):
        super().__init__(medusa.n_heads, temperature, top_k, seed)
        self.medusa = medusa

    def start(self, eng):
        check_engine(eng, self.medusa)
        super().start(eng)
        n, K, V = len(eng.active), self.medusa.n_heads, eng.model.config.vocab_size
        self.draft, self.n_draft = eng.pending.new_zeros((n, K)), torch.zeros_like(eng.n_pend)  # none yet
        self.q = torch.zeros(n, K, V, device=eng.dev) if self.temperature > 0 else None  # (n, K, V) sampling

    def feed(self, eng):
        return Fed(self.draft, self.n_draft)

    def accept(self, eng, logits, hidden):
        """logits (n, K+1, V) the base's, hidden (n, K+1, C) what the heads read."""
        out = super().accept(eng, logits, hidden)
        last = hidden.gather(1, out.verified[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (n, C)
        heads = self.medusa.head_logits(last)  # (n, K, V) at column `verified`, the base's last output
        if self.temperature == 0:
            self.draft, self.q = next_tokens(heads), None  # (n, K) each head's top-1
        else:
            self.q = sampling_dist(heads, self.temperature, self.top_k)
            self.draft = sample(self.q, self.gen)
        self.n_draft = torch.full_like(self.n_draft, self.medusa.n_heads)
        return out


class MedusaGate(Strategy):
    """MARS's tau gate with the heads in place of the masks, NOT exact for tau < 1: each forward feeds
    only the pending tokens; at the last one the base proposes the next token (AR's, always accepted) and
    head k the k-th after it, accepted in order while its probability >= tau (decode.gate, metric prob,
    as MarsGate). Nothing is verified: an accepted head token AR would not have chosen changes the text.
    tau = 1: one token per forward, exactly greedy AR. Greedy only."""
    reads_hidden = True

    def __init__(self, medusa, tau=0.95):
        check_tau(tau)
        self.medusa, self.tau, self.ahead, self.width = medusa, tau, 1, 1

    def start(self, eng):
        check_engine(eng, self.medusa)

    def feed(self, eng):
        return Fed(eng.pending[:, :0], torch.zeros_like(eng.n_pend))  # nothing after the pending tokens

    def accept(self, eng, logits, hidden):
        """logits (n, 1, V), hidden (n, 1, C) at each row's last pending token."""
        y, p = propose(torch.cat([logits, self.medusa.head_logits(hidden[:, 0])], 1))  # (n, K+1), (n, K+1, V)
        n_acc = n_accepted(gate(p, y, self.tau))
        return Accepted(y, n_acc, torch.zeros_like(n_acc), torch.full_like(n_acc, self.medusa.n_heads + 1))


class MedusaTree(Strategy):
    """The same tree verification for Medusa's heads (medusa.py), greedy: exactly greedy AR of the base.
    The tree is best_tree of the K heads' outputs (head k's top_k candidates at depth k) read at the kept
    path's last node, where the base's output is the token just taken, so head k's token is the k-th
    after it (MedusaHeads reads them there too, and keeps only their top-1 chain). Nothing but the
    nodes is fed: the heads read the hidden state of a node already there. Nothing before the first
    forward. nodes, top_k: as TreeLossless's. Runs with the per-request cache or none."""
    rows = ("tokens", "up")
    reads_hidden = True

    def __init__(self, medusa, nodes=8, top_k=3):
        if nodes < 1 or top_k < 1:
            raise ValueError(f"need nodes >= 1 and top_k >= 1, got {nodes}, {top_k}")
        K = medusa.n_heads
        N = min(nodes, sum(top_k ** d for d in range(1, K + 1)))  # at most (fewer when V < top_k)
        self.medusa, self.nodes, self.top_k = medusa, nodes, top_k
        self.ahead, self.width = K + 1, 1 + N  # nodes reach depth K

    def start(self, eng):
        check_engine(eng, self.medusa)
        check_policy(eng)
        none = eng.pending.new_zeros(len(eng.active), 0)  # tokens (n, N) and parents (n, N)
        self.tokens, self.up = none, none

    def feed(self, eng):
        parents = self.up if self.up.shape[1] else None  # a tree (none before the first forward)
        return Fed(self.tokens, torch.full_like(eng.n_pend, self.tokens.shape[1]), parents)

    def accept(self, eng, logits, hidden):
        """logits (n, width, V) the base's from the root on, hidden (n, width, C) what the heads read."""
        N = self.tokens.shape[1]
        y, n_kept, end = verify_tree(eng, self.tokens, self.up, logits[:, :N + 1], self.medusa.n_heads)
        last = hidden.gather(1, end[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (n, C) path's end
        self.tokens, self.up = best_tree(self.medusa.head_logits(last), self.nodes, self.top_k)
        return Accepted(y, n_kept + 1, n_kept, torch.full_like(n_kept, N + 1))
