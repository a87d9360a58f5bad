"""`gpudoctor monitor`: a live view of every GPU with alerts (Ctrl-C ends it and prints a summary);
`--once` prints one snapshot; `--log FILE` records samples (CSV or JSON lines); `gpudoctor monitor --
CMD ARGS` runs a command, prints alerts as they arise and a summary of its run on stderr, and exits with
the command's status; `--replay FILE` summarizes a recorded JSON-lines log. No NVML: one line, exit 2.
The work is in `cli.monitor_run`, imported when the command runs."""

from __future__ import annotations

from dataclasses import dataclass
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
    request = MonitorRequest(
        command=tuple(command or ()),
        interval_s=interval_ms / 1e3,
        once=once,
        log=log,
        gpus=gpus,
        duration_s=duration,
        summary_path=summary_path,
        as_json=as_json,
        replay=replay,
        quiet=quiet,
        gpm=not no_gpm,
    )
    code = run_monitor(request)
    if code is not None:
        raise typer.Exit(code)


@dataclass(frozen=True)
class MonitorRequest:
    """What `gpudoctor monitor` was asked: one snapshot, the live view (for `duration_s`), a command to
    follow and summarize, or a log to replay; which GPUs, how often, and the files to write."""

    command: tuple[str, ...] = ()
    interval_s: float = 0.1
    once: bool = False
    log: Path | None = None
    gpus: str | None = None  # NVML indices or UUIDs, comma-separated; None: every GPU
    duration_s: float | None = None
    summary_path: Path | None = None
    as_json: bool = False
    replay: Path | None = None
    quiet: bool = False
    gpm: bool = True

    def check(self) -> None:
        """Options that do not go together, and a log file of no known format, as one-line errors."""
        if self.once and self.command:
            raise UsageError("--once takes no command")
        if self.replay is not None and (self.once or self.command or self.log is not None):
            raise UsageError("--replay reads a log: it takes no command, --once or --log")
        if self.as_json and not (self.once or self.replay is not None):
            raise UsageError("--json goes with --once or --replay (use --summary FILE for a run's summary)")
        if self.duration_s is not None and (self.once or self.command):
            raise UsageError("--duration is for the live view")
        if self.log is not None:
            from gpudoctor.monitor.logfile import log_format

            log_format(self.log)


def run_monitor(request: MonitorRequest) -> int | None:
    """Monitor as asked; the followed command's exit status (None for the other modes)."""
    from gpudoctor.cli.monitor_run import _devices, _emit_summary, _follow, _live, _once
    from gpudoctor.monitor.alerts import AlertPolicy
    from gpudoctor.monitor.samples import MonitorRecord
    from gpudoctor.monitor.summary import summarize_record

    r = request
    r.check()
    policy = AlertPolicy()
    if r.replay is not None:
        summary = summarize_record(MonitorRecord.read_jsonl(r.replay), policy)
        _emit_summary(
            summary, r.summary_path, as_json=r.as_json, console=stdout_console(), inputs=(r.replay,)
        )
        return None
    backend = open_backend(gpm=r.gpm, process_interval_s=max(r.interval_s, 0.5))
    try:
        devices = _devices(backend, r.gpus)
        if r.once:
            _once(backend, devices, r.interval_s, r.log, r.as_json)
        elif r.command:
            return _follow(
                backend, devices, r.interval_s, r.log, list(r.command), r.summary_path, r.quiet, policy
            )
        else:
            _live(backend, devices, r.interval_s, r.log, r.duration_s, r.summary_path, policy)
    finally:
        backend.close()
    return None


def register(app: typer.Typer) -> None:
    app.command("monitor", context_settings={"allow_interspersed_args": False})(monitor_command)
