"""torch.profiler's own memory categorisation (`MemoryProfile`, private API: it needs profile_memory,
record_shapes and with_stack, and works for CPU tensors too) turned into gpudoctor's memory timeline
(schema `gpudoctor.memory-timeline/1`, read by `analysis.memory_timeline`): every tensor of one device
with its category, the user's line that allocated it and the innermost module whose forward did."""

from __future__ import annotations

from typing import Any

from gpudoctor.util.frames import frame_text, innermost_user_frame

TIMELINE_SCHEMA = "gpudoctor.memory-timeline/1"


def timeline_doc(prof: Any, names: dict[int, str], types: dict[str, str], device: Any) -> dict[str, Any]:
    """The timeline of `device`'s tensors in the profiler's recorded steps; `names`: id(module) ->
    dotted name, `types`: dotted name -> class name."""
    from torch.profiler._memory_profiler import Action, TensorKey

    memory = prof._memory_profile()
    origin = _origins(memory, names)
    sites: dict[str, int] = {}
    modules: dict[str, int] = {}
    ids: dict[tuple[Any, int], int] = {}
    events: list[list[Any]] = []

    def emit(t: int, kind: str, key: Any, version: int, size: int) -> None:
        tensor = ids.setdefault((key, version), len(ids))
        category = memory._categories.get(key, version)
        site, module = origin.get(key, (None, None))
        events.append(
            [
                int(t),
                kind,
                tensor,
                int(size),
                category.name if category is not None else None,
                sites.setdefault(site, len(sites)) if site else -1,
                modules.setdefault(module, len(modules)) if module else -1,
            ]
        )

    for t, action, (key, version), size in memory.timeline:
        if not isinstance(key, TensorKey) or key.device != device:
            continue
        if action == Action.PREEXISTING:
            emit(t, "preexisting", key, version, size)
        elif action == Action.CREATE:
            emit(t, "create", key, version, size)
        elif action == Action.DESTROY:
            emit(t, "destroy", key, version, size)
        elif action == Action.INCREMENT_VERSION:  # the same bytes, perhaps of another category now
            emit(t, "destroy", key, version, size)
            emit(t, "create", key, version + 1, size)
    return {
        "schema": TIMELINE_SCHEMA,
        "device": str(device),
        "sites": list(sites),
        "modules": list(modules),
        "module_types": types,
        "events": events,
    }


def _origins(memory: Any, names: dict[int, str]) -> dict[Any, tuple[str | None, str | None]]:
    """TensorKey -> (the user's line, the innermost module) of its allocation, from the profiler's
    Python events around it."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import TensorKey

    out: dict[Any, tuple[str | None, str | None]] = {}
    for event in memory._op_tree.sorted_nodes:
        if event.tag != _EventType.Allocation or event.extra_fields.alloc_size <= 0:
            continue
        key = TensorKey.from_allocation(event.extra_fields)
        if key is None:
            continue
        frames: list[dict[str, Any]] = []
        module = None
        parent = event.parent
        while parent is not None:
            if parent.tag in (_EventType.PyCall, _EventType.PyCCall):
                caller = getattr(parent.extra_fields, "caller", None)
                if caller is not None:
                    frames.append(
                        {
                            "filename": caller.file_name,
                            "line": caller.line_number,
                            "name": caller.function_name,
                        }
                    )
                info = (
                    getattr(parent.extra_fields, "module", None) if parent.tag == _EventType.PyCall else None
                )
                if module is None and info is not None:
                    module = names.get(int(info.self_ptr))
            parent = parent.parent
        user = innermost_user_frame(frames)
        out[key] = (frame_text(user) if user is not None else None, module)
    return out
