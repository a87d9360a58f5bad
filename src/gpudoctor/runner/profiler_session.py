"""The traced phase's torch.profiler: started on a schedule the capture's step boundaries drive (a warm-up
step, then --steps recorded) or over the whole script, the step's modules labelled as ranges in the
trace, Kineto's own lines sent to the profiler log, the trace exported and gzipped into the run
directory, and the traced steps' times. torch is imported when the profiler starts, not before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.runner.light import step_times
from gpudoctor.runner.modules import ModuleLabels, compiled_by_script
from gpudoctor.runner.phases import LiveOptions
from gpudoctor.runner.proflog import ProfilerLog
from gpudoctor.runner.record import StepTimes
from gpudoctor.runner.rundir import PROFILER_LOG, TRACE_FILE, keep_trace

if TYPE_CHECKING:
    from gpudoctor.runner.discovery import StepDefinition
    from gpudoctor.runner.memory import MemoryRecorder
    from gpudoctor.runner.steps import StepDetector
    from gpudoctor.timing.stepclock import StepClock


class ProfilerSession:
    """The profiler of one capture, from `start` to `stop`; `traced` and `trace_files` are what it
    left, `notes` gets what the run should be told (no module view, no trace)."""

    def __init__(self, out_dir: Path, options: LiveOptions, memory: MemoryRecorder, notes: list[str]) -> None:
        self.out_dir = out_dir
        self.options = options
        self.memory = memory  # handed the profiler when the trace is ready (its memory timeline)
        self.notes = notes
        self.traced: StepTimes | None = None
        self.trace_files: tuple[str, ...] = ()
        self.scheduled = False
        self.clock: StepClock | None = None
        self._prof: Any = None
        self._steps = 0  # boundaries since the traced phase started (the first ends the warm-up step)
        self._labels: ModuleLabels | None = None
        self._raw_trace: Path | None = None
        self._proflog: ProfilerLog | None = None

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(
        self, *, schedule: bool, cuda: bool, definition: StepDefinition | None, detector: StepDetector | None
    ) -> None:
        """Start the profiler: on the step boundaries' schedule, or (`schedule` False) until stopped."""
        import torch
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler import schedule as make_schedule

        o = self.options
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        raw = self.out_dir / TRACE_FILE.removesuffix(".gz")

        def on_trace_ready(prof: Any) -> None:
            prof.export_chrome_trace(str(raw))
            self.memory.on_trace_ready(prof)
            self._raw_trace = raw

        self.scheduled = schedule
        self._prof = profile(
            activities=activities,
            schedule=make_schedule(wait=0, warmup=1, active=o.steps, repeat=1) if schedule else None,
            on_trace_ready=on_trace_ready,
            record_shapes=o.record_shapes,
            profile_memory=o.profile_memory,
            with_stack=o.with_stack,
        )
        self._proflog = ProfilerLog(self.out_dir / PROFILER_LOG).start()  # Kineto's lines: to the log
        self._prof.start()
        for key in ("with_stack", "record_shapes", "profile_memory"):  # read back by the trace loader
            self._prof.add_metadata_json(key, json.dumps(getattr(o, key)))
        if definition is not None:
            # read back by the trace loader: the reports say how the step was found
            from gpudoctor.trace.model import RUN_STEP_KEY  # here: the trace package pulls in numpy

            self._prof.add_metadata_json(RUN_STEP_KEY, json.dumps(definition.description))
        self._label_modules(detector)
        self._steps = 0
        from gpudoctor.timing.stepclock import StepClock

        self.clock = StepClock(cuda)

    def step(self) -> None:
        """A step marked in a trace of the whole script (no schedule)."""
        self._prof.step()

    def boundary(self) -> bool:
        """A step boundary of the traced phase; whether its --steps are recorded with it. The step
        before the first boundary here was the profiler's warm-up: not timed."""
        self._steps += 1
        assert self.clock is not None
        self.clock.boundary()
        if self.scheduled:
            self._prof.step()
        return self._steps > self.options.steps

    def _label_modules(self, detector: StepDetector | None) -> None:
        if detector is None:
            return
        detector.label_closures = True
        root = detector.root_module
        if root is None or self.options.module_depth < 0:
            return
        if compiled_by_script(root):
            self.notes.append(
                "no module view: the root module is compiled (its submodules run inside the graph)"
            )
            return
        self._labels = ModuleLabels(root, self.options.module_depth).install()

    def stop(self, detector: StepDetector | None) -> None:
        """Stop the profiler and keep what it recorded (also when stopping fails); nothing when it is
        not running."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        if self._labels is not None:
            self._labels.remove()
            self._labels = None
        if detector is not None:
            detector.label_closures = False
        try:
            prof.stop()
        finally:
            if self.clock is not None and self.clock.marks:
                self.traced = step_times(self.clock)
            self._gzip_trace()
            if self._proflog is not None:
                self._proflog.stop()

    def _gzip_trace(self) -> None:
        raw, self._raw_trace = self._raw_trace, None
        if raw is None or not raw.exists():
            self.notes.append("the profiler produced no trace")
            return
        kept, note = keep_trace(raw, TRACE_FILE)  # gzipped, or left raw if that fails
        self.trace_files = (*self.trace_files, kept)
        if note:
            self.notes.append(note)
