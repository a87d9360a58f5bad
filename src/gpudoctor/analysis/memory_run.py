"""`analyze_memory(run, snapshots, timeline) -> MemoryAnalysis`: GPU memory of a `gpudoctor run` — per-step
peaks, where the peak goes (`memory_breakdown`), the lines that grow step over step (a leak), reserved
against allocated memory (fragmentation), and what held the memory when the script ran out of it. Pure:
the caller reads the runner's record (`RunRecord.memory_run`), the snapshots and the timeline."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from gpudoctor.analysis.keeping import keeping_line
from gpudoctor.analysis.memory_breakdown import (
    MemoryBreakdown,
    SiteBytes,
    breakdown,
    by_site,
    module_rows,
)
from gpudoctor.analysis.memory_frames import CATEGORIES, script_line, user_site
from gpudoctor.analysis.memory_snapshot import (
    Allocation,
    Owners,
    allocator_state,
    block_category,
    blocks,
    replay,
)
from gpudoctor.analysis.memory_timeline import timeline_replay
from gpudoctor.util.errors import MemoryFormatError
from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.memory/1"
RUN_SCHEMA = "gpudoctor.memory-run/1"
# A leak: allocated memory at the step boundaries grows by at least this much per step, in most steps,
# by at least this share of the peak over the steps recorded.
LEAK_MIN_PER_STEP = 256 * 1024
LEAK_MIN_RISING = 0.75
LEAK_MIN_SHARE = 0.01
MIN_LEAK_STEPS = 4


@dataclass(frozen=True)
class StepMemory:
    step: int
    phase: str  # light, detail (the step recorded in detail), traced
    peak_allocated: int
    peak_reserved: int
    allocated: int  # at the step's end
    reserved: int
    inactive_split_bytes: int  # free bytes in split segments at its end
    alloc_retries: int  # during the step: the allocator freed its cache and tried again
    device_allocs: int  # cudaMalloc calls during the step
    device_frees: int


@dataclass(frozen=True)
class Census:
    """Counted from the model and optimizer objects at a step boundary: exact bytes of storages."""

    step: int | None
    parameters: int
    gradients: int
    optimizer_state: int
    optimizers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Leak:
    bytes_per_step: float  # least-squares slope of allocated memory at the step boundaries
    steps: int
    growth: int  # last boundary minus first
    rising_share: float  # of step-over-step changes, the share that grew
    sites: tuple[SiteBytes, ...]  # bytes per step each line added between two snapshots, most first
    steps_to_full: float | None  # at this rate, until the peak reaches the memory the allocator can get


@dataclass(frozen=True)
class Fragmentation:
    steps: int
    peak_allocated: int
    peak_reserved: int
    inactive_split_bytes: int  # largest at a boundary
    inactive_split_blocks: int | None  # from a snapshot
    largest_free_block: int | None
    alloc_retries: int
    device_allocs_per_step: float
    device_frees_per_step: float
    expandable_segments: bool | None


@dataclass(frozen=True)
class OomReport:
    step: int | None  # steps seen when it happened
    requested: int
    device_free: int | None  # what CUDA still had
    capacity: int | None
    allocated: int
    reserved: int
    largest_free_block: int  # in the allocator's cache
    categories: dict[str, int]
    sites: tuple[SiteBytes, ...]
    failing_line: str | None  # the innermost line of the user's code at the failing allocation
    message: str | None
    script_line: str | None = None  # the line of the script that ran, where it differs


@dataclass(frozen=True)
class MemoryAnalysis(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor memory analysis"

    schema: str
    device: str
    capacity: int | None
    budget: int | None  # what the allocator could hold: free device memory plus its cache, when measured
    training: bool
    steps: tuple[StepMemory, ...]
    peak_allocated: int
    peak_reserved: int
    census: Census | None
    breakdown: MemoryBreakdown | None
    leak: Leak | None
    fragmentation: Fragmentation | None
    oom: OomReport | None
    step_us: float | None  # the unprofiled step time
    history: str  # how the allocator's history was kept (or why not)
    notes: tuple[str, ...] = ()


def analyze_memory(
    run: Mapping[str, Any],
    snapshots: Mapping[str, Any] | None = None,
    timeline: Any = None,
    step_us: float | None = None,
) -> MemoryAnalysis:
    if not isinstance(run, Mapping) or run.get("schema") != RUN_SCHEMA:
        raise MemoryFormatError(f"not a gpudoctor memory record of schema {RUN_SCHEMA}")
    snapshots = snapshots or {}
    notes = [str(n) for n in run.get("notes") or ()]
    steps = tuple(_step(s) for s in run.get("steps") or ())
    capacity = _opt_int(run.get("capacity"))
    budget = _opt_int(run.get("budget")) or capacity
    detail = _detail_breakdown(run, snapshots, steps, timeline, notes)
    peak_allocated = max((s.peak_allocated for s in steps), default=detail.peak if detail else 0)
    return MemoryAnalysis(
        schema=SCHEMA,
        device=str(run.get("device", "?")),
        capacity=capacity,
        budget=budget,
        training=bool(run.get("training", False)),
        steps=steps,
        peak_allocated=peak_allocated,
        peak_reserved=max((s.peak_reserved for s in steps), default=0),
        census=_census(run.get("census")),
        breakdown=detail,
        leak=find_leak(steps, run, snapshots, budget, peak_allocated),
        fragmentation=fragmentation(steps, snapshots.get("traced_end") or snapshots.get("detail_end")),
        oom=oom_report(run.get("oom"), snapshots.get("oom"), capacity, _script(run)),
        step_us=step_us,
        history=str(run.get("history", "")),
        notes=tuple(notes),
    )


def _detail_breakdown(
    run: Mapping[str, Any],
    snapshots: Mapping[str, Any],
    steps: Sequence[StepMemory],
    timeline: Any,
    notes: list[str],
) -> MemoryBreakdown | None:
    """From the allocator's history of the detail step, else from the profiler's memory timeline."""
    start, end = snapshots.get("detail_start"), snapshots.get("detail_end")
    step = _opt_int(run.get("detail_step"))
    if start is not None and end is not None:
        measured = next((s.peak_allocated for s in steps if s.step == step), None)
        r = replay(start, end, Owners.of(run.get("census_start")), Owners.of(run.get("census")))
        if r.truncated:
            notes.append("the allocator's history of the detail step is incomplete (its ring buffer wrapped)")
        modules = module_rows(run.get("modules") or ())
        return breakdown(r, "allocator history", step, measured, modules, _script(run))
    if timeline is not None:
        return breakdown(timeline_replay(timeline), "profiler memory timeline", None)
    return None


def find_leak(
    steps: Sequence[StepMemory],
    run: Mapping[str, Any],
    snapshots: Mapping[str, Any],
    budget: int | None,
    peak: int,
) -> Leak | None:
    """Allocated memory at the step boundaries growing step over step; the lines from the growth of what
    they hold between the end of the detail step and the end of the traced phase."""
    ordered = sorted(steps, key=lambda s: s.step)
    if len(ordered) < MIN_LEAK_STEPS:
        return None
    xs = [float(s.step) for s in ordered]
    ys = [float(s.allocated) for s in ordered]
    slope = _slope(xs, ys)
    deltas = [b - a for a, b in itertools.pairwise(ys)]
    rising = sum(d > 0 for d in deltas) / len(deltas)
    growth = int(ys[-1] - ys[0])
    if slope < LEAK_MIN_PER_STEP or rising < LEAK_MIN_RISING or growth < LEAK_MIN_SHARE * max(peak, 1):
        return None
    headroom = (budget - peak) if budget else None
    return Leak(
        bytes_per_step=slope,
        steps=len(ordered),
        growth=growth,
        rising_share=rising,
        sites=_growing_sites(run, snapshots),
        steps_to_full=max(headroom, 0) / slope if headroom is not None else None,
    )


def _growing_sites(run: Mapping[str, Any], snapshots: Mapping[str, Any]) -> tuple[SiteBytes, ...]:
    """Bytes per step by which each line's live blocks grew between the end of the detail step and the
    end of the traced phase; a line is the script's own (the loop's line) where the stack has it,
    with the innermost user line inside it as `inner`."""
    first, last = snapshots.get("detail_end"), snapshots.get("traced_end")
    meta = run.get("snapshots") or {}
    n0 = _opt_int((meta.get("detail_end") or {}).get("step"))
    n1 = _opt_int((meta.get("traced_end") or {}).get("step"))
    if first is None or last is None or n0 is None or n1 is None or n1 <= n0:
        return ()
    script = _script(run)
    before = {s.site: s for s in _live_by_line(first, script)}
    rows = []
    for s in _live_by_line(last, script):
        old = before.get(s.site)
        grew = s.bytes - (old.bytes if old else 0)
        if grew > 0:
            rows.append(replace(s, bytes=grew // (n1 - n0), blocks=s.blocks - (old.blocks if old else 0)))
    kept = _with_keeping_lines(rows, script, run.get("script_source"))
    return tuple(sorted(kept, key=lambda r: (-r.bytes, r.site)))


def _with_keeping_lines(rows: list[SiteBytes], script: str | None, source: Any) -> list[SiteBytes]:
    """Each growing line of the script with the later line that stores what it allocated, where the
    run recorded the script's text (`runner.memory`) and one does (`analysis.keeping`)."""
    if not script or not isinstance(source, str):
        return rows
    base = script.replace("\\", "/").rsplit("/", 1)[-1]
    out = []
    for r in rows:
        m = _SITE.match(r.site)
        if m and m.group(1).replace("\\", "/").rsplit("/", 1)[-1] == base:
            kept = keeping_line(source, int(m.group(2)))
            if kept is not None:
                r = replace(r, kept_by=f"{m.group(1)}:{kept}")
        out.append(r)
    return out


