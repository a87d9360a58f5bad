"""`gpudoctor report PATH -o FILE`: the HTML report (default), Markdown (--format md) or the annotated
trace (--format trace) of a trace, a directory of rank traces, a run directory (trace + analysis.json)
or a saved analysis.json (re-rendered without re-analyzing where the output does not need the trace).
With several ranks (a directory of rank traces, or `analyze --json`'s gpudoctor.ranks/1 document), the
HTML and Markdown show every rank side by side and detail one (--rank, default the first)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.analysis.timeline_view import idle_spans, step_timeline
from gpudoctor.cli.common import (
    DebugOption,
    EngineOption,
    WorkersOption,
    rank_index,
    set_debug,
    trace_ceilings,
)
from gpudoctor.monitor.samples import GpuSample
from gpudoctor.report.annotated_trace import annotate
from gpudoctor.report.html import render_html
from gpudoctor.report.json_out import Report, reports_from_json
from gpudoctor.report.markdown import render_markdown
from gpudoctor.report.ranks_view import RanksView
from gpudoctor.rules import diagnose
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.record import RunRecord
from gpudoctor.trace import load_trace
from gpudoctor.trace.model import Trace
from gpudoctor.util.errors import UsageError

ANALYSIS_FILE = "analysis.json"
RECORD_FILE = "record.json"  # written by `gpudoctor run`


class Format(str, Enum):
    html = "html"
    md = "md"
    trace = "trace"


DEFAULT_OUT = {Format.html: "report.html", Format.md: "report.md", Format.trace: "annotated.json.gz"}


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


def report_command(
    ctx: typer.Context,
    path: Annotated[
        Path,
        typer.Argument(
            metavar="PATH",
            help="A trace, a directory of rank traces, a run directory, or saved JSON (analysis.json, analyze --json).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="The file to write (default: report.html, report.md, annotated.json.gz)."
        ),
    ] = None,
    fmt: Annotated[
        Format, typer.Option("--format", "-f", help="html, md (Markdown) or trace (annotated Kineto trace).")
    ] = Format.html,
    step_time_ms: Annotated[
        float | None,
        typer.Option(
            "--step-time-ms",
            metavar="MS",
            min=0.001,
            help="The step time measured without the profiler (re-analyzes the trace).",
            show_default=False,
        ),
    ] = None,
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            metavar="R",
            help="With several ranks: the rank to detail (default: the first).",
            show_default=False,
        ),
    ] = None,
    workers: WorkersOption = None,
    engine: EngineOption = "auto",
    debug: DebugOption = False,
) -> None:
    """Write a report: self-contained HTML, Markdown, or the trace annotated for Perfetto.

    With several ranks, the HTML and Markdown show them side by side, the slowest marked, then detail
    one (--rank); the annotated trace is of that rank.
    """
    set_debug(ctx, debug)
    target = out or Path(DEFAULT_OUT[fmt])
    unprofiled = step_time_ms * 1000 if step_time_ms else None
    source = load_source(
        path, unprofiled, need_trace=fmt == Format.trace, rank=rank, workers=workers, engine=engine
    )
    if fmt == Format.html:
        write_html(target, source.analysis, source.diagnosis, source.trace, source.nvml, source.ranks)
    elif fmt == Format.md:
        _write_text(target, render_markdown(source.analysis, source.diagnosis, source.ranks))
    else:
        assert source.trace is not None and source.trace_path is not None  # need_trace
        write_annotated(target, source)
    typer.echo(f"wrote {target}{_ranks_note(source.ranks)}")


def ranks_view(reports: list[Report], detailed: int, saved: dict[str, Any] | None = None) -> RanksView | None:
    """The ranks side by side, where there are several; `detailed`: the rank the report details;
    `saved`: the gpudoctor.ranks/1 document they come from (its summaries cover every rank)."""
    from gpudoctor.cli.multirank import ranks_from_reports

    if len(reports) < 2 and not (saved and len(saved.get("summaries") or ()) > 1):
        return None
    return ranks_from_reports(reports, saved).view(detailed)


def _ranks_note(view: RanksView | None) -> str:
    if view is None:
        return ""
    note = f" (rank {view.detailed} of {len(view.overview.ranks)} ranks in detail"
    slowest = view.overview.slowest
    if slowest is not None and slowest.straggler and slowest.rank != view.detailed:
        note += f"; straggler: rank {slowest.rank}, see it with --rank {slowest.rank}"
    return note + ")"


def write_html(
    target: Path,
    analysis: Analysis,
    diagnosis: Diagnosis,
    trace: Trace | None,
    nvml: tuple[GpuSample, ...] = (),
    ranks: RanksView | None = None,
) -> None:
    """The HTML report of one analysis; with its trace, the GPU timeline of a representative step;
    with NVML samples, their series; with several ranks, all of them side by side."""
    view = step_timeline(trace, analysis.selected_step) if trace is not None else None
    _write_text(target, render_html(analysis, diagnosis, view, nvml, ranks))


def write_annotated(target: Path, source: Source) -> None:
    assert source.trace is not None and source.trace_path is not None
    opener = gzip.open if source.trace_path.name.endswith(".gz") else open
    with opener(source.trace_path, "rt", encoding="utf-8") as f:
        original = json.load(f)
    doc = annotate(original, idle_spans(source.trace), source.analysis, source.diagnosis)
    target.parent.mkdir(parents=True, exist_ok=True)
    writer = gzip.open if target.name.endswith(".gz") else open
    # UTF-8 as is, not \u escapes: Perfetto shows an escaped µ in an arg as the six characters. A lone
    # surrogate (only an escape in the original can make one) is written back as its escape.
    with writer(target, "wt", encoding="utf-8", errors="backslashreplace") as f:
        json.dump(doc, f, separators=(",", ":"), ensure_ascii=False)


def load_source(
    path: Path,
    unprofiled_us: float | None,
    need_trace: bool,
    rank: int | None = None,
    workers: int | None = None,
    engine: str = "auto",
) -> Source:
    """The report's source from PATH; with several ranks, `rank` (default: the first) is detailed."""
    if not path.exists():
        raise UsageError(f"no such file or directory: {path}")
    saved = _saved_analysis(path)
    if saved is None and path.is_dir():
        return _directory_source(path, unprofiled_us, rank, workers, engine)
    if saved is None:
        trace = load_trace(path)
        rank_index([trace.meta.rank], rank)
        analysis = analyze(trace, unprofiled_step_us=unprofiled_us, ceilings=trace_ceilings(trace))
        return Source(analysis, diagnose(analysis), trace, path)
    doc = json.loads(saved.read_text(encoding="utf-8"))
    reports = reports_from_json(doc)
    index = rank_index([a.trace.rank for a, _ in reports], rank)
    analysis, diagnosis = reports[index]
    nvml = nvml_samples(saved.parent / RECORD_FILE)
    trace_path = _trace_of(path, analysis, guess=len(reports) == 1)
    if trace_path is None:
        if need_trace or unprofiled_us is not None:
            raise UsageError(f"the trace behind {saved} is not found: give the trace itself")
        return Source(analysis, diagnosis, None, None, nvml, ranks_view(reports, analysis.trace.rank, doc))
    trace = load_trace(trace_path)
    if unprofiled_us is not None:
        analysis = analyze(
            trace,
            step=analysis.selected_step,
            unprofiled_step_us=unprofiled_us,
            ceilings=trace_ceilings(trace),
        )
        diagnosis = diagnose(analysis)
        reports[index] = (analysis, diagnosis)
    return Source(analysis, diagnosis, trace, trace_path, nvml, ranks_view(reports, analysis.trace.rank, doc))


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
    return Source(analysis, diagnosis, trace, trace_path, nvml_samples(record), view)


def nvml_samples(record_path: Path) -> tuple[GpuSample, ...]:
    """The NVML samples of the most sampled GPU in a `gpudoctor run` record; none without one."""
    if not record_path.is_file():
        return ()
    record = RunRecord.from_json(json.loads(record_path.read_text(encoding="utf-8")))
    samples = [GpuSample.from_json(s) for s in record.nvml_samples]
    if not samples:
        return ()
    indices = [s.index for s in samples]
    main = max(set(indices), key=indices.count)
    return tuple(s for s in samples if s.index == main)


def _saved_analysis(path: Path) -> Path | None:
    """The analysis.json of a run directory, or PATH itself when it is a gpudoctor JSON document."""
    if path.is_dir():
        return path / ANALYSIS_FILE if (path / ANALYSIS_FILE).is_file() else None
    if path.suffix != ".json":
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
        p
        for p in folder.glob("*.json.gz")
        if ".annotated" not in p.name and p.name != DEFAULT_OUT[Format.trace]
    )
    return found[0] if len(found) == 1 else None


def _write_text(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
