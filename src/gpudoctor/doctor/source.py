"""What a report is made from (`gpudoctor report PATH`, `gpudoctor.diagnose(PATH)`): a trace, a directory
of rank traces, a run directory, or a saved analysis (analysis.json, `analyze --json`), read back as a
`RunReport` — re-analyzed only where it must be (no saved analysis, or another unprofiled step time) —
with the detailed rank's trace where there is one, and every file it was read from (so that no output
is written over one of them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gpudoctor.analysis.summary import Analysis
from gpudoctor.doctor.diagnose import diagnose_loaded_traces, ranks_report, step_timeline_of
from gpudoctor.doctor.document import saved_reports
from gpudoctor.doctor.pipeline import AnalyzeOptions, diagnose_loaded, rank_index
from gpudoctor.doctor.ranks import analyze_directory, ranks_from_reports
from gpudoctor.doctor.report import RunReport
from gpudoctor.runner import rundir
from gpudoctor.trace import load_trace
from gpudoctor.trace.model import Trace
from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

ANNOTATED_DEFAULT = "annotated.json.gz"  # `gpudoctor report -f trace`'s output: never taken for a trace


@dataclass(frozen=True)
class Source:
    """A report's source: the doctor's report (the detailed rank's, with the ranks side by side where
    there are several), the detailed rank's trace where there is one, every file and directory it was
    read from, and the saved analysis it was read from, if it was."""

    report: RunReport
    trace: Trace | None
    inputs: tuple[Path, ...] = ()
    saved: Path | None = None


def load_source(
    path: Path,
    options: AnalyzeOptions | None = None,
    *,
    need_trace: bool = False,
    rank: int | None = None,
    workers: int | None = None,
    engine: str = "auto",
) -> Source:
    """The report's source from PATH; with several ranks, `rank` (default: the first) is detailed.
    `need_trace`: the output is drawn on the trace (the annotated trace): one rank's, loaded."""
    options = options or AnalyzeOptions()
    if not path.exists():
        raise UsageError(f"no such file or directory: {printable(str(path))}")
    saved = rundir.saved_analysis(path)
    if saved is None and path.is_dir() and rundir.is_run_dir(path) and not rundir.rank_files(path):
        return Source(RunReport.load(path), None, (path,))  # a run that traced nothing: its record, memory
    if saved is None and path.is_dir() and not need_trace:
        return _directory_source(path, options, rank, workers, engine)
    if saved is None:
        report, trace = diagnose_loaded_traces(
            path, options, rank=rank, timeline=True, only_detailed=need_trace
        )
        trace_path = Path(report.trace_path or path)
        record = rundir.read_record(path) if path.is_dir() else None  # a run that stopped before analysis
        return Source(replace(report, record=record), trace, (path, trace_path))
    return _saved_source(path, saved, options, need_trace, rank)


def _saved_source(
    path: Path, saved: Path, options: AnalyzeOptions, need_trace: bool, rank: int | None
) -> Source:
    reports, doc = saved_reports(saved)
    index = rank_index([a.trace.rank for a, _ in reports], rank)
    analysis, diagnosis = reports[index]
    record = rundir.read_record(saved.parent)
    trace_path = _trace_of(path, analysis, guess=len(reports) == 1)
    inputs = (path, saved, *((trace_path,) if trace_path else ()))
    several = len(reports) > 1 or len(doc.get("summaries") or ()) > 1
    if trace_path is None:
        if need_trace or options.unprofiled_us is not None:
            raise UsageError(f"the trace behind {printable(str(saved))} is not found: give the trace itself")
        ranks = ranks_from_reports(reports, doc) if several else None
        return Source(RunReport(analysis, diagnosis, record, ranks=ranks), None, inputs, saved)
    trace = load_trace(trace_path, options.max_bytes)
    if options.unprofiled_us is not None:
        analysis, diagnosis = diagnose_loaded(trace, replace(options, step=analysis.selected_step))
        reports[index] = (analysis, diagnosis)
    ranks = ranks_from_reports(reports, doc) if several else None
    report = RunReport(
        analysis,
        diagnosis,
        record,
        ranks=ranks,
        timeline=step_timeline_of(trace, analysis.selected_step),
        trace_path=str(trace_path),
    )
    return Source(report, trace, inputs, saved)


def _directory_source(
    path: Path, options: AnalyzeOptions, rank: int | None, workers: int | None, engine: str
) -> Source:
    """A directory of rank traces (or the rank-K/ folders of a run under torchrun): every rank
    summarized (in parallel where there are many), the detailed one whole, with its trace."""
    run = analyze_directory(
        path,
        unprofiled_us=options.unprofiled_us,
        detailed=rank,
        workers=workers,
        engine=engine,
        max_bytes=options.max_bytes,
    )
    report = ranks_report(run, rank, timeline=False)
    trace_path = Path(report.trace_path or path)
    trace = load_trace(trace_path, options.max_bytes)
    folder = trace_path.parent if trace_path.parent != path else path
    report = replace(
        report,
        record=rundir.read_record(folder),
        timeline=step_timeline_of(trace, report.analysis.selected_step if report.analysis else None),
    )
    inputs = (path, *(Path(p) for p in run.trace_paths.values()))
    return Source(report, trace, inputs)


def _trace_of(path: Path, analysis: Analysis, guess: bool = True) -> Path | None:
    """The trace a saved analysis was made from: beside it in a run directory, else where it was; with
    `guess`, else the one trace beside it (never for one rank of several: it may be another's)."""
    folder = path if path.is_dir() else path.parent
    recorded = Path(analysis.trace.path)
    for candidate in (folder / recorded.name, recorded):
        if candidate.is_file():
            return candidate
    if not guess:
        return None
    found = sorted(
        p for p in folder.glob("*.json.gz") if ".annotated" not in p.name and p.name != ANNOTATED_DEFAULT
    )
    return found[0] if len(found) == 1 else None
