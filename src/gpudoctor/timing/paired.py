"""A/B comparison where the unit is a pair, not a step: a baseline (A) and a candidate (B) mean step measured
next to each other (two blocks of one process, or two processes). Steps are not independent samples; pairs
are, up to drift, which each pair's order cancels (`abba` for processes, a coin per pair for blocks).

The test: Student's t on ln(B/A) over the pairs, the pair's order a covariate from six pairs in both
orders, and from six pairs an exact sign-flip test that must reject too. Faster or slower only when p < α
and the whole 95% interval lies beyond ±`same_within`; "same" within it; else ambiguous. Calibrated on A/A
data (`false_positive_rate`; docs/results.md, "Fixes")."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpudoctor.timing.compare import ALPHA, SAME_WITHIN, Verdict

ORDER_COVARIATE_FROM = 6  # pairs (with both orders among them) from which drift is regressed out
SIGN_FLIP_FROM = 6  # pairs from which the permutation test can reach p < 0.05 (2/2^6 = 0.031) and must
EXACT_UP_TO = 16  # pairs whose 2^n sign flips are enumerated; more are sampled
# Blocks extended past their plan (`BlockPlan.extend_pairs`): where the planned pairs lean to a saving of
# LEAN or more undecided, more pairs are timed and the verdict over all of them is taken at ALPHA_EXTENDED.
# Two looks at 5% would let a no-op through more often than one; 3% for the second is near Pocock's 2.94%
# for two looks (its A/A rate and power on simulated and fake-loop pairs: docs/results.md, "Fixes").
LEAN = 0.02
ALPHA_EXTENDED = 0.03


@dataclass(frozen=True)
class Pair:
    """One baseline and one candidate mean step (µs), measured next to each other; `b_first`: the
    candidate was measured first."""

    a_us: float
    b_us: float
    b_first: bool = False

    @property
    def log_ratio(self) -> float:
        return math.log(self.b_us / self.a_us)


@dataclass(frozen=True)
class PairedComparison:
    """B against A over `pairs` units. `ratio` is the geometric mean of B/A (below 1: B is faster),
    `ci_low`/`ci_high` its 95% interval, `p_value` the test's."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str  # faster, slower, same, ambiguous
    same_within: float
    pairs: int
    unit: str  # "block pair" or "process pair"
    test: str  # the test, in words
    baseline_us: float  # mean over the units of A's mean step
    candidate_us: float

    @property
    def saving(self) -> float:
        return 1 - self.ratio

    @property
    def saving_ci(self) -> tuple[float, float]:
        return 1 - self.ci_high, 1 - self.ci_low


def paired_compare(
    pairs: Sequence[Pair],
    *,
    unit: str = "block pair",
    same_within: float = SAME_WITHIN,
    alpha: float = ALPHA,
) -> PairedComparison:
    """The verdict on B against A from `pairs` (at least two, each side's times positive)."""
    if len(pairs) < 2:
        raise ValueError("a paired comparison needs two pairs or more")
    if any(not (p.a_us > 0 and p.b_us > 0) for p in pairs):
        raise ValueError("every mean step must be positive")
    d = np.array([p.log_ratio for p in pairs])
    order = np.array([1.0 if p.b_first else -1.0 for p in pairs])
    n = d.size
    adjusted = n >= ORDER_COVARIATE_FROM and 0 < int((order > 0).sum()) < n
    if adjusted:
        # d_i = μ + δ·order_i + ε_i: least squares with an intercept and the order
        x = np.column_stack([np.ones(n), order])
        coef, *_ = np.linalg.lstsq(x, d, rcond=None)
        resid = d - x @ coef
        df = n - 2
        s2 = float(resid @ resid) / df
        cov = s2 * np.linalg.inv(x.T @ x)
        mean, se = float(coef[0]), math.sqrt(max(float(cov[0, 0]), 0.0))
        test = f"t-test on ln(B/A) over {n} {unit}s, the order of each pair a covariate (df {df})"
    else:
        df = n - 1
        mean = float(d.mean())
        se = float(d.std(ddof=1)) / math.sqrt(n)
        test = f"paired t-test on ln(B/A) over {n} {unit}s (df {df})"
    if se <= 0.0:  # identical pairs: the estimate is exact
        p, half = (1.0 if mean == 0.0 else 0.0), 0.0
    else:
        p = t_two_sided_p(mean / se, df)
        half = t_quantile(1 - alpha / 2, df) * se
    if n >= SIGN_FLIP_FROM:
        p = max(p, sign_flip_p(d))
        test += "; the sign-flip permutation test must agree"
    ratio, lo, hi = math.exp(mean), math.exp(mean - half), math.exp(mean + half)
    verdict = decide_min_effect(lo, hi, p, same_within, alpha)
    return PairedComparison(
        ratio,
        lo,
        hi,
        p,
        verdict.value,
        same_within,
        n,
        unit,
        test,
        statistics.fmean(q.a_us for q in pairs),
        statistics.fmean(q.b_us for q in pairs),
    )


