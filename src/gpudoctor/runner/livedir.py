"""A run directory kept whole while the run goes on, so that however it ends — finished, an exception,
Ctrl-C, SIGTERM, `os._exit`, a crash — what was measured is on disk: `RunDir.open()` writes `record.json`
(outcome "running") before the script starts, `update()` at each phase change, SIGTERM and SIGHUP end the
script as an exit with status 128 + signal, an `atexit` hook writes the record if nothing else did, and
`finish()` writes the last one and puts the handlers back. The files are `runner.rundir`'s."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.runner.record import RunRecord
from gpudoctor.runner.rundir import prepare_run_dir, write_record
from gpudoctor.util.errors import OutputError

RUNNING_NOTE = (
    "written while the run went on: if no later record replaced this one, the process ended before "
    "gpudoctor could finish (SIGKILL, os._exit, a crash); what is here was measured"
)
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(SystemExit):
    """Raised in the script by SIGTERM or SIGHUP: it ends like `sys.exit(128 + signal)`, so the run's
    own path (capture stopped, trace kept, record written) runs before the process exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class RunDir:
    def __init__(self, out: Path, argv: list[str], started_at: str, options: dict[str, Any]) -> None:
        self.out = out
        self.argv = tuple(argv)
        self.started_at = started_at
        self.options = options
        self.signum: int | None = None  # the signal that ended the run, if one did
        self._result: Callable[[], dict[str, Any]] | None = None  # the capture's fields, as they are now
        self._finished = False
        self._previous: dict[int, Any] = {}

    # -- the path ---------------------------------------------------------------------------------------
    def open(self) -> RunDir:
        """Check the path, make the directory, write the first record, install the handlers."""
        prepare_run_dir(self.out)
        self.write(self.record("running", exit_code=-1))
        self._install()
        return self

    def watch(self, result: Callable[[], dict[str, Any]]) -> None:
        """Where the capture's fields come from (`LiveCapture.result`), for updates and the exit hook."""
        self._result = result

    # -- the record --------------------------------------------------------------------------------------
    def record(self, outcome: str, exit_code: int, error: str | None = None) -> RunRecord:
        fields: dict[str, Any] = {"environment": None, "steps_seen": 0}
        if self._result is not None:
            with contextlib.suppress(Exception):  # a half-built capture: the record says what it can
                fields = self._result()
        if outcome == "running":
            fields = {**fields, "notes": (*fields.get("notes", ()), RUNNING_NOTE)}
        return RunRecord(
            argv=self.argv,
            started_at=self.started_at,
            options=self.options,
            outcome=outcome,
            exit_code=exit_code,
            error=error,
            **fields,
        )

    def write(self, record: RunRecord) -> None:
        write_record(self.out, record)

    def update(self) -> None:
        """The record as the capture stands now (called at its phase changes); a failure to write it
        is not the script's problem: the final write will say it."""
        if not self._finished:
            with contextlib.suppress(OutputError):
                self.write(self.record("running", exit_code=-1))

    def finish(self, record: RunRecord) -> RunRecord:
        """The final record (its outcome "terminated" when a signal ended the run); handlers back."""
        if self.signum is not None and record.outcome == "exit":
            notes = (*record.notes, f"ended by {signal.Signals(self.signum).name}: what was measured is kept")
            record = _replace(record, outcome="terminated", notes=notes)
        self._finished = True
        self._uninstall()
        self.write(record)
        return record

    # -- signals and exit ------------------------------------------------------------------------------
    def _install(self) -> None:
        atexit.register(self._at_exit)
        for sig in SIGNALS:
            with contextlib.suppress(ValueError, OSError):  # not the main thread: the exit hook holds
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _uninstall(self) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)
        self._previous.clear()
        atexit.unregister(self._at_exit)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signum is not None:  # a second one: stop now (the record on disk is the last update)
            raise SystemExit(128 + signum)
        self.signum = signum
        raise Terminated(signum)

    def _at_exit(self) -> None:
        """The interpreter exits and the run never got to `finish`: keep what is known."""
        if not self._finished:
            self._finished = True
            with contextlib.suppress(Exception):
                self.write(self.record("ended", exit_code=-1, error="the process exited during the run"))


def _replace(record: RunRecord, **changes: Any) -> RunRecord:
    return dataclasses.replace(record, **changes)
