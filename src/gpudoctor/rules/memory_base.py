"""What the memory rules share: their signature (`MemoryAnalysis -> Finding | None`), severity by the
share of the peak a fix frees, and the categories of a breakdown as words."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpudoctor.analysis.memory_breakdown import SiteBytes
from gpudoctor.analysis.memory_frames import CATEGORY_LABELS
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.base import pct, size
from gpudoctor.rules.finding import Finding, Severity

MemoryRule = Callable[[MemoryAnalysis], Finding | None]


def severity_of_share(share: float) -> Severity:
    """A fix freeing ≥ 30% of the peak is major, ≥ 10% minor, less is information."""
    if share >= 0.3:
        return Severity.MAJOR
    if share >= 0.1:
        return Severity.MINOR
    return Severity.INFO


def peak_of(m: MemoryAnalysis) -> int:
    """The peak a share is taken of: the highest step peak, else the detail step's."""
    return m.peak_allocated or (m.breakdown.peak if m.breakdown else 0)


def categories_text(categories: Mapping[str, int], total: int | None = None) -> str:
    """'activations 38 GiB (62%), parameters 1.2 GiB (2%), …' largest first, zeros left out."""
    total = total or sum(categories.values()) or 1
    parts = [
        f"{CATEGORY_LABELS.get(c, c)} {size(b)} ({pct(100 * b / total)})"
        for c, b in sorted(categories.items(), key=lambda kv: -kv[1])
        if b > 0
    ]
    return ", ".join(parts)


def where(site: SiteBytes) -> str:
    """'lm.py:23 in forward (from train.py:41 in <module>)': the line, and the script's line that led
    there or the innermost line inside it."""
    around = site.script_line or site.inner
    return f"{site.site} ({'from' if site.script_line else 'inside'} {around})" if around else site.site


def of_capacity(m: MemoryAnalysis, bytes_: int) -> str:
    """' (63% of the device's 80 GiB)' where the capacity is known."""
    if not m.capacity:
        return ""
    return f" ({pct(100 * bytes_ / m.capacity)} of the device's {size(m.capacity)})"
