"""What every rule shares: the `Rule` signature, building a `Finding`, and formatting numbers in
evidence sentences."""

from __future__ import annotations

from collections.abc import Callable

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix, Severity
from gpudoctor.util.names import short_kernel_name
from gpudoctor.util.units import fmt_bytes, fmt_us

Rule = Callable[[Analysis, Facts], Finding | None]

# A finding whose fix would save less than this share of the step (below "minor") is noise, not advice.
MIN_SAVING_PCT = 2.0


def finding(
    id: str,
    title: str,
    saving_pct: float,
    evidence: list[str],
    fix: Fix,
    values: dict[str, float],
    sources: tuple[str, ...] = (),
    severity: Severity | None = None,
    memory_bytes: int | None = None,
) -> Finding:
    saving = round(max(0.0, min(saving_pct, 100.0)), 1)
    return Finding(
        id=id,
        severity=severity or Severity.of_saving(saving),
        title=title,
        est_saving_pct=saving,
        evidence=tuple(evidence),
        fix=fix,
        values={k: round(float(v), 3) for k, v in values.items()},
        sources=sources,
        est_memory_bytes=memory_bytes,
    )


def us(x: float) -> str:
    return fmt_us(x)


def size(x: float) -> str:
    return fmt_bytes(x)


def pct(x: float) -> str:
    return f"{x:.0f}%" if x >= 10 else f"{x:.1f}%"


def step_phrase(f: Facts) -> str:
    """'of each 16.4 ms step', 'of each unprofiled 16.4 ms step' where that time is known, or 'of the
    2.1 s traced' where the trace has no steps."""
    if f.whole_trace:
        return f"of the {us(f.step_us)} traced"
    if f.profiler_overhead is not None:
        return f"of each unprofiled {us(f.step_us)} step"
    return f"of each {us(f.step_us)} step"


def kernel(name: str) -> str:
    """A kernel's name, short enough for a sentence."""
    return short_kernel_name(name)
