"""The verdict on one fix, from numbers only (no processes, no clock): its mean steps against the
baseline's over pairs of units measured side by side — blocks of one process, or fresh processes —
with the timing core's paired test (`timing.paired`); and its first steps' losses or outputs against the
baseline's, within the fix's tolerance or the baseline's own run-to-run spread, whichever is larger (a
loader fix is judged on speed: its losses are reported, only held to stay finite)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpudoctor.timing.compare import ALPHA, SAME_WITHIN, Verdict
from gpudoctor.timing.paired import Pair, PairedComparison, paired_compare

NOISE_FACTOR = 3.0  # a fix may differ from the baseline by this many times the baseline's own spread


class Judged(Protocol):
    """What a verdict is read from: the timing core's `PairedComparison` (a Protocol, so tests may hand
    in their own)."""

    @property
    def ratio(self) -> float: ...
    @property
    def ci_low(self) -> float: ...
    @property
    def ci_high(self) -> float: ...
    @property
    def p_value(self) -> float: ...
    @property
    def verdict(self) -> str: ...
    @property
    def same_within(self) -> float: ...


def compare_pairs(
    pairs: Sequence[Pair], *, unit: str, same_within: float = SAME_WITHIN, alpha: float = ALPHA
) -> PairedComparison | None:
    """The paired test over `pairs` (blocks or processes side by side); None under two pairs."""
    if len(pairs) < 2:
        return None
    return paired_compare(pairs, unit=unit, same_within=same_within, alpha=alpha)


@dataclass(frozen=True)
class NumericsCheck:
    """The candidate's first steps against the baseline's: the largest relative difference of a loss
    (or of an output's sum and absolute sum, relative to the absolute sum) over the steps compared."""

    kind: str  # loss, output, none
    steps: int  # steps compared
    max_rel_diff: float | None
    tolerance: float | None  # the fix's own tolerance; None: only finiteness is checked
    noise_floor: float | None  # the baseline against itself in other processes
    ok: bool
    note: str

    @property
    def allowed(self) -> float | None:
        if self.tolerance is None:
            return None
        return max(self.tolerance, NOISE_FACTOR * (self.noise_floor or 0.0))


def rel_diff(reference: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]]) -> float:
    """Largest |candidate − reference| over the reference step's scale (its largest magnitude), over
    the steps both have; inf where one is finite and the other not."""
    worst = 0.0
    for ref, cand in zip(reference, candidate, strict=False):
        scale = max((abs(v) for v in ref if math.isfinite(v)), default=0.0) or 1e-12
        for r, c in zip(ref, cand, strict=False):
            if math.isfinite(r) != math.isfinite(c):
                return math.inf
            if math.isfinite(r):
                worst = max(worst, abs(c - r) / scale)
    return worst


def noise_floor(
    reference: Sequence[Sequence[float]], others: Sequence[Sequence[Sequence[float]]]
) -> float | None:
    """How far the baseline's own reruns land from its reference run (nondeterministic kernels)."""
    diffs = [rel_diff(reference, o) for o in others if o]
    return max(diffs) if diffs else None


def check_numerics(
    kind: str,
    reference: Sequence[Sequence[float]],
    candidate_kind: str,
    candidate: Sequence[Sequence[float]],
    tolerance: float | None,
    floor: float | None,
    tolerance_note: str = "",
) -> NumericsCheck:
    steps = min(len(reference), len(candidate))
    if kind == "none" or not reference:
        return NumericsCheck(
            "none",
            0,
            None,
            tolerance,
            floor,
            True,
            "no loss or root-module output was recorded: numerics not checked",
        )
    if candidate_kind != kind or not candidate:
        return NumericsCheck(
            kind, 0, None, tolerance, floor, False, f"the baseline recorded {kind} values and this run none"
        )
    finite = all(math.isfinite(v) for step in candidate[:steps] for v in step)
    if tolerance is None:
        note = tolerance_note or "results not comparable"
        if not finite:
            return NumericsCheck(kind, steps, None, None, floor, False, f"{note}; it produced NaN or inf")
        diff = rel_diff(reference[:steps], candidate[:steps])
        return NumericsCheck(
            kind, steps, diff, None, floor, True, f"{note}; finite ({kind} off by {_fmt(diff)})"
        )
    diff = rel_diff(reference[:steps], candidate[:steps])
    check = NumericsCheck(kind, steps, diff, tolerance, floor, True, "")
    allowed = check.allowed or 0.0
    ok = diff <= allowed
    why = f"{kind} differs by {_fmt(diff)} of its value at most over {steps} steps (allowed {_fmt(allowed)}"
    why += f": {tolerance_note})" if tolerance_note else ")"
    return NumericsCheck(kind, steps, diff, tolerance, floor, ok, why)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{100 * x:.2g}%"


def decision(timing: Judged | None, numerics: NumericsCheck | None, failure: str | None) -> tuple[bool, str]:
    """(kept, why): kept only when nothing failed, the numerics hold and it is faster beyond noise."""
    if failure is not None:
        return False, failure
    if numerics is not None and not numerics.ok:
        return False, f"changes results: {numerics.note}"
    if timing is None:
        return False, "not timed"
    if timing.verdict == Verdict.FASTER.value:
        return True, "faster beyond noise"
    if timing.verdict == Verdict.SLOWER.value:
        return False, "slower beyond noise"
    if timing.verdict == Verdict.SAME.value:
        return False, f"no significant difference (within ±{100 * timing.same_within:g}%)"
    return False, ambiguous_reason(timing)


def ambiguous_reason(timing: Judged) -> str:
    """Why a comparison neither faster, slower nor the same is no reason to keep: its interval holds
    no change (too noisy to tell), or it excludes it but the change is too small to tell from drift."""

    def saving(ratio: float) -> float:
        return 100 * (1 - ratio)

    ci = f"{saving(timing.ci_high):+.1f}% to {saving(timing.ci_low):+.1f}%"
    if timing.ci_low <= 1 <= timing.ci_high:
        return f"no significant difference (too noisy to tell: 95% CI of the saving {ci})"
    drift = f"±{100 * timing.same_within:g}% that counts as drift"
    if abs(1 - timing.ratio) < timing.same_within:
        why = f"under the {drift}"
    elif timing.p_value >= ALPHA:
        why = f"the rank test does not confirm it, p={timing.p_value:.2g}"
    else:  # the test holds, but the interval's near end is a change too small to tell from drift
        why = f"p={timing.p_value:.2g}, but the interval reaches into the {drift}"
    return f"no significant difference (a saving of {saving(timing.ratio):+.1f}%, CI {ci}: {why})"
