"""Statistics of timing samples: a summary (median, IQR, mean, std, a distribution-free confidence
interval of the median), the Mann–Whitney U test, and a bootstrap interval on the ratio of two medians.
Pure functions over numpy arrays; no scipy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

CONFIDENCE = 0.95
NOISY_REL_IQR = 0.10  # torch.utils.benchmark warns from here on; so do we
_EXACT_RANKS_UP_TO = 1000  # beyond this the binomial's normal approximation is exact enough


@dataclass(frozen=True)
class Stats:
    """Summary of n samples (same unit as the samples). `ci_low`/`ci_high` bound the median with
    `confidence` (order statistics: no assumption about the distribution's shape)."""

    n: int
    median: float
    q1: float
    q3: float
    mean: float
    std: float
    min: float
    max: float
    ci_low: float
    ci_high: float
    confidence: float = CONFIDENCE

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        """IQR over median: the spread of single samples."""
        return self.iqr / self.median if self.median > 0 else math.nan

    @property
    def rel_ci(self) -> float:
        """Half the width of the median's interval over the median: how well the median is known.
        This is the noise that the stopping rule drives under its target."""
        return (self.ci_high - self.ci_low) / 2 / self.median if self.median > 0 else math.nan

    @property
    def noisy(self) -> bool:
        return self.n > 1 and self.rel_iqr >= NOISY_REL_IQR


def summarize(samples: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Stats:
    x = np.sort(np.asarray(samples, dtype=np.float64))
    if x.size == 0:
        raise ValueError("no samples to summarize")
    q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    lo, hi = median_ci_ranks(int(x.size), confidence)
    return Stats(
        n=int(x.size),
        median=float(med),
        q1=float(q1),
        q3=float(q3),
        mean=float(x.mean()),
        std=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        min=float(x[0]),
        max=float(x[-1]),
        ci_low=float(x[lo]),
        ci_high=float(x[hi]),
        confidence=confidence,
    )


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """0-based indices (l, u) into n sorted samples such that [x_l, x_u] holds the population median
    with at least `confidence` (the count of samples under the median is Binomial(n, 1/2)).
    Below 6 samples no pair reaches 95%: the whole range is returned."""
    if n < 1:
        raise ValueError("n must be positive")
    alpha = 1.0 - confidence
    if n <= _EXACT_RANKS_UP_TO:
        total = 2**n
        limit = alpha / 2 * total
        cum = 0
        k = -1  # largest k with P(B <= k) <= alpha/2
        for j in range(n // 2 + 1):
            cum += math.comb(n, j)
            if cum > limit:
                break
            k = j
        lower = k  # P(x_(k+1) > median) = P(B <= k) <= alpha/2, x_(k+1) being index k 0-based
    else:
        lower = math.floor((n - _z(1 - alpha / 2) * math.sqrt(n)) / 2) - 1
    lower = min(max(lower, 0), (n - 1) // 2)
    return lower, n - 1 - lower


def _z(p: float) -> float:
    """Standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)  # fmt: skip
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)  # fmt: skip
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)  # fmt: skip
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    if p > 1 - 0.02425:
        return -_z(1 - p)
    q = p - 0.5
    r = q * q
    return (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * q
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their average rank (as scipy.stats.rankdata's default)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    sx = x[order]
    first = np.r_[True, sx[1:] != sx[:-1]]
    group = np.cumsum(first) - 1
    starts = np.r_[np.nonzero(first)[0], x.size]
    average = (starts[:-1] + starts[1:] - 1) / 2 + 1
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = average[group]
    return ranks


def mann_whitney(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Two-sided Mann–Whitney U test: (U of `a`, p-value), normal approximation with tie and continuity
    corrections (what scipy calls method="asymptotic"). p is 1 when every sample is equal."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0:
        raise ValueError("both sides need samples")
    both = np.concatenate([x, y])
    ranks = rankdata(both)
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2)
    n = n1 + n2
    _, counts = np.unique(both, return_counts=True)
    ties = float((counts.astype(np.float64) ** 3 - counts).sum())
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return u1, 1.0
    z = max(abs(u1 - n1 * n2 / 2) - 0.5, 0.0) / math.sqrt(var)
    return u1, math.erfc(z / math.sqrt(2))


def bootstrap_ratio_ci(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(candidate) / median(baseline), resampling each side
    independently. Seeded, so one comparison always gives one answer."""
    base = np.asarray(baseline, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples, dtype=np.float64)
    chunk = max(1, int(4_000_000 // max(base.size, cand.size)))  # bound the temporary arrays
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        mb = np.median(base[rng.integers(0, base.size, size=(k, base.size))], axis=1)
        mc = np.median(cand[rng.integers(0, cand.size, size=(k, cand.size))], axis=1)
        ratios[start : start + k] = mc / mb
    alpha = 1 - confidence
    lo, hi = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def bootstrap_ratio_ci_grouped(
    baseline: Sequence[Sequence[float]],
    candidate: Sequence[Sequence[float]],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of median(candidate) / median(baseline) when each side is several runs (processes) of
    several samples: resample the runs, then the samples within each run chosen, so that the interval
    holds the run-to-run spread as well as the spread within a run. Seeded."""
    rng = np.random.default_rng(seed)
    medians = [_grouped_medians(side, resamples, rng) for side in (baseline, candidate)]
    alpha = 1 - confidence
    lo, hi = np.quantile(medians[1] / medians[0], [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _grouped_medians(
    groups: Sequence[Sequence[float]], resamples: int, rng: np.random.Generator
) -> np.ndarray:
    runs = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    if not runs:
        raise ValueError("both sides need samples")
    width = max(r.size for r in runs)
    padded = np.zeros((len(runs), width))
    for i, r in enumerate(runs):
        padded[i, : r.size] = r
    sizes = np.array([r.size for r in runs])
    chunk = max(1, int(4_000_000 // (len(runs) * width)))
    out = np.empty(resamples)
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        pick = rng.integers(0, len(runs), size=(k, len(runs)))  # which runs
        within = (rng.random((k, len(runs), width)) * sizes[pick][:, :, None]).astype(np.int64)
        values = padded[pick[:, :, None], within]
        # every run counts with `width` draws: runs of unequal length weigh the same
        out[start : start + k] = np.median(values.reshape(k, -1), axis=1)
    return out
