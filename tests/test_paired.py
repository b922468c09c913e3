"""experiments/paired.py's rule for a seed variance estimate cut to zero: the wider of the random-effects
interval and the seed-clustered t(S - 1) interval, on constructed data sets whose answer is known by hand."""
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import paired  # noqa: E402

T4 = 2.776445  # Student's t, 97.5%, 4 degrees of freedom


@pytest.mark.parametrize("q, df, table", [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, T4),
                                           (0.975, 30, 2.0423), (0.80, 4, 0.9410), (0.975, float("inf"), 1.9600)])
def test_t_quantile_matches_the_printed_table(q, df, table):
    """At 2 seeds an interval's t has 1 degree of freedom, where a normal-based expansion is 24% low."""
    assert paired.t_quantile(q, df) == pytest.approx(table, abs=1e-4)


def seeds_with_means(counts, base, shift, prompts=100):
    """len(counts) seeds x `prompts` differences in {-1, 0, +1}: seed s has base + counts[s] prompts at +1 and
    base at -1, so its mean is counts[s] / prompts exactly; each seed's moved prompts start `shift` prompts after
    the previous seed's (shift >= 2 base + max(counts): no prompt moves in two seeds)."""
    d = np.zeros((len(counts), prompts))
    for s, c in enumerate(counts):
        order = np.roll(np.arange(prompts), s * shift)
        d[s, order[:base + c]] = 1
        d[s, order[base + c:2 * base + c]] = -1
    return d


def mean_squares(d):
    S, P = d.shape
    resid = d - d.mean(1)[:, None] - d.mean(0)[None, :] + d.mean()
    return P * d.mean(1).var(ddof=1), S * d.mean(0).var(ddof=1), (resid ** 2).sum() / ((S - 1) * (P - 1))


# seed means 0, 0.05, 0.10, 0.05, 0.05: mean 0.05, their sd sqrt(0.005 / 4) = 0.035355, se 0.035355 / sqrt(5)
KNOWN = seeds_with_means([0, 5, 10, 5, 5], base=5, shift=20)
SE = 0.0158114


def test_the_constructed_data_set_has_its_seed_term_cut():
    assert KNOWN.mean(1) == pytest.approx([0, 0.05, 0.10, 0.05, 0.05])
    ms_seed, ms_prompt, ms_noise = mean_squares(KNOWN)
    assert ms_seed == pytest.approx(0.125) and ms_seed < ms_noise  # the seed component is cut to zero
    re, cut = paired.random_effects(KNOWN)
    # the degrees of freedom jump from about 4 to (S - 1)(P - 1): noise only
    assert cut and re.df == 396 and re.method == "random effects"
    assert re.se == pytest.approx(np.sqrt(ms_noise / KNOWN.size))


def test_a_cut_seed_term_falls_back_to_the_seed_clustered_t_when_that_is_wider():
    """The known answer: 0.05 +- t(4) x 0.0158114 = [0.0061, 0.0939]."""
    right_a, right_b = (KNOWN > 0).astype(int), (KNOWN < 0).astype(int)  # a - b = KNOWN
    iv = paired.accuracy_difference(right_a, right_b)
    assert iv.estimate == pytest.approx(0.05) and iv.df == 4 and iv.se == pytest.approx(SE, rel=1e-5)
    assert iv.method == "seed-clustered"
    assert (iv.lo, iv.hi) == pytest.approx((0.05 - T4 * SE, 0.05 + T4 * SE), abs=2e-4)  # [0.0061, 0.0939]
    re, _ = paired.random_effects(KNOWN)  # what it would be without the rule: [0.016, 0.084]
    assert re.hi - re.lo < 0.8 * (iv.hi - iv.lo)
    # a verdict the rule changes: "flat within 0.09" holds on the random-effects interval, not on the wider one
    assert paired.verdict(re.lo, re.hi, 0, 0.09) == "reproduced"
    assert paired.verdict(iv.lo, iv.hi, 0, 0.09) == "not detected"


