"""`gpudoctor monitor`: a live view of every GPU with alerts (Ctrl-C ends it and prints a summary);
`--once` prints one snapshot; `--log FILE` records samples (CSV or JSON lines); `gpudoctor monitor --
CMD ARGS` runs a command, prints alerts as they arise and a summary of its run on stderr, and exits with
the command's status; `--replay FILE` summarizes a recorded JSON-lines log. No NVML: one line, exit 2.
The work is in `cli.monitor_run`, imported when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpudoctor.cli.common import DebugOption, set_debug, stdout_console
from gpudoctor.util.errors import UsageError

if TYPE_CHECKING:
    from gpudoctor.monitor.backend import NvmlBackend


def open_backend(**options: Any) -> NvmlBackend:
    """NVML, opened when the monitor runs (tests put a replay in its place)."""
    from gpudoctor.monitor.backend import open_backend as _open_backend

    return _open_backend(**options)


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
    from gpudoctor.cli.monitor_run import _devices, _emit_summary, _follow, _live, _once
    from gpudoctor.monitor.alerts import AlertPolicy
    from gpudoctor.monitor.samples import MonitorRecord
    from gpudoctor.monitor.summary import summarize_record

    command = list(command or [])
    _check_options(command, once=once, replay=replay, log=log, duration=duration, as_json=as_json)
    interval_s = interval_ms / 1e3
    policy = AlertPolicy()
    if replay is not None:
        summary = summarize_record(MonitorRecord.read_jsonl(replay), policy)
        _emit_summary(summary, summary_path, as_json=as_json, console=stdout_console(), inputs=(replay,))
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
        from gpudoctor.monitor.logfile import log_format

        log_format(log)


def register(app: typer.Typer) -> None:
    app.command("monitor", context_settings={"allow_interspersed_args": False})(monitor_command)
