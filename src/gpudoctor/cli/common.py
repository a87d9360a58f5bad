"""What every command shares: the --debug option, the console, the one-line error format, and the
options of several commands (--workers, --engine, --max-trace-size, --step-time-ms)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

if TYPE_CHECKING:
    from rich.console import Console


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


def engine_name(text: str) -> str:
    """--engine checked up front, whatever PATH turns out to be: a single file has no use for it, but a
    name that is none of the engines is still a mistake to point out, not to pass over."""
    from gpudoctor.doctor.rank_pool import check_engine

    return check_engine(text)


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


def one_blas_thread() -> None:
    """For a command that only reads and judges traces (no linear algebra), before numpy is imported:
    OpenBLAS then starts one thread instead of a pool of one per core at numpy's import, which such a
    command would wait for and never use. Not for commands that run the user's code: their numpy stays as
    the user set it up. A variable the user set is left as it is."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def set_debug(ctx: typer.Context, debug: bool) -> None:
    """Record --debug for the error handler; given at either level (`gpudoctor --debug analyze` or
    `gpudoctor analyze --debug`), it holds."""
    if debug:
        ctx.meta[DEBUG_KEY] = True


def is_debug(ctx: typer.Context) -> bool:
    return bool(ctx.meta.get(DEBUG_KEY))


def stdout_console() -> Console:
    """The console commands print on: untrusted text in it is shown escaped, never as markup. Written to
    a file or a pipe, a sentence is one line, however long (a reader or an editor wraps it), and tables
    are laid out in PIPE_WIDTH columns."""
    from gpudoctor.report.console import SafeConsole

    console = SafeConsole()
    if not console.is_terminal:
        console.soft_wrap = True
        if "COLUMNS" not in os.environ:
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


def own_options_after_script(ctx: typer.Context, command: Sequence[str]) -> str | None:
    """A warning where an argument after the script is one of the command's own options
    (`gpudoctor fix train.py --budget 2m`: the script gets --budget 2m): it names them and the order that
    gives them to gpudoctor. None when there is none."""
    if len(command) < 2:
        return None
    options = {name: param for param in ctx.command.params for name in (*param.opts, *param.secondary_opts)
               if name.startswith("-")}  # fmt: skip
    script, args = command[0], list(command[1:])
    moved: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        param = options.get(name) if name not in ("-h", "--help") else None
        if param is None:
            kept.append(args[i])
            i += 1
            continue
        takes_value = "=" not in args[i] and not getattr(param, "is_flag", False) and i + 1 < len(args)
        moved += args[i : i + 1 + takes_value]
        i += 1 + takes_value
    if not moved:
        return None
    names = [a for a in moved if a.split("=", 1)[0] in options]
    one = len(names) == 1
    where = ctx.command_path
    right = " ".join(shlex.quote(a) for a in [*where.split(), *moved, script, *kept])
    return (
        f"warning: {', '.join(names)} {'comes' if one else 'come'} after the script, so {script} gets "
        f"{'it' if one else 'them'}, not {where}; {where}'s own options go before the script: {right}"
    )


def mute(console: Console) -> None:
    """The reader of stdout is gone (`gpudoctor run train.py | head`): print nothing more, to a console
    or at the interpreter's exit, and let the work go on (a run still writes its directory)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    console.file = _Discard()


class _Discard(io.TextIOBase):
    """A text stream that keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)


def shown(console: Console, *objects: object, **options: object) -> None:
    """`console.print`, muted for good once the reader is gone (a BrokenPipeError), not raised."""
    try:
        console.print(*objects, **options)  # type: ignore[arg-type]
    except BrokenPipeError:
        mute(console)
