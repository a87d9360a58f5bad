"""What every command shares: the --debug option, the console, the one-line error format, and which
rank of several to detail."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

if TYPE_CHECKING:
    from rich.console import Console

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
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int | None:
    """`--max-trace-size` as bytes: "4G", "512M", "1.5GiB", a plain number of bytes; 0 is no limit."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"--max-trace-size: {text!r} is not a size (like 4G, 512M, or 0 for no limit)")
    n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    return n or None


MaxTraceSizeOption = Annotated[
    str,
    typer.Option(
        "--max-trace-size",
        metavar="SIZE",
        help="The largest trace JSON to read, decompressed (like 4G; 0: no limit).",
    ),
]


def step_time_us(ms: float | None) -> float | None:
    """--step-time-ms as µs: a positive, finite number of milliseconds, or None."""
    if ms is None:
        return None
    if not math.isfinite(ms) or ms <= 0:
        raise UsageError(f"--step-time-ms must be a positive number of milliseconds, not {ms}")
    return ms * 1000


def input_path(text: str) -> Path:
    """A PATH argument; an empty one is an error (Path("") would be the current directory)."""
    if not text.strip():
        raise UsageError("PATH is empty: give a trace file or a directory of traces")
    return Path(text)


def set_debug(ctx: typer.Context, debug: bool) -> None:
    """Record --debug for the error handler; given at either level (`gpudoctor --debug analyze` or
    `gpudoctor analyze --debug`), it holds."""
    if debug:
        ctx.meta[DEBUG_KEY] = True


def is_debug(ctx: typer.Context) -> bool:
    return bool(ctx.meta.get(DEBUG_KEY))


def stdout_console() -> Console:
    """The console commands print on: untrusted text in it is shown escaped, never as markup."""
    from gpudoctor.report.console import SafeConsole

    console = SafeConsole()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def stderr_console() -> Console:
    from gpudoctor.report.console import SafeConsole

    return SafeConsole(stderr=True)


def error_line(err: BaseException) -> str:
    """`gpudoctor: error: <message>` on one line, whatever the message holds (a name from a trace
    in it has its control characters shown escaped)."""
    message = printable(" ".join(str(err).split())) or type(err).__name__
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
