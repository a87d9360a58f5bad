"""Where one step's memory goes: its peak split into categories (parameters, gradients, optimizer
state, activations, inputs, temporaries, held from earlier steps), the lines that hold it at the
peak, the modules whose forward stores the activations, the memory over the step stacked by category,
and what the step leaves alive for the next one. Built from a replayed allocator history or
torch.profiler's memory timeline (`memory_snapshot.Replay`). Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.analysis.memory_frames import CATEGORIES, inner_site, script_line, user_site
from gpudoctor.analysis.memory_snapshot import (
    OWNED,
    Allocation,
    Replay,
    allocated_series,
    live_at,
    peak_index,
)

SERIES_POINTS = 300
TOP_SITES = 12
SPLIT_SHARE = 0.9  # a module holding this share of its parent's activations stands for it: look inside
MAX_MODULES = 400


@dataclass(frozen=True)
class SiteBytes:
    """Bytes held by the allocations of one source line (the innermost line of the user's code)."""

    site: str
    bytes: int
    blocks: int
    category: str  # the category of most of its bytes
    inner: str | None = None  # the innermost line outside torch, where it is not `site` (a model's file)
    script_line: str | None = None  # the line of the script that was run (its loop), for most bytes
    kept_by: str | None = None  # a leak's: the script's line that stores what this line allocated


@dataclass(frozen=True)
class ModuleMemory:
    """What one module's forward keeps alive (its activations for backward and its output), summed over
    its calls in the recorded step; `forward_us`: GPU time of its forward, where measured."""

    name: str
    type: str
    activations: int
    inputs: int = 0  # bytes of the tensors passed to it (what a checkpoint of it keeps)
    forward_us: float | None = None
    calls: int = 1


@dataclass(frozen=True)
class MemoryBreakdown:
    source: str  # "allocator history" or "profiler memory timeline"
    step: int | None
    peak: int  # the step's peak: the sum of `categories`
    categories: dict[str, int]  # at the peak, every category of CATEGORIES
    sites: tuple[SiteBytes, ...]  # alive at the peak, by line, largest first
    modules: tuple[ModuleMemory, ...]  # every module measured (inclusive bytes, calls summed), largest first
    series_t_us: tuple[float, ...]  # from the step's first event
    series: dict[str, tuple[int, ...]]  # category -> bytes at each point of series_t_us
    held: tuple[
        SiteBytes, ...
    ]  # allocated in the step, alive at its end, neither parameter, gradient nor state
    truncated: bool = False  # the history did not cover the whole step


def breakdown(
    replay: Replay,
    source: str,
    step: int | None = None,
    measured_peak: int | None = None,
    modules: Sequence[ModuleMemory] = (),
    script: str | None = None,
) -> MemoryBreakdown | None:
    """The breakdown of a replayed step; None without events. `measured_peak`: the allocator's own peak
    of that step (the replay rounds what it cannot see exactly: the difference is `unattributed`).
    `modules`: modules measured by forward hooks (inclusive of their children); without them the
    modules come from the allocations' own module names. `script`: the path of the script that ran."""
    totals, by_category = allocated_series(replay)
    at = peak_index(totals)
    if at is None:
        return None
    categories = {c: by_category[at].get(c, 0) for c in CATEGORIES}
    if measured_peak is not None and measured_peak > totals[at]:
        categories["unattributed"] += measured_peak - totals[at]
    alive = live_at(replay, at)
    if not modules:
        modules = modules_of((a for a in alive if a.category == "activations"), replay.module_types)
    t0 = replay.times_us[0] if replay.times_us else 0.0
    times, series = _downsample(totals, by_category, replay.times_us, t0)
    held = [a for a in replay.allocations if a.start >= 0 and a.end is None and a.category not in OWNED]
    return MemoryBreakdown(
        source=source,
        step=step,
        peak=sum(categories.values()),
        categories=categories,
        sites=by_site(alive, script)[:TOP_SITES],
        modules=tuple(sorted(_merged(modules).values(), key=lambda m: (-m.activations, natural(m.name))))[
            :MAX_MODULES
        ],
        series_t_us=times,
        series=series,
        held=by_site(held, script)[:TOP_SITES],
        truncated=replay.truncated,
    )


BEFORE = "allocated before the recorded step (no stack kept)"


def site_of(a: Allocation) -> tuple[str, str | None]:
    """(the user's line, the innermost line outside torch where it differs) of an allocation."""
    if a.site is not None:
        return a.site, None
    if not a.frames and a.start < 0:
        return BEFORE, None
    return user_site(a.frames), inner_site(a.frames)


def by_site(allocations: Iterable[Allocation], script: str | None = None) -> tuple[SiteBytes, ...]:
    """Allocations grouped by their user line, most bytes first; `inner`, `category` and `script_line`
    are those of most of the line's bytes."""
    sizes: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    cats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    inners: dict[str, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
    lines: dict[str, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
    for a in allocations:
        site, inner = site_of(a)
        sizes[site] += a.size
        counts[site] += 1
        cats[site][a.category] += a.size
        inners[site][inner] += a.size
        line = script_line(a.frames, script)
        lines[site][line if line != site else None] += a.size
    rows = [
        SiteBytes(site, size, counts[site], _most(cats[site]), _most(inners[site]), _most(lines[site]))
        for site, size in sizes.items()
    ]
    return tuple(sorted(rows, key=lambda r: (-r.bytes, r.site)))


def _most(sizes: Mapping[Any, int]) -> Any:
    return max(sizes.items(), key=lambda kv: kv[1])[0]  # the first seen among equals


def modules_of(
    allocations: Iterable[Allocation], types: Mapping[str, str] | None = None
) -> tuple[ModuleMemory, ...]:
    """Inclusive bytes per module (every prefix of the dotted names the allocations carry)."""
    sizes: dict[str, int] = defaultdict(int)
    for a in allocations:
        if a.module is None:
            continue
        parts = a.module.split(".")
        for i in range(1, len(parts) + 1):
            sizes[".".join(parts[:i])] += a.size
    return tuple(ModuleMemory(name, (types or {}).get(name, ""), size) for name, size in sizes.items())


def split_level(modules: Sequence[ModuleMemory]) -> tuple[ModuleMemory, ...]:
    """The modules at the level where the activations split: from the roots, step into the one child
    that holds ≥ 90% of its parent's (a wrapper such as `model.transformer`) until several share it;
    `modules` carry inclusive bytes and dotted names, several calls of one module summed."""
    merged = _merged(modules)
    if not merged:
        return ()
    level = _children(merged, None)
    while level:
        total = sum(m.activations for m in level)
        top = max(level, key=lambda m: m.activations)
        inside = _children(merged, top.name)
        if total <= 0 or top.activations < SPLIT_SHARE * total or not inside:
            break
        level = inside
    return tuple(sorted(level, key=lambda m: (-m.activations, natural(m.name))))


def repeated_blocks(modules: Sequence[ModuleMemory]) -> tuple[ModuleMemory, ...]:
    """The siblings of one type (two or more under one parent: a model's blocks) whose forwards keep
    the most activations in all, largest first; () where no type repeats."""
    groups: dict[tuple[str, str], list[ModuleMemory]] = defaultdict(list)
    for m in _merged(modules).values():
        if m.type:
            parent = m.name.rsplit(".", 1)[0] if "." in m.name else ""
            groups[(parent, m.type)].append(m)
    repeated = [g for g in groups.values() if len(g) >= 2]
    if not repeated:
        return ()
    best = max(repeated, key=lambda g: (sum(m.activations for m in g), len(g)))
    return tuple(sorted(best, key=lambda m: (-m.activations, natural(m.name))))


def _merged(modules: Sequence[ModuleMemory]) -> dict[str, ModuleMemory]:
    out: dict[str, ModuleMemory] = {}
    for m in modules:
        old = out.get(m.name)
        if old is None:
            out[m.name] = m
            continue
        forward = (
            None
            if old.forward_us is None and m.forward_us is None
            else (old.forward_us or 0.0) + (m.forward_us or 0.0)
        )
        out[m.name] = ModuleMemory(
            m.name,
            m.type or old.type,
            old.activations + m.activations,
            old.inputs + m.inputs,
            forward,
            old.calls + m.calls,
        )
    return out


def _children(merged: Mapping[str, ModuleMemory], parent: str | None) -> list[ModuleMemory]:
    """The nearest modules below `parent` (the roots for None): containers that were never called, such
    as a ModuleList, are skipped over."""
    inside = [n for n in merged if parent is None or n.startswith(parent + ".")]
    return [merged[n] for n in inside if not any(o != n and n.startswith(o + ".") for o in inside)]


def _downsample(
    totals: Sequence[int], by_category: Sequence[Mapping[str, int]], times: Sequence[float], t0: float
) -> tuple[tuple[float, ...], dict[str, tuple[int, ...]]]:
    """At most SERIES_POINTS points, each bucket's highest moment kept (a peak is never smoothed away)."""
    n = len(totals)
    step = max(1, -(-n // SERIES_POINTS))
    picks = [max(range(i, min(i + step, n)), key=lambda j: totals[j]) for i in range(0, n, step)]
    series = {c: tuple(by_category[j].get(c, 0) for j in picks) for c in CATEGORIES}
    return tuple(times[j] - t0 for j in picks), {c: v for c, v in series.items() if any(v)}


def natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts h.2 before h.10."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in name.split("."))


def compact_names(names: Sequence[str]) -> str:
    """'transformer.h.0–11' for transformer.h.0 … transformer.h.11; a comma list otherwise."""
    prefixes = {n.rsplit(".", 1)[0] for n in names if "." in n}
    tails = [n.rsplit(".", 1)[-1] for n in names]
    if len(names) > 2 and len(prefixes) == 1 and all(t.isdigit() for t in tails):
        numbers = sorted(int(t) for t in tails)
        if numbers == list(range(numbers[0], numbers[-1] + 1)):
            return f"{prefixes.pop()}.{numbers[0]}–{numbers[-1]}"
    return ", ".join(names)


def module_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[ModuleMemory, ...]:
    """Modules from the runner's forward-hook records (`name`, `type`, `activations`, `inputs`,
    `forward_us`, `calls`); malformed rows are left out."""
    out = []
    for r in rows:
        try:
            forward = r.get("forward_us")
            out.append(
                ModuleMemory(
                    str(r["name"]),
                    str(r.get("type", "")),
                    int(r["activations"]),
                    int(r.get("inputs", 0)),
                    float(forward) if isinstance(forward, (int, float)) else None,
                    int(r.get("calls", 1)),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)
