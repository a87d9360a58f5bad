"""`analyze(trace) -> Analysis`: every analysis of one trace, per step and overall, as one
serializable result. Parts the trace cannot support are None and say why in `notes`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from gpudoctor.analysis.batching import batch_evidence
from gpudoctor.analysis.comms import CommReport, comm_report
from gpudoctor.analysis.cpu import CpuStep, OpStat, cpu_steps, op_report
from gpudoctor.analysis.host_gaps import HostGap, host_gaps
from gpudoctor.analysis.kernels import Distribution, KernelReport, kernel_report
from gpudoctor.analysis.memory import MemoryReport, memory_report
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.analysis.modules import DEFAULT_DEPTH, ModuleView, module_view
from gpudoctor.analysis.profiler_cost import ProfilerCost, profiler_cost
from gpudoctor.analysis.roofline import Roofline, roofline
from gpudoctor.analysis.syncs import SyncReport, host_sync_rows, sync_report
from gpudoctor.analysis.timeline import GpuTimeline, TimeBreakdown, gpu_timeline, idle_intervals
from gpudoctor.analysis.transfers import TransferReport, transfer_report
from gpudoctor.device import DeviceInfo
from gpudoctor.device.ceilings import Ceilings, reference_ceilings
from gpudoctor.device.links import Link, reference_link
from gpudoctor.trace.content import Accelerator, accelerator, no_gpu_activity_reason
from gpudoctor.trace.iterations import StepSource, find_iterations
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Trace
from gpudoctor.trace.steps import Step, leading_warmup, steps_from_spans
from gpudoctor.util.errors import UsageError
from gpudoctor.util.gcpause import gc_paused
from gpudoctor.util.serial import Serialized
from gpudoctor.util.units import fmt_us

SCHEMA = "gpudoctor.analysis/1"


@dataclass(frozen=True)
class TraceSummary:
    path: str
    rank: int
    world_size: int | None
    events: int
    gpu_activities: int
    gpu_devices: tuple[int, ...]  # the devices this process ran GPU work on
    span_us: float
    profiler_config: dict[str, Any]
    skipped: dict[str, int]
    # The accelerator's vendor and architecture (AMD traces say gfx, not sm_); None where none is recorded.
    accelerator: Accelerator | None = None
    # Where the trace has no CUDA/ROCm GPU activity: what it holds instead, and why it is not analyzed.
    no_gpu_reason: str | None = None
    # torch.compile ran in it (its compiled regions): the modules inside a graph make no module calls
    compiled: bool = False


@dataclass(frozen=True)
class StepSummary:
    number: int
    duration_us: float
    gpu: TimeBreakdown | None
    cpu: CpuStep


@dataclass(frozen=True)
class Analysis(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor analysis"

    schema: str
    trace: TraceSummary
    device: DeviceInfo | None
    # The steps every figure over steps covers (medians, per-step means, the windows of the kernel, op,
    # transfer and GPU-time tables): the trace's steps less the warm-up steps it starts with.
    steps: tuple[StepSummary, ...]
    step_time_us: Distribution | None
    selected_step: int | None  # set when the analysis covers one step (--step)
    timeline: GpuTimeline
    kernels: KernelReport
    transfers: TransferReport
    syncs: SyncReport
    ops: tuple[OpStat, ...]  # every op, by GPU time caused (with children), then CPU time
    memory: MemoryReport | None
    notes: tuple[str, ...]
    # The step time measured without the profiler (a light run, or given by the user): what the
    # profiler's own overhead is judged against. None when unknown.
    unprofiled_step_us: float | None = None
    # The top kernels' roofline; None in an analysis saved before it existed.
    roofline: Roofline | None = None
    # The user frames that hold the host's time between ops (with_stack traces), most first.
    host_gaps: tuple[HostGap, ...] = ()
    # How the steps were found (marked or inferred); None in an analysis saved before it existed.
    steps_source: StepSource | None = None
    # Where no step was found: the traced time (the GPU's span) as one whole, with its host figures;
    # what rules then reason with, as shares of the traced time. None where there are steps.
    whole_trace: StepSummary | None = None
    # What shows the work has a batch dimension (a DataLoader, an optimizer step, module calls, ...);
    # empty where nothing does; None in an analysis saved before it existed (unknown).
    batch_evidence: tuple[str, ...] | None = None
    # Where in the model: per nn.Module, its GPU (forward, backward) and host time per step; None where
    # the trace has no module calls (record with_stack, or run under gpudoctor run).
    modules: ModuleView | None = None
    # The collectives: each call's size and bandwidth, exposed and overlapped communication per step.
    comms: CommReport | None = None
    # GPU memory as `gpudoctor run` recorded it (analysis.memory_run); None for a trace alone.
    memory_run: MemoryAnalysis | None = None
    # What the profiler recorded per step and its estimated host cost; None in an analysis saved before
    # it existed, or a trace without host events.
    profiler_cost: ProfilerCost | None = None
    # Steps at the start of the trace that are warm-up outliers (`trace.steps.leading_warmup`): shown,
    # and left out of `steps` and of every figure over them.
    warmup_steps: tuple[StepSummary, ...] = ()

    @property
    def window(self) -> TimeBreakdown | None:
        """The breakdown the summary leads with: the profiled steps, else the GPU's own span."""
        return self.timeline.profiled_steps or self.timeline.gpu_window


