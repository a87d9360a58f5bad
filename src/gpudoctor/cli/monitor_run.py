"""What `gpudoctor monitor` does once it runs (cli.monitor parses): the snapshot, the live view, following
a command with its alerts and summary, and writing the summary. Imported when the command runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live

from gpudoctor.cli.common import error_line, stderr_console, stdout_console
from gpudoctor.monitor.alerts import AlertPolicy
from gpudoctor.monitor.backend import NvmlBackend
from gpudoctor.monitor.logfile import SampleLog
from gpudoctor.monitor.procs import ProcessTree
from gpudoctor.monitor.session import MonitorSession, read_once
from gpudoctor.monitor.summary import MonitorSummary
from gpudoctor.report.monitor_view import alert_line, render_live, render_snapshot, render_summary
from gpudoctor.util.errors import GpudoctorError, UsageError
from gpudoctor.util.outfile import write_json
from gpudoctor.util.serial import to_jsonable

SNAPSHOT_SCHEMA = "gpudoctor.monitor-snapshot/1"
REFRESH_S = 0.25  # the live view redraws 4 times a second, whatever the sampling interval
INTERRUPT_GRACE_S = 10.0  # after Ctrl-C, how long the command gets to exit before it is terminated


class CommandError(GpudoctorError):
    """The followed command could not be started (127: not found, 126: not executable), as shells do."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _devices(backend: NvmlBackend, gpus: str | None) -> tuple[int, ...]:
    if not gpus:
        return tuple(d.index for d in backend.devices())
    chosen = []
    for part in gpus.split(","):
        part = part.strip()
        if not part:
            continue
        chosen.append(backend.resolve(int(part) if part.isdigit() else part))
    if not chosen:
        raise UsageError("--gpu: name at least one GPU")
    return tuple(dict.fromkeys(chosen))


def _open_log(
    backend: NvmlBackend, devices: tuple[int, ...], log: Path | None, interval_s: float
) -> SampleLog | None:
    if log is None:
        return None
    infos = tuple(d for d in backend.devices() if d.index in devices)
    return SampleLog(log, backend.system(), infos, interval_s)


def _once(
    backend: NvmlBackend, devices: tuple[int, ...], interval_s: float, log: Path | None, as_json: bool
) -> None:
    snap = read_once(backend, devices=devices, interval_s=interval_s)
    sample_log = _open_log(backend, devices, log, interval_s)
    if sample_log is not None:
        with sample_log:
            for s in snap.latest:
                sample_log.write(s)
    if as_json:
        doc = {"schema": SNAPSHOT_SCHEMA, **to_jsonable(snap)}
        typer.echo(json.dumps(doc, indent=1, allow_nan=False))
        return
    render_snapshot(snap, stdout_console())


def _live(
    backend: NvmlBackend,
    devices: tuple[int, ...],
    interval_s: float,
    log: Path | None,
    duration: float | None,
    summary_path: Path | None,
    policy: AlertPolicy,
) -> None:
    console = stdout_console()
    session = MonitorSession(
        backend,
        interval_s=interval_s,
        devices=devices,
        policy=policy,
        log=_open_log(backend, devices, log, interval_s),
    )
    footer = "Ctrl-C to stop" if duration is None else f"for {duration:g} s"
    deadline = time.monotonic() + duration if duration is not None else None
    session.start()
    ok = False
    try:
        with Live(console=console, auto_refresh=False, transient=console.is_terminal) as live:
            try:
                while deadline is None or time.monotonic() < deadline:
                    time.sleep(
                        REFRESH_S
                        if deadline is None
                        else max(0.0, min(REFRESH_S, deadline - time.monotonic()))
                    )
                    if session.error is not None:
                        raise session.error
                    live.update(render_live(session.snapshot(), footer=footer), refresh=True)
            except KeyboardInterrupt:
                pass  # Ctrl-C is how a live view ends
        ok = True
    finally:
        summary = session.stop(raise_error=ok)
    _emit_summary(summary, summary_path, as_json=False, console=console)


def _follow(
    backend: NvmlBackend,
    devices: tuple[int, ...],
    interval_s: float,
    log: Path | None,
    command: list[str],
    summary_path: Path | None,
    quiet: bool,
    policy: AlertPolicy,
) -> int:
    """Run `command`, sample while it runs, summarize on stderr; return its exit status."""
    err = stderr_console()
    sample_log = _open_log(backend, devices, log, interval_s)
    try:
        proc = _spawn(command)
    except BaseException:
        if sample_log is not None:
            sample_log.close()
        raise
    session = MonitorSession(
        backend,
        interval_s=interval_s,
        devices=devices,
        policy=policy,
        owner=ProcessTree(proc.pid),
        log=sample_log,
    )
    session.start()
    restore = _forward_signals(proc)
    try:
        code = _wait(proc, session, quiet)
    finally:
        restore()
        summary = session.stop(command=tuple(command), exit_code=proc.returncode, raise_error=False)
        summary = summary.used_by_command()
    if session.error is not None:
        print(f"gpudoctor: the monitor stopped early: {error_line(session.error)}", file=sys.stderr)
    _emit_summary(summary, summary_path, as_json=False, console=err)
    return code


def _spawn(command: list[str]) -> subprocess.Popen[Any]:
    try:
        return subprocess.Popen(command)
    except FileNotFoundError:
        raise CommandError(f"command not found: {command[0]}", 127) from None
    except PermissionError:
        raise CommandError(f"permission denied: {command[0]}", 126) from None
    except OSError as exc:
        raise CommandError(f"cannot run {command[0]}: {exc.strerror or exc}", 126) from None


def _wait(proc: subprocess.Popen[Any], session: MonitorSession, quiet: bool) -> int:
    """Wait for the command, printing alerts as they are raised. Ctrl-C reaches the command too (same
    process group); it gets INTERRUPT_GRACE_S to exit, a second Ctrl-C or the grace's end stops it."""
    interrupted_at: float | None = None
    reported = False
    while True:
        try:
            returncode = proc.wait(timeout=REFRESH_S)
            break
        except subprocess.TimeoutExpired:
            if interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE_S:
                _stop(proc)
        except KeyboardInterrupt:
            if interrupted_at is not None:
                _stop(proc)
            interrupted_at = time.monotonic()
        if session.error is not None and not reported:
            reported = True
            print(f"gpudoctor: the monitor stopped: {error_line(session.error)}", file=sys.stderr)
        if not quiet:
            for alert in session.raised():
                print(alert_line(alert), file=sys.stderr)
    return 128 - returncode if returncode < 0 else returncode


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


def _forward_signals(proc: subprocess.Popen[Any]) -> Any:
    """Pass SIGTERM and SIGHUP on to the command (so that `kill gpudoctor` stops the job too); returns a
    function that puts the previous handlers back."""
    previous: dict[int, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    except (ValueError, AttributeError):  # not the main thread, or no such signal here
        pass

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _emit_summary(
    summary: MonitorSummary,
    path: Path | None,
    *,
    as_json: bool,
    console: Console,
    inputs: tuple[Path, ...] = (),
) -> None:
    if path is not None:
        write_json(path, summary.to_json(), inputs=inputs)
    if as_json:
        typer.echo(json.dumps(summary.to_json(), indent=1, allow_nan=False))
    else:
        render_summary(summary, console)
