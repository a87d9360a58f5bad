"""In-process capture for `gpudoctor run`: at each step boundary (found by `runner.steps`), the phases:
skip warm-up steps, a light phase (step times from CUDA events or perf_counter, torch.cuda memory
statistics, NVML samples; no profiler), a traced phase (torch.profiler driven by the same boundaries),
then `StopRun` once captured, unless told to let the script finish.

`LiveCapture.install()` / `uninstall()` bracket the script; uninstall removes every hook and stops the
profiler and sampler whatever state they are in. Nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpudoctor.runner import settle
from gpudoctor.runner.compile_workers import stop_compile_workers
from gpudoctor.runner.discovery import StepDefinition
from gpudoctor.runner.environment import cuda_uuid, environment
from gpudoctor.runner.memory import MemoryOptions, MemoryRecorder
from gpudoctor.runner.modules import ModuleLabels
from gpudoctor.runner.phases import LiveOptions, StopRun
from gpudoctor.runner.proflog import ProfilerLog
from gpudoctor.runner.record import Environment, StepFound, StepTimes
from gpudoctor.runner.rundir import PROFILER_LOG, TRACE_FILE, keep_trace
from gpudoctor.runner.steps import StepDetector

if TYPE_CHECKING:  # the timing core's package imports numpy: the command line starts without it
    from gpudoctor.timing.blocks import Block, BlockLayout, BlockSchedule, Redone
    from gpudoctor.timing.stepclock import StepClock

TRACE_NAME = TRACE_FILE
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


class LightAgreement(Protocol):
    """How the ranks of a run agree on extending their light phase alike (`runner.ranks.RankRun`)."""

    def post_settled(self, check: int, settled: bool) -> None:
        """Tell the other ranks whether this rank's light-phase steps have settled at `check`."""

    def all_settled(self, check: int) -> bool:
        """Whether every rank's had at `check` (True where some rank's post cannot be read: end)."""


