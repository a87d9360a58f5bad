"""A run's memory, diagnosed: what `runner.memory` recorded (the record's `memory_run` and the snapshots
it names under `memory/`) analyzed into a `MemoryAnalysis`, with its findings (`rules`'s memory
registry). Also for a run with no trace to analyze (an out-of-memory error in the first steps,
`--light`). Reads and writes through `runner.rundir`; renders nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudoctor.analysis.memory_run import MemoryAnalysis, analyze_memory
from gpudoctor.rules.finding import Finding
from gpudoctor.rules.memory_registry import memory_findings
from gpudoctor.runner.record import RunRecord
from gpudoctor.runner.rundir import read_snapshot
from gpudoctor.util.errors import GpudoctorError
from gpudoctor.util.serial import to_jsonable


def memory_of_run(out: Path, record: RunRecord) -> tuple[MemoryAnalysis | None, str | None]:
    """The run's memory analysis (None when nothing was recorded), or None and why it could not be
    analyzed."""
    run = record.memory_run
    if not run:
        return None, None
    try:
        snapshots = {
            name: read_snapshot(out, meta.get("file"))
            for name, meta in (run.get("snapshots") or {}).items()
            if isinstance(meta, dict)
        }
        timeline = read_snapshot(out, (run.get("timeline") or {}).get("file"))
        if isinstance(run.get("oom"), dict) and record.error:
            run = {**run, "oom": {**run["oom"], "message": record.error}}
        step_us = record.light.median_us if record.light else None
        memory = analyze_memory(run, {k: v for k, v in snapshots.items() if v is not None}, timeline, step_us)
    except GpudoctorError as err:
        return None, f"the memory recording could not be analyzed: {err}"
    return memory, None


def memory_document(memory: MemoryAnalysis, findings: tuple[Finding, ...]) -> dict[str, Any]:
    """memory.json: the analysis (schema gpudoctor.memory/1) with its findings."""
    return {**memory.to_json(), "findings": [to_jsonable(f) for f in findings]}


def memory_from_document(doc: dict[str, Any]) -> tuple[MemoryAnalysis, tuple[Finding, ...]]:
    from gpudoctor.util.serial import from_jsonable

    findings = tuple(from_jsonable(Finding, f) for f in doc.get("findings") or ())
    return MemoryAnalysis.from_json({k: v for k, v in doc.items() if k != "findings"}), findings


def findings_of(memory: MemoryAnalysis) -> tuple[Finding, ...]:
    return tuple(memory_findings(memory))
