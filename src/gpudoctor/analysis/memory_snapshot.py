"""Torch's CUDA allocator snapshot (`torch.cuda.memory._snapshot()`, the dict memory_viz reads) as data: the
allocator's totals, the live blocks by category and allocating line, and one step's history replayed into
allocations with a start, an end and a category (from the storages gpudoctor counted, else the frames).
Pure functions over the dict; no torch, no I/O."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.analysis.memory_frames import CATEGORIES, category_of_frames, in_forward
from gpudoctor.util.errors import MemoryFormatError

BLOCK_ROUND = 512  # the caching allocator rounds every request up to a multiple of 512 bytes
OWNED = ("parameters", "gradients", "optimizer_state")


@dataclass(frozen=True)
class Owners:
    """The storages gpudoctor counted at a step boundary, by start address: which block holds a
    parameter, a gradient or optimizer state."""

    addresses: tuple[int, ...] = ()
    categories: tuple[str, ...] = ()

    @classmethod
    def of(cls, census: Mapping[str, Any] | None) -> Owners:
        """From a census's `{"parameters": [[address, bytes], ...], "gradients": ..., ...}`."""
        pairs: list[tuple[int, str]] = []
        for category in OWNED:
            for item in (census or {}).get(f"{category}_storages", ()) or ():
                if isinstance(item, (list, tuple)) and item and isinstance(item[0], int):
                    pairs.append((int(item[0]), category))
        pairs.sort()
        return cls(tuple(a for a, _ in pairs), tuple(c for _, c in pairs))

    def owner(self, address: int, size: int) -> str | None:
        """The category of the first counted storage inside [address, address + size), if any."""
        i = bisect.bisect_left(self.addresses, address)
        if i < len(self.addresses) and self.addresses[i] < address + size:
            return self.categories[i]
        return None


@dataclass(frozen=True)
class AllocatorBlock:
    address: int
    size: int  # bytes the allocator gave (rounded)
    requested: int
    state: str  # active_allocated, active_pending_free, inactive
    frames: tuple[Mapping[str, Any], ...]  # innermost first; empty without history

    @property
    def allocated(self) -> bool:
        return self.state == "active_allocated"


@dataclass(frozen=True)
class AllocatorState:
    """The allocator at the snapshot's moment."""

    reserved: int  # every segment (what cudaMalloc gave the cache)
    allocated: int  # blocks in use by tensors
    segments: int
    inactive_split_blocks: int  # free blocks inside segments that also hold live ones
    inactive_split_bytes: int
    largest_free_block: int  # the largest request the cache could serve without cudaMalloc
    expandable_segments: bool


@dataclass(frozen=True)
class Allocation:
    """One allocation in a replayed history: `start`/`end` are event indices (-1: alive before the
    history began; None: still alive at its end)."""

    address: int
    size: int
    start: int
    end: int | None
    frames: tuple[Mapping[str, Any], ...]
    category: str
    site: str | None = None  # where the history names the line itself (the profiler's timeline)
    module: str | None = None  # the module whose forward allocated it, where known


@dataclass(frozen=True)
class Replay:
    allocations: tuple[Allocation, ...]
    times_us: tuple[float, ...]  # per event index
    start_reserved: int
    reserved: tuple[int, ...]  # per event index
    truncated: bool  # the history's ring buffer had wrapped: the start state does not match it
    module_types: dict[str, str] = field(default_factory=dict)  # module name -> class, where known


def _frames(value: Any) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(f for f in value if isinstance(f, Mapping))


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MemoryFormatError(f"not a torch memory snapshot: {what} is {type(value).__name__}, not an int")
    return value


def segments(snapshot: Any) -> list[Mapping[str, Any]]:
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("segments"), list):
        raise MemoryFormatError("not a torch memory snapshot: no 'segments' list")
    return [s for s in snapshot["segments"] if isinstance(s, Mapping)]


def blocks(snapshot: Any) -> list[AllocatorBlock]:
    """Every block of every segment, addresses computed where the snapshot leaves them out."""
    out = []
    for seg in segments(snapshot):
        address = _int(seg.get("address", 0), "a segment's address")
        for b in seg.get("blocks") or ():
            if not isinstance(b, Mapping):
                continue
            size = _int(b.get("size", 0), "a block's size")
            out.append(
                AllocatorBlock(
                    address=_int(b.get("address", address), "a block's address"),
                    size=size,
                    requested=_int(b.get("requested_size", size), "a block's requested size"),
                    state=str(b.get("state", "inactive")),
                    frames=_frames(b.get("frames")),
                )
            )
            address = out[-1].address + size
    return out


def allocator_state(snapshot: Any) -> AllocatorState:
    reserved = allocated = split_blocks = split_bytes = largest = 0
    expandable = bool((snapshot.get("allocator_settings") or {}).get("expandable_segments", False))
    segs = segments(snapshot)
    for seg in segs:
        reserved += _int(seg.get("total_size", 0), "a segment's total size")
        expandable = expandable or bool(seg.get("is_expandable", False))
        seg_blocks = [b for b in seg.get("blocks") or () if isinstance(b, Mapping)]
        for b in seg_blocks:
            size = _int(b.get("size", 0), "a block's size")
            if b.get("state") == "active_allocated":
                allocated += size
            elif b.get("state") == "inactive":
                largest = max(largest, size)
                if len(seg_blocks) > 1:
                    split_blocks += 1
                    split_bytes += size
    return AllocatorState(reserved, allocated, len(segs), split_blocks, split_bytes, largest, expandable)


