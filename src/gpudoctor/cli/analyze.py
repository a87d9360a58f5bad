"""`gpudoctor analyze PATH`: the doctor on a trace (`doctor.diagnose_trace`) or a directory of rank
traces (`doctor.diagnose_ranks`), then the summary printed, or the JSON of the analysis with --json
(nothing else on stdout)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
    stdout_console,
    step_time_us,
)

if TYPE_CHECKING:
    from gpudoctor.doctor.pipeline import AnalyzeOptions
    from gpudoctor.doctor.report import RunReport


def analyze_command(
    ctx: typer.Context,
    path: Annotated[
        str,
        typer.Argument(
            metavar="PATH",
            help="A Kineto trace (.json or .json.gz) or a directory of rank traces.",
            show_default=False,
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis as JSON on stdout.")] = False,
    step: Annotated[
        int | None,
        typer.Option(
            "--step", metavar="N", help="Analyze step N alone (the N of ProfilerStep#N).", show_default=False
        ),
    ] = None,
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            metavar="R",
            help="With several ranks: the rank to detail (default: the first); with --json, print only it.",
            show_default=False,
        ),
    ] = None,
    top: Annotated[
        int, typer.Option("--top", metavar="K", min=1, help="Rows in the top-kernel and top-op tables.")
    ] = 10,
    step_time_ms: Annotated[
        float | None,
        typer.Option(
            "--step-time-ms",
            metavar="MS",
            help="The step time measured without the profiler: the profiler's own overhead is then "
            "taken out of the diagnosis.",
            show_default=False,
        ),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Also write the HTML report (of the detailed rank).",
            show_default=False,
        ),
    ] = None,
    module_depth: Annotated[
        int,
        typer.Option(
            "--module-depth",
            metavar="D",
            min=1,
            max=8,
            help="How deep below the model's root the module view goes (with_stack traces, gpudoctor run).",
        ),
    ] = 2,
    max_trace_size: MaxTraceSizeOption = "4G",
    workers: WorkersOption = None,
    engine: EngineOption = "auto",
    debug: DebugOption = False,
) -> None:
    """Diagnose a torch.profiler trace.

    What bounds the step and each bottleneck found, ranked by what its fix can save, with evidence and
    the change to make; then step time, GPU busy time and idle time by cause, top kernels, launches,
    host/device transfers, host synchronizations, top ops and memory. PATH: a Kineto trace file or a
    directory of rank traces.
    """
    set_debug(ctx, debug)
    one_blas_thread()
    from gpudoctor.doctor.pipeline import AnalyzeOptions

    request = AnalyzeRequest(
        engine=engine_name(engine),
        path=input_path(path),
        options=AnalyzeOptions(
            step=step,
            top=max(top, 15),
            unprofiled_us=step_time_us(step_time_ms),
            module_depth=module_depth,
            max_bytes=parse_size(max_trace_size),
        ),
        rank=rank,
        workers=workers,
        as_json=as_json,
        html=html,
        top=top,
    )
    run_analyze(request)


@dataclass(frozen=True)
class AnalyzeRequest:
    """What `gpudoctor analyze` was asked: the trace or directory of rank traces, how it is analyzed,
    the rank to detail, where the ranks of a directory are analyzed, and the outputs: the summary (its
    tables `top` rows long) or the JSON on stdout, and an HTML report."""

    path: Path
    options: AnalyzeOptions
    engine: str = "auto"
    rank: int | None = None
    workers: int | None = None
    as_json: bool = False
    html: Path | None = None
    top: int = 10


def run_analyze(request: AnalyzeRequest) -> None:
    """The doctor on the path (`doctor.diagnose_trace`, or `diagnose_ranks` for a directory of rank
    traces), then its output."""
    import json

    from gpudoctor.doctor.diagnose import diagnose_ranks, diagnose_trace

    r = request
    if r.path.is_dir() and r.options.step is None:  # many rank files: each rank by a worker, summaries kept
        report = diagnose_ranks(
            r.path, r.options, rank=r.rank, engine=r.engine, workers=r.workers,
            all_reports=r.as_json and r.rank is None, timeline=r.html is not None,
        )  # fmt: skip
    else:
        report = diagnose_trace(r.path, r.options, rank=r.rank, timeline=r.html is not None)
    if r.html is not None:
        from gpudoctor.cli.report_files import write_html

        inputs = (
            r.path,
            *((report.ranks.trace_paths.values()) if report.ranks else (report.trace_path or r.path,)),
        )
        write_html(r.html, report, inputs=inputs)
    if r.as_json:
        typer.echo(json.dumps(_json_doc(report, r.rank), indent=1, allow_nan=False))
        return
    from gpudoctor.report.run_view import render_report

    render_report(report, stdout_console(), top=r.top)


def _json_doc(report: RunReport, rank: int | None) -> dict[str, Any]:
    """The findings with the analysis: of the rank asked for alone, else of every rank (gpudoctor.ranks/1)."""
    several = report.ranks is not None and len(report.ranks.summaries) > 1
    if rank is not None or not several:
        return {**report.diagnosis.to_json(), "analysis": report.analysis.to_json()}  # type: ignore[union-attr]
    return report.analysis_document() or {}


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)
