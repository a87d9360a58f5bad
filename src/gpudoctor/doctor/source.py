"""What `gpudoctor report` and `analyze --html` work from and write: the report's `Source` (one rank's
analysis and diagnosis, its trace where there is one, the ranks side by side), read from a trace, a
directory of rank traces, a run directory or a saved analysis; and the HTML, Markdown and annotated
trace files, each through `util.outfile` (never over an input). Imported only when such a command
runs: it pulls in the analysis and the renderers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.analysis.timeline_view import idle_spans, step_timeline
from gpudoctor.cli.common import rank_index, trace_ceilings
from gpudoctor.monitor.samples import GpuSample
from gpudoctor.report.annotated_trace import annotate
from gpudoctor.report.html import render_html
from gpudoctor.report.json_out import Report, reports_from_json
from gpudoctor.report.markdown import render_markdown
from gpudoctor.report.ranks_view import RanksView
from gpudoctor.rules import diagnose
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.record import RunRecord
from gpudoctor.trace import load_trace, load_traces
from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES, load_document
from gpudoctor.trace.model import Trace
from gpudoctor.util.errors import UsageError
from gpudoctor.util.jsonfile import read_json_object
from gpudoctor.util.outfile import open_output, write_text
from gpudoctor.util.text import printable

ANALYSIS_FILE = "analysis.json"
RECORD_FILE = "record.json"  # written by `gpudoctor run`
ANNOTATED_DEFAULT = "annotated.json.gz"
DAMAGED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError)


@dataclass(frozen=True)
class Source:
    """What a report is made from: one rank's analysis and diagnosis, and its trace where there is one;
    with several ranks, every rank's analysis and diagnosis too."""

    analysis: Analysis
    diagnosis: Diagnosis
    trace: Trace | None
    trace_path: Path | None
    nvml: tuple[GpuSample, ...] = ()  # from a `gpudoctor run` directory's record.json
    ranks: RanksView | None = None  # with several ranks
    inputs: tuple[Path, ...] = ()  # every file and directory it was read from
    saved: Path | None = None  # the saved analysis it was read from, if it was


def ranks_view(
    reports: Sequence[Report], detailed: int, saved: dict[str, Any] | None = None
) -> RanksView | None:
    """The ranks side by side, where there are several; `detailed`: the rank the report details;
    `saved`: the gpudoctor.ranks/1 document they come from (its summaries cover every rank)."""
    from gpudoctor.cli.multirank import ranks_from_reports

    if len(reports) < 2 and not (saved and len(saved.get("summaries") or ()) > 1):
        return None
    return ranks_from_reports(list(reports), saved).view(detailed)


