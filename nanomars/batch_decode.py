"""
Batched decoding in one call: each function builds the engine (engine.py) with one strategy
(strategies.py) and runs it. Every row returns exactly what decoding that prompt alone returns (tested).

    batch_decode    MARS, per-row tau (tau = 1 is exactly greedy AR); align / adaptive windows
    batch_ar        AR, the baseline (MARS with B = 1 decodes the same tokens, doing more work)
    batch_lossless  lossless MARS: the masks draft, AR verifies; exactly AR's output for any model
    batch_jacobi    Jacobi decoding of a plain AR model; exactly greedy AR
    batch_paper_block   the released block sampler (baselines.py), for comparison with the paper
    BatchEngine     the same engine to step yourself: engine.step(), engine.tau[row] = x between steps

cache: "request" (per-request KV caches, the default), None (recompute everything each forward), or
"block" (nanoMARS's block-level cache with cache_block tokens per block, baselines.BlockCache).
"""
from .baselines import BlockCache, PaperBlockEngine
from .engine import PAD, BatchDecoded, Engine, NoCache, PerRequestCache, first_stop, forward_window, splice  # noqa: F401
from .strategies import AR, AdaptiveWindow, AlignedWindow, Jacobi, Lossless, MarsGate

CACHES = (None, "request", "block", "paper_block")


def cache_policy(cache, cache_block):
    if cache not in CACHES:
        raise ValueError(f"cache must be None, 'request', 'block' or 'paper_block', got {cache!r}")
    return {None: NoCache, "request": PerRequestCache}[cache]() if cache != "block" else BlockCache(cache_block)


def BatchEngine(model, prompts, max_new_tokens, mask_id=None, block_size=4, tau=0.95, stop_ids=(),
                cache="request", cache_block=16, metric="prob", temperature=0.0, top_k=None, seed=None,
                jacobi=False, lossless=False, align=False, adaptive=False):
    """An engine.Engine for the documented flags: MARS by default; jacobi (block_size is its window) or
    lossless instead; align / adaptive windows (MARS only); cache="paper_block" is the released block
    sampler with cache_block as its block. engine.tau[row] = x between steps changes a row's threshold."""
    special = [name for name, on in (("align", align), ("adaptive", adaptive), ("jacobi", jacobi),
                                     ("lossless", lossless), ("cache='paper_block'", cache == "paper_block")) if on]
    if len(special) > 1:
        raise ValueError(f"{' and '.join(special)} are different strategies: use one at a time")
    if cache == "paper_block":
        return PaperBlockEngine(model, prompts, max_new_tokens, mask_id, cache_block, tau, stop_ids, metric,
                                temperature, top_k, seed)
    policy = cache_policy(cache, cache_block)
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
    """Batched MARS. tau: one float or one per prompt. kw: cache, cache_block, metric, temperature,
    top_k, seed, align, adaptive (see BatchEngine)."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, block_size, tau, stop_ids, **kw).run()


def batch_ar(model, prompts, max_new_tokens, stop_ids=(), cache="request", cache_block=16, temperature=0.0,
             top_k=None, seed=None):
    """Batched AR: greedy, or sampled with temperature/top_k/seed."""
    return Engine(model, prompts, max_new_tokens, AR(temperature, top_k, seed), stop_ids,
                  cache_policy(cache, cache_block)).run()


def batch_lossless(model, prompts, max_new_tokens, mask_id, block_size=4, stop_ids=(), cache="request", **kw):
    """Lossless MARS: the masks draft, AR verifies (speculative decoding with the model as its own drafter).
    Greedy: exactly greedy AR's tokens for any model; sampled (temperature, top_k, seed): distributed
    exactly as AR sampling. kw: cache_block, temperature, top_k, seed."""
    return BatchEngine(model, prompts, max_new_tokens, mask_id, block_size, 1.0, stop_ids, cache,
                       lossless=True, **kw).run()


def batch_jacobi(model, prompts, max_new_tokens, window=4, stop_ids=(), cache="request"):
    """Jacobi decoding of an AR model: each forward checks a window of guesses, accepts the converged
    prefix and takes the rest of its outputs as the next guesses. Exactly greedy AR's tokens."""
    return Engine(model, prompts, max_new_tokens, Jacobi(window), stop_ids, cache_policy(cache, 16)).run()


def batch_paper_block(model, prompts, max_new_tokens, mask_id, cache_block=32, tau=0.95, stop_ids=(), **kw):
    """MARS with the released block sampler (baselines.py): windows are the rest of the current
    cache_block-token block, one extra forward commits each block. out.tokens_per_forward counts up to the
    stop token, out.paper_tokens_per_forward as the paper does. kw: metric, temperature, top_k, seed."""
    return PaperBlockEngine(model, prompts, max_new_tokens, mask_id, cache_block, tau, stop_ids, **kw).run()
