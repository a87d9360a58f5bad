"""What a batch-size sweep says, from measured points (each batch size timed in a fresh process): the memory
model `peak = fixed + per_sample × batch` and the largest batch it predicts, the knee where throughput
stops growing, and for inference the latency per batch and the largest batch within a target. Pure. The
knee is judged against each point's own noise (a larger size counts with its fast quartile), and the
sweep measures two sizes past a knee, so one slow point makes no knee (docs/memory.md)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.batch/1"
KNEE_GAIN = 0.10  # a doubling that gains less throughput than this is past the knee
DOUBTFUL_LOSS = -0.5  # a doubling that loses more than half the throughput: a busy machine, more likely
HEADROOM = 0.02  # of the budget, kept free of the prediction (fragmentation, workspaces)


@dataclass(frozen=True)
class BatchPoint:
    """One batch size, run in its own process."""

    batch: int
    status: str  # ok, oom (torch.OutOfMemoryError), error, no_steps
    step_us: float | None = None  # median of the light phase (one step = one batch)
    peak_allocated: int | None = None  # the highest step peak of the light phase
    peak_reserved: int | None = None
    steps: int = 0
    error: str | None = None
    step_p25_us: float | None = None  # the quartiles of the light phase's step times: its own noise
    step_p75_us: float | None = None

    @property
    def fits(self) -> bool:
        return self.status == "ok"

    @property
    def throughput(self) -> float | None:
        """Samples per second."""
        return self.batch / self.step_us * 1e6 if self.step_us else None

    @property
    def throughput_fast(self) -> float | None:
        """Samples per second at the fast quartile of its steps (the lower quartile of its step times):
        as fast as its own noise lets this point be. The median's where the quartiles are unknown."""
        fast = self.step_p25_us or self.step_us
        return self.batch / fast * 1e6 if fast else None

    @property
    def spread(self) -> float | None:
        """The interquartile range of its step times over their median (0.1: ±5% around it)."""
        if not self.step_us or self.step_p25_us is None or self.step_p75_us is None:
            return None
        return (self.step_p75_us - self.step_p25_us) / self.step_us


