"""`gpudoctor analyze PATH`: load a trace (or a directory of rank traces), analyze it and print the
summary, or the JSON of the analysis with --json (nothing else on stdout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.cli.common import DebugOption, set_debug, stdout_console
from gpudoctor.report.json_out import analysis_json
from gpudoctor.report.terminal import render_analysis, render_rank_overview
from gpudoctor.trace import load_traces
from gpudoctor.util.errors import UsageError


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
    debug: DebugOption = False,
) -> None:
    """Summarize a torch.profiler trace.

    Step time, GPU busy time and idle time by cause, top kernels, launches, host/device transfers,
    host synchronizations, top ops and memory, from a Kineto trace file or a directory of rank traces.
    """
    set_debug(ctx, debug)
    analyses = [analyze(trace, step=step, top=max(top, 15)) for trace in load_traces(path)]
    chosen = _choose_rank(analyses, rank)
    if as_json:
        doc = analysis_json([chosen] if rank is not None else analyses)
        typer.echo(json.dumps(doc, indent=1, allow_nan=False))
        return
    console = stdout_console()
    if len(analyses) > 1:
        render_rank_overview(analyses, console, detailed=chosen.trace.rank)
        console.print()
    render_analysis(chosen, console, top=top)


def _choose_rank(analyses: list[Analysis], rank: int | None) -> Analysis:
    if rank is None:
        return analyses[0]
    for a in analyses:
        if a.trace.rank == rank:
            return a
    have = ", ".join(str(a.trace.rank) for a in analyses)
    raise UsageError(f"no rank {rank} among the traces (ranks: {have})")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze_command)
