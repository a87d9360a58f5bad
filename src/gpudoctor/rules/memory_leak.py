"""`memory_leak`: allocated memory grows step over step — the loop keeps something from every step
(losses with their graphs, outputs appended to a list, a cache that never drops). With the lines
whose held memory grew between two snapshots, and when at this rate the device is full."""

from __future__ import annotations

from gpudoctor.analysis.memory_breakdown import SiteBytes
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.base import finding, pct, size
from gpudoctor.rules.finding import Finding, Fix, Severity
from gpudoctor.rules.memory_base import where

# Full within this many more steps: critical (a run of a few hours), else major.
CRITICAL_STEPS = 10_000
HORIZON_STEPS = 100  # the memory a leak takes is stated for this many more steps

FIX = Fix(
    summary="Keep numbers, not tensors, across steps: `.item()` (or `.detach()`) what you log, run "
    "evaluation under `torch.no_grad()`, and drop references to outputs you do not need.",
    snippet="""\
losses.append(loss.item())           # not losses.append(loss): that keeps its whole graph alive
with torch.no_grad():                # evaluation: no graph at all
    val_loss = model(x_val).loss
running += loss.detach()             # a tensor sum without the graph""",
)


def memory_leak(m: MemoryAnalysis) -> Finding | None:
    leak = m.leak
    if leak is None:
        return None
    evidence = [
        f"Allocated memory at the step boundaries grows by {size(leak.bytes_per_step)} per step over "
        f"{leak.steps} steps ({size(leak.growth)} in all; it rose in {pct(100 * leak.rising_share)} of them).",
    ]
    if leak.steps_to_full is not None:
        evidence.append(
            f"At this rate the peak reaches the {size(m.budget or 0)} the allocator can have in about "
            f"{leak.steps_to_full:,.0f} more steps, then torch.OutOfMemoryError."
        )
    if leak.sites:
        evidence.append(
            "Memory held by these lines grew: "
            + "; ".join(f"{where(s)} +{size(s.bytes)} per step{_kept(s)}" for s in leak.sites[:4])
            + "."
        )
    else:
        evidence.append("No snapshot names the line (run on a GPU with the allocator's history on).")
    critical = leak.steps_to_full is not None and leak.steps_to_full < CRITICAL_STEPS
    return finding(
        "memory_leak",
        "Memory grows every step (a leak)",
        0.0,
        evidence,
        FIX,
        {
            "bytes_per_step": leak.bytes_per_step,
            "growth": leak.growth,
            "steps": leak.steps,
            "steps_to_full": leak.steps_to_full if leak.steps_to_full is not None else -1,
        },
        sources=tuple(s.site for s in leak.sites[:4])
        + tuple(s.kept_by for s in leak.sites[:4] if s.kept_by and s.kept_by not in _lines(s.site)),
        severity=Severity.CRITICAL if critical else Severity.MAJOR,
        memory_bytes=int(max(leak.growth, leak.bytes_per_step * HORIZON_STEPS)),
    )


def _kept(s: SiteBytes) -> str:
    """', kept by train.py:31 (it stores what that line allocates)' where the run saw the storing line."""
    if not s.kept_by:
        return ""
    if s.kept_by in _lines(s.site):
        return " (the same line keeps it)"
    return f", kept by {s.kept_by} (it stores what that line allocates)"


def _lines(site: str) -> str:
    return site.split(" in ", 1)[0]
