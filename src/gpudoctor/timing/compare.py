"""Comparing measurements: the ratio of medians with a bootstrap interval and a Mann–Whitney test,
turned into a verdict (faster / slower / same / ambiguous); and the regression check against a saved
baseline that the pytest fixture and `gpudoctor bench --compare` share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from gpudoctor.timing.measurement import Measurement
from gpudoctor.timing.stats import bootstrap_ratio_ci, mann_whitney
from gpudoctor.util.errors import UsageError

SAME_WITHIN = 0.01  # differences under 1% are "same": smaller than run-to-run drift of GPU clocks
ALPHA = 0.05
REGRESSION_THRESHOLD = 0.05


class Verdict(str, Enum):
    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True)
class Comparison:
    """The candidate against the baseline. `ratio` is candidate time over baseline time (below 1:
    the candidate is faster); `ci_low`/`ci_high` its 95% bootstrap interval; `p_value` Mann–Whitney's."""

    baseline: str
    candidate: str
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: Verdict
    same_within: float
    n_baseline: int
    n_candidate: int
    note: str | None = None  # e.g. measured on different devices

    @property
    def speedup(self) -> float:
        return 1 / self.ratio if self.ratio > 0 else math.inf

    @property
    def change(self) -> float:
        """Relative change of time: +0.05 is 5% slower."""
        return self.ratio - 1


def decide(
    ratio: float, ci_low: float, ci_high: float, p_value: float, same_within: float, alpha: float
) -> Verdict:
    """Verdict "same" when the whole interval lies within ±same_within of 1; "faster"/"slower" when the
    interval excludes 1, the test agrees (p < alpha) and the estimate itself is beyond ±same_within;
    otherwise "ambiguous" (too noisy, or a difference too small to tell from drift)."""
    if 1 - same_within <= ci_low and ci_high <= 1 + same_within:
        return Verdict.SAME
    if p_value < alpha and ci_high < 1 and ratio <= 1 - same_within:
        return Verdict.FASTER
    if p_value < alpha and ci_low > 1 and ratio >= 1 + same_within:
        return Verdict.SLOWER
    return Verdict.AMBIGUOUS


def compare(
    baseline: Measurement,
    candidate: Measurement,
    *,
    same_within: float = SAME_WITHIN,
    alpha: float = ALPHA,
    seed: int = 0,
) -> Comparison:
    """Is `candidate` faster than `baseline`? Device times are compared (host time on the CPU)."""
    if not 0 <= same_within < 1:
        raise UsageError(f"same_within must be in [0, 1), not {same_within}")
    a, b = baseline.used_samples_us, candidate.used_samples_us
    ratio = candidate.median_us / baseline.median_us
    lo, hi = bootstrap_ratio_ci(a, b, seed=seed)
    _, p = mann_whitney(a, b)
    note = None
    if baseline.device_name != candidate.device_name:
        note = f"different devices: {baseline.device_name} vs {candidate.device_name}"
    elif baseline.mode != candidate.mode:
        note = f"different modes: {baseline.mode} vs {candidate.mode}"
    return Comparison(
        baseline=baseline.label,
        candidate=candidate.label,
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        verdict=decide(ratio, lo, hi, p, same_within, alpha),
        same_within=same_within,
        n_baseline=int(a.size),
        n_candidate=int(b.size),
        note=note,
    )


@dataclass(frozen=True)
class RegressionCheck:
    comparison: Comparison
    threshold: float
    regressed: bool

    @property
    def message(self) -> str:
        c = self.comparison
        figures = f"{c.ratio:.3f}× the baseline (95% CI {c.ci_low:.3f}–{c.ci_high:.3f}, p={c.p_value:.2g})"
        extra = f"; {c.note}" if c.note else ""
        if self.regressed:
            return f"{c.candidate}: regression, {c.change:+.1%} slower than the baseline: {figures}{extra}"
        return f"{c.candidate}: {c.verdict.value}, {figures}{extra}"


def check_regression(
    baseline: Measurement, current: Measurement, threshold: float = REGRESSION_THRESHOLD, *, seed: int = 0
) -> RegressionCheck:
    """A regression is a significant slowdown (verdict "slower") whose ratio exceeds 1 + threshold."""
    if threshold < 0:
        raise UsageError(f"the regression threshold must not be negative, not {threshold}")
    c = compare(baseline, current, same_within=min(SAME_WITHIN, threshold), seed=seed)
    return RegressionCheck(c, threshold, c.verdict is Verdict.SLOWER and c.ratio > 1 + threshold)


def match_baseline(baselines: list[Measurement], label: str) -> Measurement | None:
    """The baseline with this label (the last one, if a file holds several)."""
    found = [m for m in baselines if m.label == label]
    return found[-1] if found else None
