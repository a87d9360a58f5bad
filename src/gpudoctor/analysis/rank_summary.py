"""`summarize_rank(analysis, ...) -> RankSummary`: what the ranks of a distributed run are compared on,
small enough to send back from a worker that analyzed one rank (a few KB against the trace's hundreds
of MB): the rank's figures (`analysis.ranks.RankFigures`), its host time per step by where it went,
its top kernels with their grids, each collective call with its kernel time, its clocks from NVML
(a `gpudoctor run` record) and its top findings. Serializable (schema `gpudoctor.rank-summary/1`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpudoctor.analysis.comms import CommCall
from gpudoctor.analysis.cpu import CpuStep
from gpudoctor.analysis.ranks import RankFigures, rank_figures
from gpudoctor.analysis.summary import Analysis
from gpudoctor.device.links import Link
from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.rank-summary/1"
TOP_KERNELS = 30
MIN_UTIL_SAMPLES = 5  # NVML samples (0.1 s apart) before the light phase's utilization counts


@dataclass(frozen=True)
class TopFinding:
    """One of the rank's findings, as the ranks table shows it (analysis does not import rules)."""

    id: str
    est_saving_pct: float
    title: str


@dataclass(frozen=True)
class KernelSig:
    """A compute kernel of the rank, per step: what two ranks doing the same work share (its name and
    grid) and what tells them apart (its time)."""

    name: str
    calls_per_step: float
    us_per_step: float
    grid: tuple[int, int, int] | None  # of its longest call


@dataclass(frozen=True)
class Clocks:
    """The GPU's clocks during the run's light phase, from NVML (`gpudoctor run` records them), and how
    busy it was then (unprofiled: the share of time a kernel ran, a collective's waiting kernel included)."""

    sm_busy_mean_mhz: float | None  # mean SM clock while utilization was ≥ 50%
    sm_max_mhz: int | None
    slowdown_shares: dict[str, float]  # reason -> share of samples (gpu_idle excluded)
    util_mean_pct: float | None = None  # NVML utilization, mean over the light phase's samples

    @classmethod
    def from_nvml_summary(cls, summary: dict[str, Any] | None) -> Clocks | None:
        """From a record's `nvml_summary` (MonitorSummary JSON): its most sampled GPU's clocks."""
        devices = (summary or {}).get("devices") or []
        devices = [d for d in devices if isinstance(d, dict)]
        if not devices:
            return None
        d = max(devices, key=lambda d: d.get("samples") or 0)
        shares = d.get("slowdown_shares") or {}
        util = d.get("gpu_util_mean_pct")
        # the utilization only where the rank's own GPU was the one watched: a rank that watched every
        # GPU of its node (its own not found by UUID) cannot say which is its own
        own = len(devices) == 1 and (d.get("samples") or 0) >= MIN_UTIL_SAMPLES
        return cls(
            d.get("sm_clock_busy_mean_mhz"),
            d.get("sm_max_mhz"),
            {str(k): float(v) for k, v in shares.items() if isinstance(v, (int, float))},
            float(util) if own and isinstance(util, (int, float)) else None,
        )


@dataclass(frozen=True)
class RankSummary(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor rank summary"

    rank: int
    path: str
    world_size: int | None
    device_name: str | None
    figures: RankFigures
    unprofiled_step_us: float | None  # the light phase's median (gpudoctor run), when known
    # Host per step (means over the profiled steps, as traced): in the DataLoader, and in neither a
    # PyTorch op, the DataLoader nor a call that waits for the GPU (the script's own Python) within the
    # host's span of each step (`CpuStep.span_us`, not its window), less the long gaps that open with
    # hundreds of launches queued (the host ahead of its GPU: `CpuStep.ahead_us`).
    dataloader_us: float
    host_other_us: float
    host_top_frame: str | None  # the user frame holding most of that time (with_stack traces)
    compute_us: float | None  # compute no communication or copy hides, per step
    kernels: tuple[KernelSig, ...]  # the top compute kernels by time
    calls: tuple[CommCall, ...]  # the collectives issued in the profiled steps
    comm_exposed_us: float | None  # per step, mean
    comm_overlapped_us: float | None
    exposed_by_collective_us: dict[str, float]  # per step, mean
    algorithms: tuple[str, ...]
    link: Link | None
    clocks: Clocks | None
    top_findings: tuple[TopFinding, ...]
    # The worker's own cost, where a pool made the summary (benchmarks/ranks_parallel.py reports them).
    seconds: float | None = None
    peak_rss_bytes: int | None = None
    schema: str = field(default=SCHEMA)


def _span(c: CpuStep) -> float:
    return c.span_us if c.span_us is not None else c.duration_us


def summarize_rank(
    a: Analysis, top_findings: tuple[TopFinding, ...] = (), clocks: Clocks | None = None
) -> RankSummary:
    """The rank's summary from its analysis; `top_findings` from its diagnosis, `clocks` from NVML."""
    steps = a.steps
    n = len(steps) or 1
    cpu = [s.cpu for s in steps]
    host_other = [  # within the host's own span: the rest of a longer window is its GPU's lag
        max(_span(c) - c.cpu_ops_us - c.dataloader_us - c.sync_us - c.ahead_us, 0.0) for c in cpu
    ]
    figures = rank_figures(a)
    compute = None
    if figures.compute_share is not None:
        compute = figures.compute_share * (figures.step_p50_us or (a.window.window_us if a.window else 0.0))
    comms = a.comms
    comm_steps = comms.steps if comms is not None else ()
    return RankSummary(
        rank=a.trace.rank,
        path=a.trace.path,
        world_size=a.trace.world_size,
        device_name=a.device.name if a.device is not None else None,
        figures=figures,
        unprofiled_step_us=a.unprofiled_step_us,
        dataloader_us=sum(c.dataloader_us for c in cpu) / n,
        host_other_us=sum(host_other) / n,
        host_top_frame=a.host_gaps[0].frame if a.host_gaps else None,
        compute_us=compute,
        kernels=_kernels(a, n),
        calls=tuple(c for c in comms.calls if c.step is not None) if comms is not None else (),
        comm_exposed_us=statistics.fmean(s.exposed_us for s in comm_steps) if comm_steps else None,
        comm_overlapped_us=statistics.fmean(s.overlapped_us for s in comm_steps) if comm_steps else None,
        exposed_by_collective_us=_mean_by_collective(comm_steps),
        algorithms=comms.algorithms if comms is not None else (),
        link=comms.link if comms is not None else None,
        clocks=clocks,
        top_findings=top_findings,
    )


def _kernels(a: Analysis, steps: int) -> tuple[KernelSig, ...]:
    out = []
    for k in a.kernels.top[:TOP_KERNELS]:
        if k.category == "communication":
            continue
        out.append(KernelSig(k.name, k.calls / steps, k.total_us / steps, k.grid))
    return tuple(out)


def _mean_by_collective(steps: tuple[Any, ...]) -> dict[str, float]:
    if not steps:
        return {}
    kinds = {k for s in steps for k in s.exposed_by_collective_us}
    return {k: sum(s.exposed_by_collective_us.get(k, 0.0) for s in steps) / len(steps) for k in sorted(kinds)}
