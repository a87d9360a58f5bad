"""The roofline of the top kernels: each kernel's achieved FLOP/s against its arithmetic intensity, under the
device's measured ceilings. A kernel carries the work of the innermost enclosing op whose work is known
(`opwork`), once (an op holding another of its kind gives nothing of its own); an op's work is split among
its math kernels by their share of its time, its helper kernels carrying none; a kernel of an unknown op
is left off: nothing is guessed. The rules: docs/analysis.md, "Roofline of the top kernels"."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.opwork import FAMILIES, OpWork, op_family, op_work
from gpudoctor.device.ceilings import Ceilings
from gpudoctor.trace.links import op_parents, op_rows, op_subtrees
from gpudoctor.trace.model import Kind, Trace
from gpudoctor.util.units import fmt_bytes

TOP_POINTS = 20
MATH_FAMILIES = ("matmul", "convolution", "attention")


@dataclass(frozen=True)
class RooflinePoint:
    kernel: str
    op: str  # the op whose work it carries (the one with the most time, if several)
    family: str  # matmul, convolution, attention or elementwise
    dtype: str  # of the math: "bfloat16", "tf32", "float32", ...
    peak: str  # the FLOP/s ceiling that applies: a key of RooflineCeilings.flops
    calls: int
    time_us: float  # of the calls with known work
    flops: float
    bytes: float
    flops_from_trace: bool  # Kineto's own `flops` arg (with_flops), not a formula over shapes
    split: bool  # some calls' op launched other kernels too: its work was split by time
    flops_per_s: float
    bytes_per_s: float
    intensity: float  # FLOPs per byte
    attainable_flops_per_s: float | None  # min(peak, intensity × bandwidth); None without ceilings
    bound: str | None  # "memory" or "compute", by which ceiling is lower at this intensity
    ceiling_share: float | None  # achieved / attainable
    # Where ceiling_share > 1: why the kernel beats its measured ceiling (never a share over 100% unsaid)
    beyond_ceiling: str | None = None


@dataclass(frozen=True)
class RooflineCeilings:
    device_name: str
    bytes_per_s: float
    flops: dict[str, float]  # dtype -> FLOP/s
    source: str  # where the figures come from, for the reader
    copy_bytes: int = 0  # the buffer the copy ceiling was measured with (0: not recorded)
    matmul_n: int = 0  # the n of the n³ matmuls the FLOP/s ceilings were measured with
    l2_cache_bytes: int | None = None  # the GPU's L2, where the trace or the device table says


@dataclass(frozen=True)
class Roofline:
    points: tuple[RooflinePoint, ...]  # the top kernels with known work, by time
    ceilings: RooflineCeilings | None
    kernel_us: float  # all kernel time in the window
    covered_us: float  # kernel time whose work is known (on the roofline or not shown)
    shown_us: float  # kernel time of the points
    note: str  # why the roofline is empty or partial, or where its ceilings come from

    @property
    def coverage(self) -> float:
        return self.covered_us / self.kernel_us if self.kernel_us > 0 else 0.0


def roofline(
    trace: Trace,
    ceilings: Ceilings | None,
    window: tuple[float, float] | None = None,
    top: int = TOP_POINTS,
) -> Roofline:
    """The roofline of the `top` kernels by time (among those with known work) that start inside
    `window` (default: all), under `ceilings` (those of the trace's device, or None)."""
    rows = trace.rows(Kind.KERNEL)
    if window is not None:
        rows = rows[(trace.ts[rows] >= window[0]) & (trace.ts[rows] < window[1])]
    kernel_us = float(trace.dur[rows].sum())
    limits = _ceilings(ceilings)
    info = trace.device_info
    if limits is not None and info is not None and info.l2_cache_bytes:
        limits = replace(limits, l2_cache_bytes=info.l2_cache_bytes)
    if not len(rows):
        return Roofline((), limits, 0.0, 0.0, 0.0, "no kernels in this trace")
    anchor, work, from_trace = _anchors(trace, rows)
    if not (anchor >= 0).any():
        shaped = bool((trace.inputs >= 0).any()) or bool(np.isfinite(trace.flops).any())
        note = (
            "no kernel was launched by an op whose FLOPs and bytes gpudoctor derives "
            "(matmul, convolution, attention, elementwise)"
            if shaped
            else "the trace has no op shapes: profile with record_shapes=True "
            "(gpudoctor run --record-shapes) to see the roofline"
        )
        return Roofline((), limits, kernel_us, 0.0, 0.0, note)
    points, covered = _points(trace, rows, anchor, work, from_trace, limits, top)
    shown = sum(p.time_us for p in points)
    note = limits.source if limits else _no_ceilings(trace)
    return Roofline(tuple(points), limits, kernel_us, covered, shown, note)


def _ceilings(c: Ceilings | None) -> RooflineCeilings | None:
    if c is None or not (c.copy_bytes_per_s > 0):
        return None
    flops = {k: v for k, v in c.matmul_flops.items() if c.flops_for(k) is not None}
    source = c.source or f"measured on this machine {c.measured_at}".strip()
    return RooflineCeilings(c.device_name, c.copy_bytes_per_s, flops, source, c.copy_bytes, c.matmul_n)


def _no_ceilings(trace: Trace) -> str:
    info = trace.device_info
    name = info.name if info else "this trace's GPU"
    return f"no measured ceilings for {name}: run `gpudoctor bench --ceilings` on it to draw them"


def _anchors(trace: Trace, kernels: np.ndarray) -> tuple[np.ndarray, list[OpWork | None], np.ndarray]:
    """Per kernel, the position (in the CPU op rows) of the op whose work it carries, or -1; the
    work of each op position; whether its FLOPs are Kineto's own."""
    ops = trace.rows(Kind.CPU_OP)
    if not len(ops):
        return np.full(len(kernels), -1, dtype=np.int64), [], np.zeros(0, dtype=bool)
    work, from_trace = _op_work(trace, ops)
    family = np.array([FAMILIES.index(w.family) if w is not None else -1 for w in work], dtype=np.int8)
    known = family >= 0
    parent = op_parents(trace, ops)
    # holds another op of known work of its kind (aten::linear around aten::addmm; not a convolution
    # around its bias add: that is other work)
    shadowed = _holds_its_kind(trace, ops, family)
    # nearest op of known work, the op itself or its innermost enclosing one (pointer jumping)
    target = np.where(known, np.arange(len(ops)), parent)
    for _ in range(64):
        pending = np.flatnonzero((target >= 0) & ~known[np.maximum(target, 0)])
        if not len(pending):
            break
        target[pending] = target[target[pending]]
    position = np.full(len(trace), -1, dtype=np.int64)
    position[ops] = np.arange(len(ops))
    launcher = op_rows(trace, kernels)
    pos = np.where(launcher >= 0, position[np.maximum(launcher, 0)], -1)
    anchor = np.where(pos >= 0, target[np.maximum(pos, 0)], -1)
    anchor = np.where((anchor >= 0) & ~shadowed[np.maximum(anchor, 0)], anchor, -1)
    return anchor, work, from_trace


def _op_work(trace: Trace, ops: np.ndarray) -> tuple[list[OpWork | None], np.ndarray]:
    """The work of every CPU op row, computed once per distinct (name, arguments); Kineto's own FLOPs
    replace the formula's where the op, or an enclosing op of the same kind, recorded them."""
    work: list[OpWork | None] = [None] * len(ops)
    shaped = np.flatnonzero(trace.inputs[ops] >= 0)
    if len(shaped):
        key = (trace.name[ops[shaped]].astype(np.int64) << 32) | trace.inputs[ops[shaped]]
        distinct, inverse = np.unique(key, return_inverse=True)
        per_key = [op_work(trace.names[k >> 32], trace.op_inputs[k & 0xFFFFFFFF]) for k in distinct.tolist()]
        for p, k in zip(shaped.tolist(), inverse.tolist(), strict=True):
            work[p] = per_key[k]
    from_trace = np.zeros(len(ops), dtype=bool)
    flops = trace.flops[ops]
    if not (np.isfinite(flops) & (flops > 0)).any():
        return work, from_trace
    # the op's own FLOPs, else those of the nearest enclosing op of its kind, through ops of its kind
    # only (aten::conv2d around cudnn_convolution)
    source = _nearest_recorded(
        op_parents(trace, ops), _name_families(trace, ops), np.isfinite(flops) & (flops > 0)
    )
    for p in np.flatnonzero([w is not None for w in work]).tolist():
        w, q = work[p], int(source[p])
        assert w is not None
        if q >= 0:
            work[p] = OpWork(float(flops[q]), w.bytes, w.family, w.dtype)
            from_trace[p] = True
    return work, from_trace


def _holds_its_kind(trace: Trace, ops: np.ndarray, family: np.ndarray) -> np.ndarray:
    """Per op of known work, whether one of its descendants has known work of the same family: in
    preorder a descendant's index lies within the op's stretch, so a count between two bounds."""
    order, end = op_subtrees(trace, ops)
    rank = np.empty(len(ops), dtype=np.int64)
    rank[order] = np.arange(len(ops))
    out = np.zeros(len(ops), dtype=bool)
    for f in np.unique(family[family >= 0]).tolist():
        members = np.flatnonzero(family == f)
        at = np.sort(rank[members])
        inside = np.searchsorted(at, end[rank[members]], "left") - np.searchsorted(at, rank[members], "right")
        out[members] = inside > 0
    return out


def _name_families(trace: Trace, ops: np.ndarray) -> np.ndarray:
    """Per op, its family's index in FAMILIES by its name (-1: none), found once per distinct name."""
    distinct, inverse = np.unique(trace.name[ops], return_inverse=True)
    names = [op_family(trace.names[k]) for k in distinct.tolist()]
    return np.array([FAMILIES.index(f) if f else -1 for f in names], dtype=np.int8)[inverse.reshape(-1)]


def _nearest_recorded(parent: np.ndarray, family: np.ndarray, recorded: np.ndarray) -> np.ndarray:
    """Per op, the op itself if `recorded`, else the nearest ancestor that is, reached through
    ancestors of the op's family only; -1 where none. Pointer jumping: O(n log depth)."""
    safe = np.maximum(parent, 0)
    defer = ~recorded & (parent >= 0) & (family >= 0) & (family[safe] == family)
    source = np.where(recorded, np.arange(len(parent)), -1)
    ptr = np.where(defer, parent, -1)
    done = ~defer
    pending = np.flatnonzero(defer)
    while len(pending):
        up = ptr[pending]
        ready = done[up]
        source[pending[ready]] = source[up[ready]]
        done[pending[ready]] = True
        ptr[pending[~ready]] = ptr[up[~ready]]
        pending = pending[~ready]
    return source


def _points(
    trace: Trace,
    kernels: np.ndarray,
    anchor: np.ndarray,
    work: list[OpWork | None],
    from_trace: np.ndarray,
    limits: RooflineCeilings | None,
    top: int,
) -> tuple[list[RooflinePoint], float]:
    anchor = _math_kernels_only(trace, kernels, anchor, work)
    ok = anchor >= 0
    k_rows, k_anchor = kernels[ok], anchor[ok]
    dur = trace.dur[k_rows]
    # split each op instance's work among its kernels by time (equally where all took 0 µs)
    ids, inverse, counts = np.unique(k_anchor, return_inverse=True, return_counts=True)
    op_time = np.bincount(inverse, weights=dur)
    share = np.where(
        op_time[inverse] > 0, dur / np.where(op_time[inverse] > 0, op_time[inverse], 1), 1 / counts[inverse]
    )
    op_flops = np.array([work[int(a)].flops for a in ids.tolist()])
    op_bytes = np.array([work[int(a)].bytes for a in ids.tolist()])
    k_flops, k_bytes = op_flops[inverse] * share, op_bytes[inverse] * share
    k_split = counts[inverse] > 1
    names, by_name = np.unique(trace.name[k_rows], return_inverse=True)
    time_by_name = np.bincount(by_name, weights=dur)
    order = np.argsort(-time_by_name, kind="stable")[:top]
    points = []
    for g in order.tolist():
        members = np.flatnonzero(by_name == g)
        points.append(
            _point(
                trace.names[int(names[g])],
                trace,
                k_anchor[members],
                dur[members],
                float(k_flops[members].sum()),
                float(k_bytes[members].sum()),
                bool(k_split[members].any()),
                work,
                from_trace,
                limits,
            )
        )
    return [p for p in points if p is not None], float(dur.sum())


def _math_kernels_only(
    trace: Trace, kernels: np.ndarray, anchor: np.ndarray, work: list[OpWork | None]
) -> np.ndarray:
    """Unlink the helper kernels of math ops that also launched math kernels (a cuDNN convolution's
    nchwToNhwc conversions carry none of its FLOPs)."""
    linked = np.flatnonzero(anchor >= 0)
    math_op = np.array([work[int(a)].family in MATH_FAMILIES for a in anchor[linked].tolist()], dtype=bool)
    category = classify.kernel_category(trace)[trace.name[kernels[linked]]]
    math_kernel = np.isin(category, MATH_FAMILIES)
    with_math = np.zeros(len(work), dtype=bool)
    with_math[anchor[linked][math_kernel]] = True
    helper = math_op & ~math_kernel & with_math[anchor[linked]]
    out = anchor.copy()
    out[linked[helper]] = -1
    return out


def _point(
    kernel: str,
    trace: Trace,
    anchors: np.ndarray,
    dur: np.ndarray,
    flops: float,
    nbytes: float,
    split: bool,
    work: list[OpWork | None],
    from_trace: np.ndarray,
    limits: RooflineCeilings | None,
) -> RooflinePoint | None:
    time_us = float(dur.sum())
    if not (time_us > 0 and flops > 0 and nbytes > 0):
        return None
    ops = trace.rows(Kind.CPU_OP)
    main = int(anchors[np.argmax(dur)])  # the op of its longest call
    w = work[main]
    assert w is not None
    dtype = w.dtype
    # fp32 matmuls and convolutions on the tensor cores run as TF32: their kernels say so
    if dtype == "float32" and w.family in MATH_FAMILIES and classify.TF32.search(kernel):
        dtype = "tf32"
    peak = dtype if w.family in MATH_FAMILIES else "float32"  # elementwise math runs on CUDA cores
    rate, bandwidth, intensity = flops / (time_us * 1e-6), nbytes / (time_us * 1e-6), flops / nbytes
    attainable = bound = share = None
    if limits is not None and limits.flops.get(peak):
        roof, slope = limits.flops[peak], intensity * limits.bytes_per_s
        attainable = min(roof, slope)
        bound = "memory" if slope < roof else "compute"
        share = rate / attainable
    return RooflinePoint(
        kernel=kernel,
        op=trace.name_of(int(ops[main])),
        family=w.family,
        dtype=dtype,
        peak=peak,
        calls=len(dur),
        time_us=time_us,
        flops=flops,
        bytes=nbytes,
        flops_from_trace=bool(from_trace[anchors].all()),
        split=split,
        flops_per_s=rate,
        bytes_per_s=bandwidth,
        intensity=intensity,
        attainable_flops_per_s=attainable,
        bound=bound,
        ceiling_share=share if share is None or math.isfinite(share) else None,
        beyond_ceiling=_beyond(share, bound, peak, nbytes / len(dur), limits),
    )


def _beyond(
    share: float | None, bound: str | None, peak: str, bytes_per_call: float, limits: RooflineCeilings | None
) -> str | None:
    """Why a kernel reaches more than its measured ceiling; None where it does not."""
    if share is None or not math.isfinite(share) or share <= 1.0 or limits is None:
        return None
    if bound == "compute":
        shape = f"{limits.matmul_n}³" if limits.matmul_n else "one large square"
        return (
            f"above the {peak} FLOP/s measured on a {shape} matmul: cuBLAS runs this shape faster, or the "
            "clocks ran higher than at that measurement; that ceiling is a reference, not the peak"
        )
    l2 = limits.l2_cache_bytes
    if l2 and bytes_per_call <= l2:
        return (
            f"its operands ({fmt_bytes(bytes_per_call)} per call) fit in the {fmt_bytes(l2)} L2 cache, which "
            "serves them faster than the DRAM the copy ceiling measured"
        )
    copy = f"{fmt_bytes(limits.copy_bytes)} " if limits.copy_bytes else ""
    return (
        f"it moved its bytes (each operand counted once) faster than the {copy}device-to-device copy that "
        "measured the memory ceiling: part of its operands were still in the L2 cache (written by the kernel "
        "before it), or the copy's rate falls short of the DRAM's; against the DRAM the share is lower"
    )