def analyze(
    trace: Trace,
    step: int | None = None,
    top: int = 15,
    unprofiled_step_us: float | None = None,
    ceilings: Ceilings | None = None,
    module_depth: int = DEFAULT_DEPTH,
    link: Link | None = None,
) -> Analysis:
    """All analyses of one trace; with `step`, every figure covers that step alone. `top`: how many
    kernels are listed in detail. `unprofiled_step_us`: the step time measured without the profiler.
    `ceilings`: the measured ceilings of the trace's GPU for the roofline (the CLI passes
    `device.ceilings.ceilings_for_device`); default: gpudoctor's table of measured devices.
    `module_depth`: how deep below the root the module view goes. `link`: the GPU's link to its peers as
    NVML recorded it (`gpudoctor run`); default: `device.links`' table."""
    info = trace.device_info
    if ceilings is None and info is not None:
        ceilings = reference_ceilings(info.name)
    if link is None and info is not None:
        link = reference_link(info.name)
    with gc_paused():
        return _analyze(trace, step, top, unprofiled_step_us, ceilings, module_depth, link)


def _analyze(
    trace: Trace,
    step: int | None,
    top: int,
    unprofiled_step_us: float | None,
    ceilings: Ceilings | None,
    module_depth: int,
    link: Link | None,
) -> Analysis:
    found = find_iterations(trace)
    steps = found.steps
    notes: list[str] = []  # how the steps were found is `steps_source`, said by every report
    if step is not None:
        chosen = tuple(s for s in steps if s.number == step)
        if not chosen:
            have = ", ".join(str(s.number) for s in steps) or "none"
            raise UsageError(f"no step {step} in this trace (steps: {have})")
        steps = chosen
    warm = leading_warmup(steps)
    shown, steps = steps, steps[warm:]
    if not trace.has_gpu:
        notes.append(no_gpu_activity_reason(trace))
    window = (steps[0].window_start_us, steps[-1].window_end_us) if steps else None  # GPU side
    cpu_window = (steps[0].start_us, steps[-1].end_us) if steps else None
    syncs = host_sync_rows(trace)
    gpu_rows = _launched_within(trace, steps[0]) if step is not None else None
    timeline = gpu_timeline(trace, shown, gpu_rows, warm)
    every_step = _step_summaries(trace, shown, syncs, timeline, gpu_rows)
    step_rows = every_step[warm:]
    timeline = replace(timeline, steps=timeline.steps[warm:])
    memory = memory_report(trace, steps)
    if memory is None and len(trace.memory):
        notes.append("memory events only for the CPU: no GPU memory to analyze")
    elif memory is None:
        notes.append("no GPU memory events: record with profile_memory=True for the memory analysis")
    if unprofiled_step_us:
        notes.extend(_unprofiled_notes(unprofiled_step_us, step_rows))
    durations = np.array([s.duration_us for s in steps])
    return Analysis(
        schema=SCHEMA,
        trace=_summary(trace),
        device=trace.device_info,
        steps=step_rows,
        step_time_us=Distribution.of(durations),
        selected_step=step,
        timeline=timeline,
        kernels=kernel_report(trace, window, top),
        transfers=transfer_report(trace, window),
        syncs=sync_report(trace, steps),
        ops=op_report(trace, cpu_window),
        memory=memory,
        notes=tuple(notes),
        unprofiled_step_us=unprofiled_step_us,
        roofline=roofline(trace, ceilings, window),
        host_gaps=host_gaps(trace, steps, syncs),
        steps_source=found.source,
        whole_trace=None if steps else _whole_trace(trace, syncs),
        batch_evidence=batch_evidence(trace),
        modules=module_view(trace, steps, module_depth),
        comms=comm_report(trace, steps, window, link),
        profiler_cost=profiler_cost(trace, steps),
        warmup_steps=every_step[:warm],
    )