def block_category(block: AllocatorBlock, owners: Owners) -> str:
    return owners.owner(block.address, block.size) or category_of_frames(block.frames)


def live_by_category(snapshot: Any, owners: Owners) -> dict[str, int]:
    """Bytes of the blocks in use, by category, at the snapshot's moment."""
    totals = dict.fromkeys(CATEGORIES, 0)
    for b in blocks(snapshot):
        if b.allocated:
            totals[block_category(b, owners)] += b.size
    return totals


def trace_entries(snapshot: Any, device: int = 0) -> list[Mapping[str, Any]]:
    traces = snapshot.get("device_traces") if isinstance(snapshot, Mapping) else None
    if not isinstance(traces, list) or len(traces) <= device or not isinstance(traces[device], list):
        return []
    return [e for e in traces[device] if isinstance(e, Mapping) and isinstance(e.get("action"), str)]


def replay(start: Any, end: Any, owners_start: Owners, owners_end: Owners, device: int = 0) -> Replay:
    """The allocations of the history in `end` (recorded from the moment of `start`, the state then),
    each with its category: what was alive at `start` by its owner (else `other`); what was allocated
    during the history by its owner at `end` where it is still alive then, else by its frames — the
    user's own lines before the step's first forward are inputs, after it temporaries."""
    entries = trace_entries(end, device)
    exact = {(b.address, b.requested): b.size for b in blocks(end) if b.allocated}
    live: dict[int, list[Any]] = {}  # address -> [size, start, frames, category or None]
    for b in blocks(start):
        if b.allocated:
            live[b.address] = [b.size, -1, b.frames, owners_start.owner(b.address, b.size) or "other"]
    done: list[Allocation] = []
    times: list[float] = []
    reserved_now = allocator_state(start).reserved
    reserved: list[int] = []
    first_forward: int | None = None
    truncated = False
    for i, e in enumerate(entries):
        times.append(float(e.get("time_us", 0) or 0))
        action, addr, size = e["action"], int(e.get("addr", 0) or 0), int(e.get("size", 0) or 0)
        if action == "alloc":
            frames = _frames(e.get("frames"))
            if first_forward is None and in_forward(frames):
                first_forward = i
            live[addr] = [exact.get((addr, size), _rounded(size)), i, frames, None]
        elif action == "free_requested":
            item = live.pop(addr, None)
            if item is None:
                truncated = True  # freed, but not alive at the start: the ring buffer dropped its alloc
            else:
                done.append(_allocation(addr, item, i, owners_end, first_forward))
        elif action in ("segment_alloc", "segment_map"):
            reserved_now += size
        elif action in ("segment_free", "segment_unmap"):
            reserved_now -= size
        reserved.append(reserved_now)
    done.extend(_allocation(addr, item, None, owners_end, first_forward) for addr, item in live.items())
    done.sort(key=lambda a: (a.start, a.address))
    return Replay(tuple(done), tuple(times), allocator_state(start).reserved, tuple(reserved), truncated)


def _rounded(size: int) -> int:
    return max(BLOCK_ROUND, -(-size // BLOCK_ROUND) * BLOCK_ROUND)


def _allocation(
    addr: int, item: list[Any], end: int | None, owners: Owners, first_forward: int | None
) -> Allocation:
    size, start, frames, category = item
    if category is None:
        owner = owners.owner(addr, size) if end is None else None
        after = first_forward is not None and start > first_forward
        category = owner or category_of_frames(frames, after_forward=after)
    return Allocation(addr, size, start, end, frames, category)


def live_at(replay_: Replay, index: int) -> list[Allocation]:
    """The allocations alive just after event `index`."""
    return [a for a in replay_.allocations if a.start <= index and (a.end is None or a.end > index)]


def allocated_series(replay_: Replay) -> tuple[list[int], list[dict[str, int]]]:
    """Allocated bytes after each event, in all and by category (one dict per event: fine for the few
    thousand events of a step; callers downsample)."""
    deltas: list[list[tuple[str, int]]] = [[] for _ in replay_.times_us]
    base = dict.fromkeys(CATEGORIES, 0)
    for a in replay_.allocations:
        if a.start < 0:
            base[a.category] += a.size
        else:
            deltas[a.start].append((a.category, a.size))
        if a.end is not None:
            deltas[a.end].append((a.category, -a.size))
    totals, by_category = [], []
    now = dict(base)
    for changes in deltas:
        for category, size in changes:
            now[category] += size
        by_category.append(dict(now))
        totals.append(sum(now.values()))
    return totals, by_category


def peak_index(totals: Sequence[int]) -> int | None:
    """The first event at which allocated memory is highest; None without events."""
    if not totals:
        return None
    top = max(totals)
    return next(i for i, t in enumerate(totals) if t == top)
