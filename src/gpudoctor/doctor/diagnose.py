"""The doctor on traces that already exist: `diagnose_trace` (a trace file, or a directory of rank
traces loaded whole) and `diagnose_ranks` (a directory of many rank traces, each rank analyzed by a
worker on processes, Ray or Dask, the parent holding summaries), each returning a `RunReport`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.doctor.document import Report
from gpudoctor.doctor.pipeline import AnalyzeOptions, diagnose_loaded, load_traces, rank_index
from gpudoctor.doctor.ranks import RanksRun, analyze_directory, check_rank, ranks_from_reports
from gpudoctor.doctor.report import RunReport
from gpudoctor.trace.model import Trace
from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

if TYPE_CHECKING:
    from gpudoctor.analysis.timeline_view import StepTimeline
    from gpudoctor.trace.split import StartedLoad


def diagnose_trace(
    path: str | os.PathLike[str],
    options: AnalyzeOptions | None = None,
    *,
    rank: int | None = None,
    timeline: bool = False,
    started: StartedLoad | None = None,
) -> RunReport:
    """A Kineto trace analyzed and diagnosed. A directory of rank traces is loaded whole, every rank
    analyzed, `rank` (default the first) detailed; `timeline`: also the GPU timeline of a representative
    step (for the HTML report); `started`: the load of the trace file at `path`, already begun
    (`trace.split.start_load`), in place of loading it here where it has started a helper."""
    report, _ = diagnose_loaded_traces(
        _existing(path), options or AnalyzeOptions(), rank=rank, timeline=timeline, started=started
    )
    return report


def diagnose_loaded_traces(
    path: Path,
    options: AnalyzeOptions,
    *,
    rank: int | None = None,
    timeline: bool = False,
    only_detailed: bool = False,
    started: StartedLoad | None = None,
) -> tuple[RunReport, Trace]:
    """`diagnose_trace`, with the detailed rank's trace; `only_detailed`: analyze that rank alone."""
    if started is not None and started.split:
        traces = [started.result()]
    else:
        traces = load_traces(path, options.max_bytes)
    index = rank_index([t.meta.rank for t in traces], rank)
    if only_detailed:
        traces, index = [traces[index]], 0
    reports = [diagnose_loaded(t, options) for t in traces]
    return report_of(reports, traces[index], timeline=timeline), traces[index]


def report_of(
    reports: list[Report], trace: Trace, *, timeline: bool, notes: tuple[str, ...] = ()
) -> RunReport:
    """The report of one or more analyzed traces, `trace`'s rank detailed."""
    chosen = next(r for r in reports if r[0].trace.rank == trace.meta.rank)
    ranks = ranks_from_reports(reports) if len(reports) > 1 else None
    return RunReport(
        chosen[0],
        chosen[1],
        ranks=ranks,
        timeline=step_timeline_of(trace, chosen[0].selected_step) if timeline else None,
        trace_path=trace.meta.path,
        notes=notes,
    )


def diagnose_ranks(
    directory: str | os.PathLike[str],
    options: AnalyzeOptions | None = None,
    *,
    rank: int | None = None,
    engine: str = "auto",
    workers: int | None = None,
    all_reports: bool = False,
    timeline: bool = False,
) -> RunReport:
    """Every rank of a directory of rank traces (or of a run's `rank-K/` folders) analyzed — on this
    machine's processes (`engine="processes"`), an existing Ray or Dask cluster (`"ray"`, `"dask"`),
    serially, or as many ranks and cores suggest (`"auto"`) — the ranks compared, those that wait for a
    straggler diagnosed at their own pace; `rank` (default the first) detailed. The whole report comes
    back for the detailed rank and the slowest, or for every rank with `all_reports`."""
    path, options = _existing(directory), options or AnalyzeOptions()
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise UsageError(f"{printable(str(path))}: {what}: give a directory of rank traces")
    run = analyze_directory(
        path,
        unprofiled_us=options.unprofiled_us,
        detailed=rank,
        all_reports=all_reports,
        workers=workers,
        engine=engine,
        top=options.top,
        max_bytes=options.max_bytes,
    )
    return ranks_report(run, rank, timeline=timeline)


def ranks_report(run: RanksRun, rank: int | None, *, timeline: bool = False) -> RunReport:
    chosen = check_rank(run, rank)
    analysis, diagnosis = run.reports[chosen]
    trace_path = run.trace_paths[chosen]
    view = None
    if timeline:
        from gpudoctor.trace import load_trace

        view = step_timeline_of(load_trace(trace_path), analysis.selected_step)
    return RunReport(analysis, diagnosis, ranks=run, timeline=view, trace_path=trace_path)


def step_timeline_of(trace: Trace, step: int | None) -> StepTimeline | None:
    from gpudoctor.analysis.timeline_view import step_timeline

    return step_timeline(trace, step)


def _existing(path: str | os.PathLike[str]) -> Path:
    """PATH as a path; an empty one is an error (Path("") would be the current directory). A missing
    file is the trace loader's to name."""
    if not os.fspath(path).strip():
        raise UsageError("PATH is empty: give a trace file or a directory of traces")
    return Path(path)