def write_html(
    target: Path,
    analysis: Analysis,
    diagnosis: Diagnosis,
    trace: Trace | None,
    nvml: tuple[GpuSample, ...] = (),
    ranks: RanksView | None = None,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> None:
    """The HTML report of one analysis; with its trace, the GPU timeline of a representative step;
    with NVML samples, their series; with several ranks, all of them side by side."""
    view = step_timeline(trace, analysis.selected_step) if trace is not None else None
    write_text(target, render_html(analysis, diagnosis, view, nvml, ranks), inputs=inputs)


def write_markdown(target: Path, source: Source) -> None:
    write_text(target, render_markdown(source.analysis, source.diagnosis, source.ranks), inputs=source.inputs)


def write_annotated(target: Path, source: Source, max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES) -> None:
    """The original trace (read by the trace loader's JSON path) with gpudoctor's tracks added."""
    import json

    assert source.trace is not None and source.trace_path is not None
    original = load_document(source.trace_path, max_bytes)
    doc = annotate(original, idle_spans(source.trace), source.analysis, source.diagnosis)
    # UTF-8 as is, not \u escapes: Perfetto shows an escaped µ in an arg as the six characters. A lone
    # surrogate (only an escape in the original can make one) is written back as its escape.
    with open_output(target, inputs=source.inputs) as f:
        json.dump(doc, f, separators=(",", ":"), ensure_ascii=False)


def load_source(
    path: Path,
    unprofiled_us: float | None,
    need_trace: bool,
    rank: int | None = None,
    max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES,
    workers: int | None = None,
    engine: str = "auto",
) -> Source:
    """The report's source from PATH; with several ranks, `rank` (default: the first) is detailed."""
    if not path.exists():
        raise UsageError(f"no such file or directory: {printable(str(path))}")
    saved = _saved_analysis(path)
    if saved is None and path.is_dir() and not need_trace:
        return _directory_source(path, unprofiled_us, rank, workers, engine)
    if saved is None:
        traces = load_traces(path, max_bytes)
        index = rank_index([t.meta.rank for t in traces], rank)
        if len(traces) == 1 or need_trace:  # the annotated trace is of one rank: analyze only it
            traces = [traces[index]]
            index = 0
        analyses = [analyze(t, unprofiled_step_us=unprofiled_us, ceilings=trace_ceilings(t)) for t in traces]
        reports = [(a, diagnose(a)) for a in analyses]
        analysis, diagnosis = reports[index]
        nvml = nvml_samples(path / RECORD_FILE) if path.is_dir() else ()  # a run that stopped before analysis
        trace_path = path if path.is_file() else Path(traces[index].meta.path)
        view = ranks_view(reports, analysis.trace.rank)
        return Source(analysis, diagnosis, traces[index], trace_path, nvml, view, (path, trace_path))
    reports, doc = saved_reports(saved)
    index = rank_index([a.trace.rank for a, _ in reports], rank)
    analysis, diagnosis = reports[index]
    nvml = nvml_samples(saved.parent / RECORD_FILE)
    trace_path = _trace_of(path, analysis, guess=len(reports) == 1)
    inputs = (path, saved, *((trace_path,) if trace_path else ()))
    if trace_path is None:
        if need_trace or unprofiled_us is not None:
            raise UsageError(f"the trace behind {printable(str(saved))} is not found: give the trace itself")
        view = ranks_view(reports, analysis.trace.rank, doc)
        return Source(analysis, diagnosis, None, None, nvml, view, inputs, saved)
    trace = load_trace(trace_path, max_bytes)
    if unprofiled_us is not None:
        analysis = analyze(
            trace,
            step=analysis.selected_step,
            unprofiled_step_us=unprofiled_us,
            ceilings=trace_ceilings(trace),
        )
        diagnosis = diagnose(analysis)
        reports[index] = (analysis, diagnosis)
    view = ranks_view(reports, analysis.trace.rank, doc)
    return Source(analysis, diagnosis, trace, trace_path, nvml, view, inputs, saved)


def _directory_source(
    path: Path, unprofiled_us: float | None, rank: int | None, workers: int | None, engine: str
) -> Source:
    """A directory of rank traces (or the rank-K/ folders of a run under torchrun): every rank
    summarized (in parallel where there are many), the detailed one whole, with its trace."""
    from gpudoctor.cli.multirank import analyze_directory, check_rank

    run = analyze_directory(path, unprofiled_us=unprofiled_us, detailed=rank, workers=workers, engine=engine)
    chosen = check_rank(run, rank)
    analysis, diagnosis = run.reports[chosen]
    trace_path = Path(run.trace_paths[chosen])
    trace = load_trace(trace_path)
    record = trace_path.parent / RECORD_FILE if trace_path.parent != path else path / RECORD_FILE
    view = run.view(chosen) if len(run.summaries) > 1 else None
    inputs = (path, *(Path(p) for p in run.trace_paths.values()))
    return Source(analysis, diagnosis, trace, trace_path, nvml_samples(record), view, inputs)


def saved_reports(saved: Path) -> tuple[list[Report], dict[str, Any]]:
    """The reports of a saved analysis.json (or `analyze --json` output), and the document; one line if
    it is damaged."""
    doc = read_json_object(saved, "gpudoctor analysis")
    try:
        return reports_from_json(doc), doc
    except UsageError as err:
        raise UsageError(f"{printable(str(saved))}: {err}") from None
    except DAMAGED as err:
        raise UsageError(
            f"{printable(str(saved))} is a damaged gpudoctor analysis (edited or from another version): "
            f"{type(err).__name__}: {err}"
        ) from None


def nvml_samples(record_path: Path) -> tuple[GpuSample, ...]:
    """The NVML samples of the most sampled GPU in a `gpudoctor run` record; none without one."""
    if not record_path.is_file():
        return ()
    doc = read_json_object(record_path, "gpudoctor run record")
    try:
        record = RunRecord.from_json(doc)
        samples = [GpuSample.from_json(s) for s in record.nvml_samples]
    except DAMAGED as err:
        raise UsageError(
            f"{printable(str(record_path))} is a damaged gpudoctor run record: {type(err).__name__}: {err}"
        ) from None
    if not samples:
        return ()
    indices = [s.index for s in samples]
    main = max(set(indices), key=indices.count)
    return tuple(s for s in samples if s.index == main)


def _saved_analysis(path: Path) -> Path | None:
    """The analysis.json of a run directory, or PATH itself when it is a gpudoctor JSON document."""
    if path.is_dir():
        return path / ANALYSIS_FILE if (path / ANALYSIS_FILE).is_file() else None
    if path.suffix != ".json" or not path.is_file():  # not a FIFO: reading its head would wait
        return None
    with path.open("rb") as f:
        head = f.read(256)
    return path if b'"gpudoctor.' in head and b'"schema"' in head else None


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
