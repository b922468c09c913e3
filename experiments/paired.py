"""
Paired comparisons for experiments/power_grid.py: two rows evaluated on the same prompts with the same seeds
(a stage-2 row's seed s starts from AR-SFT E's seed s) compared by a 95% interval on their difference.

Method: the per-(seed, prompt) differences d[s, p] (e.g. right_a - right_b) follow a two-way random-effects
model, d = mu + seed effect + prompt effect + noise: seeds are a sample of training randomness, prompts a
sample of what the generators draw, and the claims are about both. The estimate is the mean of d; its
variance, from the two-way ANOVA mean squares (MS_seed, MS_prompt, MS_noise, no replication),
    var = (MS_seed + MS_prompt - MS_noise) / (S * P)
(each variance component clipped at 0), with Satterthwaite's degrees of freedom for a t interval. Pairing
removes what both rows share (how hard a prompt is); the seed term carries training noise, so 5 seeds
give a t with about 4 degrees of freedom when seeds disagree.
Why not the two methods usually named: McNemar per seed tests one seed's prompts and gives a p-value, not
an interval over seeds; a bootstrap that resamples seeds and prompts (crossed, or nested) counts the
seed-by-prompt noise twice (an interval up to 1.4x too wide when, as here, seeds disagree on which prompts
they get right), and with 5 seeds its seed level has too few distinct resamples. Tested on simulated
data (tests/test_power_grid.py): the interval covers the true difference 94-98% of the time (98% when the
seeds agree: 5 seeds cannot show that they do, and the t pays for it, an interval ~1.3x the ideal width).
When the seed mean square falls below the noise mean square, the seed component is cut to zero and the
Satterthwaite degrees of freedom jump from about S - 1 to thousands: the interval then rests on an estimate
that seeds do not vary, which 5 seeds cannot show. The rule in that case (and only then): the WIDER of that
interval and the seed-clustered t interval, the mean of the S per-seed mean differences +- t(S - 1) x their
sd / sqrt(S). The clustered interval is conditional on the prompts (their effect is common to every seed's
mean), so neither is always the wider; taking the wider keeps each error source that either one sees.
tests/test_paired.py checks the rule on constructed data sets whose interval is known by hand.
Ratios (tokens per forward = sum of tokens / sum of forwards) use the same interval on the linearised
per-prompt terms (the delta method): (tokens - r * forwards) / mean forwards.

Smallest detectable effect (two-sided 5%, power 80%): mde = (t_0.975 + t_0.80) * se (normal: 2.80 se).

Verdicts (claims of the paper with a direction): "reproduced" if the interval excludes 0 on the paper's
side, "contradicted" if it excludes 0 on the other side, else "not detected" (give the interval and mde).
A claim of no difference ("flat", direction 0, margin m): "reproduced" if the whole interval lies inside
(-m, m), "contradicted" if it lies wholly outside it, else "not detected".
"""
import math
from statistics import NormalDist
from typing import NamedTuple

import numpy as np


class Interval(NamedTuple):
    estimate: float
    lo: float
    hi: float
    se: float
    df: float
    method: str = "random effects"  # or "seed-clustered" (the seed term cut, the clustered t the wider)


