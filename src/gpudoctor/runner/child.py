"""The one way gpudoctor starts a process for the user's script (a fix round, a batch point, the diagnosis
run): `python -m <module> <argv>` in a process group of its own, its output in a log, a time limit that
ends the whole group, whatever the group still holds afterwards ended with it, and the result JSON read
back; a child that times out, dies or writes nothing is a `ChildRun` saying so, never an exception. The
fork server (`fixes.forkserver`) forks the same child instead. `run_attached` runs a command in the
foreground (torchrun): its output on this terminal, its exit status back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.runner.procgroup import end_group
from gpudoctor.runner.rundir import open_log
from gpudoctor.util.errors import GpudoctorError
from gpudoctor.util.outfile import close_live

LOG_TAIL = 2000  # characters of a child's output kept with its result
# after a child has written its result, how long its way out (the script's threads joined, its atexit
# functions, a DataLoader's workers and pinned-memory thread shut down) may take before it is ended
EXIT_GRACE_S = 5.0


@dataclass(frozen=True)
class ChildRun:
    exit_code: int | None  # None: it was killed at its time limit
    result: dict[str, Any] | None  # the JSON it wrote, or None (then `error` says why)
    error: str | None
    log_tail: str
    leftover: int  # processes its group still held after it ended (killed)
    wall_s: float

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


def child_env() -> dict[str, str]:
    """This environment, with gpudoctor importable in a child even where it is not installed."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def log_tail(log: Path, size: int = LOG_TAIL) -> str:
    try:
        return log.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def end_within(grace_s: float = EXIT_GRACE_S, code: int = 0) -> threading.Thread:
    """Called by a child once its result is written: the interpreter's way out gets `grace_s`, then
    the process ends anyway, its threads' stacks in its log first. Nothing after the result is the
    measurement's, and every second of it is the session's: a loader that pinned its batches can take
    most of a minute to shut down (docs/results.md, "Measurements behind the flow")."""

    def end() -> None:
        time.sleep(grace_s)
        with contextlib.suppress(BaseException):
            import faulthandler

            print(f"gpudoctor: the process had not ended {grace_s:g} s after writing its result; "
                  "ended now. Its threads were at:", file=sys.stderr, flush=True)  # fmt: skip
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        os._exit(code)

    thread = threading.Thread(target=end, name="gpudoctor-end-within", daemon=True)
    thread.start()
    return thread


def read_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON a child wrote, or None and why not."""
    if not path.exists():
        return None, "no result written"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return None, f"unreadable result: {err}"
    return (doc, None) if isinstance(doc, dict) else (None, "unreadable result: not a JSON object")


def run_child(module: str, argv: Sequence[str], *, result: Path, log: Path, timeout_s: float) -> ChildRun:
    """Run `python -m module argv…` to its end (or its time limit); what it wrote to `result`."""
    return _run_to_end([sys.executable, "-m", module, *argv], child_env(), None, result, log, timeout_s, None)


def run_plain(
    argv: Sequence[str], *, env: dict[str, str], cwd: str, result: Path, log: Path, timeout_s: float
) -> ChildRun:
    """Run `argv` as the user runs their script (`python script.py args`: no gpudoctor on its path, the
    environment and folder given), with the protocol's process group, time limit, log and result file:
    the proof of `gpudoctor fix` (`fixes.prove`), whose stopwatch writes `result`."""
    return _run_to_end(list(argv), env, cwd, result, log, timeout_s, subprocess.DEVNULL)


def _run_to_end(
    cmd: list[str],
    env: dict[str, str],
    cwd: str | None,
    result: Path,
    log: Path,
    timeout_s: float,
    stdin: int | None,
) -> ChildRun:
    result.unlink(missing_ok=True)
    t0 = time.perf_counter()
    f = open_log(log)
    try:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=stdin,
                                env=env, cwd=cwd, start_new_session=True)  # fmt: skip
    except OSError as err:
        raise GpudoctorError(f"cannot start {cmd[0]}: {err}") from None
    finally:
        close_live(f)
    code: int | None
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(proc.pid)
        proc.wait()
        code = None
    except KeyboardInterrupt:
        end_group(proc.pid)
        proc.wait()
        raise
    left = end_group(proc.pid)
    doc, why = read_result(result) if code is not None else (None, f"ran past {timeout_s:.0f} s")
    if doc is None and code is not None:
        why = f"exit status {code}, {why}"
    return ChildRun(code, doc, why, log_tail(log), left, time.perf_counter() - t0)


INTERRUPT_GRACE_S = 30.0  # after Ctrl-C, how long the group has to end itself before it is killed


def run_attached(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run `argv` in the foreground, its output on this terminal, in a process group of its own; Ctrl-C
    here is passed on to the group (torchrun stops its ranks, which leave what they captured), and
    whatever the group still holds once its leader has ended is ended with it. Its exit status (negative:
    the signal that ended it)."""
    try:
        proc = subprocess.Popen(
            list(argv), env=env if env is not None else child_env(), start_new_session=True
        )
    except OSError as err:
        raise GpudoctorError(f"cannot start {argv[0]}: {err}") from None
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            end_group(proc.pid)
            proc.wait()
        raise
    finally:
        end_group(proc.pid)
    return code
