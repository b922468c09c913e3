"""
Batched decoding in one call. Every decoder is a strategy run by the engine (engine.py), one way in:

    Engine(model, prompts, max_new_tokens, strategy, stop_ids, cache).run()

with MARS's strategies from strategies.py or a peer's from compare/ (PromptLookup, DraftModel,
MedusaHeads, TreeLossless, ...); a strategy takes its own settings, sampling included (temperature,
top_k, seed), in its constructor. The functions below are that call for MARS's own decoders. Every row
returns exactly what decoding that prompt alone returns (tested).

    batch_decode    MARS, per-row tau (tau = 1 is exactly greedy AR); window=<a window policy object>
                    (align=True, adaptive=True: the built-in ones)
    batch_ar        AR, the baseline (MARS with B = 1 decodes the same tokens, doing more work)
    batch_lossless  lossless MARS: the masks draft, AR verifies; exactly AR's output for any model
    batch_jacobi    Jacobi decoding of a plain AR model; exactly greedy AR
    mars_engine     batch_decode's engine, to step yourself: engine.step(), engine.set_tau(row, x)
                    between steps (BatchEngine: its earlier name)

cache: "request" (per-request KV caches, the default), None (recompute everything each forward), or a
cache policy object such as compare.block_cache.BlockCache(16) (the block-level cache, a baseline).
"""
from .engine import PAD, BatchDecoded, Engine, NoCache, PerRequestCache, cache_policy, first_stop, forward_window, splice  # noqa: F401 (the engine's names, from here too)
from .strategies import AR, AdaptiveWindow, AlignedWindow, Jacobi, Lossless, MarsGate


def mars_engine(model, prompts, max_new_tokens, mask_id=None, block_size=4, tau=0.95, stop_ids=(),
                cache="request", metric="prob", temperature=0.0, top_k=None, seed=None, window=None, align=False,
                adaptive=False):
    """An Engine running MARS's gate (MarsGate). window: a window policy object (strategies.FixedWindow,
    the default; AlignedWindow; AdaptiveWindow; or your own: __call__(gate, engine) -> proposals per row,
    update(gate, accepted)); align=True and adaptive=True are shorthands for the two built-in ones."""
    if sum(map(bool, (window, align, adaptive))) > 1:
        raise ValueError("window, align and adaptive each choose the window: give one of them")
    window = window or (AlignedWindow() if align else AdaptiveWindow() if adaptive else None)
    strategy = MarsGate(mask_id, block_size, tau, metric, temperature, top_k, seed, window)
    return Engine(model, prompts, max_new_tokens, strategy, stop_ids, cache)


BatchEngine = mars_engine  # the earlier name, kept for code that uses it


def batch_decode(model, prompts, max_new_tokens, mask_id, block_size=4, tau=0.95, stop_ids=(), **kw):
    """Batched MARS. tau: one float or one per prompt. kw: cache, metric, temperature, top_k, seed, window
    (a window policy object), align, adaptive (see mars_engine)."""
    return mars_engine(model, prompts, max_new_tokens, mask_id, block_size, tau, stop_ids, **kw).run()


def batch_ar(model, prompts, max_new_tokens, stop_ids=(), cache="request", temperature=0.0, top_k=None,
             seed=None):
    """Batched AR: greedy, or sampled with temperature/top_k/seed."""
    return Engine(model, prompts, max_new_tokens, AR(temperature, top_k, seed), stop_ids, cache).run()


def batch_lossless(model, prompts, max_new_tokens, mask_id, block_size=4, stop_ids=(), cache="request",
                   temperature=0.0, top_k=None, seed=None):
    """Lossless MARS: the masks draft, AR verifies (speculative decoding with the model as its own drafter).
    Greedy: exactly greedy AR's tokens for any model; sampled (temperature, top_k, seed): distributed
    exactly as AR sampling."""
    strategy = Lossless(mask_id, block_size, temperature, top_k, seed)
    return Engine(model, prompts, max_new_tokens, strategy, stop_ids, cache).run()


def batch_jacobi(model, prompts, max_new_tokens, window=4, stop_ids=(), cache="request"):
    """Jacobi decoding of an AR model: each forward checks a window of guesses, accepts the converged
    prefix and takes the rest of its outputs as the next guesses. Exactly greedy AR's tokens."""
    return Engine(model, prompts, max_new_tokens, Jacobi(window), stop_ids, cache).run()