def _step_summaries(
    trace: Trace,
    steps: tuple[Step, ...],
    syncs: np.ndarray,
    timeline: GpuTimeline,
    gpu_rows: np.ndarray | None,
) -> tuple[StepSummary, ...]:
    cpu = cpu_steps(trace, steps, syncs, idle_intervals(trace, steps, gpu_rows).get("host_wait"))
    return tuple(
        StepSummary(s.number, s.duration_us, timeline.steps[i] if timeline.steps else None, cpu[i])
        for i, s in enumerate(steps)
    )


# The step measured without the profiler may fall this far below the GPU's busy time in a traced step
# (noise, a GPU-bound step) before the two cannot both be right.
UNPROFILED_BELOW_BUSY = 0.9


# ... and this far above the traced step before the profiler, which only slows a step, cannot explain it.
UNPROFILED_ABOVE_TRACED = 1.5


def _unprofiled_notes(unprofiled_us: float, steps: tuple[StepSummary, ...]) -> list[str]:
    """Where the step time measured without the profiler cannot be right: shorter than the GPU's work
    in a traced step, or far longer than the traced step itself (a typo, a step of another shape, or
    seconds per many steps). Nothing without steps or GPU activity."""
    given = f"the step time measured without the profiler ({fmt_us(unprofiled_us)})"
    busy = [s.gpu.busy_us for s in steps if s.gpu is not None]
    median = float(np.median(busy)) if busy else 0.0
    if median and unprofiled_us < UNPROFILED_BELOW_BUSY * median:
        return [
            f"{given} is shorter than the GPU's busy time in a traced step ({fmt_us(median)}, median): "
            "the GPU cannot do that work in it, so GPU shares of it are capped at 100%; check the step "
            "time given"
        ]
    traced = float(np.median([s.duration_us for s in steps])) if median else 0.0
    if traced and unprofiled_us > UNPROFILED_ABOVE_TRACED * traced:
        return [
            f"{given} is {unprofiled_us / traced:.1f}× the traced step ({fmt_us(traced)}, median): the "
            "profiler slows a step, it cannot make one faster, so the trace cannot show where the rest went "
            "and the diagnosis counts it as GPU idle; check that the time given is of these steps (the same "
            "batch, model and settings)"
        ]
    return []


def _whole_trace(trace: Trace, syncs: np.ndarray) -> StepSummary | None:
    """The GPU's span (and the launches of its work) as one step numbered 0; None without GPU work."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    if not len(gpu):
        return None
    launch = launch_rows(trace, gpu)
    launched = launch[launch >= 0]
    start = min(float(trace.ts[gpu].min()), float(trace.ts[launched].min()) if len(launched) else np.inf)
    end = float((trace.ts[gpu] + trace.dur[gpu]).max())
    whole = steps_from_spans(trace, [(start, end)], [0])
    return _step_summaries(trace, whole, syncs, gpu_timeline(trace, whole), None)[0]


def _launched_within(trace: Trace, step: Step) -> np.ndarray:
    """The GPU activity one step launched (or, where no launch is recorded, ran)."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    launch = launch_rows(trace, gpu)
    when = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], trace.ts[gpu])
    return gpu[(when >= step.start_us) & (when < step.end_us)]


COMPILED_OPS = ("Torch-Compiled Region", "CompiledFunction")  # torch.compile's ops in a trace


def _summary(trace: Trace) -> TraceSummary:
    span = float((trace.ts + trace.dur).max()) if len(trace) else 0.0
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    dist = trace.meta.distributed
    return TraceSummary(
        path=trace.meta.path,
        rank=trace.meta.rank,
        world_size=dist.world_size if dist else None,
        events=len(trace) + len(trace.memory),
        gpu_activities=len(gpu),
        gpu_devices=tuple(int(d) for d in np.unique(trace.device[gpu]) if d >= 0),
        span_us=span,
        profiler_config=dict(trace.meta.profiler_config),
        skipped=dict(trace.skipped),
        accelerator=accelerator(trace),
        no_gpu_reason=None if len(gpu) else no_gpu_activity_reason(trace),
        compiled=any(n.startswith(COMPILED_OPS) for n in trace.names),
    )


__all__ = ["SCHEMA", "Analysis", "Step", "StepSource", "analyze"]
