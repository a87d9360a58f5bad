"""`gpudoctor analyze` without typer: most of a small trace's wait was importing typer, click and every
other command. A command line is taken here only when it is plain — `analyze`, one PATH, and options
of the table below with values that typer would accept as they are — and then runs the very code the
typer command runs (`cli.analyze_run`), with its errors mapped as `cli.app` maps them. Anything else
(help, a usage error, `--html`, a value typer would refuse or read otherwise) returns None: the typer
app then handles it, so help, usage errors and their exit codes stay typer's own."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.util.errors import GpudoctorError

FLAGS = {"--json": "as_json", "--debug": "debug"}


def _ranged(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """click's IntRange: `int(text)`, then the bounds (outside them: ValueError, and typer decides)."""

    def convert(text: str) -> int:
        value = int(text)
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(text)
        return value

    return convert


# option -> (keyword of `analyze_request`, conversion as click's type for it converts a string)
VALUED: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--step": ("step", int),
    "--rank": ("rank", int),
    "--top": ("top", _ranged(low=1)),
    "--step-time-ms": ("step_time_ms", float),
    "--module-depth": ("module_depth", _ranged(low=1, high=8)),
    "--max-trace-size": ("max_trace_size", str),
    "--workers": ("workers", _ranged(low=1)),
    "--engine": ("engine", str),
}


def plain_analyze(args: Sequence[str]) -> dict[str, Any] | None:
    """The keyword values of a plain `analyze` command line (see the module), `debug` among them; None
    where typer should read it."""
    if len(args) < 2 or args[0] != "analyze":
        return None
    values: dict[str, Any] = {}
    path: str | None = None
    rest = list(args[1:])
    while rest:
        token = rest.pop(0)
        if not token.startswith("-"):
            if path is not None:
                return None  # an extra argument: typer's usage error
            path = token
            continue
        name, eq, text = token.partition("=")
        if name in FLAGS and not eq:
            values[FLAGS[name]] = True
            continue
        if name not in VALUED:
            return None  # --help, --html, --, an unknown or misspelt option
        if not eq:
            if not rest:
                return None
            text = rest.pop(0)
        if text.startswith("-"):
            return None  # typer takes it as the value; a negative --step, say, is typer's to read
        key, convert = VALUED[name]
        try:
            values[key] = convert(text)
        except ValueError:
            return None
    if path is None:
        return None
    return {"path": path, **values}


def fast_analyze(args: Sequence[str], *, own_process: bool = False) -> int | None:
    """Run a plain `analyze` command line; its exit code, or None for typer to handle it.

    `own_process`: the command line is this process's own, which ends when this returns. For one
    trace file, Python's cyclic garbage collector is then left off: the command makes next to no cyclic
    garbage, and its collections would go over every object the imports and the analysis made, again
    and again, for memory that the process hands back at exit anyway (`gc.freeze` keeps them out of
    the last ones). A directory's ranks are analyzed by workers that may outlive many traces: not there.
    """
    values = plain_analyze(args)
    if values is None:
        return None
    collector_off = own_process and not os.path.isdir(values["path"])
    if collector_off:
        gc.disable()
    try:
        return _run(values)
    finally:
        if collector_off:
            gc.freeze()


def _run(values: dict[str, Any]) -> int:
    debug = values.pop("debug", False)
    from gpudoctor.cli.analyze_run import analyze_request, run_analyze

    try:
        run_analyze(analyze_request(**values))
    except GpudoctorError as err:
        if debug:
            import traceback

            traceback.print_exc(file=sys.stderr)
        else:
            from gpudoctor.cli.basics import error_line

            print(error_line(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except EOFError:  # as click aborts
        print(file=sys.stderr)
        print("Aborted!", file=sys.stderr)
        return 1
    return 0  # a broken pipe goes on up to `cli.main`, which exits 1 as typer does