_SITE = re.compile(r"^(.*):(\d+) in ")


def _live_by_line(snapshot: Any, script: str | None) -> tuple[SiteBytes, ...]:
    """Live blocks grouped by the script's line (else the user's innermost line)."""
    live = [
        Allocation(b.address, b.size, -1, None, b.frames, block_category(b, Owners()))
        for b in blocks(snapshot)
        if b.allocated
    ]
    rows: dict[str, list[Allocation]] = defaultdict(list)
    for a in live:
        rows[script_line(a.frames, script) or user_site(a.frames)].append(a)
    out = []
    for key, group in rows.items():
        (inner,) = by_site(group)[:1]
        out.append(
            SiteBytes(
                key,
                sum(a.size for a in group),
                len(group),
                inner.category,
                None if inner.site == key else inner.site,
            )
        )
    return tuple(out)


def fragmentation(steps: Sequence[StepMemory], snapshot: Any) -> Fragmentation | None:
    """The allocator's figures over the timed steps (the light phase where there is one)."""
    timed = [s for s in steps if s.phase == "light"] or list(steps)
    if not timed:
        return None
    state = allocator_state(snapshot) if snapshot is not None else None
    n = len(timed)
    return Fragmentation(
        steps=n,
        peak_allocated=max(s.peak_allocated for s in timed),
        peak_reserved=max(s.peak_reserved for s in timed),
        inactive_split_bytes=max(s.inactive_split_bytes for s in timed),
        inactive_split_blocks=state.inactive_split_blocks if state else None,
        largest_free_block=state.largest_free_block if state else None,
        alloc_retries=sum(s.alloc_retries for s in steps),
        device_allocs_per_step=sum(s.device_allocs for s in timed) / n,
        device_frees_per_step=sum(s.device_frees for s in timed) / n,
        expandable_segments=state.expandable_segments if state else None,
    )