def test_a_cut_seed_term_keeps_the_random_effects_interval_when_that_is_wider():
    """Seeds that move overlapping prompts: a large prompt term, seed means close (0.02-0.06)."""
    d = seeds_with_means([2, 4, 6, 4, 4], base=20, shift=7)
    re, cut = paired.random_effects(d)
    clustered = paired.seed_clustered(d)
    assert cut and clustered.df == 4 and clustered.se == pytest.approx(0.0063246, rel=1e-4)
    assert paired.interval(d) == re and re.hi - re.lo > 2 * (clustered.hi - clustered.lo)
    same = seeds_with_means([4] * 5, base=5, shift=20)  # identical seed means: a clustered interval of width 0
    assert paired.seed_clustered(same).se == 0 and paired.interval(same) == paired.random_effects(same)[0]


def test_a_seed_term_kept_leaves_the_random_effects_interval_alone():
    rng = np.random.default_rng(0)
    d = (rng.random((5, 400)) < 0.2).astype(float) - (rng.random((5, 400)) < 0.2)
    d += np.array([0.0, 0.1, 0.2, 0.3, 0.4])[:, None]  # seeds differ by far more than the noise says
    re, cut = paired.random_effects(d)
    assert not cut and paired.interval(d) == re and re.df < 10


def test_the_rule_reaches_ratios_too():
    """Tokens per forward: the same rule on the delta method's per-prompt terms (2 + KNOWN against 2 tokens a
    forward, 10 forwards on every prompt: the terms are KNOWN itself)."""
    forwards = np.full(KNOWN.shape, 10.0)
    iv = paired.ratio_difference(20 + 10 * KNOWN, forwards, np.full(KNOWN.shape, 20.0), forwards)
    assert iv.estimate == pytest.approx(0.05) and iv.df == 4 and iv.method == "seed-clustered"
    assert iv.hi - iv.estimate == pytest.approx(T4 * SE, rel=4e-3)


def test_the_reading_says_where_0_and_the_papers_figure_lie():
    """claims.reading on intervals placed by hand against 0, the paper's figure and the flat band, one per case."""
    from experiments.claims import paper_figure, reading
    assert paper_figure("a (paper -1.1..-1.6, Table 4)") == (-1.6, -1.1, "-1.1 to -1.6")
    assert paper_figure("(paper: reasoning collapses, BBH 26.3 -> 7.5)")[2] == "-18.8 on BBH"
    assert paper_figure("tokens/forward (no sourced paper figure)") is None
    plus, minus, flat = (1.7, 1.7, "+1.7"), (-7.6, -7.6, "-7.6"), (-0.7, -0.7, "-0.7")
    cases = [((3.5, 5.0, +1, plus), "in direction only, larger than the paper's +1.7"),
             ((1.0, 2.0, +1, plus), "in direction and size, the paper's +1.7 inside the interval"),
             ((-1.8, -0.5, -1, minus), "in direction only, smaller than the paper's -7.6"),
             ((-0.1, 1.8, +1, plus), "0 and the paper's +1.7 both inside"),
             ((-2.2, 2.4, -1, (-6.2, -6.2, "-6.2")), "0 inside; the paper's -6.2 is excluded"),
             ((0.6, 3.2, -1, (-2.3, -2.3, "-2.3")), "a rise, against the paper's direction; the paper's -2.3 is excluded"),
             ((-2.7, -1.0, 0, flat), "not flat: a fall is detected, larger than the paper's -0.7"),
             ((-3.0, -2.0, 0, flat), "not flat: a fall beyond +-1.7 is detected, larger than the paper's -0.7"),
             ((-0.5, 0.4, 0, flat), "flat: the interval lies inside +-1.7; the paper's -0.7 below it"),
             ((-2.0, 0.4, 0, flat), "0 and the paper's -0.7 both inside; the interval reaches past +-1.7"),
             ((2.5, 3.8, None, (-5.9, -5.9, "-5.9")), "a rise is detected, 0 below the interval; the paper's -5.9 below it"),
             ((0.5, 2.0, +1, None), "in the paper's direction"),
             ((-0.1, 0.08, None, None), "0 inside")]
    for (lo, hi, direction, paper), want in cases:
        assert reading(lo, hi, direction, paper, 1.7 if direction == 0 else None) == want, (lo, hi, direction)
