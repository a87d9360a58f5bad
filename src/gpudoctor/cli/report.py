"""`gpudoctor report PATH -o FILE`: the HTML report (default), Markdown (--format md) or the annotated
trace (--format trace) of a trace, a directory of rank traces, a run directory (trace + analysis.json)
or a saved analysis.json (re-rendered without re-analyzing where the output does not need the trace).
With several ranks (a directory of rank traces, or `analyze --json`'s gpudoctor.ranks/1 document), the
HTML and Markdown show every rank side by side and detail one (--rank, default the first). The source
is the doctor's (`doctor.source`), the files `cli.report_files`', imported when the command runs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.cli.common import (
    DebugOption,
    EngineOption,
    MaxTraceSizeOption,
    WorkersOption,
    engine_name,
    input_path,
    one_blas_thread,
    parse_size,
    set_debug,
    step_time_us,
)
from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

if TYPE_CHECKING:
    from gpudoctor.doctor.pipeline import AnalyzeOptions
    from gpudoctor.report.ranks_view import RanksView


class Format(str, Enum):
    html = "html"
    md = "md"
    trace = "trace"


DEFAULT_OUT = {Format.html: "report.html", Format.md: "report.md", Format.trace: "annotated.json.gz"}


def report_command(
    ctx: typer.Context,
    path: Annotated[
        str,
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
    max_trace_size: MaxTraceSizeOption = "4G",
    workers: WorkersOption = None,
    engine: EngineOption = "auto",
    debug: DebugOption = False,
) -> None:
    """Write a report: self-contained HTML, Markdown, or the trace annotated for Perfetto.

    With several ranks, the HTML and Markdown show them side by side, the slowest marked, then detail
    one (--rank); the annotated trace is of that rank.
    """
    set_debug(ctx, debug)
    one_blas_thread()
    from gpudoctor.doctor.pipeline import AnalyzeOptions

    engine = engine_name(engine)
    source_path = input_path(path)
    request = ReportRequest(
        path=source_path,
        target=out or Path(DEFAULT_OUT[fmt]),
        fmt=fmt,
        options=AnalyzeOptions(
            unprofiled_us=step_time_us(step_time_ms), max_bytes=parse_size(max_trace_size)
        ),
        rank=rank,
        workers=workers,
        engine=engine,
    )
    typer.echo(write_report(request))


@dataclass(frozen=True)
class ReportRequest:
    """What `gpudoctor report` was asked: the input (a trace, a directory of rank traces, a run
    directory or a saved analysis), the file to write and its format, how a trace is analyzed again,
    the rank to detail, and where the ranks of a directory are analyzed."""

    path: Path
    target: Path
    fmt: Format
    options: AnalyzeOptions
    rank: int | None = None
    workers: int | None = None
    engine: str = "auto"


def write_report(request: ReportRequest) -> str:
    """Write the report as asked; the line that says what was written."""
    from gpudoctor.cli import report_files
    from gpudoctor.doctor.document import DAMAGED
    from gpudoctor.doctor.source import load_source
    from gpudoctor.report.run_view import ranks_view

    r = request
    source = load_source(
        r.path, r.options, need_trace=r.fmt == Format.trace, rank=r.rank, workers=r.workers, engine=r.engine
    )
    try:
        if r.fmt == Format.html:
            report_files.write_html(r.target, source.report, source.inputs)
        elif r.fmt == Format.md:
            report_files.write_markdown(r.target, source)
        else:
            report_files.write_annotated(r.target, source, r.options.max_bytes)
    except DAMAGED as err:  # a saved analysis whose values no report can show: edited by hand
        if source.saved is None:
            raise
        raise UsageError(
            f"{printable(str(source.saved))} cannot be rendered (edited by hand?): {type(err).__name__}: {err}"
        ) from None
    return f"wrote {printable(str(r.target))}{_ranks_note(ranks_view(source.report))}"


def _ranks_note(view: RanksView | None) -> str:
    if view is None:
        return ""
    note = f" (rank {view.detailed} of {len(view.overview.ranks)} ranks in detail"
    slowest = view.overview.slowest
    if slowest is not None and slowest.straggler and slowest.rank != view.detailed:
        note += f"; straggler: rank {slowest.rank}, see it with --rank {slowest.rank}"
    return note + ")"


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
