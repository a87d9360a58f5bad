"""The memory timeline gpudoctor writes from torch.profiler's own memory categorisation
(`torch.profiler._memory_profiler.MemoryProfile`: needs profile_memory, record_shapes and with_stack;
works on CPU tensors too), replayed like an allocator history: every tensor's bytes with torch's
category, its line and module. Schema `gpudoctor.memory-timeline/1`: interned `sites` and `modules`, and
`events` of `[t_ns, kind, tensor, bytes, category, site, module]`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudoctor.analysis.memory_frames import PROFILER_CATEGORIES
from gpudoctor.analysis.memory_snapshot import Allocation, Replay
from gpudoctor.util.errors import MemoryFormatError

SCHEMA = "gpudoctor.memory-timeline/1"


def timeline_replay(doc: Any) -> Replay:
    """The timeline's tensors as allocations (event indices as in `Replay`)."""
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        raise MemoryFormatError(f"not a gpudoctor memory timeline of schema {SCHEMA}")
    sites, modules, events = doc.get("sites") or [], doc.get("modules") or [], doc.get("events")
    if not isinstance(events, list):
        raise MemoryFormatError("a memory timeline without an 'events' list")
    live: dict[int, tuple[int, int, str, str | None, str | None]] = {}
    done: list[Allocation] = []
    times: list[float] = []
    for e in events:
        if not isinstance(e, list) or len(e) != 7:
            raise MemoryFormatError(
                "a memory timeline event is not [t_ns, kind, tensor, bytes, category, site, module]"
            )
        t_ns, kind, tensor, size, category, site, module = e
        if kind == "destroy":
            item = live.pop(tensor, None)
            index = len(times)
            times.append(float(t_ns) / 1e3)
            if item is not None:
                done.append(_allocation(tensor, item, index))
            continue
        start = -1 if kind == "preexisting" else len(times)
        if kind != "preexisting":
            times.append(float(t_ns) / 1e3)
        live[tensor] = (
            int(size),
            start,
            PROFILER_CATEGORIES.get(str(category), "other" if kind == "preexisting" else "unattributed"),
            _name(sites, site),
            _name(modules, module),
        )
    done.extend(_allocation(tensor, item, None) for tensor, item in live.items())
    done.sort(key=lambda a: (a.start, a.address))
    types = doc.get("module_types")
    types = {str(k): str(v) for k, v in types.items()} if isinstance(types, Mapping) else {}
    return Replay(tuple(done), tuple(times), 0, tuple(0 for _ in times), False, types)


def _allocation(
    tensor: int, item: tuple[int, int, str, str | None, str | None], end: int | None
) -> Allocation:
    size, start, category, site, module = item
    return Allocation(int(tensor), size, start, end, (), category, site, module)


def _name(names: list[Any], index: Any) -> str | None:
    if isinstance(index, int) and 0 <= index < len(names):
        return str(names[index])
    return None
