"""The doctor in a notebook or a script of one's own: `with gpudoctor.profile() as p:` captures the block as
`gpudoctor run` captures a script, lets it run to its end and diagnoses it (`p.report`); `diagnose(path)`
reads a trace, a directory of rank traces, a run directory or a saved analysis. Both hand the `RunReport`
to `present` (rendering is the top level's). Nothing runs at import; what a profile installs is removed
when its block ends, also on an exception."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from gpudoctor.doctor.report import RunReport
from gpudoctor.doctor.run import default_out, diagnose_run, now_utc, record_of
from gpudoctor.runner.capture import LiveCapture, LiveOptions
from gpudoctor.runner.launch import ScriptEnd
from gpudoctor.runner.record import PROFILE_ARGV0
from gpudoctor.util.errors import UsageError

Present = Callable[[RunReport], Any]


@dataclass(frozen=True)
class ProfileOptions:
    """The phases of a profiled block, shorter than a script's: a notebook's loop is often short. After
    `warmup` steps (and until step times settle), `light_steps` are timed without the profiler for at
    least `light_seconds`, then `steps` are traced; the block then runs on to its end."""

    warmup: int = 2
    warmup_seconds: float = 0.0
    light_steps: int = 10
    light_seconds: float = 0.0  # a notebook's loop is short: its steps, not a time, bound the phase
    steps: int = 3
    with_stack: bool = False
    record_shapes: bool = False
    profile_memory: bool = False
    nvml: bool = True
    module_depth: int = 3

    def live(self) -> LiveOptions:
        return LiveOptions(
            warmup=self.warmup, warmup_seconds=self.warmup_seconds, light_steps=self.light_steps,
            light_seconds=self.light_seconds, steps=self.steps, run_to_end=True, with_stack=self.with_stack,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory, nvml=self.nvml,
            module_depth=self.module_depth,
        )  # fmt: skip


NESTED = (
    "gpudoctor.profile(): this block ran inside another capture of this process (gpudoctor run, gpudoctor "
    "fix, or an outer profile()), which recorded it: its report is that one's"
)


class Profile:
    """A block of the caller's code under the doctor (`gpudoctor.profile()`); one use."""

    def __init__(
        self,
        options: ProfileOptions | None = None,
        *,
        out: str | Path | None = None,
        name: str = "notebook",
        present: Present | None = None,
    ) -> None:
        self.options = options or ProfileOptions()
        self.out = Path(out) if out is not None else default_out(f"{name}.py")
        self._present = present
        self._capture: LiveCapture | None = None
        self._live: Any = None
        self._started = ""
        self._report: RunReport | None = None
        self._nested = False  # entered while another capture held this process: a pass-through

    def __enter__(self) -> Profile:
        from gpudoctor.runner import capture as capture_module
        from gpudoctor.runner.livedir import RunDir

        if self._started:
            raise UsageError("a gpudoctor.profile() runs once: start another for another block")
        if capture_module._ACTIVE is not None:
            # inside `gpudoctor run` or `fix` (or another profile()), which capture this process already:
            # the block runs as it is, theirs is the capture; the script is not stopped for using us
            self._nested = True
            self._started = now_utc()
            return self
        self._started = now_utc()
        live = self.options.live()
        caller = sys._getframe(1).f_code.co_filename  # the block's own loops are the script's
        self._live = RunDir(self.out, [PROFILE_ARGV0, caller], self._started, dict(vars(live))).open()
        self._capture = LiveCapture(self.out, live, (caller,)).install()
        self._live.watch(self._capture.result)
        self._capture.on_change = self._live.update
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._nested:
            return
        capture, live = self._capture, self._live
        assert capture is not None and live is not None
        capture.uninstall()
        end = _end_of(kind, error)
        record = live.finish(record_of(capture, end, list(live.argv), self._started, capture.options))
        report = diagnose_run(self.out, record)
        if not record.trace_files and end.outcome == "completed":
            report = replace(report, notes=(*report.notes, _untraced(record.steps_seen, self.options)))
        self._report = report

    @property
    def run_report(self) -> RunReport:
        """The doctor's report of the block (after it ended)."""
        if self._nested:
            raise UsageError(NESTED)
        if self._report is None:
            raise UsageError("the profiled block has not ended yet: read .report after the with block")
        return self._report

    @property
    def report(self) -> Any:
        """The report, presented: text in a console, the HTML report inline in Jupyter."""
        if self._nested:
            return NESTED
        report = self.run_report
        return self._present(report) if self._present is not None else report


def _untraced(steps: int, o: ProfileOptions) -> str:
    timed = f"{o.light_steps} timed" + (f" for at least {o.light_seconds:g} s" if o.light_seconds else "")
    return (
        f"nothing was traced: the block ended after {steps} steps, before its {o.steps} traced ones (it "
        f"needs {o.warmup} warm-up steps or more, until step times settle, then {timed}, then one for the "
        "profiler to warm up): run more steps in it, or profile with fewer light_steps"
    )


def _end_of(kind: type[BaseException] | None, error: BaseException | None) -> ScriptEnd:
    if kind is None:
        return ScriptEnd("completed", 0)
    if issubclass(kind, KeyboardInterrupt):
        return ScriptEnd("interrupted", 130, error)
    if issubclass(kind, SystemExit):
        code = error.code if isinstance(error, SystemExit) and isinstance(error.code, int) else 1
        return ScriptEnd("exit", code)
    return ScriptEnd("exception", 1, error)


def diagnose(path: str | Path, *, rank: int | None = None, present: Present | None = None) -> Any:
    """The report of a trace, a directory of rank traces, a run directory or a saved analysis."""
    from gpudoctor.doctor.source import load_source

    report = load_source(Path(path), rank=rank).report
    return present(report) if present is not None else report
