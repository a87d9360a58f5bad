"""The doctor's pipeline, put together here once: a trace loaded (a file, a directory of rank traces, or
the `rank-K/` folders of a run), analyzed under the measured ceilings of the GPU it came from, and
diagnosed. Every way in — `gpudoctor analyze`, `report`, `run`, the rank pool's workers, a notebook —
goes through `diagnose_loaded`; nothing here renders."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.analysis.modules import DEFAULT_DEPTH
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.rules import diagnose
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.rundir import rank_files
from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES, load_trace, load_trace_files
from gpudoctor.trace.model import Trace
from gpudoctor.util.errors import UsageError

if TYPE_CHECKING:
    from gpudoctor.analysis.memory_run import MemoryAnalysis
    from gpudoctor.device.ceilings import Ceilings
    from gpudoctor.device.links import Link


@dataclass(frozen=True)
class AnalyzeOptions:
    """How a trace is analyzed: `step` alone (else every profiled step), `top` rows of the kernel and op
    tables, the step time measured without the profiler (its overhead is then taken out), how deep the
    module view goes, and the largest trace read (decompressed; None: no limit)."""

    step: int | None = None
    top: int = 15
    unprofiled_us: float | None = None
    module_depth: int = DEFAULT_DEPTH
    max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES


def trace_ceilings(trace: Trace) -> Ceilings | None:
    """The measured ceilings of the trace's GPU for its roofline: this machine's cache if it measured a
    GPU of that name, else gpudoctor's table of measured devices."""
    from gpudoctor.device.ceilings import ceilings_for_device

    info = trace.device_info
    return ceilings_for_device(info.name) if info is not None else None


def diagnose_loaded(
    trace: Trace,
    options: AnalyzeOptions | None = None,
    *,
    link: Link | None = None,
    memory: MemoryAnalysis | None = None,
) -> tuple[Analysis, Diagnosis]:
    """One trace analyzed and diagnosed; `link`: the GPU's link as NVML saw it (a rank of a run),
    `memory`: the run's memory analysis, which the findings then take into account."""
    options = options or AnalyzeOptions()
    analysis = analyze(
        trace,
        step=options.step,
        top=options.top,
        unprofiled_step_us=options.unprofiled_us,
        ceilings=trace_ceilings(trace),
        module_depth=options.module_depth,
        link=link,
    )
    if memory is not None:
        analysis = replace(analysis, memory_run=memory)
    return analysis, diagnose(analysis)


def diagnose_again(analysis: Analysis, *, unprofiled_us: float | None) -> tuple[Analysis, Diagnosis]:
    """An analysis diagnosed again against another unprofiled step time (a rank that waits for a
    straggler, against its own pace)."""
    analysis = replace(analysis, unprofiled_step_us=unprofiled_us)
    return analysis, diagnose(analysis)


def load_traces(path: str | os.PathLike[str], max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES) -> list[Trace]:
    """A trace file, or every trace of a directory — one per rank, or one per `rank-K/` folder of a
    `gpudoctor run` of several ranks — sorted by rank."""
    p = Path(path)
    if not os.fspath(path) or not p.is_dir():
        return [load_trace(path, max_bytes)]
    return load_trace_files([f.trace for f in rank_files(p)], p, max_bytes)


def rank_index(ranks: Sequence[int], rank: int | None) -> int:
    """Where `rank` is among the ranks loaded (in their order); without one, the first. A rank not
    among them is a user error that names the ranks there are."""
    if not ranks:
        raise UsageError("no ranks to report on")
    if rank is None:
        return 0
    if rank in ranks:
        return list(ranks).index(rank)
    raise UsageError(f"no rank {rank} among the traces (ranks: {', '.join(map(str, ranks))})")
