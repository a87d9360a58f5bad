"""The memory rules and `memory_findings(m)`: every memory finding of a run, an out-of-memory error
first, then by severity and by the memory its fix frees."""

from __future__ import annotations

from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.activation_checkpointing import activation_checkpointing
from gpudoctor.rules.finding import Finding, Severity
from gpudoctor.rules.memory_base import MemoryRule
from gpudoctor.rules.memory_fragmentation import memory_fragmentation
from gpudoctor.rules.memory_held import memory_held
from gpudoctor.rules.memory_leak import memory_leak
from gpudoctor.rules.optimizer_state import optimizer_state_memory
from gpudoctor.rules.out_of_memory import out_of_memory

MEMORY_RULES: tuple[MemoryRule, ...] = (
    out_of_memory,
    memory_leak,
    memory_fragmentation,
    activation_checkpointing,
    optimizer_state_memory,
    memory_held,
)
_ORDER = {Severity.CRITICAL: 0, Severity.MAJOR: 1, Severity.MINOR: 2, Severity.INFO: 3}


def memory_findings(m: MemoryAnalysis | None) -> tuple[Finding, ...]:
    if m is None:
        return ()
    found = [f for f in (rule(m) for rule in MEMORY_RULES) if f is not None]
    found.sort(key=lambda f: (f.id != "out_of_memory", _ORDER[f.severity], -(f.est_memory_bytes or 0), f.id))
    return tuple(found)
