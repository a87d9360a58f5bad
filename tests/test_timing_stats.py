"""The statistics under every timing figure: the summary matches numpy, the median's interval covers the
true median as often as it claims, the Mann–Whitney test matches textbook values, and the bootstrap
interval of a ratio of medians is seeded and sound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpudoctor.timing.stats import (
    _z,
    bootstrap_ratio_ci,
    mann_whitney,
    median_ci_ranks,
    rankdata,
    summarize,
)


def test_summary_matches_numpy() -> None:
    x = np.random.default_rng(1).lognormal(3, 0.2, 501)
    s = summarize(x)
    assert s.n == 501
    assert s.median == pytest.approx(np.median(x))
    assert (s.q1, s.q3) == pytest.approx(tuple(np.quantile(x, [0.25, 0.75])))
    assert s.mean == pytest.approx(x.mean())
    assert s.std == pytest.approx(x.std(ddof=1))
    assert s.min == x.min() and s.max == x.max()
    assert s.ci_low <= s.median <= s.ci_high
    assert s.rel_iqr == pytest.approx(s.iqr / s.median)


def test_a_single_sample_summarizes_without_nan() -> None:
    s = summarize([5.0])
    assert (s.median, s.std, s.ci_low, s.ci_high) == (5.0, 0.0, 5.0, 5.0)
    assert not s.noisy


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize(("n", "expected"), [(6, (0, 5)), (10, (1, 8)), (20, (5, 14)), (100, (39, 60))])
def test_median_interval_ranks_match_binomial_tables(n: int, expected: tuple[int, int]) -> None:
    # 1-based tables: n=10 → (2, 9), n=20 → (6, 15), n=100 → (40, 61)
    assert median_ci_ranks(n) == expected


def test_median_interval_ranks_are_continuous_at_the_switch_to_the_normal_approximation() -> None:
    lo_exact, _ = median_ci_ranks(1000)
    lo_approx, _ = median_ci_ranks(1001)
    assert abs(lo_exact - lo_approx) <= 1


def test_median_interval_covers_the_true_median_at_least_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    true_median = math.exp(1.0)  # of lognormal(1, 0.5)
    hits = 0
    for _ in range(2000):
        s = summarize(rng.lognormal(1.0, 0.5, 30))
        hits += s.ci_low <= true_median <= s.ci_high
    assert hits / 2000 >= 0.94


def test_normal_quantile() -> None:
    assert _z(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert _z(0.5) == pytest.approx(0.0, abs=1e-12)
    assert _z(0.001) == pytest.approx(-3.090232, abs=1e-6)


def test_rankdata_averages_ties() -> None:
    assert rankdata(np.array([10.0, 20.0, 10.0, 30.0])).tolist() == [1.5, 3.0, 1.5, 4.0]


def test_mann_whitney_complete_separation_matches_the_normal_approximation() -> None:
    # n1 = n2 = 10, U = 0: z = (50 - 0.5) / sqrt(10·10·21/12) = 3.742, two-sided p = 1.83e-4
    u, p = mann_whitney(np.arange(10.0), np.arange(10.0) + 100)
    assert u == 0
    assert p == pytest.approx(1.826e-4, rel=0.01)


def test_mann_whitney_identical_samples_are_not_different() -> None:
    _u, p = mann_whitney([1.0, 1.0, 1.0], [1.0, 1.0])
    assert p == 1.0
    _, p = mann_whitney(np.arange(50.0), np.arange(50.0))
    assert p > 0.9


def test_bootstrap_interval_is_seeded_and_brackets_the_ratio() -> None:
    rng = np.random.default_rng(3)
    a = rng.lognormal(0, 0.01, 300) * 100
    b = rng.lognormal(0, 0.01, 300) * 97
    lo, hi = bootstrap_ratio_ci(a, b, seed=5)
    assert (lo, hi) == bootstrap_ratio_ci(a, b, seed=5)
    assert lo < np.median(b) / np.median(a) < hi
    assert 0.96 < lo < hi < 0.98


def test_bootstrap_handles_many_samples_in_chunks() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(100, 1, 20_000), rng.normal(100, 1, 20_000)
    lo, hi = bootstrap_ratio_ci(a, b, resamples=300)
    assert lo < 1 < hi


def test_kernel_activities_are_summed_per_call() -> None:
    from gpudoctor.timing.kernels import summarize_activities

    # two calls of two kernels each, given out of order
    acts = [(10.0, 2.0, "b"), (0.0, 1.0, "a"), (1.5, 3.0, "b"), (11.0, 1.5, "a")]
    kt = summarize_activities(acts, calls=2)
    assert kt.grouped and kt.kernels_per_call == 2
    assert kt.per_call_us == (4.0, 3.5)
    assert kt.names == ("b", "a")


def test_uneven_kernel_counts_give_only_the_mean() -> None:
    from gpudoctor.timing.kernels import summarize_activities

    kt = summarize_activities([(0.0, 1.0, "a"), (1.0, 2.0, "a"), (5.0, 3.0, "a")], calls=2)
    assert not kt.grouped and kt.per_call_us == (3.0,) and kt.kernels_per_call == 1.5
    assert "no GPU activity" in summarize_activities([], calls=3)
