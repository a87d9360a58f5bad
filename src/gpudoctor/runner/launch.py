"""Run a Python script or module in this process as `python script.py args` / `python -m mod args`
would: `__main__`, sys.argv, sys.path[0]; how it ended becomes a `ScriptEnd` (exit code, exception)
instead of leaving this process. sys.argv and sys.path are restored afterwards."""

from __future__ import annotations

import importlib.util
import runpy
import sys
import traceback
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path

from gpudoctor.runner.phases import StopRun
from gpudoctor.util.errors import UsageError


@dataclass(frozen=True)
class ScriptEnd:
    outcome: str  # completed, stopped, exit, exception, interrupted
    exit_code: int
    error: BaseException | None = None  # the exception that ended it (not SystemExit or StopRun)


def run_script(target: str, args: list[str], *, module: bool = False) -> ScriptEnd:
    """Run `target` (a path, or a module name with `module=True`) with `args` as its command line."""
    spec = check_runnable(target, module=module)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if spec is not None:
            sys.argv = [target, *args]  # runpy replaces argv[0] with the module's file
            sys.path.insert(0, str(Path.cwd()))
            if not hasattr(spec.loader, "get_code") and spec.origin and spec.origin.endswith(".py"):
                # an import hook that cannot hand runpy the code (pytest's assertion rewriter): run the file
                sys.argv[0] = spec.origin
                runpy.run_path(spec.origin, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            path = Path(target).resolve()
            sys.argv = [target, *args]
            sys.path.insert(0, str(path.parent))
            runpy.run_path(str(path), run_name="__main__")
    except StopRun:
        return ScriptEnd("stopped", 0)
    except SystemExit as stop:
        return ScriptEnd("exit", _exit_code(stop.code))
    except KeyboardInterrupt as err:
        return ScriptEnd("interrupted", 130, err)
    except Exception as err:
        return ScriptEnd("exception", 1, err)
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
    return ScriptEnd("completed", 0)


def check_runnable(target: str, *, module: bool = False) -> ModuleSpec | None:
    """A `UsageError` (one line, exit 2) unless `target` names a script file, or with `module` a
    module that can be found as `python -m` would find it (the current directory first); the
    module's spec."""
    if not module:
        if not Path(target).is_file():
            raise UsageError(f"no such script: {target}")
        check_syntax(target)
        return None
    saved = sys.path[:]
    sys.path.insert(0, str(Path.cwd()))
    try:
        spec = _find_module(target)
    finally:
        sys.path[:] = saved
    if spec is None:
        raise UsageError(f"no module named {target!r}")
    return spec


def check_syntax(target: str) -> None:
    """A `UsageError` where the script does not compile: said before any process starts or waits on
    it, as the line Python would point to."""
    try:
        compile(Path(target).read_bytes(), target, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:  # ValueError: a null byte in the source
        where = f"{target}, line {err.lineno}" if isinstance(err, SyntaxError) and err.lineno else target
        what = err.msg if isinstance(err, SyntaxError) else str(err)
        raise UsageError(f"the script does not compile: {type(err).__name__}: {what} ({where})") from None
    except OSError as err:
        raise UsageError(f"cannot read the script: {err}") from None


def _find_module(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _exit_code(code: object) -> int:
    """SystemExit's code as Python maps it to a status: None → 0, an int as is, anything else printed
    to stderr → 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def print_script_traceback(err: BaseException) -> None:
    """The traceback as Python prints it for the script: our own and runpy's frames left out."""
    tb = err.__traceback__
    ours = (str(Path(__file__).parent.parent), runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(ours):
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb, file=sys.stderr)
