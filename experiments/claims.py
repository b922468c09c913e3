"""
A grid's claims read off its results file: the paired difference of two rows over the seeds both have and the
prompts of the powered split (paired.py's interval), and the protocol's word for it. A stage-2 row counts only
if it started from its seed's parent (paired_rows); verdicts need every seed of the protocol.
"""
import numpy as np

from experiments import paired, powered_eval


def paired_rows(results, parent_of=lambda row: "ar_E"):
    """The grid's records the report may use: rows whose parent digest is the digest recorded by their seed's
    parent_of(row) (or that record none); and the names of those left out."""
    digest = {(r["row"], r["seed"]): r["digest"] for r in results if "digest" in r and "seed" in r}
    keep = [r for r in results
            if "parent_digest" not in r or r["parent_digest"] == digest.get((parent_of(r["row"]), r["seed"]))]
    return keep, [r["name"] for r in results if r not in keep]


def side(run, tau, sweep_idx, on_sweep, kept):
    """A row's (right, tokens, forwards) per prompt at tau, on the compared prompts."""
    e = run["all"] if tau == "1" else run["sweep"][tau]
    pick = sweep_idx if (on_sweep and tau == "1") else slice(None)
    per = lambda key: np.asarray([int(c) for c in e["right"]] if key == "right" else e[key], dtype=float)[pick]  # noqa: E731
    return [per(key)[kept] if key == "right" or key in e else None for key in ("right", "tokens", "forwards")]


def difference(results, a, b, metric, tau_a, tau_b, cfg, family=None):
    """The paired difference a - b over the seeds both rows have: (paired.Interval, seeds) or None. On the sweep
    prompts if either side is a sweep, else on all prompts; one family's prompts if given."""
    runs = {(r["row"], r["seed"]): r for r in results if "seed" in r}
    def has(row, s, tau):
        run = runs.get((row, s), {})
        return "all" in run if tau == "1" else tau in run.get("sweep", {})
    seeds = sorted(s for (row, s) in runs if row == a and s > 0 and has(a, s, tau_a) and has(b, s, tau_b))
    if not seeds:
        return None
    examples = powered_eval.powered_split(cfg["n_per_family"])
    sweep_idx = list(powered_eval.subset_indices(examples, cfg["sweep_per_family"]))
    on_sweep = tau_a != "1" or tau_b != "1"
    prompts = sweep_idx if on_sweep else range(len(examples))
    kept = np.array([family in (None, examples[i]["family"]) for i in prompts])
    A, B = ([side(runs[row, s], tau, sweep_idx, on_sweep, kept) for s in seeds] for row, tau in ((a, tau_a), (b, tau_b)))
    stack = lambda parts, k: np.stack([p[k] for p in parts])  # noqa: E731
    if metric == "accuracy":
        return paired.accuracy_difference(stack(A, 0), stack(B, 0)), seeds
    return paired.ratio_difference(stack(A, 1), stack(A, 2), stack(B, 1), stack(B, 2)), seeds


def seed_count(n):
    return f"{n} seed{'s' if n > 1 else ''}"


def judge(iv, seeds, direction, cfg, flat):
    """The protocol's word for an interval (only with every seed of the protocol): direction +1 / -1 the paper's
    sign, 0 its "flat within +-flat", None a measurement."""
    if len(seeds) < len(cfg["seeds"]):
        return f"interim ({seed_count(len(seeds))}): no verdict"
    if direction is None:
        return "detected above 0" if iv.lo > 0 else "detected below 0" if iv.hi < 0 else "not detected"
    return paired.verdict(iv.lo, iv.hi, direction, flat)


def verdict_row(key, text, iv, seeds, direction, cfg, flat=None):
    return {"key": key, "claim": text, "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "seeds": seeds,
            "df": iv.df, "method": iv.method, "mde": paired.mde(iv), "verdict": judge(iv, seeds, direction, cfg, flat)}
