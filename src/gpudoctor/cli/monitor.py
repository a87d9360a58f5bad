"""`gpudoctor monitor`: a live view of every GPU with alerts (Ctrl-C ends it and prints a summary);
`--once` prints one snapshot; `--log FILE` records samples (CSV or JSON lines); `gpudoctor monitor --
CMD ARGS` runs a command, prints alerts as they arise and a summary of its run on stderr, and exits with
the command's status; `--replay FILE` summarizes a recorded JSON-lines log. No NVML: one line, exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live

from gpudoctor.cli.common import DebugOption, error_line, set_debug, stderr_console, stdout_console
from gpudoctor.monitor.alerts import AlertPolicy
from gpudoctor.monitor.backend import NvmlBackend, open_backend
from gpudoctor.monitor.logfile import SampleLog, log_format
from gpudoctor.monitor.procs import ProcessTree
from gpudoctor.monitor.samples import MonitorRecord
from gpudoctor.monitor.session import MonitorSession, read_once
from gpudoctor.monitor.summary import MonitorSummary, summarize_record
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


def monitor_command(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="COMMAND",
            help="Run this command (after --), follow it, and summarize its run.",
            show_default=False,
        ),
    ] = None,
    interval_ms: Annotated[
        float,
        typer.Option("--interval", "-i", metavar="MS", min=10, help="Sampling interval in milliseconds."),
    ] = 100,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log",
            metavar="FILE",
            help="Write every sample: .csv, or .jsonl (JSON lines; .gz too).",
            show_default=False,
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            "-g",
            metavar="IDS",
            help="GPUs to watch: NVML indices or UUIDs, comma-separated.",
            show_default=False,
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            "-d",
            metavar="S",
            min=0,
            help="Stop the live view after S seconds.",
            show_default=False,
        ),
    ] = None,
    summary_path: Annotated[
        Path | None,
        typer.Option(
            "--summary",
            metavar="FILE",
            help="Also write the end-of-run summary as JSON to FILE.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --once or --replay: print JSON on stdout instead of tables.")
    ] = False,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="FILE",
            help="Summarize a JSON-lines log written by --log.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Following a command: no alerts while it runs.")
    ] = False,
    no_gpm: Annotated[
        bool, typer.Option("--no-gpm", help="Do not read NVML GPM (SM / tensor / DRAM activity).")
    ] = False,
    debug: DebugOption = False,
) -> None:
    """Watch the GPUs: utilization, memory, clocks and why they drop, power, processes, alerts.

    Alerts: GPU busy under 50% while held (input pipeline suspect), clocks held down (and why),
    another process on the same GPU (contention), memory over 90%, SMs idle while kernels run (GPM).
    `gpudoctor monitor -- python train.py` follows the command and summarizes its run.
    """
    set_debug(ctx, debug)
    command = list(command or [])
    _check_options(command, once=once, replay=replay, log=log, duration=duration, as_json=as_json)
    interval_s = interval_ms / 1e3
    policy = AlertPolicy()
    if replay is not None:
        summary = summarize_record(MonitorRecord.read_jsonl(replay), policy)
        _emit_summary(summary, summary_path, as_json=as_json, console=stdout_console())
        return
    backend = open_backend(gpm=not no_gpm, process_interval_s=max(interval_s, 0.5))
    try:
        devices = _devices(backend, gpus)
        if once:
            _once(backend, devices, interval_s, log, as_json)
        elif command:
            code = _follow(backend, devices, interval_s, log, command, summary_path, quiet, policy)
            raise typer.Exit(code)
        else:
            _live(backend, devices, interval_s, log, duration, summary_path, policy)
    finally:
        backend.close()


def _check_options(
    command: list[str],
    *,
    once: bool,
    replay: Path | None,
    log: Path | None,
    duration: float | None,
    as_json: bool,
) -> None:
    if once and command:
        raise UsageError("--once takes no command")
    if replay is not None and (once or command or log is not None):
        raise UsageError("--replay reads a log: it takes no command, --once or --log")
    if as_json and not (once or replay is not None):
        raise UsageError("--json goes with --once or --replay (use --summary FILE for a run's summary)")
    if duration is not None and (once or command):
        raise UsageError("--duration is for the live view")
    if log is not None:
        log_format(log)


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


def _emit_summary(summary: MonitorSummary, path: Path | None, *, as_json: bool, console: Console) -> None:
    if path is not None:
        write_json(path, summary.to_json())
    if as_json:
        typer.echo(json.dumps(summary.to_json(), indent=1, allow_nan=False))
    else:
        render_summary(summary, console)


def register(app: typer.Typer) -> None:
    app.command("monitor", context_settings={"allow_interspersed_args": False})(monitor_command)
