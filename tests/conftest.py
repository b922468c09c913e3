import copy
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tests' models are tiny: a second intra-op thread costs more in hand-offs than its half of a matmul saves,
# and on a busy machine it spins waiting for the other core (tests/test_lossless.py's fast tests, 2 cores under
# load: 11 s of CPU with one thread, 83 s with two). Processes the tests start get OMP_NUM_THREADS=1 likewise.
torch.set_num_threads(1)

from nanomars.masks import causal_mask  # noqa: E402
from nanomars.model import Config, Decoder, KVCache  # noqa: E402
from nanomars.compare.medusa import Medusa, medusa_loss  # noqa: E402
from nanomars.decode import sample, sampling_dist  # noqa: E402
from nanomars.dual_track import collate  # noqa: E402
from nanomars.util.tasks import held_out_split, train_examples  # noqa: E402


TRAINED = {"trained", "zero_heads", "medusa"}  # the fixtures that train a model (about a minute, once a session)


def pytest_configure(config):
    config.addinivalue_line("markers", "trained: needs a trained model fixture (also slow)")
    config.addinivalue_line("markers", "slow: starts processes that train or execute end to end (notebooks, the "
                            "experiment runners' --quick, train.py runs) or needs a trained model; "
                            "pytest -m 'not slow' is the fast loop")


def pytest_collection_modifyitems(items):
    for item in items:  # every test that requests a trained fixture is marked, so the fast loop skips it
        if TRAINED & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("trained"):
            item.add_marker("trained")
            item.add_marker("slow")


def random_model(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64, max_seq_len=128)
    model = Decoder(Config(**{**cfg, **overrides}))
    model.init_weights()
    return model.eval()


def constant_model(token, **overrides):
    """A decoder that predicts `token` whatever it is fed (its head: zero weights and a bias on `token`), so
    its greedy continuation is token, token, ..."""
    model = random_model(tie_embeddings=False, **overrides)
    head = torch.nn.Linear(model.config.n_embd, model.config.vocab_size)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token] = 5.0
    model.lm_head = head
    return model


def held_out_prompts(tok, n_per_family=1, greeting=False):
    """The user turns of the first n_per_family held-out examples of every task family, as prompt ids, family
    after family; greeting: then the one-word chat "Hi", a short prompt among the long ones."""
    prompts = [tok.prompt_ids(ex["messages"][:1]) for ex in held_out_split(n_per_family)]
    return prompts + [tok.prompt_ids("Hi")] if greeting else prompts


@torch.no_grad()
def assert_cache_is_a_fresh_prefill(model, cache, row, tokens):
    """Row `row` of a KVCache holds `tokens` and nothing else: its length is len(tokens) and its K/V up to
    there equal those of one causal forward over the tokens alone (no mask token's K/V kept, none missing)."""
    L = len(tokens)
    assert int(cache.lengths[row]) == L
    fresh = KVCache(model.config, 1, L, "cpu", cache.k.dtype)
    model(torch.tensor([tokens]), torch.arange(L)[None], causal_mask(L), fresh, torch.arange(L)[None])
    torch.testing.assert_close(cache.k[:, row, :, :L], fresh.k[:, 0])
    torch.testing.assert_close(cache.v[:, row, :, :L], fresh.v[:, 0])


@pytest.fixture(scope="session")
def tok():
    from nanomars.util.tokenizer import load_default_tokenizer
    return load_default_tokenizer()


def train_briefly(model, tok, seed, steps, loss):
    """A few AdamW steps (lr 3e-3, batch 32 drawn with the seed) on the default suite's examples;
    loss(model, step, x, response, targets) -> the step's loss. Returns the model in eval mode."""
    data = [tok.render(ex["messages"]) for ex in train_examples(2000, seed=seed)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        idx = torch.randint(len(data), (32,), generator=gen)
        x, response, targets = collate([data[i] for i in idx], 4, tok.eos_id)
        loss(model, step, x, response, targets).backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.fixture(scope="session")
def trained(tok):
    """A small model briefly trained (AR then MARS dual-track) on the default suite: confident enough
    that MARS accepts several tokens per forward, so decoding tests exercise multi-token spans."""
    from nanomars.dual_track import ar_loss, dual_track_loss
    torch.manual_seed(0)
    model = Decoder(Config(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                           intermediate_size=128, max_seq_len=256))
    model.init_weights()
    return train_briefly(model, tok, 0, 160, lambda m, step, x, response, targets: ar_loss(m, x, targets)
                         if step < 80 else dual_track_loss(m, x, response, targets, 4, tok.mask_id)[0])


# -------------------------------------------------------------------------------- the engine's parts
def _policies():
    from nanomars.compare.block_cache import BlockCache
    from nanomars.engine import NoCache, PerRequestCache
    return {"request": PerRequestCache, "none": NoCache, "block": lambda: BlockCache(4)}


POLICIES = _policies()  # the cache policies a strategy is tested under


def decode(model, prompts, n, strategy, stop_ids=(), policy="request"):
    """Run one strategy in the engine under a named cache policy."""
    from nanomars.engine import Engine
    return Engine(model, prompts, n, strategy, stop_ids, POLICIES[policy]()).run()


def tokens(out):
    return [r.tokens for r in out.rows]


def spans(out):
    return [r.spans for r in out.rows]


# ------------------------------------------------------------------ Medusa heads (test_medusa, test_tree, test_bench)
def random_heads(base, K, seed=0):
    """A Medusa on `base` whose K heads have random weights (not the zero start): drafts of all kinds."""
    medusa = Medusa(copy.deepcopy(base), K)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in medusa.heads:
            w.weight.copy_(torch.randn(w.weight.shape, generator=gen))
            w.bias.copy_(torch.randn(w.bias.shape, generator=gen))
    return medusa.eval()


def batches(tok, n_steps, seed):
    data = [tok.render(ex["messages"]) for ex in train_examples(2000, seed=seed)]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n_steps):
        idx = torch.randint(len(data), (32,), generator=gen)
        yield collate([data[i] for i in idx], 4, tok.eos_id)