def decide_min_effect(
    ci_low: float, ci_high: float, p_value: float, same_within: float, alpha: float
) -> Verdict:
    """Faster or slower only when the interval excludes every change within ±`same_within`."""
    if 1 - same_within <= ci_low and ci_high <= 1 + same_within:
        return Verdict.SAME
    if p_value < alpha and ci_high < 1 - same_within:
        return Verdict.FASTER
    if p_value < alpha and ci_low > 1 + same_within:
        return Verdict.SLOWER
    return Verdict.AMBIGUOUS


def pairs_in_order(labelled: Sequence[tuple[bool, float]]) -> list[Pair]:
    """Units in the order they were measured, as (is_candidate, mean µs), paired two by two: positions
    (0, 1), (2, 3), … each one A and one B (the block schedule and A B B A … give that); an unpaired last unit,
    or two of a kind side by side, are left out."""
    out = []
    for first, second in zip(labelled[0::2], labelled[1::2], strict=False):
        if first[0] == second[0]:
            continue
        a, b = (second, first) if first[0] else (first, second)
        out.append(Pair(a[1], b[1], b_first=first[0]))
    return out


def abba(pairs: int) -> list[bool]:
    """The schedule of `pairs` pairs: A B, B A, A B, … (True: the candidate); linear drift cancels
    over each two pairs, and configurations meet back to back (B B, A A) half of the time, so half the
    boundaries need no switch."""
    return [side for k in range(pairs) for side in ((False, True) if k % 2 == 0 else (True, False))]


def random_orders(pairs: int, rng: np.random.Generator) -> list[bool]:
    """A coin for each pair: True, the candidate first (the block schedule's order)."""
    return [bool(c) for c in rng.random(pairs) < 0.5]


def sides(b_first: Sequence[bool]) -> list[bool]:
    """The units of pairs in these orders, one after another (True: the candidate's)."""
    return [side for first in b_first for side in ((True, False) if first else (False, True))]


def leans_to_a_saving(pairs: Sequence[Pair], lean: float = LEAN, same_within: float = SAME_WITHIN) -> bool:
    """Undecided (the paired test ambiguous) with B at least `lean` faster than A: more pairs may
    tell a saving that is there (see ALPHA_EXTENDED)."""
    if len(pairs) < 2:
        return False
    c = paired_compare(pairs, same_within=same_within)
    return c.verdict == Verdict.AMBIGUOUS.value and c.ratio <= 1 - lean