def oom_report(oom: Any, snapshot: Any, capacity: int | None, script: str | None = None) -> OomReport | None:
    """What held the memory when an allocation failed: the live blocks of the snapshot taken at that
    moment by category (owners from the census taken then) and by line."""
    if not isinstance(oom, Mapping):
        return None
    categories = dict.fromkeys(CATEGORIES, 0)
    sites: tuple[SiteBytes, ...] = ()
    allocated = reserved = largest = 0
    if snapshot is not None:
        owners = Owners.of(oom.get("census"))
        live = [
            Allocation(b.address, b.size, -1, None, b.frames, block_category(b, owners))
            for b in blocks(snapshot)
            if b.allocated
        ]
        for a in live:
            categories[a.category] += a.size
        sites = by_site(live, script)[:12]
        state = allocator_state(snapshot)
        allocated, reserved, largest = state.allocated, state.reserved, state.largest_free_block
    return OomReport(
        step=_opt_int(oom.get("step")),
        requested=int(oom.get("requested", 0) or 0),
        device_free=_opt_int(oom.get("device_free")),
        capacity=capacity,
        allocated=allocated or int(oom.get("device_allocated", 0) or 0),
        reserved=reserved,
        largest_free_block=largest,
        categories=categories,
        sites=sites,
        failing_line=oom.get("failing_line") if isinstance(oom.get("failing_line"), str) else None,
        message=oom.get("message") if isinstance(oom.get("message"), str) else None,
        script_line=oom.get("script_line") if isinstance(oom.get("script_line"), str) else None,
    )


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def _step(s: Any) -> StepMemory:
    if not isinstance(s, Mapping):
        raise MemoryFormatError("a memory step is not an object")
    try:
        return StepMemory(
            step=int(s["step"]),
            phase=str(s.get("phase", "light")),
            **{k: int(s.get(k, 0) or 0) for k in _STEP_INTS},
        )
    except (KeyError, TypeError, ValueError) as err:
        raise MemoryFormatError(f"a memory step is damaged: {err}") from None


_STEP_INTS = (
    "peak_allocated",
    "peak_reserved",
    "allocated",
    "reserved",
    "inactive_split_bytes",
    "alloc_retries",
    "device_allocs",
    "device_frees",
)


def _census(c: Any) -> Census | None:
    if not isinstance(c, Mapping):
        return None
    return Census(
        step=_opt_int(c.get("step")),
        parameters=int(c.get("parameters", 0) or 0),
        gradients=int(c.get("gradients", 0) or 0),
        optimizer_state=int(c.get("optimizer_state", 0) or 0),
        optimizers=tuple(str(o) for o in c.get("optimizers") or ()),
    )


def _script(run: Mapping[str, Any]) -> str | None:
    return run.get("script") if isinstance(run.get("script"), str) else None


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
