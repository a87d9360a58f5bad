"""In-process capture for `gpudoctor run`: at each step boundary (found by `runner.steps`), the phases:
skip warm-up steps, a light phase (step times from CUDA events or perf_counter, torch.cuda memory
statistics, NVML samples; no profiler), a traced phase (torch.profiler driven by the same boundaries),
then `StopRun` once captured, unless told to let the script finish.

`LiveCapture.install()` / `uninstall()` bracket the script; uninstall removes every hook and stops the
profiler and sampler whatever state they are in. Nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpudoctor.runner.proflog import ProfilerLog
from gpudoctor.runner.record import Environment, StepTimes
from gpudoctor.runner.rundir import PROFILER_LOG, keep_trace
from gpudoctor.runner.steps import StepDetector

TRACE_NAME = "trace.json.gz"
MEMORY_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
)

_ACTIVE: LiveCapture | None = None  # set only between install() and uninstall()


class StopRun(BaseException):
    """Raised from a step boundary once everything is captured; a BaseException so that the script's
    own `except Exception` does not swallow it."""


@dataclass(frozen=True)
class LiveOptions:
    warmup: int = 3  # steps skipped before the light phase
    light_steps: int = 20
    steps: int = 5  # profiled (active) steps of the traced phase
    light_only: bool = False
    run_to_end: bool = False  # let the script finish after the capture instead of stopping it
    with_stack: bool = False
    record_shapes: bool = False
    profile_memory: bool = False
    nvml: bool = True
    nvml_interval_s: float = 0.1


class _Clock:
    """Marks at step boundaries: CUDA events on the current stream (no sync until `times_us`), or
    perf_counter on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.name = "cuda_events" if cuda else "perf_counter"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter_ns())

    def times_us(self) -> StepTimes:
        if len(self.marks) < 2:
            return StepTimes(self.name, ())
        if self.cuda:
            self.marks[-1].synchronize()
            times = [a.elapsed_time(b) * 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]
        else:
            times = [(b - a) / 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return StepTimes(self.name, tuple(times))


class LiveCapture:
    """The phases of one run; `boundary()` is called at the end of every step of the script."""

    def __init__(self, out_dir: Path, options: LiveOptions) -> None:
        self.out_dir = out_dir
        self.options = options
        self.steps_seen = 0
        self.phase = "warmup"  # warmup, light, traced, done
        self.light: StepTimes | None = None
        self.traced: StepTimes | None = None
        self.environment: Environment | None = None
        self.memory: dict[str, int] | None = None
        self.memory_missing: str | None = None
        self.nvml_samples: tuple[dict[str, Any], ...] = ()
        self.nvml_summary: dict[str, Any] | None = None
        self.nvml_missing: str | None = None
        self.trace_files: tuple[str, ...] = ()
        self.notes: list[str] = []
        self._clock: _Clock | None = None
        self._cuda = False
        self._detector: StepDetector | None = None
        self._prof: Any = None
        self._prof_steps = 0
        self._raw_trace: Path | None = None
        self._nvml: Any = None  # (backend, session)
        self.on_change: Any = None  # called at each phase change (runner.rundir: the record so far)
        self._proflog: ProfilerLog | None = None

    # -- installation --------------------------------------------------------------------------------
    def install(self) -> LiveCapture:
        global _ACTIVE
        self._detector = StepDetector(self.boundary).install()
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        """Stop whatever is running and remove the hooks; safe to call twice, also after a failure."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if self._detector is not None:
            self._detector.uninstall()
        self.finish()

    def explicit_step(self) -> None:
        if self._detector is not None:
            self._detector.explicit_step()
        else:
            self.boundary()

    # -- phases --------------------------------------------------------------------------------------
    def boundary(self) -> None:
        self.steps_seen += 1
        if self.phase == "done":
            return
        try:
            self._advance()
        except StopRun:
            raise
        except Exception as err:  # a failure of ours must not break the user's script
            self.notes.append(f"capture stopped at step {self.steps_seen}: {type(err).__name__}: {err}")
            self.finish()
            return
        if self.phase == "done" and not self.options.run_to_end:
            raise StopRun

    def _advance(self) -> None:
        o, n = self.options, self.steps_seen
        light_start = max(o.warmup, 1)  # the first boundary starts the first timed step
        if self.phase == "warmup" and n >= light_start:
            self._start_light()
            return
        if self.phase == "light":
            assert self._clock is not None
            self._clock.mark()
            if len(self._clock.marks) > o.light_steps:
                self._end_light()
                if o.light_only:
                    self.phase = "done"
                else:
                    self._start_traced()
            return
        if self.phase == "traced":
            # the step before the first boundary here was the profiler's warm-up: not timed
            self._prof_steps += 1
            assert self._clock is not None
            self._clock.mark()
            self._prof.step()
            if self._prof_steps > o.steps:
                self._end_traced()

    def _start_light(self) -> None:
        import torch

        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.environment = environment(self._cuda)
        self._start_nvml()
        self._clock = _Clock(self._cuda)
        self._clock.mark()
        self.phase = "light"

    def _end_light(self) -> None:
        assert self._clock is not None
        self.light = self._clock.times_us()
        self._read_memory()
        self._stop_nvml()
        self._changed()

    def _start_traced(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        o = self.options
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        raw = self.out_dir / TRACE_NAME.removesuffix(".gz")

        def on_trace_ready(prof: Any) -> None:
            prof.export_chrome_trace(str(raw))
            self._raw_trace = raw

        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=o.steps, repeat=1),
            on_trace_ready=on_trace_ready,
            record_shapes=o.record_shapes,
            profile_memory=o.profile_memory,
            with_stack=o.with_stack,
        )
        self._proflog = ProfilerLog(self.out_dir / PROFILER_LOG).start()  # Kineto's lines: to the log
        self._prof.start()
        for key in ("with_stack", "record_shapes", "profile_memory"):  # read back by the trace loader
            self._prof.add_metadata_json(key, json.dumps(getattr(o, key)))
        self._prof_steps = 0
        self._clock = _Clock(self._cuda)
        self.phase = "traced"

    def _end_traced(self) -> None:
        self._stop_profiler()
        self.phase = "done"

    def _stop_profiler(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        try:
            prof.stop()
        finally:
            if self._clock is not None and self._clock.marks:
                self.traced = self._clock.times_us()
            self._gzip_trace()
            if self._proflog is not None:
                self._proflog.stop()
            self._changed()

    def finish(self) -> None:
        """End every phase early (the script ended or failed): keep what was captured."""
        if self.phase == "light":
            self._end_light()
        elif self.phase == "traced":
            self._stop_profiler()
        self._stop_nvml()
        self.phase = "done"

    def _gzip_trace(self) -> None:
        raw, self._raw_trace = self._raw_trace, None
        if raw is None or not raw.exists():
            self.notes.append("the profiler produced no trace")
            return
        kept, note = keep_trace(raw, TRACE_NAME)  # gzipped, or left raw if that fails
        self.trace_files = (*self.trace_files, kept)
        if note:
            self.notes.append(note)

    def _changed(self) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):  # the record so far is a by-product of the run
                self.on_change()

    # -- memory and NVML -----------------------------------------------------------------------------
    def _read_memory(self) -> None:
        if not self._cuda:
            self.memory_missing = "no CUDA device in use: torch.cuda memory statistics are GPU-only"
            return
        import torch

        stats = torch.cuda.memory_stats()
        self.memory = {k: int(stats[k]) for k in MEMORY_KEYS if k in stats}

    def _start_nvml(self) -> None:
        if not self.options.nvml:
            self.nvml_missing = "turned off (--no-nvml)"
            return
        if not self._cuda:
            self.nvml_missing = "no CUDA device in use"
            return
        from gpudoctor.monitor import MonitorSession, open_backend
        from gpudoctor.util.errors import GpudoctorError

        try:
            backend = open_backend()
        except (GpudoctorError, OSError) as err:
            self.nvml_missing = str(err)
            return
        try:
            devices = [backend.resolve(_cuda_uuid())]
        except Exception:  # an unknown UUID (MIG, another namespace): watch every GPU
            devices = None
        session = MonitorSession(backend, interval_s=self.options.nvml_interval_s, devices=devices, keep=None)
        self._nvml = (backend, session.start())

    def _stop_nvml(self) -> None:
        if self._nvml is None:
            return
        (backend, session), self._nvml = self._nvml, None
        try:
            summary = session.stop(raise_error=False)
            self.nvml_samples = tuple(s.to_json() for s in session.sampler.samples())
            self.nvml_summary = summary.to_json()
        finally:
            backend.close()

    def result(self) -> dict[str, Any]:
        """The captured fields of a `RunRecord`."""
        return {
            "light": self.light,
            "traced": self.traced,
            "environment": self.environment,
            "memory": self.memory,
            "memory_missing": self.memory_missing,
            "nvml_samples": self.nvml_samples,
            "nvml_summary": self.nvml_summary,
            "nvml_missing": self.nvml_missing,
            "trace_files": self.trace_files,
            "steps_seen": self.steps_seen,
            "notes": tuple(self.notes),
        }


def _cuda_uuid() -> str:
    import torch

    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def environment(cuda: bool) -> Environment:
    """The versions and flags that change what a step costs, read now."""
    import platform

    import torch

    env = Environment(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
        cpu_count=os.cpu_count(),
    )
    if cuda:
        index = torch.cuda.current_device()
        env = replace(env, device=f"cuda:{index}", gpu_name=torch.cuda.get_device_name(index))
        with contextlib.suppress(Exception):
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
                env = replace(env, driver=driver.decode() if isinstance(driver, bytes) else driver)
            finally:
                pynvml.nvmlShutdown()
    return env


# -- the user's API (through gpudoctor.step / gpudoctor.session) ---------------------------------------
def step() -> None:
    """Mark the end of a step; a no-op outside `gpudoctor run`."""
    if _ACTIVE is not None:
        _ACTIVE.explicit_step()


class Session:
    """What `with gpudoctor.session() as s:` gives: `s.step()` marks a step; `s.active` says whether
    gpudoctor run is capturing."""

    def __init__(self, capture: LiveCapture | None) -> None:
        self._capture = capture

    @property
    def active(self) -> bool:
        return self._capture is not None

    def step(self) -> None:
        if self._capture is not None:
            self._capture.explicit_step()


@contextlib.contextmanager
def session() -> Iterator[Session]:
    """A region of steps: leaving it ends any phase still running (the rest of the script is not
    traced). Outside `gpudoctor run` it does nothing."""
    capture = _ACTIVE
    try:
        yield Session(capture)
    finally:
        if capture is not None and _ACTIVE is capture:
            capture.finish()