@pytest.fixture(scope="session")
def zero_heads(trained):
    """K = 3 heads as train.py starts them (zero) on a copy of the session's trained model."""
    return Medusa(copy.deepcopy(trained), 3).eval()


@pytest.fixture(scope="session")
def medusa(tok, zero_heads):
    """Those heads trained 150 steps (batch 32, lr 3e-3)."""
    model = copy.deepcopy(zero_heads).train()
    opt = model.configure_optimizer(3e-3)
    for x, _, targets in batches(tok, 150, seed=2):
        medusa_loss(model, x, targets, 3)[0].backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


# ------------------------------------------------------- helpers several test files share (not tests)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--n_kv_head", "1", "--intermediate_size", "64",
        "--batch_size", "4", "--n_train", "200", "--eval_interval", "3", "--eval_batches", "1", "--device", "cpu"]


def run_train(args, launcher=(sys.executable,)):
    """python train.py ARGS from the repo root, one thread; its stdout (a failure shows its output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*launcher, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def small_vocab_model(seed=0):
    """Vocabulary of 8 (id 7 is the mask), untied head: the masks' guesses are sometimes right, so drafts
    get kept, cut and rejected. (A tied random model only ever drafts its mask id: nothing is kept.)"""
    return random_model(seed=seed, vocab_size=8, tie_embeddings=False)


PROMPTS = [[5, 17, 3, 44, 2], [7], list(range(10, 50)), [1, 2, 3, 4, 5, 6, 7, 8, 9]]  # for random_model (vocab 97)
SMALL_PROMPTS = [[1, 2, 3], [5], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3], [4, 4]]


V, K = 8, 3  # vocabulary, generated tokens whose joint distribution is tested (V**K = 512 outcomes)
N_SAMPLES = 6000


@torch.no_grad()
def exact_ar_distribution(model, prompt, temperature, top_k):
    """P(x1, x2, x3) of AR sampling, by enumeration with full causal forwards: (V**K,)."""
    P = len(prompt)
    seqs = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])  # (V*V, P+2)
    logits = model(seqs, torch.arange(P + 2)[None].expand(V * V, -1), causal_mask(P + 2)) / temperature
    if top_k is not None:
        kth = logits.sort(-1, descending=True).values[..., top_k - 1:top_k]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = logits.softmax(-1)
    p1, p2, p3 = p[0, P - 1], p[::V, P], p[:, P + 1].view(V, V, V)  # x1; x2 | x1; x3 | x1, x2
    return (p1[:, None, None] * p2[:, :, None] * p3).flatten()


def chi_square_pvalue(out, expected):
    """Pearson's chi-square of the rows' first K tokens against `expected`; outcomes expected fewer than
    5 times are pooled into one cell. Returns the p-value."""
    t = torch.tensor([r.tokens[:K] for r in out.rows])
    observed = torch.bincount(t[:, 0] * V * V + t[:, 1] * V + t[:, 2], minlength=V ** K).double()
    expected = expected.double() * len(t)
    rare = expected < 5
    observed = torch.cat([observed[~rare], observed[rare].sum()[None]])
    expected = torch.cat([expected[~rare], expected[rare].sum()[None]])
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor((len(expected) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))  # the chi-square survival function


def keep_every_draft(draft, n_draft, logits, q, temperature, top_k, generator):
    """WRONG: no verification: every draft token is kept, then AR's bonus after them."""
    p = sampling_dist(logits, temperature, top_k)  # (n, D+1, V)
    bonus = sample(p.gather(1, n_draft[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0], generator)
    return torch.cat([draft, draft[:, :1]], 1).scatter(1, n_draft[:, None], bonus[:, None]), n_draft


def replace_from_p(draft, n_draft, logits, q, temperature, top_k, generator):
    """WRONG, subtly: the right acceptance test min(1, p/q), but a rejected token is replaced by a sample
    of p instead of the residual max(0, p - q)."""
    D = draft.shape[1]
    p = sampling_dist(logits, temperature, top_k)
    px = p[:, :D].gather(-1, draft[..., None])[..., 0]
    qx = q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(px.shape, generator=generator)
    a = ((torch.arange(D) < n_draft[:, None]) & (u * qx < px)).long().cumprod(1).sum(1)
    p_a = p.gather(1, a[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
    return torch.cat([draft, draft[:, :1]], 1).scatter(1, a[:, None], sample(p_a, generator)[:, None]), a


def path(parents, f):
    """Fed token f's ancestors and itself, root to f."""
    out = [f]
    while parents[out[-1]] >= 0:
        out.append(int(parents[out[-1]]))
    return out[::-1]