MAX_MARKS = 20000  # the light phase ends after this many marks, however short its time
MARK_EVERY_US = 1000.0  # light-phase marks at least this far apart (steps shorter are marked in groups)
MAX_EVERY = 1000
MEMORY_EVERY_S = 0.02  # light-phase memory statistics at most this often (each group's peak),
MEMORY_EACH_STEPS = 5  # after the first steps of the phase, each read alone
MAX_EXTRA_WARMUP = 50  # warm-up steps beyond --warmup while step times still fall
SETTLE_SLACK_S = 0.02  # a step within this of the fastest is warm whatever the ratio
SETTLE_STEPS = 3  # the last warm-up steps whose fastest a warm step is held to
# A light phase without blocks during which the process compiled (`disturbed` moved: a recompilation on
# an epoch's last, smaller batch) starts again from the next step, at most this many times; past that
# the compilations are the loop's own and count
MAX_LIGHT_RESTARTS = 4


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
        self.on_switch = on_switch
        self.switch_lag = switch_lag  # with blocks: steps a switch takes to reach the loop (settled out)
        # seconds spent compiling so far: a block during which it moved is timed again, a light phase
        # without blocks starts again (not under ranks, whose phases go by agreed step counts)
        self.disturbed = disturbed
        self.restarted_s: list[float] = []  # each restart of the light phase: the seconds compiled
        self._light_mark = 0.0
        self.options = options
        self.script_files = script_files
        # Told of each phase it enters ("light", "traced", "done"): runner.ranks, whose ranks must enter
        # each at the same step, so the phases then go by step counts alone (`lockstep`).
        self.on_phase = on_phase
        self.lockstep = on_phase is not None
        self.light_target: int | None = None  # light-phase steps, when agreed among ranks
        # with ranks: where every rank's light-phase steps have settled, told through their store, so
        # that the phase is extended alike on all of them (`runner.ranks.RankRun`); None: not extended
        self.agree: LightAgreement | None = None
        self._check = 0  # the agreement's current check (its keys in the store are posted once each)
        self._check_at: int | None = None  # the light-phase step of the next check
        self._posted_at: int | None = None  # the step at which this rank posted the current check
        self.steps_seen = 0  # boundaries of the step as finally defined
        self.first_step = 1  # the script's iteration the first of them ends (StepDetector.first_step)
        self.phase = "warmup"  # warmup, light, traced, done
        self.definition: StepDefinition | None = None
        self.light: StepTimes | None = None
        self.traced: StepTimes | None = None
        self.calls_per_step: float | None = None  # root module calls per light-phase step
        self.environment: Environment | None = None
        self.memory: dict[str, int] | None = None
        self.memory_missing: str | None = None
        self.nvml_samples: tuple[dict[str, Any], ...] = ()
        self.nvml_summary: dict[str, Any] | None = None
        self.nvml_missing: str | None = None
        self.trace_files: tuple[str, ...] = ()
        self.notes: list[str] = []
        self._clock: StepClock | None = None
        self._blocks: BlockSchedule | None = None
        self.blocks: tuple[Block, ...] = ()  # the light phase's blocks, with LiveOptions.blocks
        self.redone: tuple[Redone, ...] = ()  # blocks set aside and timed again (the process compiled)
        self.block_layout: BlockLayout | None = None  # their calibration, period, steps and orders
        self._cuda = False
        self._detector: StepDetector | None = None
        self._warm: list[float] = []  # host times of the warm-up boundaries
        self._memory_at = 0.0  # when the allocator's statistics were last read
        self._memory_rows = 0  # light-phase steps whose statistics were read
        self._light_start = 0.0
        self._planned_s: float | None = None  # how long the light phase took to reach its plan
        self._settle_checked = 0.0
        self._light_calls = 0
        self._prof: Any = None
        self._prof_steps = 0
        self._labels: ModuleLabels | None = None
        self._raw_trace: Path | None = None
        self._nvml: Any = None  # (backend, session)
        timeline = options.profile_memory and options.record_shapes and options.with_stack
        self.memory_recorder = MemoryRecorder(
            MemoryOptions(options.memory_history, options.memory_history != "off", timeline)
        )
        self.on_change: Any = None  # called at each phase change (runner.rundir: the record so far)
        self._proflog: ProfilerLog | None = None

    # -- installation --------------------------------------------------------------------------------
    def install(self) -> LiveCapture:
        global _ACTIVE
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
            self._stop_nvml()
            self.phase, self.steps_seen, self._clock, self._warm = "warmup", 0, None, []
            self._memory_rows = 0
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
        return self.phase == "light" and (self._blocks is None or self._blocks.timing)

    # -- phases --------------------------------------------------------------------------------------
    def boundary(self) -> None:
        self.steps_seen += 1
        if self.phase == "done":
            return
        ended = self.phase
        # Reading the allocator's statistics costs tens of µs: in the light phase, per group of steps
        # at least MEMORY_EVERY_S long (each group's peak), so that the step time keeps it out.
        now = time.perf_counter()
        light_rows = self._memory_rows if ended == "light" else 0
        memory = ended != "light" or light_rows < MEMORY_EACH_STEPS or now - self._memory_at >= MEMORY_EVERY_S
        if ended == "light" and memory:
            self._memory_rows += 1
        try:
            if memory:
                self.memory_recorder.end_step(ended, self.step_number)
            self._advance()
            if not memory and self.phase != ended:  # a phase ends: its last group is read all the same
                self.memory_recorder.end_step(ended, self.step_number)
                memory = True
            if memory:
                self.memory_recorder.begin_step(self.phase, ended)
                self._memory_at = now
        except StopRun:
            raise
        except Exception as err:  # a failure of ours must not break the user's script
            self.notes.append(f"capture stopped at step {self.steps_seen}: {type(err).__name__}: {err}")
            self.finish()
            return
        if self.phase == "done" and not self.options.run_to_end:
            raise StopRun

    def _advance(self) -> None:
        o = self.options
        if self.phase == "warmup":
            self._warm.append(time.perf_counter())
            if self._warmed_up():
                self._enter("light")
                self._start_light()
            return
        if self.phase == "light":
            if self._blocks is not None:
                done = self._blocks.boundary()
            else:
                assert self._clock is not None
                if self._restart_if_compiled():
                    return
                self._clock.boundary()
                done = self._light_done()
            if done:
                self._end_light()
                if o.light_only:
                    self.phase = "done"
                    self._enter("done")
                else:
                    self._enter("traced")
                    self._start_traced(schedule=self.definition is None or self.definition.source != "window")
            return
        if self.phase == "traced" and self.options.trace_all:
            self._prof.step()  # steps marked in a trace of the whole script, which runs to its end
            return
        if self.phase == "traced":
            # the step before the first boundary here was the profiler's warm-up: not timed
            self._prof_steps += 1
            assert self._clock is not None
            self._clock.boundary()
            if self._scheduled:
                self._prof.step()
            if self._prof_steps > o.steps:
                self._end_traced()
                self._enter("done")

    def _enter(self, phase: str) -> None:
        if self.on_phase is not None:
            self.on_phase(phase, self)

    def _light_done(self) -> bool:
        """--light-steps and --light-seconds both reached (or too many marks), and then its steps
        settled (`runner.settle`) or the phase ran twice as long as planned (not with --light-seconds
        0); with ranks, the number of steps rank 0 planned, so that every rank ends the phase at the
        same step."""
        assert self._clock is not None
        if self.light_target is not None:
            return self._agreed_done()
        o, now = self.options, time.perf_counter()
        if len(self._clock.marks) > MAX_MARKS:
            return True
        if self._clock.timed_steps < o.light_steps or now - self._light_start < o.light_seconds:
            return False
        if not o.settle or o.light_seconds <= 0:  # no floor of seconds: --light-steps, not extended
            return True
        if self._planned_s is None:
            self._planned_s = now - self._light_start
        if now - self._light_start >= settle.EXTEND_FACTOR * self._planned_s:
            return True
        if now - self._settle_checked < settle.CHECK_EVERY_S:
            return False
        self._settle_checked = now
        times = self._clock.ready_times()
        return settle.light_done(times, min_steps=o.light_steps, min_seconds=o.light_seconds)

    def _agreed_done(self) -> bool:
        """With ranks: the steps rank 0 planned, then — where the ranks' steps have not all settled —
        more, up to EXTEND_FACTOR times the plan, every rank ending at the same step. At each check (the
        plan's end, then every AGREE_CHUNK of the plan) each rank posts whether its own steps settled;
        AGREE_LAG steps later every rank reads all the posts and ends, or goes on, alike."""
        assert self._clock is not None and self.light_target is not None
        steps, o = self._clock.steps, self.options
        if self.agree is None or not o.settle or o.light_seconds <= 0:
            return steps >= self.light_target
        if steps >= settle.EXTEND_FACTOR * self.light_target:  # the cap: every rank at the same step
            return True
        if self._posted_at is None:
            if steps < (self._check_at or self.light_target):
                return False
            if self._planned_s is None:
                self._planned_s = time.perf_counter() - self._light_start
            times = self._clock.ready_times()
            self.agree.post_settled(
                self._check, settle.light_done(times, min_steps=o.light_steps, min_seconds=0)
            )
            self._posted_at = steps
            return False
        if steps < self._posted_at + settle.AGREE_LAG:
            return False
        if self.agree.all_settled(self._check):
            return True
        self._check += 1
        self._check_at = steps + max(1, math.ceil(settle.AGREE_CHUNK * self.light_target))
        self._posted_at = None
        return False

    def light_plan(self) -> int:
        """Light-phase steps enough for --light-seconds at the warm-up's pace (what rank 0 proposes) —
        and for --warmup-seconds: with ranks the warm-up goes by --warmup steps alone, and the light
        phase leaves out its unsettled head instead, extended only where the ranks agree that one has
        not settled (`_agreed_done`; not with --light-seconds 0: then --light-steps)."""
        times = [b - a for a, b in itertools.pairwise(self._warm)]
        pace = statistics.median(times) if times else 0.0
        o = self.options
        wanted = o.light_seconds + (o.warmup_seconds if o.settle and o.light_seconds > 0 else 0.0)
        seconds = math.ceil(wanted / pace) if pace > 0 else 0
        return max(o.light_steps, min(seconds, MAX_MARKS))

    def _warmed_up(self) -> bool:
        """At least --warmup steps, and until a step takes no more than twice the fastest of the last
        SETTLE_STEPS (after the first calls of a compiled model, cudnn.benchmark's search), within a
        cap. Not the fastest so far: while the GPU's queue fills, a loop the GPU bounds ends its first
        steps at the host's pace, many times faster than it will run (ViT-B/16 in float32 on the H100:
        every warm-up ran to the cap, 50 steps of 98 ms). With ranks, --warmup steps alone: a choice
        every rank makes at the same step."""
        n = len(self._warm) - 1  # whole steps between boundaries
        if self.lockstep:
            return n >= max(self.options.warmup, 1)
        if self._warm and self._warm[-1] - self._warm[0] < self.options.warmup_seconds:
            return False
        if n < max(self.options.warmup, 1):
            return self.options.warmup == 0 and n >= 0
        times = [b - a for a, b in itertools.pairwise(self._warm)]
        recent = times[-SETTLE_STEPS:]
        settled = times[-1] <= max(2 * min(recent), min(recent) + SETTLE_SLACK_S)  # jitter is not warm-up
        return settled or n >= self.options.warmup + MAX_EXTRA_WARMUP

    def _mark_every(self) -> int:
        """Mark every k-th boundary when the warm-up's steps are short, so that marks are at least
        MARK_EVERY_US apart and their own cost stays out of the step time."""
        times = [b - a for a, b in itertools.pairwise(self._warm)]
        if not times:
            return 1
        step_us = 1e6 * statistics.median(times)
        # (no more than a third of --light-steps a group: a short light phase keeps its steps)
        cap = max(1, min(MAX_EVERY, self.options.light_steps // 3))
        return max(1, min(cap, math.ceil(MARK_EVERY_US / max(step_us, 1e-3))))

    def _start_light(self) -> None:
        import torch

        stop_compile_workers()
        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.environment = environment(self._cuda)
        self._start_nvml()
        self._light_start = time.perf_counter()
        self._planned_s, self._settle_checked = None, 0.0
        self._check_at, self._posted_at = None, None  # (check numbers go on: each key posted once)
        self._light_calls = self._detector.calls if self._detector else 0
        self.phase = "light"
        from gpudoctor.timing.blocks import BlockSchedule
        from gpudoctor.timing.stepclock import StepClock

        plan = self.options.blocks
        if plan is not None:
            sync = torch.cuda.synchronize if self._cuda else None
            self._blocks = BlockSchedule(
                plan,
                self.on_switch or (lambda on: None),
                cuda=self._cuda,
                sync=sync,
                disturbed=self.disturbed,
                lag=self.switch_lag,
            )
            self._blocks.boundary()
            return
        self._clock = StepClock(self._cuda, every=self._mark_every())
        self._clock.boundary()
        self._light_mark = self.disturbed() if self.disturbed is not None else 0.0

    def _restart_if_compiled(self) -> bool:
        """Without blocks: where the process compiled since the light phase (re)started, the phase starts
        again from this boundary (a recompilation is paid once, as the first compilation is, which the
        warm-up leaves out), up to MAX_LIGHT_RESTARTS times; True when it did."""
        if self.disturbed is None or self.lockstep or len(self.restarted_s) >= MAX_LIGHT_RESTARTS:
            return False
        moved = self.disturbed() - self._light_mark
        if moved <= 0.0:
            return False
        from gpudoctor.timing.stepclock import StepClock

        self.restarted_s.append(moved)
        self._light_mark += moved
        n = len(self.restarted_s)
        note = (
            f"the light phase started again after a recompilation ({sum(self.restarted_s):.1f} s compiling"
            f"{f', {n} times' if n > 1 else ''}): a one-off cost, as the first compilation is, not the step's"
        )
        self.notes[:] = [x for x in self.notes if not x.startswith("the light phase started again")] + [note]
        self._light_start = time.perf_counter()
        self._planned_s, self._settle_checked = None, 0.0
        self._light_calls = self._detector.calls if self._detector else 0
        self._clock = StepClock(self._cuda, every=self._mark_every())
        self._clock.boundary()
        return True

    def _end_light(self) -> None:
        if self._blocks is not None:
            self.blocks = tuple(self._blocks.blocks)
            self.redone = tuple(self._blocks.redone)
            self.block_layout = self._blocks.layout
            clock = self.blocks[0].clock if self.blocks else ("cuda_events" if self._cuda else "perf_counter")
            self.light = StepTimes(clock, tuple(t for b in self.blocks for t in b.step_times_us))
        else:
            assert self._clock is not None
            self.light = _step_times(self._clock)
        if self._detector is not None and self._detector.root_module is not None and self.light.times_us:
            self.calls_per_step = (self._detector.calls - self._light_calls) / len(self.light.times_us)
        if self._clock is not None and self._blocks is None and self.options.settle:
            self._settle_light(self._clock)
        self._read_memory()
        self._stop_nvml()
        self._changed()

    def _settle_light(self, clock: StepClock) -> None:
        """Leave out the light phase's unsettled head; say so where it mattered, and if it did not settle."""
        assert self.light is not None
        late = time.perf_counter() - self._light_start - self._planned_s if self._planned_s else 0.0
        self.light = settle.settled(self.light, clock.host_time_of_step, max(late, 0.0))
        found = settle.notes(self.light, agreed=self.light_target is not None and self.agree is None)
        self.notes.extend(n for n in found if n not in self.notes)

    def _start_traced(self, schedule: bool = True) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler import schedule as make_schedule

        o = self.options
        self._cuda = self._cuda or (torch.cuda.is_available() and torch.cuda.is_initialized())
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        raw = self.out_dir / TRACE_NAME.removesuffix(".gz")

        def on_trace_ready(prof: Any) -> None:
            prof.export_chrome_trace(str(raw))
            self.memory_recorder.on_trace_ready(prof)
            self._raw_trace = raw

        self._scheduled = schedule
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
        if self.definition is not None:
            # read back by the trace loader: the reports say how the step was found
            from gpudoctor.trace.model import RUN_STEP_KEY  # here: the trace package pulls in numpy

            self._prof.add_metadata_json(RUN_STEP_KEY, json.dumps(self.definition.description))
        self._label_modules()
        self._prof_steps = 0
        from gpudoctor.timing.stepclock import StepClock

        self._clock = StepClock(self._cuda)
        self.phase = "traced"

    def _root_name(self) -> str | None:
        """The class of the module the script calls each step (a compiled one's original), if known."""
        root = self._detector.root_module if self._detector is not None else None
        return None if root is None else type(getattr(root, "_orig_mod", None) or root).__name__

    def _label_modules(self) -> None:
        detector = self._detector
        if detector is None:
            return
        detector.label_closures = True
        root = detector.root_module
        if root is None or self.options.module_depth < 0:
            return
        # torch.compile(model), or model.compile() (its hooks too run inside the graph)
        if (
            getattr(root, "_orig_mod", None) is not None
            or getattr(root, "_compiled_call_impl", None) is not None
        ):
            self.notes.append(
                "no module view: the root module is compiled (its submodules run inside the graph)"
            )
            return
        self._labels = ModuleLabels(root, self.options.module_depth).install()

    def _end_traced(self) -> None:
        self._stop_profiler()
        self.phase = "done"

    def _stop_profiler(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        if self._labels is not None:
            self._labels.remove()
            self._labels = None
        if self._detector is not None:
            self._detector.label_closures = False
        try:
            prof.stop()
        finally:
            if self._clock is not None and self._clock.marks:
                self.traced = _step_times(self._clock)
            self._gzip_trace()
            if self._proflog is not None:
                self._proflog.stop()
            self._changed()

    def finish(self) -> None:
        """End every phase early (the script ended or failed): keep what was captured."""
        if self.phase == "light":
            self._end_light()
        elif self.phase == "traced" or self._prof is not None:
            self._stop_profiler()
        self._stop_nvml()
        self.memory_recorder.finish()
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
            devices = [backend.resolve(cuda_uuid())]
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
        definition = self.definition
        return {
            "light": self.light,
            "traced": self.traced,
            "environment": self.environment,
            "memory": self.memory,
            "memory_missing": self.memory_missing,
            "memory_run": self.memory_recorder.result(),
            "nvml_samples": self.nvml_samples,
            "nvml_summary": self.nvml_summary,
            "nvml_missing": self.nvml_missing,
            "trace_files": self.trace_files,
            "steps_seen": self.steps_seen,
            "notes": tuple(self.notes),
            "step": None
            if definition is None
            else StepFound.of(definition, self.calls_per_step, self._root_name()),
        }


def _step_times(clock: StepClock) -> StepTimes:
    spans = clock.spans()
    return StepTimes(spans.clock, spans.times_us, spans.host_span_s)


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
