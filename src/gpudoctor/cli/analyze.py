"""`gpudoctor analyze PATH`: load a trace (or a directory of rank traces), analyze it and print the
summary, or the JSON of the analysis with --json (nothing else on stdout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.cli.common import (
    DebugOption,
    EngineOption,
    MaxTraceSizeOption,
    WorkersOption,
    input_path,
    parse_size,
    rank_index,
    set_debug,
    stdout_console,
    step_time_us,
    trace_ceilings,
)


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
    import json

    from gpudoctor.analysis.summary import analyze
    from gpudoctor.report.json_out import report_json
    from gpudoctor.report.terminal import render_analysis, render_rank_overview
    from gpudoctor.rules import diagnose
    from gpudoctor.trace import load_traces

    source = input_path(path)
    unprofiled = step_time_us(step_time_ms)
    max_bytes = parse_size(max_trace_size)
    if source.is_dir() and step is None:
        _analyze_ranks(source, as_json, rank, top, unprofiled, html, workers, engine)
        return
    traces = load_traces(source, max_bytes)
    analyses = [
        analyze(
            trace,
            step=step,
            top=max(top, 15),
            unprofiled_step_us=unprofiled,
            ceilings=trace_ceilings(trace),
            module_depth=module_depth,
        )
        for trace in traces
    ]
    reports = [(a, diagnose(a)) for a in analyses]
    index = rank_index([a.trace.rank for a in analyses], rank)
    chosen, diagnosis = reports[index]
    view = None
    if len(reports) > 1 or html is not None:  # the report's module: only where it is needed
        from gpudoctor.cli.report_source import ranks_view, write_html

        view = ranks_view(reports, chosen.trace.rank)
    if html is not None:
        write_html(
            html,
            chosen,
            diagnosis,
            traces[index],
            ranks=view,
            inputs=(source, *(t.meta.path for t in traces)),
        )
    if as_json:
        doc = report_json([reports[index]] if rank is not None else reports)
        typer.echo(json.dumps(doc, indent=1, allow_nan=False))
        return
    console = stdout_console()
    if view is not None:
        render_rank_overview(view, console)
        console.print()
    render_analysis(chosen, console, top=top, diagnosis=diagnosis)


def _analyze_ranks(
    path: Path,
    as_json: bool,
    rank: int | None,
    top: int,
    unprofiled: float | None,
    html: Path | None,
    workers: int | None,
    engine: str,
) -> None:
    """A directory of rank traces: every rank (in parallel where there are many), then one in detail."""
    import json

    from gpudoctor.cli.multirank import analyze_directory, check_rank, combined_doc
    from gpudoctor.cli.report_source import write_html
    from gpudoctor.report.json_out import report_json
    from gpudoctor.report.terminal import render_analysis, render_rank_overview
    from gpudoctor.trace import load_trace

    run = analyze_directory(
        path, unprofiled_us=unprofiled, detailed=rank, all_reports=as_json and rank is None,
        workers=workers, engine=engine, top=max(top, 15),
    )  # fmt: skip
    chosen = check_rank(run, rank)
    a, d = run.reports[chosen]
    view = run.view(chosen) if len(run.summaries) > 1 else None
    if html is not None:
        inputs = (path, *run.trace_paths.values())
        write_html(html, a, d, load_trace(run.trace_paths[chosen]), ranks=view, inputs=inputs)
    if as_json:
        doc = report_json([(a, d)]) if rank is not None or view is None else combined_doc(run)
        typer.echo(json.dumps(doc, indent=1, allow_nan=False))
        return
    console = stdout_console()
    if view is not None:
        render_rank_overview(view, console)
        console.print()
    render_analysis(a, console, top=top, diagnosis=d)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)
