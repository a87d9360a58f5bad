"""The `gpudoctor` console script (and `python -m gpudoctor`). A plain `gpudoctor analyze` command line
runs on the fast path (`cli.fast`: no typer, click or the other commands imported); every other one
goes to the typer app (`cli.app`), as do all that the fast path is not sure of, so that help, usage
errors and their exit codes are typer's. `app` is importable from here, as it was."""

from __future__ import annotations

import os
import sys
from typing import Any


def main(argv: list[str] | None = None) -> None:
    """The console script (and `python -m gpudoctor`)."""
    if _stdout_closed():
        print("gpudoctor: error: stdout is closed: redirect it (> /dev/null to discard)", file=sys.stderr)
        sys.exit(2)
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        from gpudoctor.cli.fast import fast_analyze

        code = fast_analyze(args, own_process=argv is None)
        if code is not None:
            if argv is None:
                _end_now(code)
            sys.exit(code)
        from gpudoctor.cli.app import app

        app(args=args, prog_name="gpudoctor")
    except KeyboardInterrupt:  # outside typer's own handling, e.g. while starting up
        sys.exit(130)
    except BrokenPipeError:  # `gpudoctor analyze t.json | head`: the reader has all it wanted
        _quiet_stdout()
        sys.exit(1)


def _end_now(code: int) -> None:
    """End this process at once, its output flushed, where Python's teardown would only free memory
    object by object: nothing registered to run at exit, no other thread, no tracer or profiler
    watching (a coverage or cProfile run still gets its report). Otherwise return, for `sys.exit`."""
    import atexit
    import threading

    registered = getattr(atexit, "_ncallbacks", None)
    if registered is None or registered() or threading.active_count() > 1:
        return
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stdout_closed() -> bool:
    """Started with file descriptor 1 closed (`gpudoctor analyze t.json >&-`): nothing can be shown."""
    if sys.stdout is None:
        return True
    try:
        os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return not hasattr(sys.stdout, "getvalue")  # a StringIO (tests) has no descriptor, and is open
    return False


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that flushing at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def __getattr__(name: str) -> Any:
    """`from gpudoctor.cli.main import app`: the typer app, imported when asked for."""
    if name == "app":
        from gpudoctor.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
