"""What the doctor says: a `Finding` per bottleneck — stable id, severity, the share of step time its
fix can save at most, the evidence from the trace, and the fix — and the `Diagnosis` that ranks them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.findings/1"


class Severity(str, Enum):
    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"
    INFO = "info"

    @classmethod
    def of_saving(cls, pct: float) -> Severity:
        """Severity by what the fix can save: ≥ 20% of the step critical, ≥ 8% major, ≥ 2% minor."""
        if pct >= 20:
            return cls.CRITICAL
        if pct >= 8:
            return cls.MAJOR
        if pct >= 2:
            return cls.MINOR
        return cls.INFO


@dataclass(frozen=True)
class Fix:
    summary: str  # what to change, in one sentence
    snippet: str  # runnable PyTorch showing the change


@dataclass(frozen=True)
class Finding:
    id: str  # stable API: JSON consumers and CI gates depend on it
    severity: Severity
    title: str
    est_saving_pct: float  # upper bound on the share of step time the fix saves, justified in `evidence`
    evidence: tuple[str, ...]  # sentences with the numbers, kernel and op names, source lines
    fix: Fix
    values: dict[str, float]  # the numbers behind the evidence, machine-readable
    sources: tuple[str, ...] = ()  # the user's Python frames involved, where the trace has stacks
    # memory findings: the device memory the fix frees at most, in bytes (None for time findings)
    est_memory_bytes: int | None = None


@dataclass(frozen=True)
class Diagnosis(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "gpudoctor findings"

    schema: str
    findings: tuple[Finding, ...]  # by est_saving_pct, highest first
    bound: str  # what limits the step, in one sentence
    summary: dict[str, float | None]
    # What `est_saving_pct` is a share of: "step", or "traced time" where the trace has no steps.
    saving_of: str = "step"
    # Whether the time rules ran: False where there was nothing to judge (no GPU activity, too little
    # GPU work, no trace), so that no report says "no bottleneck found" of what it did not look at.
    judged: bool = True

    def get(self, finding_id: str) -> Finding | None:
        return next((f for f in self.findings if f.id == finding_id), None)
