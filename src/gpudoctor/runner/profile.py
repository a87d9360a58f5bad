"""Record a Kineto trace of a step function with torch.profiler: skip `wait` steps, warm the profiler
up for `warmup`, record `active` steps (each marked `ProfilerStep#N`), export, gzip.

torch is imported here only, and only when `profile_steps` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.runner.rundir import keep_trace
from gpudoctor.util.errors import GpudoctorError


@dataclass(frozen=True)
class StepTraceOptions:
    """How a step function's trace is recorded: the steps skipped, warmed up and recorded, and what the
    profiler records of them."""

    active: int = 3
    wait: int = 1
    warmup: int = 2
    cuda: bool = True  # record GPU activity (ignored without a GPU)
    with_stack: bool = False
    profile_memory: bool = False
    record_shapes: bool = False
    with_flops: bool = False  # Kineto's own FLOP estimate on matmul/conv ops (a 'flops' arg)


def profile_steps(
    run_step: Callable[[], None], dest: Path, options: StepTraceOptions = StepTraceOptions()
) -> Path:
    """Run `wait + warmup + active` steps under the profiler and write the trace to `dest` (.json.gz).

    The raw JSON is written next to `dest` first and removed once gzipped, so a failure half-way
    leaves whatever the profiler produced.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if options.cuda and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    dest.parent.mkdir(parents=True, exist_ok=True)
    raw = dest.with_name(dest.name.removesuffix(".gz"))
    if raw == dest:
        raw = dest.with_suffix(dest.suffix + ".json")
    exported: list[Path] = []

    def on_trace_ready(prof: profile) -> None:
        prof.export_chrome_trace(str(raw))
        exported.append(raw)

    with profile(
        activities=activities,
        schedule=schedule(wait=options.wait, warmup=options.warmup, active=options.active, repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=options.record_shapes,
        profile_memory=options.profile_memory,
        with_stack=options.with_stack,
        with_flops=options.with_flops,
    ) as prof:
        for _ in range(options.wait + options.warmup + options.active):
            run_step()
            prof.step()
    if not exported:
        raise GpudoctorError("the profiler produced no trace")
    kept, _ = keep_trace(raw, dest.name)  # gzipped through the one writer; left raw if that fails
    return dest.with_name(kept)
