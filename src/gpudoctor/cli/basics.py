"""What the commands share that needs no typer: the console, the one-line error format and the checks
of option values. `gpudoctor analyze`'s fast path (`cli.fast`) runs on these alone, without typer."""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

if TYPE_CHECKING:
    from rich.console import Console


PIPE_WIDTH = 120  # rich's 80 columns cramp the tables when the output goes to a file or a pipe


def engine_name(text: str) -> str:
    """--engine checked up front, whatever PATH turns out to be: a single file has no use for it, but a
    name that is none of the engines is still a mistake to point out, not to pass over."""
    from gpudoctor.doctor.engines import check_engine

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
