"""`gpudoctor run`'s memory part: read what `runner.memory` wrote into the run directory (the record's
`memory_run` and the snapshots it names), analyze it, write `memory.json` (schema `gpudoctor.memory/1`
with the memory findings) and, for a run with no trace to analyze (an out-of-memory error in the first
steps, --light), print the memory findings and figures."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from gpudoctor.analysis.memory_run import MemoryAnalysis, analyze_memory
from gpudoctor.report.findings_view import render_diagnosis
from gpudoctor.report.memory_view import render_memory_run
from gpudoctor.rules.finding import SCHEMA as FINDINGS_SCHEMA
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.rules.memory_registry import memory_findings
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.errors import GpudoctorError, MemoryFormatError
from gpudoctor.util.serial import to_jsonable

MEMORY_FILE = "memory.json"
MAX_SNAPSHOT_BYTES = 1 << 30  # decompressed
_NAME = re.compile(r"memory/[a-z_]+\.json\.gz")


def memory_of_run(out: Path, record: RunRecord, console: Console) -> MemoryAnalysis | None:
    """The run's memory analysis (None when nothing was recorded); memory.json written beside it."""
    run = record.memory_run
    if not run:
        return None
    try:
        snapshots = {
            name: read_json_gz(out, meta.get("file"))
            for name, meta in (run.get("snapshots") or {}).items()
            if isinstance(meta, dict)
        }
        timeline = read_json_gz(out, (run.get("timeline") or {}).get("file"))
        if isinstance(run.get("oom"), dict) and record.error:
            run = {**run, "oom": {**run["oom"], "message": record.error}}
        step_us = record.light.median_us if record.light else None
        memory = analyze_memory(run, {k: v for k, v in snapshots.items() if v is not None}, timeline, step_us)
    except GpudoctorError as err:
        console.print(f"the memory recording could not be analyzed: {err}", style="dim")
        return None
    doc = {**memory.to_json(), "findings": [to_jsonable(f) for f in memory_findings(memory)]}
    (out / MEMORY_FILE).write_text(json.dumps(doc, indent=1, allow_nan=False))
    return memory


def render_without_trace(memory: MemoryAnalysis, console: Console) -> None:
    """The memory findings and figures of a run whose trace could not be analyzed (or has none)."""
    findings = memory_findings(memory)
    bound = (
        "The script ran out of GPU memory."
        if memory.oom is not None
        else "No trace to judge the step's time by: memory only."
    )
    render_diagnosis(Diagnosis(FINDINGS_SCHEMA, findings, bound, {}), console)
    render_memory_run(memory, console)


def read_json_gz(out: Path, name: Any) -> Any:
    """A gzipped JSON file the recorder named; None when it is missing. Only names under memory/ are
    read, and at most MAX_SNAPSHOT_BYTES of JSON."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    path = out / name
    if not path.is_file():
        return None
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise MemoryFormatError(f"{path}: more than {MAX_SNAPSHOT_BYTES >> 20} MiB of JSON")
        return json.loads(data)
    except (OSError, EOFError, ValueError) as err:
        raise MemoryFormatError(f"{path}: {err}") from None