@dataclass(frozen=True)
class MemoryModel:
    """Peak allocated memory as a line in the batch size, fitted on measured sizes."""

    fixed: float  # bytes at batch 0: parameters, optimizer state, workspaces
    per_sample: float  # bytes each sample adds: activations, inputs
    batches: tuple[int, ...]  # the sizes it was fitted on

    def peak(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch

    def largest(self, budget: float) -> int | None:
        """The largest batch whose predicted peak stays within `budget` less the headroom."""
        if self.per_sample <= 0:
            return None
        return max(int((budget * (1 - HEADROOM) - self.fixed) // self.per_sample), 0)


@dataclass(frozen=True)
class Knee:
    batch: int  # past this size a doubling gains less than KNEE_GAIN
    gain: float  # the per-doubling throughput gain just past it (medians)
    gains: tuple[tuple[int, float], ...]  # (from size, per-doubling gain to the next measured size)
    sizes_past: int = 1  # larger sizes measured, each gaining less than KNEE_GAIN beyond its noise

    @property
    def doubtful(self) -> bool:
        """A doubling that more than halves the throughput (the step took over 4× as long for 2× the
        samples) is not how batches scale, short of memory pressure: more likely the larger sizes ran
        while something else used the machine (each point is one process, timed once)."""
        return self.gain < DOUBTFUL_LOSS


@dataclass(frozen=True)
class BatchSweep(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor batch sweep"

    schema: str
    script: tuple[str, ...]  # the command line swept
    knob: dict[str, Any]  # how the batch size was set: argparse flag or DataLoader, its default
    training: bool
    device: str | None
    capacity: int | None
    budget: int | None  # what the allocator can get: free device memory plus its cache at start
    points: tuple[BatchPoint, ...]  # by batch size
    memory_model: MemoryModel | None
    predicted_max: int | None  # from the memory model and the budget
    largest_fit: int | None  # the largest size that ran
    smallest_oom: int | None  # the smallest size that ran out of memory
    knee: Knee | None
    latency_target_us: float | None = None
    latency_pick: int | None = None  # the largest size meeting the target, where one does
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the memory model's prediction when the sweep went to try it (from the smaller sizes alone);
    # `predicted_max` is the final fit, which may include the tries around it
    prediction_tried: int | None = None

    @property
    def sublinear_until(self) -> int | None:
        """Up to this size, time per batch grows less than the batch (each sample gets cheaper by at
        least KNEE_GAIN per doubling): the knee, or the largest size measured without one."""
        ok = [p.batch for p in self.points if p.fits and p.step_us]
        if not ok:
            return None
        return self.knee.batch if self.knee else max(ok)


def fit_memory(points: Sequence[BatchPoint]) -> MemoryModel | None:
    """The line through the two largest sizes that ran with a measured peak (the per-sample bytes of
    small batches are lost in the fixed part); None with fewer than two."""
    ok = sorted((p for p in points if p.fits and p.peak_allocated is not None), key=lambda p: p.batch)
    distinct = list({p.batch: p for p in ok}.values())
    if len(distinct) < 2:
        return None
    a, b = distinct[-2], distinct[-1]
    assert a.peak_allocated is not None and b.peak_allocated is not None
    per_sample = (b.peak_allocated - a.peak_allocated) / (b.batch - a.batch)
    return MemoryModel(a.peak_allocated - per_sample * a.batch, per_sample, (a.batch, b.batch))


def find_knee(points: Sequence[BatchPoint], gain: float = KNEE_GAIN) -> Knee | None:
    """The first measured size `a` from which throughput never again grows by `gain` per doubling:
    to every larger measured size `b`, the gain (scaled to a doubling) stays below it even with `b`
    at the fast quartile of its own steps (`BatchPoint.throughput_fast`, against `a`'s median). So
    one point slower than the trend does not make a knee when its own steps spread enough to explain
    the drop (a busy machine), nor when any larger size grows again (one noisy dip followed by growth
    is no knee). `Knee.sizes_past` says on how many larger sizes the drop was seen (the sweep measures
    two before it stops, where it can). None while throughput still grows at the largest size."""
    ok = sorted((p for p in points if p.fits and p.throughput), key=lambda p: p.batch)
    ok = list({p.batch: p for p in ok}.values())
    gains = tuple((a.batch, _gain(a, b)) for a, b in itertools.pairwise(ok))
    for i, a in enumerate(ok[:-1]):
        if all(_gain(a, b, fast=True) < gain for b in ok[i + 1 :]):
            return Knee(a.batch, gains[i][1], gains, len(ok) - 1 - i)
    return None


def _gain(a: BatchPoint, b: BatchPoint, fast: bool = False) -> float:
    """Throughput gain from size a to size b, per doubling (with `fast`, b at its fast quartile)."""
    high = b.throughput_fast if fast else b.throughput
    return (high / a.throughput) ** (1 / math.log2(b.batch / a.batch)) - 1  # type: ignore[operator]


def latency_pick(points: Sequence[BatchPoint], target_us: float) -> int | None:
    """The largest size that ran within the latency target (one step = one batch's latency)."""
    ok = [p.batch for p in points if p.fits and p.step_us is not None and p.step_us <= target_us]
    return max(ok) if ok else None


def summarize(
    points: Sequence[BatchPoint],
    *,
    script: Sequence[str],
    knob: dict[str, Any],
    training: bool,
    device: str | None = None,
    capacity: int | None = None,
    budget: int | None = None,
    latency_target_us: float | None = None,
    notes: Sequence[str] = (),
    prediction_tried: int | None = None,
) -> BatchSweep:
    ordered = tuple(sorted(points, key=lambda p: (p.batch, p.status)))
    model = fit_memory(ordered)
    fits = [p.batch for p in ordered if p.fits]
    ooms = [p.batch for p in ordered if p.status == "oom"]
    return BatchSweep(
        schema=SCHEMA,
        script=tuple(script),
        knob=dict(knob),
        training=training,
        device=device,
        capacity=capacity,
        budget=budget,
        points=ordered,
        memory_model=model,
        predicted_max=model.largest(budget) if model and budget else None,
        largest_fit=max(fits) if fits else None,
        smallest_oom=min(ooms) if ooms else None,
        knee=find_knee(ordered),
        latency_target_us=latency_target_us,
        latency_pick=latency_pick(ordered, latency_target_us) if latency_target_us else None,
        notes=tuple(notes),
        prediction_tried=prediction_tried,
    )


def point_of(raw: dict[str, Any]) -> BatchPoint:
    times = [float(t) for t in raw.get("step_times_us") or ()]
    median = statistics.median(times) if times else None
    quartiles = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [median] * 3
    return BatchPoint(
        batch=int(raw["batch"]),
        status=str(raw.get("status", "error")),
        step_us=median,
        peak_allocated=raw.get("peak_allocated"),
        peak_reserved=raw.get("peak_reserved"),
        steps=len(times),
        error=raw.get("error"),
        step_p25_us=quartiles[0],
        step_p75_us=quartiles[2],
    )
