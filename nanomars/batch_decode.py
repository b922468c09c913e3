"""
Batched decoding in one call: each function builds the engine (engine.py) with one strategy
(strategies.py) and runs it. Every row returns exactly what decoding that prompt alone returns (tested).

    batch_decode    MARS, per-row tau (tau = 1 is exactly greedy AR); align / adaptive windows
    batch_ar        AR, the baseline (MARS with B = 1 decodes the same tokens, doing more work)
    batch_lossless  lossless MARS: the masks draft, AR verifies; exactly AR's output for any model
    batch_jacobi    Jacobi decoding of a plain AR model; exactly greedy AR
    BatchEngine     the same engine to step yourself: engine.step(), engine.tau[row] = x between steps

cache: "request" (per-request KV caches, the default), None (recompute everything each forward), or a
cache policy object such as compare.block_cache.BlockCache(16) (the block-level cache, a baseline).
"""
from .engine import PAD, BatchDecoded, Engine, NoCache, PerRequestCache, first_stop, forward_window, splice  # noqa: F401 (the engine's names, from here too)
from .strategies import AR, AdaptiveWindow, AlignedWindow, Jacobi, Lossless, MarsGate

def cache_policy(cache):
    """None, "request" or a policy object (anything with engine.PerRequestCache's methods) -> the policy."""
    if cache is None or cache == "request":
        return NoCache() if cache is None else PerRequestCache()
    if isinstance(cache, str) or not hasattr(cache, "commit"):
        raise ValueError(f"cache must be None, 'request' or a cache policy object, got {cache!r}")
    return cache


def BatchEngine(model, prompts, max_new_tokens, mask_id=None, block_size=4, tau=0.95, stop_ids=(),
                cache="request", metric="prob", temperature=0.0, top_k=None, seed=None,
                jacobi=False, lossless=False, align=False, adaptive=False):
    """An engine.Engine for the documented flags: MARS by default; jacobi (block_size is its window) or
    lossless instead; align / adaptive windows (MARS only). engine.tau[row] = x between steps changes a
    row's threshold."""
    special = [name for name, on in (("align", align), ("adaptive", adaptive), ("jacobi", jacobi),
                                     ("lossless", lossless)) if on]
    if len(special) > 1:
        raise ValueError(f"{' and '.join(special)} are different strategies: use one at a time")
    policy = cache_policy(cache)
    if jacobi:
        if temperature:
            raise ValueError("Jacobi decoding is greedy: it has no temperature")
        strategy = Jacobi(block_size)
    elif lossless:
        strategy = Lossless(mask_id, block_size, temperature, top_k, seed)
    else:
        window = AlignedWindow() if align else AdaptiveWindow() if adaptive else None
        strategy = MarsGate(mask_id, block_size, tau, metric, temperature, top_k, seed, window)
    engine = Engine(model, prompts, max_new_tokens, strategy, stop_ids, policy)
    engine.tau = getattr(strategy, "tau", None)  # the real-time knob: the gate's own per-row taus
    return engine


def batch_decode(model, prompts, max_new_tokens, mask_id, block_size=4, tau=0.95, stop_ids=(), **kw):
    """Batched MARS. tau: one float or one per prompt. kw: cache, metric, temperature,
    top_k, seed, align, adaptive (see BatchEngine)."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, block_size, tau, stop_ids, **kw).run()


def batch_ar(model, prompts, max_new_tokens, stop_ids=(), cache="request", temperature=0.0, top_k=None,
             seed=None):
    """Batched AR: greedy, or sampled with temperature/top_k/seed."""
    return Engine(model, prompts, max_new_tokens, AR(temperature, top_k, seed), stop_ids,
                  cache_policy(cache)).run()


def batch_lossless(model, prompts, max_new_tokens, mask_id, block_size=4, stop_ids=(), cache="request", **kw):
    """Lossless MARS: the masks draft, AR verifies (speculative decoding with the model as its own drafter).
    Greedy: exactly greedy AR's tokens for any model; sampled (temperature, top_k, seed): distributed
    exactly as AR sampling. kw: temperature, top_k, seed."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, block_size, 1.0, stop_ids, cache,
                       lossless=True, **kw).run()


def batch_jacobi(model, prompts, max_new_tokens, window=4, stop_ids=(), cache="request"):
    """Jacobi decoding of an AR model: each forward checks a window of guesses, accepts the converged
    prefix and takes the rest of its outputs as the next guesses. Exactly greedy AR's tokens."""
    return Engine(model, prompts, max_new_tokens, Jacobi(window), stop_ids, cache_policy(cache)).run()

