"""The profiler's distortion of a `gpudoctor run`, in numbers (`observer.json`): the step time with and
without the profiler, and the GPU's busy share of the step as the trace shows it and as it is without
the profiler. Kernels are not slowed by the profiler, the host is: busy time per step over the
unprofiled step time."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.facts import facts_of
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.serial import Serialized


@dataclass(frozen=True)
class ObserverEffect(Serialized):
    light_median_us: float | None  # the step without the profiler (the light phase's mean per step)
    traced_median_us: float | None
    profiler_overhead: float | None  # traced over light, less one
    trace_step_median_us: float | None = None
    gpu_busy_us_per_step: float | None = None
    busy_pct_traced: float | None = None  # as the trace alone reads it
    busy_pct_unprofiled: float | None = None  # the same busy time over the unprofiled step


def unprofiled_step_us(record: RunRecord) -> float | None:
    """The step time without the profiler: the light phase's time over its steps (None for timed windows,
    which are no step of the script)."""
    if record.light is None or (record.step is not None and record.step.source == "window"):
        return None
    return record.light.mean_us


def observer_effect(analysis: Analysis, record: RunRecord) -> ObserverEffect:
    facts = facts_of(analysis)
    light = unprofiled_step_us(record)
    base = ObserverEffect(
        light_median_us=light,
        traced_median_us=record.traced.median_us if record.traced else None,
        profiler_overhead=record.profiler_overhead,
    )
    if facts is None:
        return base
    return ObserverEffect(
        light_median_us=base.light_median_us,
        traced_median_us=base.traced_median_us,
        profiler_overhead=base.profiler_overhead,
        trace_step_median_us=facts.traced_step_us,
        gpu_busy_us_per_step=facts.busy_us,
        busy_pct_traced=100 * min(facts.busy_us / facts.traced_step_us, 1.0),
        busy_pct_unprofiled=100 * facts.busy_fraction if light else None,
    )
