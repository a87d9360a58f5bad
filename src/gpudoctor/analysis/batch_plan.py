"""Which batch sizes a sweep measures, one at a time: doublings while throughput still grows (or a latency
target is not yet crossed, or fewer than two sizes past a knee are measured), then the largest size the
memory model predicts and the next size up, to confirm it. `sweep(measure, plan, script)` runs the loop
with the function that measures one size (a fresh process, or injected measurements in tests). No I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis.batch import BatchPoint, BatchSweep, find_knee, fit_memory, point_of, summarize
from gpudoctor.util.errors import UsageError

Measure = Callable[[int], dict[str, Any]]
LATENCY_BISECTIONS = 3  # sizes tried between the last meeting a latency target and the first missing it


@dataclass(frozen=True)
class SweepPlan:
    start: int = 1  # the first size measured
    max_batch: int | None = None
    max_runs: int = 14
    latency_target_us: float | None = None
    # sizes measured past the knee before jumping to the largest that fits: a knee holds only if
    # every one of them gains too little, so two keep one slow point from ending the doublings
    past_knee: int = 2
    confirm: bool = True  # try the predicted largest size and the next one up


def next_batch(points: Sequence[BatchPoint], plan: SweepPlan, budget: int | None) -> int | None:
    """The next size to measure, or None when the sweep is done."""
    if not points:
        return max(plan.start, 1)
    if len(points) >= plan.max_runs:
        return None
    tried = {p.batch for p in points}
    ok = sorted(p.batch for p in points if p.fits)
    oom = min((p.batch for p in points if p.status == "oom"), default=None)
    if not ok:  # the first sizes ran out of memory: halve until one fits
        return oom // 2 if oom is not None and oom > 1 and oom // 2 not in tried else None
    top = ok[-1]
    limit = min(x for x in (plan.max_batch, (oom - 1) if oom else None, 1 << 20) if x is not None)
    model = fit_memory(points)
    predicted = model.largest(budget) if model is not None and budget else None
    refine = _latency_refinement(points, plan, tried)
    if refine is not None:
        return refine
    if _still_exploring(points, plan) and 2 * top <= limit and (predicted is None or 2 * top <= predicted):
        return 2 * top
    if not plan.confirm:
        return None
    if predicted is None:  # no memory model (no GPU, one size that ran): only locate a known boundary
        middle = (top + oom) // 2 if oom is not None else top
        return middle if oom is not None and oom - top > step_above(top) and middle not in tried else None
    return _confirm(predicted, ok, oom, tried, limit)


def _still_exploring(points: Sequence[BatchPoint], plan: SweepPlan) -> bool:
    """Throughput still grows (or the sizes past the knee are not yet measured), or the latency target
    has not been crossed yet."""
    if plan.latency_target_us is not None and not any(
        p.fits and p.step_us is not None and p.step_us > plan.latency_target_us for p in points
    ):
        return True
    knee = find_knee(points)
    if knee is None:
        return True
    past = [p for p in points if p.fits and p.batch > knee.batch]
    return len(past) < plan.past_knee


def _confirm(predicted: int, ok: list[int], oom: int | None, tried: set[int], limit: int) -> int | None:
    """Try the predicted largest size, then the next size up. A prediction already refuted (a size at or
    below it ran out of memory): halve the gap between the largest size that ran and the smallest that
    did not, down to one step."""
    top = ok[-1]
    if oom is not None and predicted >= oom:
        middle = (top + oom) // 2
        return middle if oom - top > step_above(top) and middle not in tried else None
    target = min(max(predicted, 1), limit)
    if target > top and target not in tried:
        return target
    up = target + step_above(target)
    if target in ok and up not in tried and up <= limit and (oom is None or up < oom):
        return up
    return None


def step_above(batch: int) -> int:
    """The next size up from `batch` in the sweep's resolution: about 1/16 of its power of two."""
    return max(1, (1 << max(int(math.log2(max(batch, 1))), 0)) // 16)


def _latency_refinement(points: Sequence[BatchPoint], plan: SweepPlan, tried: set[int]) -> int | None:
    """With a latency target crossed between two measured sizes far apart, the size halfway (twice)."""
    target = plan.latency_target_us
    if target is None:
        return None
    ok = sorted((p for p in points if p.fits and p.step_us is not None), key=lambda p: p.batch)
    meets = [p.batch for p in ok if p.step_us <= target]  # type: ignore[operator]
    over = [p.batch for p in ok if p.step_us > target]  # type: ignore[operator]
    if not meets or not over:
        return None
    low, high = (
        max(meets),
        min(b for b in over if b > max(meets)) if any(b > max(meets) for b in over) else None,
    )
    if high is None or high - low <= max(1, low // 8):
        return None
    middle = (low + high) // 2
    refined = len([b for b in tried if low < b < high])
    return middle if middle not in tried and refined < LATENCY_BISECTIONS else None


def sweep(
    measure: Measure, plan: SweepPlan, script: Sequence[str], notes: list[str] | None = None
) -> BatchSweep:
    """Measure sizes until `next_batch` says done; the summary of what was measured."""
    points: list[BatchPoint] = []
    raws: list[dict[str, Any]] = []
    notes = notes if notes is not None else []
    tried_prediction = None
    while True:
        budget = _first(raws, "budget")
        batch = next_batch(points, plan, budget)
        if batch is None:
            break
        if any(p.batch == batch for p in points):  # measured already, and it failed: again would too
            notes.append(f"batch {batch} was measured already: the sweep stops there")
            break
        model = fit_memory(points)
        if tried_prediction is None and model is not None and budget and batch == model.largest(budget):
            tried_prediction = batch
        raw = measure(batch)
        if _first([*raws, raw], "knob") is None:
            if raw.get("status") == "error":
                raise UsageError(f"the script failed at batch {batch}: {raw.get('error')}")
            raise UsageError(
                "no batch size to sweep: the script has no --batch-size-like option and builds no "
                "DataLoader with a batch_size (name the option with --batch-arg)"
            )
        if not points and raw.get("status") in ("error", "no_steps"):  # the first size: nothing to go on
            raise UsageError(f"the script failed at batch {batch}: {raw.get('error') or 'no step was timed'}")
        raws.append(raw)
        points.append(point_of(raw))
        if raw.get("status") in ("error", "no_steps"):
            notes.append(f"batch {batch}: {raw.get('error') or 'no step was timed'}")
    return summarize(
        points,
        script=script,
        knob=_first(raws, "knob") or {},
        training=any(r.get("training") for r in raws),
        device=_first(raws, "device"),
        capacity=_first(raws, "capacity"),
        budget=_first(raws, "budget"),
        latency_target_us=plan.latency_target_us,
        notes=notes,
        prediction_tried=tried_prediction,
    )


def _first(raws: Sequence[dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in raws if r.get(key) is not None), None)
