"""`gpudoctor analyze PATH`: the doctor on a trace (`doctor.diagnose_trace`) or a directory of rank
traces (`doctor.diagnose_ranks`), then the summary printed, or the JSON of the analysis with --json
(nothing else on stdout). The typer command: its options, help and usage errors; what it does is
`cli.analyze_run`'s, which `cli.fast` calls without typer for a plain command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.cli.analyze_run import analyze_request, run_analyze
from gpudoctor.cli.common import DebugOption, EngineOption, MaxTraceSizeOption, WorkersOption, set_debug


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
    request = analyze_request(
        path, as_json=as_json, step=step, rank=rank, top=top, step_time_ms=step_time_ms, html=html,
        module_depth=module_depth, max_trace_size=max_trace_size, workers=workers, engine=engine,
    )  # fmt: skip
    run_analyze(request)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)
