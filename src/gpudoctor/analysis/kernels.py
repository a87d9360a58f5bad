"""GPU kernels: the top kernels by total time, how small kernels are, how long launches wait, and
how much matmul / convolution time runs on tensor cores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import Kind, Trace

SHORT_KERNEL_US = 10.0


@dataclass(frozen=True)
class KernelStat:
    name: str
    calls: int
    total_us: float
    mean_us: float
    median_us: float
    share: float  # of all kernel time
    est_occupancy_pct: float | None  # duration-weighted mean of Kineto's estimate
    blocks_per_sm: float | None  # duration-weighted mean
    grid: tuple[int, int, int] | None  # of the longest call
    block: tuple[int, int, int] | None
    category: str  # one of classify.KERNEL_CATEGORIES or 'other'
    tensor_cores: bool | None  # None where the name does not tell


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution | None:
        if not len(values):
            return None
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return cls(len(values), float(values.mean()), float(p50), float(p90), float(p99), float(values.max()))


@dataclass(frozen=True)
class KernelReport:
    count: int
    total_us: float
    distinct: int
    top: tuple[KernelStat, ...]
    short_count_share: float  # share of kernels under SHORT_KERNEL_US
    short_time_share: float  # share of kernel time in them
    launch_delay_us: Distribution | None  # kernel start − start of its launching call
    matmul_us: float
    convolution_us: float
    tensor_core_share: float | None  # of matmul + convolution time, where the names tell
    no_tensor_core_us: float  # matmul + convolution time in kernels that say they use no tensor cores
    time_by_category_us: dict[str, float]  # every kernel, by classify.KERNEL_CATEGORIES
    under_one_wave_us: float  # time in kernels with fewer blocks than SMs (Kineto's blocks per SM < 1)
    under_one_wave_fill: float | None  # their duration-weighted mean blocks per SM: the share of SMs used
    nchw_normalization_us: float  # normalization kernels of the NCHW layout (not channels_last / NHWC)
    # matmul + convolution time in TF32 tensor-core kernels (float32 tensors), by their names
    tf32_us: float = 0.0


def kernel_report(trace: Trace, window: tuple[float, float] | None = None, top: int = 15) -> KernelReport:
    """Kernels that start inside `window` (default: all), the `top` by total time in detail."""
    rows = trace.rows(Kind.KERNEL)
    if window is not None:
        rows = rows[(trace.ts[rows] >= window[0]) & (trace.ts[rows] < window[1])]
    if not len(rows):
        return KernelReport(0, 0.0, 0, (), 0.0, 0.0, None, 0.0, 0.0, None, 0.0, {}, 0.0, None, 0.0)
    dur = trace.dur[rows]
    total = float(dur.sum())
    names = trace.name[rows]
    ids, inverse = np.unique(names, return_inverse=True)
    per_total = np.bincount(inverse, weights=dur)
    counts = np.bincount(inverse)
    order = np.argsort(-per_total)
    sort_by_group = np.lexsort((dur, inverse))
    bounds = np.concatenate(([0], np.cumsum(counts)))
    category = classify.kernel_category(trace)
    channels_last = classify.name_mask(trace, classify.CHANNELS_LAST, rows)
    tc = classify.name_mask(trace, classify.TENSOR_CORE, rows)
    not_tc = classify.name_mask(trace, classify.NOT_TENSOR_CORE, rows)
    tf32 = classify.name_mask(trace, classify.TF32, rows) & ~classify.name_mask(
        trace, classify.REDUCED_PRECISION, rows
    )

    def stat(g: int) -> KernelStat:
        members = rows[sort_by_group[bounds[g] : bounds[g + 1]]]
        d = trace.dur[members]
        longest = members[-1]
        name_id = int(ids[g])
        weights = d if d.sum() > 0 else None
        return KernelStat(
            name=trace.names[name_id],
            calls=int(counts[g]),
            total_us=float(per_total[g]),
            mean_us=float(per_total[g] / counts[g]),
            median_us=float(np.median(d)),
            share=float(per_total[g] / total) if total > 0 else 0.0,
            est_occupancy_pct=_weighted(trace.occupancy[members], weights),
            blocks_per_sm=_weighted(trace.blocks_per_sm[members], weights),
            grid=_dims(trace.grid[longest]),
            block=_dims(trace.block[longest]),
            category=str(category[name_id]),
            tensor_cores=_tensor_cores(bool(tc[name_id]), bool(not_tc[name_id])),
        )

    cat = category[names]
    is_conv, is_mm = cat == "convolution", cat == "matmul"
    heavy = is_mm | is_conv
    by_category = {str(c): float(dur[cat == c].sum()) for c in np.unique(cat)}
    bps = trace.blocks_per_sm[rows]
    under = (bps > 0) & (bps < 1) & (cat != "communication")  # NCCL runs few blocks by design
    known = heavy & (tc[names] | not_tc[names])
    heavy_known_us = float(dur[known].sum())
    tc_us = float(dur[known & tc[names] & ~not_tc[names]].sum())
    launch = launch_rows(trace, rows)
    linked = launch >= 0
    delay = trace.ts[rows[linked]] - trace.ts[launch[linked]]
    short = dur < SHORT_KERNEL_US
    return KernelReport(
        count=len(rows),
        total_us=total,
        distinct=len(ids),
        top=tuple(stat(int(g)) for g in order[:top]),
        short_count_share=float(short.mean()),
        short_time_share=float(dur[short].sum() / total) if total > 0 else 0.0,
        launch_delay_us=Distribution.of(delay),
        matmul_us=float(dur[is_mm].sum()),
        convolution_us=float(dur[is_conv].sum()),
        tensor_core_share=tc_us / heavy_known_us if heavy_known_us > 0 else None,
        no_tensor_core_us=float(dur[heavy & not_tc[names]].sum()),
        time_by_category_us=by_category,
        under_one_wave_us=float(dur[under].sum()),
        under_one_wave_fill=float(np.average(bps[under], weights=dur[under]))
        if dur[under].sum() > 0
        else None,
        nchw_normalization_us=float(dur[(cat == "normalization") & ~channels_last[names]].sum()),
        tf32_us=float(dur[heavy & tf32[names] & ~not_tc[names]].sum()),
    )


def _weighted(values: np.ndarray, weights: np.ndarray | None) -> float | None:
    ok = ~np.isnan(values) & (values > 0)  # Kineto writes 0 where it could not estimate
    if not ok.any():
        return None
    if weights is None:
        return float(values[ok].mean())
    w = weights[ok]
    return float(np.average(values[ok], weights=w)) if w.sum() > 0 else float(values[ok].mean())


def _dims(d: np.ndarray) -> tuple[int, int, int] | None:
    if not d.any():
        return None
    return (int(d[0]), int(d[1]), int(d[2]))


def _tensor_cores(tc: bool, not_tc: bool) -> bool | None:
    if not_tc:
        return False
    if tc:
        return True
    return None
