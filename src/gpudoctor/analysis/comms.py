"""`comm_report(trace, steps, window)`: one rank's collectives — each call torch.distributed recorded
(`record_param_comms`) joined to its kernel, its algorithm and bus bandwidth as NCCL-tests defines them,
per message size; and per step, the communication that ran beside compute and alone, by collective. On a
rank that waits for another a collective's kernel is mostly waiting: across ranks, `analysis.across_ranks`
takes each call's shortest kernel as its transfer time."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.intervals import Disjoint, union
from gpudoctor.device.links import Link
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import Kind, Trace
from gpudoctor.trace.steps import Step

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")
# From kernel names (NCCL: ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_AllGather_RING_LL_Sum_bf16;
# RCCL alike), most specific first.
_KERNEL_COLLECTIVE = (
    ("all_reduce", re.compile(r"AllReduce", re.I)),
    ("reduce_scatter", re.compile(r"ReduceScatter", re.I)),
    ("all_gather", re.compile(r"AllGather", re.I)),
    ("all_to_all", re.compile(r"AllToAll", re.I)),
    ("send_recv", re.compile(r"SendRecv|_Send|_Recv", re.I)),
    ("broadcast", re.compile(r"Broadcast", re.I)),
    ("reduce", re.compile(r"_Reduce", re.I)),
)
_ALGORITHM = re.compile(
    r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)"
)
# record_param_comms' "Collective name", normalized (lower case, no underscores) -> collective
_CALL_COLLECTIVE = (
    ("allreduce", "all_reduce"),
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("reduce", "reduce"),
)
ELEMENT_BYTES = {
    "Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}  # fmt: skip


def bus_factor(collective: str, n: int) -> float:
    """NCCL-tests' bus bandwidth factor: what turns algorithm bandwidth into the rate each link carries
    (docs/PERFORMANCE.md of nccl-tests): all-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all
    (n−1)/n; broadcast, reduce, send/recv 1. 0 for a group of one (nothing crosses a link)."""
    if n <= 1:
        return 0.0
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class CommCall:
    """One collective call and its kernel. `step`/`order` identify it across ranks: ranks issue their
    collectives in the same order, so the k-th call of step N is the same collective on every rank."""

    step: int | None  # the ProfilerStep#N it was issued in (None outside steps or without them)
    order: int  # its position among that step's calls
    collective: str  # one of COLLECTIVES, or the recorded name
    group: str  # process group name
    group_size: int
    bytes: int  # message size S (NCCL-tests' convention)
    start_us: float | None  # its kernels' first start and total time (None: no kernel in the trace)
    dur_us: float | None


@dataclass(frozen=True)
class CollectiveStat:
    """The calls of one collective, group size and message size, with their kernel times."""

    collective: str
    group_size: int
    bytes: int
    calls: int
    total_us: float
    median_us: float
    min_us: float
    algbw_median: float  # bytes/s
    busbw_median: float
    busbw_best: float  # of its shortest call: the least waiting for other ranks


@dataclass(frozen=True)
class CommStep:
    number: int
    calls: int
    bytes: int
    comm_us: float  # union of the communication kernels in the step's window
    exposed_us: float  # of it, with no compute kernel beside it
    exposed_by_collective_us: dict[str, float]

    @property
    def overlapped_us(self) -> float:
        return max(self.comm_us - self.exposed_us, 0.0)


@dataclass(frozen=True)
class CommReport:
    calls: tuple[CommCall, ...]  # issue order, those with a kernel in the window or issued in a step
    collectives: tuple[CollectiveStat, ...]  # by total kernel time
    steps: tuple[CommStep, ...]  # one per profiled step
    comm_by_collective_us: dict[str, float]  # window: each collective's kernels, union
    exposed_by_collective_us: dict[str, float]  # window: of it, with no compute beside
    algorithms: tuple[str, ...]  # NCCL algorithm_protocol of the kernels, by time ("RING_LL")
    unlinked_kernels: int  # communication kernels whose call is not in the trace (launched before it)
    link: Link | None  # what the bandwidth is judged against (NVML or the reference table)


def comm_report(
    trace: Trace, steps: tuple[Step, ...], window: tuple[float, float] | None, link: Link | None = None
) -> CommReport | None:
    """The collectives of the window (default: the whole trace); None without communication kernels
    and recorded calls."""
    kernels = trace.rows(Kind.KERNEL)
    comm = classify.rows_matching(trace, kernels, classify.COMMUNICATION)
    if window is not None:
        comm = comm[(trace.ts[comm] >= window[0]) & (trace.ts[comm] < window[1])]
    if not len(comm) and not len(trace.comm_calls):
        return None
    kinds = _kernel_collectives(trace, comm)
    call_of = _call_of_kernel(trace, comm)
    calls = _calls(trace, steps, comm, call_of)
    compute = _compute(trace, kernels, window)
    comm_by, exposed_by = {}, {}
    for kind in dict.fromkeys(kinds.tolist()):
        mine = comm[kinds == kind]
        total, exposed = _exposed(trace.ts[mine], trace.ts[mine] + trace.dur[mine], compute, window)
        comm_by[kind], exposed_by[kind] = total, exposed
    return CommReport(
        calls=calls,
        collectives=_stats(calls),
        steps=_steps(trace, steps, comm, kinds, calls, compute),
        comm_by_collective_us=comm_by,
        exposed_by_collective_us=exposed_by,
        algorithms=_algorithms(trace, comm),
        unlinked_kernels=int((call_of < 0).sum()),
        link=link,
    )


def call_collective(name: str) -> str:
    key = name.lower().replace("_", "")
    for needle, collective in _CALL_COLLECTIVE:
        if needle in key:
            return collective
    return name or "other"


def _kernel_collectives(trace: Trace, rows: np.ndarray) -> np.ndarray:
    ids, inverse = np.unique(trace.name[rows], return_inverse=True)
    per_name = np.array([_kernel_collective(trace.names[i]) for i in ids.tolist()] or ["other"], dtype=object)
    return per_name[inverse] if len(rows) else np.array([], dtype=object)


def _kernel_collective(name: str) -> str:
    return next((c for c, pattern in _KERNEL_COLLECTIVE if pattern.search(name)), "other")


def _call_of_kernel(trace: Trace, comm: np.ndarray) -> np.ndarray:
    """For each communication kernel, the index of its recorded call (-1 if none): kernel → launch
    (correlation) → the launch's External id → the record_param_comms op with that id."""
    calls = trace.comm_calls
    out = np.full(len(comm), -1, dtype=np.int64)
    if not len(calls) or not len(comm):
        return out
    launch = launch_rows(trace, comm)
    ext = np.where(launch >= 0, trace.external_id[np.maximum(launch, 0)], -1)
    order = np.argsort(calls.external_id, kind="stable")
    keys = calls.external_id[order]
    pos = np.minimum(np.searchsorted(keys, ext), len(keys) - 1)
    hit = (ext >= 0) & (keys[pos] == ext)
    out[hit] = order[pos[hit]]
    return out


