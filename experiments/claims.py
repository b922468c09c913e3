"""
A grid's claims read off its results file: the paired difference of two rows over the seeds both have and the
prompts of the powered split (paired.py's interval), the protocol's word for it, and its reading: where 0 and the
paper's figure lie against the interval (reading; every grid's report and the science pages use this one). A stage-2
row counts only if it started from its seed's parent (paired_rows); verdicts need every seed of the protocol.
"""
import re
import statistics

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


# "(paper +1.7", "(paper about -5.5)", "(paper -1.1..-1.6"; else a benchmark's before -> after ("BBH 26.3 -> 7.5")
PAPER = re.compile(r"paper (?:about )?([+-]\d+\.\d+)(?:\.\.([+-]\d+\.\d+))?")
BEFORE_AFTER = re.compile(r"(\w+) (\d+\.\d+) -> (\d+\.\d+)")


def paper_figure(text):
    """The paper's figure a claim's text quotes, in its units (accuracy in points): (low, high, as the page writes
    it), a single figure with low == high; None where the text quotes none ("no sourced paper figure")."""
    m = PAPER.search(text)
    if m:
        lo, hi = sorted((float(m[1]), float(m[2] or m[1])))
        return lo, hi, f"{m[1]} to {m[2]}" if m[2] else m[1]
    m = BEFORE_AFTER.search(text)
    if m:
        fall = float(m[3]) - float(m[2])
        return fall, fall, f"{fall:+.1f} on {m[1]}"
    return None


def where(lo, hi, a, b):
    """Where the values a..b lie against the interval [lo, hi]: "below", "above", "inside" or "across an end"."""
    return "below" if b < lo else "above" if a > hi else "inside" if lo <= a and b <= hi else "across an end"


def size(lo, hi, paper):
    """An interval that excludes 0 against the paper's figure: "larger/smaller than the paper's X" where the figure
    has the interval's sign, else where the figure lies."""
    fig, its = where(lo, hi, paper[0], paper[1]), f"the paper's {paper[2]}"
    if fig in ("inside", "across an end"):
        return f"{its} {'inside' if fig == 'inside' else 'across an end of'} the interval"
    if (paper[0] > 0) != (lo > 0):
        return f"{its} {fig} it"
    return f"{'larger' if (fig == 'below') == (lo > 0) else 'smaller'} than {its}"


def reading(lo, hi, direction, paper=None, flat=None):
    """What an interval shows beside its rule's word, in the paper's units (lo, hi, paper and flat all in points
    for accuracy): where 0 lies, where the paper's figure (paper_figure()) lies, and for a claim with a direction
    whether the size matches; for the flat claim (direction 0, band +-flat) whether a fall or a rise is detected;
    for a measurement (direction None) where 0 lies."""
    zero = where(lo, hi, 0, 0)
    fig, its = (where(lo, hi, paper[0], paper[1]), f"the paper's {paper[2]}") if paper else (None, None)
    if direction == 0 and -flat < lo and hi < flat:  # the flat rule's "reproduced", whatever side 0 is on
        return f"flat: the interval lies inside +-{flat:g}" + (f", 0 {zero} it" if zero != "inside" else "") + \
            (f"; {its} {fig} it" if paper else "")
    if zero == "inside":
        band = f"; the interval reaches past +-{flat:g}" if direction == 0 else ""
        if not paper:
            return f"0 inside{band}"
        if fig == "inside":
            return f"0 and {its} both inside{band}"
        return f"0 inside{band}; {its} " + ("is excluded" if fig in ("below", "above") else "across an end of it")
    change = "a fall" if zero == "above" else "a rise"
    compared = f", {size(lo, hi, paper)}" if paper else ""
    if direction == 0:
        beyond = f" beyond +-{flat:g}" if lo >= flat or hi <= -flat else ""
        return f"not flat: {change}{beyond} is detected{compared}"
    if direction is None:
        return f"{change} is detected, 0 {zero} the interval" + (f"; {size(lo, hi, paper)}" if paper else "")
    if (zero == "below") != (direction > 0):
        return f"{change}, against the paper's direction" + (f"; {its} is excluded" if paper else "")
    if not paper:
        return "in the paper's direction"
    return f"in direction {'and size' if fig in ('inside', 'across an end') else 'only'}{compared}"


def verdict_row(key, text, iv, seeds, direction, cfg, flat=None, scale=100):
    """A claim's report line as a dict; scale: the paper's units per unit of the metric (100: accuracy in points,
    1: tokens/forward)."""
    return {"key": key, "claim": text, "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "seeds": seeds,
            "df": iv.df, "method": iv.method, "mde": paired.mde(iv), "verdict": judge(iv, seeds, direction, cfg, flat),
            "reading": reading(scale * iv.lo, scale * iv.hi, direction, paper_figure(text), flat and scale * flat)}


def line(r):
    """A report() row as --report prints it: the interval (accuracy in points), the rule's word and the reading."""
    pts = 1 if "tokens/forward" in r["claim"] else 100
    unit = "" if pts == 1 else " points"
    method = ", seed-clustered" if r["method"] != "random effects" else ""
    detectable = f", smallest detectable {pts * r['mde']:.2f}" if r["verdict"] == "not detected" else ""
    return (f"{r['key']:<8} {r['claim']}: {pts * r['estimate']:+.2f} [{pts * r['lo']:+.2f}, {pts * r['hi']:+.2f}]"
            f"{unit} ({seed_count(len(r['seeds']))}, t({r['df']:.0f}){method}): {r['verdict']} ({r['reading']})"
            f"{detectable}")


def tokens_per_forward_line(results, row="mars_B4", tau="0.95"):
    """A row's tokens/forward at tau on the sweep prompts, mean +- sd over its seeds, as the reports print it
    beside claim e (None where no seed has that sweep)."""
    tpf = [sum(r["sweep"][tau]["tokens"]) / sum(r["sweep"][tau]["forwards"]) for r in results
           if r.get("row") == row and tau in r.get("sweep", {})]
    if not tpf:
        return None
    spread = f" +- {statistics.stdev(tpf):.2f} ({len(tpf)} seeds)" if len(tpf) > 1 else " (1 seed)"
    return f"         MARS B 4 tokens/forward at tau {tau}: {statistics.mean(tpf):.2f}{spread}"