def t_quantile(q, df):
    """Student's t quantile (0.5 < q < 1, df >= 1 as Satterthwaite's are here). With t = sqrt(df) tan(u) the
    t density becomes cos(u)^(df - 1) / B(df / 2, 1 / 2), smooth and bounded, so the CDF is Simpson's rule on
    it and the quantile a bisection on u. The quantile is at most df 1's, tan(pi (q - 1/2)), which bounds u
    and keeps the density's peak (width 1 / sqrt(df)) many grid points wide. Checked against the printed table.
    Above 1e6 degrees of freedom the normal quantile (within 3e-6 of t's; lgamma's rounding grows past it)."""
    if df > 1e6:
        return NormalDist().inv_cdf(q)
    beta = math.exp(math.lgamma(df / 2) + math.lgamma(0.5) - math.lgamma(df / 2 + 0.5))
    lo, hi = 0.0, math.atan(math.tan(math.pi * (q - 0.5)) / math.sqrt(df))
    grid = np.linspace(0.0, 1.0, 2001)
    simpson = np.ones(2001); simpson[1:-1:2], simpson[2:-1:2] = 4, 2
    for _ in range(50):
        u = (lo + hi) / 2
        area = float((simpson * np.cos(u * grid) ** (df - 1)).sum()) * u / 6000 / beta
        lo, hi = (u, hi) if area < q - 0.5 else (lo, u)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def random_effects(d, level=0.95):
    """d: (seeds, prompts) per-cell values -> the t interval on their mean under the random-effects model, with
    (as a second value) whether the seed component was cut to zero."""
    d = np.asarray(d, dtype=float)
    S, P = d.shape
    m = float(d.mean())
    seed_means, prompt_means = d.mean(1), d.mean(0)
    terms = [(S * ((prompt_means - m) ** 2).sum() / (P - 1), P - 1)]  # (mean square, degrees of freedom): prompts
    cut = False
    if S > 1:
        ms_seed = P * ((seed_means - m) ** 2).sum() / (S - 1)
        ms_noise = ((d - seed_means[:, None] - prompt_means[None, :] + m) ** 2).sum() / ((S - 1) * (P - 1))
        cut = not ms_seed > ms_noise
        # var * S * P = MS_seed + MS_prompt - MS_noise; a mean square below MS_noise: its component is 0, dropped
        terms = [(ms, df) for ms, df in (terms[0], (ms_seed, S - 1)) if ms > ms_noise]
        terms.append(((1 - len(terms)) * ms_noise, (S - 1) * (P - 1)))
    var_sp = sum(ms for ms, _ in terms)
    if var_sp <= 0:
        return Interval(m, m, m, 0.0, math.inf), cut
    df = float(var_sp ** 2 / sum(ms ** 2 / df for ms, df in terms))  # Satterthwaite
    se = math.sqrt(float(var_sp) / (S * P))
    half = t_quantile((1 + level) / 2, df) * se
    return Interval(m, m - half, m + half, se, df), cut


def seed_clustered(d, level=0.95):
    """The t interval with S - 1 degrees of freedom on the S per-seed means of d (seeds, prompts)."""
    seed_means = np.asarray(d, dtype=float).mean(1)
    S, m = len(seed_means), float(seed_means.mean())
    se = float(seed_means.std(ddof=1)) / math.sqrt(S)
    half = t_quantile((1 + level) / 2, S - 1) * se
    return Interval(m, m - half, m + half, se, float(S - 1), "seed-clustered")


def interval(d, level=0.95):
    """d: (seeds, prompts) per-cell values -> the 95% interval on their mean: the random-effects one, or, where its
    seed component was cut to zero, the wider of it and the seed-clustered t(S - 1) interval (the module's rule)."""
    iv, cut = random_effects(d, level)
    if cut and np.shape(d)[0] > 1:
        clustered = seed_clustered(d, level)
        if clustered.hi - clustered.lo > iv.hi - iv.lo:
            return clustered
    return iv


def accuracy_difference(right_a, right_b):
    """Accuracy of a minus accuracy of b; right_*: (seeds, prompts) of 0/1, the same seeds and prompts."""
    return interval(np.asarray(right_a, dtype=float) - np.asarray(right_b, dtype=float))


def ratio_difference(num_a, den_a, num_b, den_b):
    """sum(num_a) / sum(den_a) minus the same for b (tokens per forward); (seeds, prompts) arrays each."""
    def linear(num, den):  # the ratio's per-cell terms: their mean is the ratio's error, to first order
        num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
        return float(num.sum() / den.sum()), (num - num.sum() / den.sum() * den) / den.mean()
    (ra, ua), (rb, ub) = linear(num_a, den_a), linear(num_b, den_b)
    spread = interval(ua - ub)
    return Interval(ra - rb, ra - rb - (spread.estimate - spread.lo), ra - rb + (spread.hi - spread.estimate),
                    spread.se, spread.df, spread.method)


def mde(iv, power=0.8):
    """The smallest true difference this design detects with `power` at the 5% level (two-sided)."""
    return (t_quantile(0.975, iv.df) + t_quantile(power, iv.df)) * iv.se if iv.se else 0.0


def verdict(lo, hi, direction, margin=None):
    """direction +1 / -1: the sign of the paper's difference; 0 with a margin: the paper says "no difference"."""
    if direction == 0:
        if -margin < lo and hi < margin:
            return "reproduced"
        return "contradicted" if lo >= margin or hi <= -margin else "not detected"
    if lo > 0 or hi < 0:
        return "reproduced" if (lo > 0) == (direction > 0) else "contradicted"
    return "not detected"
