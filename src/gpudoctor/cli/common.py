"""What every command shares that is typer's: the --debug option and the options of several commands
(--workers, --engine, --max-trace-size). The rest they share (the console, the error line, the checks
of option values) is `cli.basics`, re-exported here."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Annotated

import typer

from gpudoctor.cli.basics import (
    PIPE_WIDTH,
    engine_name,
    error_line,
    input_path,
    mute,
    one_blas_thread,
    parse_size,
    shown,
    stderr_console,
    stdout_console,
    step_time_us,
)

__all__ = [
    "DEBUG_KEY", "PIPE_WIDTH", "DebugOption", "EngineOption", "MaxTraceSizeOption", "WorkersOption",
    "engine_name", "error_line", "input_path", "is_debug", "mute", "one_blas_thread",
    "own_options_after_script", "parse_size", "set_debug", "shown", "stderr_console", "stdout_console",
    "step_time_us",
]  # fmt: skip

DEBUG_KEY = "gpudoctor.debug"  # in click's context meta, which all nested contexts share

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


MaxTraceSizeOption = Annotated[
    str,
    typer.Option(
        "--max-trace-size",
        metavar="SIZE",
        help="The largest trace JSON to read, decompressed (like 4G; 0: no limit).",
    ),
]


def set_debug(ctx: typer.Context, debug: bool) -> None:
    """Record --debug for the error handler; given at either level (`gpudoctor --debug analyze` or
    `gpudoctor analyze --debug`), it holds."""
    if debug:
        ctx.meta[DEBUG_KEY] = True


def is_debug(ctx: typer.Context) -> bool:
    return bool(ctx.meta.get(DEBUG_KEY))


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