def _calls(
    trace: Trace, steps: tuple[Step, ...], comm: np.ndarray, call_of: np.ndarray
) -> tuple[CommCall, ...]:
    c = trace.comm_calls
    if not len(c):
        return ()
    start = np.full(len(c), np.nan)
    end = np.full(len(c), np.nan)
    busy = np.zeros(len(c))
    linked = call_of >= 0
    k_start, k_end = trace.ts[comm][linked], (trace.ts[comm] + trace.dur[comm])[linked]
    idx = call_of[linked]
    np.fmin.at(start, idx, k_start)
    np.fmax.at(end, idx, k_end)
    np.add.at(busy, idx, trace.dur[comm][linked])
    step_of = _step_of(steps, c.ts)
    out, order_in_step = [], {}
    for i in range(len(c)):
        if step_of[i] is None and np.isnan(start[i]):
            continue  # issued outside the profiled steps, its kernel not in the window
        collective = call_collective(c.collective[i])
        if collective == "other" or c.collective[i].lower() == "barrier":
            continue
        order = order_in_step.get(step_of[i], 0)
        order_in_step[step_of[i]] = order + 1
        n = int(c.group_size[i])
        nelems = _message_nelems(collective, int(c.in_nelems[i]), int(c.out_nelems[i]), n)
        size = nelems * ELEMENT_BYTES.get(c.dtype[i], 0) if nelems > 0 else 0
        has = not np.isnan(start[i])
        out.append(
            CommCall(step_of[i], order, collective, c.group[i], n, size,
                     float(start[i]) if has else None, float(busy[i]) if has else None)
        )  # fmt: skip
    return tuple(out)


