"""Host-device synchronizations: which calls blocked the host, how long, which op caused them and,
where the trace has Python stacks, the user's source line."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.trace.links import enclosing_rows, gpu_rows_of_launch, python_stack, user_frame
from gpudoctor.trace.model import LAUNCH_KINDS, Kind, Trace
from gpudoctor.trace.steps import Step

# Host and device clocks in a Kineto trace agree to about a microsecond; a call that returned this
# much before its copy ended still waited for it.
SYNC_TOLERANCE_US = 2.0


@dataclass(frozen=True)
class SyncSite:
    """All synchronizations made by one call from one place."""

    call: str  # cudaStreamSynchronize, cudaMemcpyAsync (blocking), ...
    kind: str  # 'synchronize', or the blocking copy's direction: 'copy_h2d', 'copy_d2h', 'copy_d2d', 'copy_other'
    op: str | None  # the outermost CPU op around the call, e.g. aten::item
    inner_op: str | None  # the innermost, e.g. aten::_local_scalar_dense
    source: str | None  # the user's frame, e.g. "train.py(42): train_step"
    stack: tuple[str, ...]  # Python frames, innermost first (empty without with_stack)
    count: int
    total_us: float  # host time blocked in these calls
    max_us: float


@dataclass(frozen=True)
class SyncReport:
    count: int
    total_us: float
    per_step: float | None  # syncs per profiled step
    blocking_copies: int  # asynchronous copies that still blocked the host
    sites: tuple[SyncSite, ...]  # by total blocked time, longest first


def host_sync_rows(trace: Trace) -> np.ndarray:
    """Runtime calls that block the host until the GPU catches up: explicit synchronizations,
    synchronous copies, and asynchronous copies that nonetheless returned only after their copy
    ended (a device-to-host copy into pageable memory)."""
    return np.union1d(_explicit_syncs(trace), _blocking_copies(trace))


def _explicit_syncs(trace: Trace) -> np.ndarray:
    return classify.rows_matching(trace, trace.rows(*LAUNCH_KINDS), classify.SYNC_CALLS)


def _blocking_copies(trace: Trace) -> np.ndarray:
    launches = trace.rows(*LAUNCH_KINDS)
    copies = classify.rows_matching(trace, launches, classify.COPY_CALLS)
    copies = copies[~classify.name_mask(trace, classify.SYNC_CALLS, copies)[trace.name[copies]]]
    if not len(copies):
        return copies
    target = gpu_rows_of_launch(trace, copies)
    ok = target >= 0
    copies, target = copies[ok], target[ok]
    call_end = trace.ts[copies] + trace.dur[copies]
    copy_end = trace.ts[target] + trace.dur[target]
    return copies[call_end >= copy_end - SYNC_TOLERANCE_US]


def _sync_kinds(trace: Trace, rows: np.ndarray) -> list[str]:
    """'synchronize' for explicit syncs; for copies that blocked, 'copy_' + the copy's direction."""
    target = gpu_rows_of_launch(trace, rows)
    out = []
    for r, t in zip(rows.tolist(), target.tolist(), strict=True):
        if t < 0 or "Synchronize" in trace.name_of(r):
            out.append("synchronize")
        else:
            out.append("copy_" + classify.copy_direction(trace.name_of(t)))
    return out


def sync_report(trace: Trace, steps: tuple[Step, ...]) -> SyncReport:
    rows = host_sync_rows(trace)
    blocking = len(_blocking_copies(trace))
    if steps:  # only what happened inside the profiled steps
        inside = (trace.ts[rows] >= steps[0].start_us) & (trace.ts[rows] < steps[-1].end_us)
        rows = rows[inside]
    if not len(rows):
        return SyncReport(0, 0.0, 0.0 if steps else None, blocking, ())
    ops = trace.rows(Kind.CPU_OP)
    inner = enclosing_rows(trace, ops, rows)
    outer = enclosing_rows(trace, ops, rows, outermost=True)
    has_stacks = len(trace.rows(Kind.PYTHON)) > 0
    kinds = _sync_kinds(trace, rows)
    groups: dict[tuple[str, str, str | None, str | None, str | None], list[int]] = {}
    stacks: dict[tuple[str, str, str | None, str | None, str | None], tuple[str, ...]] = {}
    for i, r in enumerate(rows.tolist()):
        stack = tuple(python_stack(trace, r)) if has_stacks else ()
        key = (
            trace.name_of(r),
            kinds[i],
            trace.name_of(int(outer[i])) if outer[i] >= 0 else None,
            trace.name_of(int(inner[i])) if inner[i] >= 0 else None,
            user_frame(list(stack)),
        )
        groups.setdefault(key, []).append(r)
        stacks.setdefault(key, stack)
    sites = []
    for key, members in groups.items():
        durs = trace.dur[np.array(members)]
        sites.append(SyncSite(*key, stacks[key], len(members), float(durs.sum()), float(durs.max())))
    sites.sort(key=lambda s: -s.total_us)
    total = float(trace.dur[rows].sum())
    per_step = len(rows) / len(steps) if steps else None
    return SyncReport(len(rows), total, per_step, blocking, tuple(sites))
