"""In-process capture for `gpudoctor run`: at each step boundary (found by `runner.steps`), the phases:
skip warm-up steps (`phases.WarmUp`), a light phase (`light.LightPhase`: step times from CUDA events or
perf_counter, no profiler; its end agreed among ranks by `agreement`), with the allocator's statistics
and NVML samples beside it (`samplers`), a traced phase (`profiler_session.ProfilerSession`: torch.profiler
driven by the same boundaries), then `StopRun` once captured, unless told to let the script finish.
`LiveCapture` holds the phase machine and hands each phase to its part.

`LiveCapture.install()` / `uninstall()` bracket the script; uninstall removes every hook and stops the
profiler and sampler whatever state they are in. Nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.runner.agreement import LightAgreement, RankAgreement
from gpudoctor.runner.compile_workers import stop_compile_workers
from gpudoctor.runner.discovery import StepDefinition
from gpudoctor.runner.environment import environment
from gpudoctor.runner.forked import leave_forked_children
from gpudoctor.runner.light import LightPhase
from gpudoctor.runner.memory import MemoryOptions, MemoryRecorder
from gpudoctor.runner.phases import LiveOptions, StopRun, WarmUp
from gpudoctor.runner.profiler_session import ProfilerSession
from gpudoctor.runner.record import Environment, StepFound, StepTimes
from gpudoctor.runner.samplers import MemoryCadence, NvmlSampling, allocator_statistics
from gpudoctor.runner.steps import StepDetector

if TYPE_CHECKING:  # the timing core's package imports numpy: the command line starts without it
    from gpudoctor.timing.blocks import Block, BlockLayout, Redone

__all__ = ["LiveCapture", "LiveOptions", "StepRegion", "StopRun", "session", "step"]

_ACTIVE: LiveCapture | None = None  # set only between install() and uninstall()


class LiveCapture:
    """The phases of one run; `boundary()` is called at every step boundary the detector finds."""

    def __init__(
        self,
        out_dir: Path,
        options: LiveOptions,
        script_files: tuple[str, ...] = (),
        on_phase: Callable[[str, LiveCapture], None] | None = None,
        on_switch: Callable[[bool], None] | None = None,
        disturbed: Callable[[], float] | None = None,
        switch_lag: Callable[[], int] | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.options = options
        self.script_files = script_files
        self.on_switch = on_switch
        self.switch_lag = switch_lag  # with blocks: steps a switch takes to reach the loop (settled out)
        # seconds spent compiling so far: a block during which it moved is timed again, a light phase
        # without blocks starts again (not under ranks, whose phases go by agreed step counts)
        self.disturbed = disturbed
        self.restarted_s: list[float] = []  # each restart of the light phase: the seconds compiled
        # Told of each phase it enters ("light", "traced", "done"): runner.ranks, whose ranks must enter
        # each at the same step, so the phases then go by step counts alone (`lockstep`).
        self.on_phase = on_phase
        self.lockstep = on_phase is not None
        # with ranks, set as the light phase begins: its steps as agreed, and how the ranks agree on
        # extending it alike where their steps have not settled (`runner.agreement`; None: not extended)
        self.light_target: int | None = None
        self.agree: LightAgreement | None = None
        self.agreement = RankAgreement()
        self.steps_seen = 0  # boundaries of the step as finally defined
        self.first_step = 1  # the script's iteration the first of them ends (StepDetector.first_step)
        self.phase = "warmup"  # warmup, light, traced, done
        self.definition: StepDefinition | None = None
        self.warmup = WarmUp(options, self.lockstep)
        self.light: StepTimes | None = None
        self.calls_per_step: float | None = None  # root module calls per light-phase step
        self.blocks: tuple[Block, ...] = ()  # the light phase's blocks, with LiveOptions.blocks
        self.redone: tuple[Redone, ...] = ()  # blocks set aside and timed again (the process compiled)
        self.block_layout: BlockLayout | None = None  # their calibration, period, steps and orders
        self.environment: Environment | None = None
        self.memory: dict[str, int] | None = None
        self.memory_missing: str | None = None
        self.notes: list[str] = []
        self.on_change: Any = None  # called at each phase change (runner.rundir: the record so far)
        self.nvml = NvmlSampling(options)
        timeline = options.profile_memory and options.record_shapes and options.with_stack
        self.memory_recorder = MemoryRecorder(
            MemoryOptions(options.memory_history, options.memory_history != "off", timeline)
        )
        self.profiler = ProfilerSession(out_dir, options, self.memory_recorder, self.notes)
        self._cadence = MemoryCadence()
        self._light: LightPhase | None = None
        self._cuda = False
        self._detector: StepDetector | None = None

    @property
    def traced(self) -> StepTimes | None:
        return self.profiler.traced

    @property
    def trace_files(self) -> tuple[str, ...]:
        return self.profiler.trace_files

    # -- installation --------------------------------------------------------------------------------
    def install(self) -> LiveCapture:
        global _ACTIVE
        leave_forked_children()  # a DataLoader's workers run as in the script, without gpudoctor's hooks
        self._detector = StepDetector(
            self.boundary, self._on_definition, self.script_files, discover=not self.options.trace_all
        ).install()
        detector = self._detector
        self.memory_recorder.root_hint = lambda: detector.root_module
        self.memory_recorder.install()
        _ACTIVE = self
        if self.options.trace_all:
            self._start_traced(schedule=False)
        return self

    def uninstall(self) -> None:
        """Stop whatever is running and remove the hooks; safe to call twice, also after a failure."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if self._detector is not None:
            self.notes.extend(n for n in self._detector.notes if n not in self.notes)
            self._detector.uninstall()
        self.finish()
        self.memory_recorder.uninstall()
        with contextlib.suppress(OSError):
            self.memory_recorder.write_files(self.out_dir)

    def explicit_step(self) -> None:
        if self._detector is not None:
            self._detector.explicit_step()
        else:
            self.boundary()

    def _on_definition(self, definition: StepDefinition, restart: bool) -> None:
        previous, self.definition = self.definition, definition
        self.first_step = self._detector.first_step if self._detector is not None else 1
        if not restart or previous is None:
            return
        if self.phase in ("warmup", "light"):
            self.nvml.stop()
            self.phase, self.steps_seen, self._light = "warmup", 0, None
            self.warmup.restart()
            self._cadence.restart()
            self.memory_recorder.restart()
            self.notes.append(
                f"the step is {definition.description}, not {previous.description}: the warm-up and the "
                "timing started again from there"
            )
        else:
            self.notes.append(f"the step became {definition.description} after tracing had begun")

    @property
    def step_number(self) -> int:
        """The script's iteration that the step ending now is (the memory record's step numbers)."""
        return self.steps_seen + self.first_step - 1

    @property
    def timing(self) -> bool:
        """The steps now count in what the light phase measures: its steps, or with blocks, a block's
        (not their prewarm, calibration or settling steps)."""
        return self.phase == "light" and (self._light is None or self._light.timing)

    def light_plan(self) -> int:
        """The light-phase steps rank 0 proposes to the others (`WarmUp.light_plan`)."""
        return self.warmup.light_plan()

    # -- phases --------------------------------------------------------------------------------------
    def boundary(self) -> None:
        self.steps_seen += 1
        if self.phase == "done":
            return
        ended = self.phase
        now = time.perf_counter()
        memory = self._cadence.due(ended, now)
        try:
            if memory:
                self.memory_recorder.end_step(ended, self.step_number)
            self._advance()
            if not memory and self.phase != ended:  # a phase ends: its last group is read all the same
                self.memory_recorder.end_step(ended, self.step_number)
                memory = True
            if memory:
                self.memory_recorder.begin_step(self.phase, ended)
                self._cadence.read(now)
        except StopRun:
            raise
        except Exception as err:  # a failure of ours must not break the user's script
            self.notes.append(f"capture stopped at step {self.steps_seen}: {type(err).__name__}: {err}")
            self.finish()
            return
        if self.phase == "done" and not self.options.run_to_end:
            raise StopRun

    def _advance(self) -> None:
        if self.phase == "warmup":
            if self.warmup.boundary():
                self._enter("light")
                self._start_light()
            return
        if self.phase == "light":
            assert self._light is not None
            if self._light.boundary():
                self._end_light()
                if self.options.light_only:
                    self.phase = "done"
                    self._enter("done")
                else:
                    self._enter("traced")
                    self._start_traced(schedule=self.definition is None or self.definition.source != "window")
            return
        if self.phase == "traced" and self.options.trace_all:
            self.profiler.step()  # steps marked in a trace of the whole script, which runs to its end
            return
        if self.phase == "traced" and self.profiler.boundary():
            self._stop_profiler()
            self.phase = "done"
            self._enter("done")

    def _enter(self, phase: str) -> None:
        if self.on_phase is not None:
            self.on_phase(phase, self)

    def _start_light(self) -> None:
        import torch

        stop_compile_workers()
        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.environment = environment(self._cuda)
        self.nvml.start(self._cuda)
        detector = self._detector
        self.agreement.begin(self.light_target, self.agree)
        self._light = LightPhase(
            self.options,
            cuda=self._cuda,
            every=self.warmup.mark_every(),
            agreement=self.agreement,
            calls=lambda: detector.calls if detector else 0,
            restarts=self.restarted_s,
            notes=self.notes,
            disturbed=self.disturbed,
            can_restart=not self.lockstep,
        )
        self.phase = "light"
        plan = self.options.blocks
        if plan is None:
            self._light.start_clock()
            return
        from gpudoctor.timing.blocks import BlockSchedule

        sync = torch.cuda.synchronize if self._cuda else None
        self._light.start_blocks(
            BlockSchedule(
                plan,
                self.on_switch or (lambda on: None),
                cuda=self._cuda,
                sync=sync,
                disturbed=self.disturbed,
                lag=self.switch_lag,
                agree=self._agreed_block_steps if self.lockstep else None,
            )
        )

    def _agreed_block_steps(self, steps: int) -> int:
        """The steps of a block as rank 0 calibrated them (this rank's own without a store)."""
        return self.agree.shared("blocks/steps", steps) if self.agree is not None else steps

    def _end_light(self) -> None:
        assert self._light is not None
        detector = self._detector
        end = self._light.end(root_known=detector is not None and detector.root_module is not None)
        self.light, self.blocks, self.redone, self.block_layout = (
            end.light, end.blocks, end.redone, end.block_layout
        )  # fmt: skip
        if end.calls_per_step is not None:
            self.calls_per_step = end.calls_per_step
        self.notes.extend(n for n in end.notes if n not in self.notes)
        self.memory, self.memory_missing = allocator_statistics(self._cuda)
        self.nvml.stop()
        self._changed()

    def _start_traced(self, schedule: bool = True) -> None:
        import torch

        self._cuda = self._cuda or (torch.cuda.is_available() and torch.cuda.is_initialized())
        self.profiler.start(
            schedule=schedule, cuda=self._cuda, definition=self.definition, detector=self._detector
        )
        self.phase = "traced"

    def _stop_profiler(self) -> None:
        if not self.profiler.running:
            return
        try:
            self.profiler.stop(self._detector)
        finally:
            self._changed()

    def finish(self) -> None:
        """End every phase early (the script ended or failed): keep what was captured."""
        if self.phase == "light":
            self._end_light()
        elif self.phase == "traced" or self.profiler.running:
            self._stop_profiler()
        self.nvml.stop()
        self.memory_recorder.finish()
        self.phase = "done"

    def _changed(self) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):  # the record so far is a by-product of the run
                self.on_change()

    def _root_name(self) -> str | None:
        """The class of the module the script calls each step (a compiled one's original), if known."""
        root = self._detector.root_module if self._detector is not None else None
        return None if root is None else type(getattr(root, "_orig_mod", None) or root).__name__

    def result(self) -> dict[str, Any]:
        """The captured fields of a `RunRecord`."""
        definition = self.definition
        return {
            "light": self.light,
            "traced": self.traced,
            "environment": self.environment,
            "memory": self.memory,
            "memory_missing": self.memory_missing,
            "memory_run": self.memory_recorder.result(),
            "nvml_samples": self.nvml.samples,
            "nvml_summary": self.nvml.summary,
            "nvml_missing": self.nvml.missing,
            "trace_files": self.trace_files,
            "steps_seen": self.steps_seen,
            "notes": tuple(self.notes),
            "step": None
            if definition is None
            else StepFound.of(definition, self.calls_per_step, self._root_name()),
        }


# -- the user's API (through gpudoctor.step / gpudoctor.session) ---------------------------------------
def step() -> None:
    """Mark the end of a step; a no-op outside `gpudoctor run`."""
    if _ACTIVE is not None:
        _ACTIVE.explicit_step()


class StepRegion:
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
def session() -> Iterator[StepRegion]:
    """A region of steps: leaving it ends any phase still running (the rest of the script is not
    traced). Outside `gpudoctor run` it does nothing."""
    capture = _ACTIVE
    try:
        yield StepRegion(capture)
    finally:
        if capture is not None and _ACTIVE is capture:
            capture.finish()