def sequential_verdict(
    pairs: Sequence[Pair], planned: int, *, unit: str = "block pair", same_within: float = SAME_WITHIN
) -> str:
    """The verdict of a schedule that may extend (`BlockPlan.extend_pairs`) on pairs recorded past its
    plan: its first `planned` pairs alone where they do not lean to a saving, else all of them at
    ALPHA_EXTENDED (what the session would have judged)."""
    first = list(pairs[:planned])
    if len(pairs) <= planned or not leans_to_a_saving(first, same_within=same_within):
        return paired_compare(first, unit=unit, same_within=same_within).verdict
    return paired_compare(pairs, unit=unit, same_within=same_within, alpha=ALPHA_EXTENDED).verdict


def false_positive_rate(
    units: Sequence[float],
    pairs: int,
    *,
    extend: int = 0,
    unit: str = "block pair",
    pairing: bool = False,
    orders: str = "random",
    same_within: float = SAME_WITHIN,
    alpha: float = ALPHA,
    comparisons: int = 200,
    seed: int = 0,
    decide_fn: Callable[[Sequence[Pair]], str] | None = None,
) -> tuple[float, int]:
    """A/A calibration: `units` are mean steps of one configuration in the order they were measured
    (blocks of one process, or processes one after another). Each comparison takes 2·`pairs` of them —
    a random stretch of adjacent units, as the block schedule takes them (from any unit: the schedule's
    blocks are the same steps whatever their order), or with `pairing` a random pairing of any of them
    (processes: every pairing of the recorded ones is a comparison the session could have made, drift
    between them included) — labels them as the session would (`orders`: "random", a coin for each
    pair as blocks are ordered; "abba", A B B A … or B A A B … as processes are) and asks for a
    verdict. With `extend`, each comparison takes 2·(`pairs` + `extend`) units and is judged as an
    extending block schedule is (`sequential_verdict`). Returns (share of faster or slower verdicts,
    comparisons made)."""
    if orders not in ("random", "abba"):
        raise ValueError(f"orders is random or abba, not {orders!r}")
    if extend and decide_fn is not None:
        raise ValueError("an extending schedule is judged by sequential_verdict, not a decide_fn")
    n = 2 * (pairs + extend)
    if len(units) < n:
        raise ValueError(f"{len(units)} units cannot make {pairs + extend} pairs")
    rng = np.random.default_rng(seed)
    values = np.asarray(units, dtype=np.float64)
    judge = decide_fn or (
        (lambda ps: sequential_verdict(ps, pairs, unit=unit, same_within=same_within))
        if extend
        else (lambda ps: paired_compare(ps, unit=unit, same_within=same_within, alpha=alpha).verdict)
    )
    false = 0
    for _ in range(comparisons):
        if pairing:
            picked = values[rng.permutation(len(values))[:n]]
        else:
            start = int(rng.integers(0, len(values) - n + 1))
            picked = values[start : start + n]
        if orders == "random":
            labels = sides(random_orders(pairs + extend, rng))
        else:
            labels = abba(pairs + extend)
            if rng.random() < 0.5:
                labels = [not s for s in labels]
        verdict = judge(pairs_in_order(list(zip(labels, picked.tolist(), strict=True))))
        false += verdict in (Verdict.FASTER.value, Verdict.SLOWER.value)
    return false / comparisons, comparisons


def sign_flip_p(d: np.ndarray, *, samples: int = 20000, seed: int = 0) -> float:
    """Two-sided p of the mean of `d` under random signs (each pair's A and B exchangeable): exact
    over all 2^n sign patterns up to EXACT_UP_TO pairs, else from `samples` seeded draws."""
    n = d.size
    if n <= EXACT_UP_TO:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    else:
        signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(samples, n))
    observed = abs(float(d.mean()))
    flipped = np.abs((signs * d).mean(axis=1))
    return float((flipped >= observed - 1e-12 * max(observed, 1e-300)).mean())


# -- Student's t without scipy ----------------------------------------------------------------------------
def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with `df` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The `q` quantile (q > 0.5) of Student's t, by bisection on its distribution function."""
    if not 0.5 < q < 1:
        raise ValueError("q must be in (0.5, 1)")
    target = 2 * (1 - q)  # two-sided tail
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return front * f / a
