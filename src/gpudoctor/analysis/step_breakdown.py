"""Each step as TensorBoard's PyTorch profiler plugin (torch-tb-profiler) broke it down, for users who read
it there: `step_breakdown(trace, windows)`. Every moment of a step goes to the first of these that is
happening (its `ProfileRole` order): a kernel on the GPU, a copy, a memset, a collective (NCCL kernels, and
c10d / nccl: / gloo: ops), a CUDA runtime or driver call, the DataLoader, a CPU op or Python frame; else
Other. So the parts add to the step. And per step the GPU's estimated SM efficiency, as the plugin
computed it — at each moment the running kernels' Kineto "blocks per SM" summed and capped at 1, averaged
over the whole step, idle included — and the kernels' estimated achieved occupancy, weighted by their time
in the step (Kineto's "est. achieved occupancy %"; as the plugin, a kernel that carries 0 counts as 0), with
their mean warps per SM. Each is None where no kernel in the step carries it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.cpu import DATALOADER
from gpudoctor.analysis.intervals import Disjoint, difference
from gpudoctor.trace.model import LAUNCH_KINDS, Kind, Trace

ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
ROLE_LABELS = {
    "kernel": "Kernel",
    "memcpy": "Memcpy",
    "memset": "Memset",
    "communication": "Communication",
    "runtime": "Runtime",
    "dataloader": "DataLoader",
    "cpu_exec": "CPU Exec",
    "other": "Other",
}
# The plugin's communication ops (`NcclOpNameSet`, `GlooOpNameSet`) and PyTorch's c10d ops since.
COMM_OPS = re.compile(r"^(nccl|gloo):|^c10d::", re.I)
_STEP_MARK = re.compile(r"^ProfilerStep#\d+$")


@dataclass(frozen=True)
class StepRoles:
    number: int
    duration_us: float
    roles_us: dict[str, float]  # by ROLES, each moment once: they add to duration_us


@dataclass(frozen=True)
class KernelEfficiency:
    number: int
    sm_efficiency_pct: float | None  # over the step, idle included (as the plugin's "Est. SM Efficiency")
    occupancy_pct: float | None  # kernel-time-weighted "est. achieved occupancy %"
    warps_per_sm: float | None  # kernel-time-weighted Kineto "warps per SM"
    kernel_us: float  # kernel time in the step
    estimated_us: float  # of it, in kernels that carry blocks per SM (what SM efficiency rests on)
    occupancy_us: float = 0.0  # of it, in kernels that carry an occupancy (what occupancy rests on)


@dataclass(frozen=True)
class StepBreakdown:
    steps: tuple[StepRoles, ...]
    efficiency: tuple[KernelEfficiency, ...]

    @property
    def mean_us(self) -> dict[str, float]:
        """Each role's mean time per step."""
        n = max(len(self.steps), 1)
        return {r: sum(s.roles_us[r] for s in self.steps) / n for r in ROLES}

    @property
    def mean_step_us(self) -> float:
        return sum(s.duration_us for s in self.steps) / max(len(self.steps), 1)

    def mean_of(self, field: str) -> float | None:
        """The kernel-time-weighted mean over the steps of occupancy or warps per SM (the time of the kernels
        that carry them); None where no step has it."""
        pairs = [
            (getattr(e, field), e.occupancy_us) for e in self.efficiency if getattr(e, field) is not None
        ]
        weight = sum(w for _, w in pairs)
        if not pairs:
            return None
        return sum(v * w for v, w in pairs) / weight if weight > 0 else sum(v for v, _ in pairs) / len(pairs)

    @property
    def mean_sm_efficiency_pct(self) -> float | None:
        """Over all the steps' time, as the plugin's overview gives it."""
        known = [
            (e.sm_efficiency_pct, s.duration_us) for e, s in zip(self.efficiency, self.steps, strict=True)
        ]
        known = [(v, d) for v, d in known if v is not None]
        total = sum(d for _, d in known)
        return sum(v * d for v, d in known) / total if known and total > 0 else None


