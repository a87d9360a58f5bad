"""What every command shares: the --debug option, the console, the one-line error format, and which
rank of several to detail."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from gpudoctor.util.errors import UsageError

if TYPE_CHECKING:
    from gpudoctor.device.ceilings import Ceilings
    from gpudoctor.trace.model import Trace

DEBUG_KEY = "gpudoctor.debug"  # in click's context meta, which all nested contexts share
PIPE_WIDTH = 120  # rich's 80 columns cramp the tables when the output goes to a file or a pipe

DebugOption = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        metavar="N",
        min=1,
        help="With a directory of rank traces: processes that analyze ranks in parallel (default: the CPUs).",
        show_default=False,
    ),
]
EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        help="With a directory of rank traces: where the ranks are analyzed: auto, serial, processes, or an "
        "existing ray / dask cluster (RAY_ADDRESS, DASK_SCHEDULER_ADDRESS).",
    ),
]


def set_debug(ctx: typer.Context, debug: bool) -> None:
    """Record --debug for the error handler; given at either level (`gpudoctor --debug analyze` or
    `gpudoctor analyze --debug`), it holds."""
    if debug:
        ctx.meta[DEBUG_KEY] = True


def is_debug(ctx: typer.Context) -> bool:
    return bool(ctx.meta.get(DEBUG_KEY))


def stdout_console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def error_line(err: BaseException) -> str:
    """`gpudoctor: error: <message>` on one line, whatever the message holds."""
    message = " ".join(str(err).split()) or type(err).__name__
    return f"gpudoctor: error: {message}"


def rank_index(ranks: Sequence[int], rank: int | None) -> int:
    """Where `rank` is among the ranks loaded (in their order); without one, the first. A rank not
    among them is a user error that names the ranks there are."""
    if not ranks:
        raise UsageError("no ranks to report on")
    if rank is None:
        return 0
    if rank in ranks:
        return list(ranks).index(rank)
    raise UsageError(f"no rank {rank} among the traces (ranks: {', '.join(map(str, ranks))})")


def trace_ceilings(trace: Trace) -> Ceilings | None:
    """The measured ceilings of the trace's GPU for its roofline: this machine's cache if it measured a
    GPU of that name, else gpudoctor's table of measured devices."""
    from gpudoctor.device.ceilings import ceilings_for_device

    info = trace.device_info
    return ceilings_for_device(info.name) if info is not None else None