def _message_nelems(collective: str, n_in: int, n_out: int, group: int) -> int:
    if collective == "all_gather":
        return max(n_out, n_in * group if n_in > 0 and group > 0 else -1)
    if collective == "reduce_scatter":
        return max(n_in, n_out * group if n_out > 0 and group > 0 else -1)
    return n_in if n_in > 0 else n_out


def _step_of(steps: tuple[Step, ...], ts: np.ndarray) -> list[int | None]:
    out: list[int | None] = [None] * len(ts)
    for s in steps:
        for i in np.flatnonzero((ts >= s.start_us) & (ts < s.end_us)).tolist():
            out[i] = s.number
    return out


def _stats(calls: tuple[CommCall, ...]) -> tuple[CollectiveStat, ...]:
    groups: dict[tuple[str, int, int], list[float]] = {}
    for c in calls:
        if c.dur_us is not None and c.dur_us > 0 and c.bytes > 0:
            groups.setdefault((c.collective, c.group_size, c.bytes), []).append(c.dur_us)
    out = []
    for (collective, n, size), times in groups.items():
        median, fastest = statistics.median(times), min(times)
        factor = bus_factor(collective, n)
        out.append(
            CollectiveStat(collective, n, size, len(times), sum(times), median, fastest,
                           size / (median * 1e-6), factor * size / (median * 1e-6), factor * size / (fastest * 1e-6))
        )  # fmt: skip
    return tuple(sorted(out, key=lambda s: -s.total_us))


def _compute(trace: Trace, kernels: np.ndarray, window: tuple[float, float] | None) -> Disjoint:
    labels = classify.gpu_activity_label(trace, kernels)
    mine = kernels[labels == "compute"]
    return Disjoint.of(trace.ts[mine], trace.ts[mine] + trace.dur[mine])


def _exposed(
    start: np.ndarray, end: np.ndarray, compute: Disjoint, window: tuple[float, float] | None
) -> tuple[float, float]:
    """(union of the intervals, the part of it no compute covers), clipped to the window."""
    s, e = union(start, end)
    if window is not None:
        s, e = np.clip(s, *window), np.clip(e, *window)
    total = float((e - s).sum())
    return total, total - float(compute.covered(s, e).sum())


def _steps(
    trace: Trace,
    steps: tuple[Step, ...],
    comm: np.ndarray,
    kinds: np.ndarray,
    calls: tuple[CommCall, ...],
    compute: Disjoint,
) -> tuple[CommStep, ...]:
    start, end = trace.ts[comm], trace.ts[comm] + trace.dur[comm]
    out = []
    for s in steps:
        window = (s.window_start_us, s.window_end_us)
        total, exposed = _exposed(start, end, compute, window)
        by_kind = {}
        for kind in dict.fromkeys(kinds.tolist()):
            mine = kinds == kind
            by_kind[kind] = _exposed(start[mine], end[mine], compute, window)[1]
        mine_calls = [c for c in calls if c.step == s.number]
        out.append(
            CommStep(s.number, len(mine_calls), sum(c.bytes for c in mine_calls), total, exposed, by_kind)
        )
    return tuple(out)


def _algorithms(trace: Trace, comm: np.ndarray) -> tuple[str, ...]:
    time: dict[str, float] = {}
    for row in comm.tolist():
        m = _ALGORITHM.search(trace.names[int(trace.name[row])])
        if m:
            key = f"{m.group(1)}_{m.group(2)}"
            time[key] = time.get(key, 0.0) + float(trace.dur[row])
    return tuple(sorted(time, key=lambda k: -time[k]))