def step_breakdown(trace: Trace, windows: list[tuple[int, float, float]]) -> StepBreakdown | None:
    """Per (number, start, end) window (the steps' windows, or the traced time as one): its time by role
    and its kernels' estimated efficiency. None without windows."""
    if not windows:
        return None
    a = np.array([w[1] for w in windows])
    b = np.array([w[2] for w in windows])
    taken = Disjoint.of(np.zeros(0), np.zeros(0))
    spent: dict[str, np.ndarray] = {}
    for role, spans in _role_spans(trace):
        own = difference(spans, taken)
        spent[role] = own.covered(a, b)
        taken = Disjoint.of(
            np.concatenate((taken.start, spans.start)), np.concatenate((taken.end, spans.end))
        )
    duration = b - a
    spent["other"] = np.maximum(duration - sum(spent.values()), 0.0)
    steps = tuple(
        StepRoles(n, float(duration[i]), {r: float(spent[r][i]) for r in ROLES})
        for i, (n, _, _) in enumerate(windows)
    )
    return StepBreakdown(steps, _efficiency(trace, windows))


def _role_spans(trace: Trace) -> list[tuple[str, Disjoint]]:
    """Each role's union of spans, in the plugin's order (Other is what none covers)."""

    def spans(rows: np.ndarray) -> Disjoint:
        return Disjoint.of(trace.ts[rows], trace.ts[rows] + trace.dur[rows])

    kernels = trace.rows(Kind.KERNEL)
    comm = classify.name_mask(trace, classify.COMMUNICATION, kernels)[trace.name[kernels]]
    host = trace.rows(Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON)
    host = host[~classify.name_mask(trace, _STEP_MARK, host)[trace.name[host]]]
    loader = classify.name_mask(trace, DATALOADER, host)[trace.name[host]]
    comm_ops = classify.name_mask(trace, COMM_OPS, host)[trace.name[host]]
    return [
        ("kernel", spans(kernels[~comm])),
        ("memcpy", spans(trace.rows(Kind.MEMCPY))),
        ("memset", spans(trace.rows(Kind.MEMSET))),
        ("communication", spans(np.concatenate((kernels[comm], host[comm_ops])))),
        ("runtime", spans(trace.rows(*LAUNCH_KINDS))),
        ("dataloader", spans(host[loader & ~comm_ops])),
        ("cpu_exec", spans(host[~loader & ~comm_ops])),
    ]


def _efficiency(trace: Trace, windows: list[tuple[int, float, float]]) -> tuple[KernelEfficiency, ...]:
    kernels = trace.rows(Kind.KERNEL)
    start, end = trace.ts[kernels], trace.ts[kernels] + trace.dur[kernels]
    bps = np.nan_to_num(trace.blocks_per_sm[kernels].astype(np.float64), nan=0.0)
    occ = trace.occupancy[kernels].astype(np.float64)  # NaN: not in the trace
    warps = trace.warps_per_sm[kernels].astype(np.float64)
    times, level = _sm_fill(start[bps > 0], end[bps > 0], bps[bps > 0])
    out = []
    for n, a, b in windows:
        inside = np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None)
        kernel_us = float(inside.sum())
        estimated = float(inside[bps > 0].sum())
        sm = None
        if estimated > 0 and b > a:
            lo, hi = np.clip(times[:-1], a, b), np.clip(times[1:], a, b)
            sm = 100.0 * float((level * (hi - lo)).sum()) / (b - a)
        carried = float(inside[~np.isnan(occ)].sum())
        occupancy, warps_per_sm = _weighted(occ, inside), _weighted(warps, inside)
        out.append(KernelEfficiency(n, sm, occupancy, warps_per_sm, kernel_us, estimated, carried))
    return tuple(out)


def _sm_fill(start: np.ndarray, end: np.ndarray, bps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plugin's approximated SM efficiency as a step function: breakpoints, and between each pair
    the running kernels' blocks per SM summed, capped at 1."""
    if not len(start):
        return np.zeros(1), np.zeros(0)
    t = np.concatenate((start, end))
    delta = np.concatenate((bps, -bps))
    order = np.lexsort((np.concatenate((np.zeros(len(start)), np.ones(len(end)))), t))  # starts first
    t, delta = t[order], delta[order]
    level = np.clip(np.cumsum(delta)[:-1], 0.0, 1.0)
    return t, level


def _weighted(values: np.ndarray, weights: np.ndarray) -> float | None:
    ok = ~np.isnan(values) & (values >= 0) & (weights > 0)
    return float(np.average(values[ok], weights=weights[ok])) if ok.any() else None
