"""`gpudoctor analyze PATH`: load a trace (or a directory of rank traces), analyze it and print the
summary, or the JSON of the analysis with --json (nothing else on stdout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.analysis.modules import DEFAULT_DEPTH
from gpudoctor.analysis.summary import analyze
from gpudoctor.cli.common import (
    DebugOption,
    EngineOption,
    WorkersOption,
    rank_index,
    set_debug,
    stdout_console,
    trace_ceilings,
)
from gpudoctor.cli.multirank import analyze_directory, check_rank, combined_doc
from gpudoctor.cli.report import write_html
from gpudoctor.report.json_out import report_json
from gpudoctor.report.terminal import render_analysis, render_rank_overview
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace


def analyze_command(
    ctx: typer.Context,
    path: Annotated[
        Path,
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
            "--step",
            metavar="N",
            help="Analyze step N alone (the N of ProfilerStep#N; inferred steps count from 1).",
            show_default=False,
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
            min=0.001,
            help="The step time measured without the profiler: the profiler's own overhead is then "
            "taken out of the diagnosis.",
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
    ] = DEFAULT_DEPTH,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Also write the HTML report (of the detailed rank).",
            show_default=False,
        ),
    ] = None,
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
    unprofiled = step_time_ms * 1000 if step_time_ms else None
    if path.is_dir():
        _analyze_ranks(path, as_json, step, rank, top, unprofiled, html, workers, engine)
        return
    trace = load_trace(path)
    rank_index([trace.meta.rank], rank)  # a rank that is not this trace's is a user error
    a = analyze(
        trace,
        step=step,
        top=max(top, 15),
        unprofiled_step_us=unprofiled,
        ceilings=trace_ceilings(trace),
        module_depth=module_depth,
    )
    d = diagnose(a)
    if html is not None:
        write_html(html, a, d, trace)
    if as_json:
        typer.echo(json.dumps(report_json([(a, d)]), indent=1, allow_nan=False))
        return
    render_analysis(a, stdout_console(), top=top, diagnosis=d)


def _analyze_ranks(
    path: Path,
    as_json: bool,
    step: int | None,
    rank: int | None,
    top: int,
    unprofiled: float | None,
    html: Path | None,
    workers: int | None,
    engine: str,
) -> None:
    """A directory of rank traces: every rank (in parallel where there are many), then one in detail."""
    if step is not None:  # one step of every rank: each analyzed whole here, the ranks are few
        _analyze_ranks_step(path, as_json, step, rank, top, unprofiled, html)
        return
    run = analyze_directory(
        path, unprofiled_us=unprofiled, detailed=rank, all_reports=as_json and rank is None,
        workers=workers, engine=engine, top=max(top, 15),
    )  # fmt: skip
    chosen = check_rank(run, rank)
    a, d = run.reports[chosen]
    view = run.view(chosen) if len(run.summaries) > 1 else None
    if html is not None:
        write_html(html, a, d, load_trace(run.trace_paths[chosen]), ranks=view)
    if as_json:
        doc = report_json([(a, d)]) if rank is not None or view is None else combined_doc(run)
        typer.echo(json.dumps(doc, indent=1, allow_nan=False))
        return
    console = stdout_console()
    if view is not None:
        render_rank_overview(view, console)
        console.print()
    render_analysis(a, console, top=top, diagnosis=d)


def _analyze_ranks_step(
    path: Path,
    as_json: bool,
    step: int,
    rank: int | None,
    top: int,
    unprofiled: float | None,
    html: Path | None,
) -> None:
    from gpudoctor.cli.multirank import ranks_from_reports
    from gpudoctor.trace import load_traces

    traces = load_traces(path)
    reports = []
    for t in traces:
        a = analyze(t, step=step, top=max(top, 15), unprofiled_step_us=unprofiled, ceilings=trace_ceilings(t))
        reports.append((a, diagnose(a)))
    index = rank_index([a.trace.rank for a, _ in reports], rank)
    a, d = reports[index]
    view = ranks_from_reports(reports).view(a.trace.rank) if len(reports) > 1 else None
    if html is not None:
        write_html(html, a, d, traces[index], ranks=view)
    if as_json:
        typer.echo(
            json.dumps(
                report_json([reports[index]] if rank is not None else reports), indent=1, allow_nan=False
            )
        )
        return
    console = stdout_console()
    if view is not None:
        render_rank_overview(view, console)
        console.print()
    render_analysis(a, console, top=top, diagnosis=d)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)
