"""The CPU-vs-GPU explorer: common ops (matmul, elementwise add, reduction, convolution, softmax, sort)
over a range of sizes, timed with `bench` on the CPU and on the GPU — device time with the data already
there, one synchronized call, and with the copies in and out — and the size from which the GPU wins."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.device.ceilings import cpu_name
from gpudoctor.timing.api import bench, driver_version, resolve_device
from gpudoctor.timing.measurement import Environment
from gpudoctor.util.errors import UsageError
from gpudoctor.util.serial import check_schema, from_jsonable, to_jsonable

SCHEMA = "gpudoctor.explore"
SCHEMA_VERSION = 1
SCENARIOS = ("gpu", "gpu_sync", "gpu_transfer")
SCENARIO_LABELS = {
    "cpu": "CPU",
    "gpu": "GPU device time",
    "gpu_sync": "GPU, one synced call",
    "gpu_transfer": "GPU + pageable copies",
}
# Per point: enough to rank CPU against GPU across decades of size, not a publication figure.
POINT_OPTIONS: dict[str, Any] = {
    "min_samples": 5,
    "min_time_s": 0.02,
    "max_noise": 0.02,
    "timeout_s": 1.5,
    "warmup_max_s": 0.2,
    "sample_target_us": 500.0,
}

_ELEMS = tuple(4**k for k in range(5, 14))  # 1Ki … 64Mi elements


@dataclass(frozen=True)
class OpSpec:
    name: str
    description: str
    size_unit: str
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]


OPS: dict[str, OpSpec] = {
    "matmul": OpSpec("matmul", "n×n @ n×n", "n", (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                     (32, 128, 512, 2048)),
    "add": OpSpec("add", "x + y, elementwise", "elements", _ELEMS, _ELEMS[::2]),
    "sum": OpSpec("sum", "x.sum(), a full reduction", "elements", _ELEMS, _ELEMS[::2]),
    "conv2d": OpSpec("conv2d", "8×64×s×s, 64→64 channels, 3×3", "s", (8, 16, 32, 64, 128), (8, 32, 128)),
    "softmax": OpSpec("softmax", "softmax over rows of up to 1024", "elements", _ELEMS, _ELEMS[::2]),
    "sort": OpSpec("sort", "torch.sort of a vector", "elements", _ELEMS[:-1], _ELEMS[:-1:2]),
}  # fmt: skip


@dataclass(frozen=True)
class ExplorePoint:
    """One op at one size; times in µs (None: not measured)."""

    op: str
    size: int
    nbytes: int
    flops: float
    cpu_us: float | None = None
    gpu_us: float | None = None  # device time, inputs already on the GPU, launches hidden
    gpu_sync_us: float | None = None  # one call and a synchronize, as a caller waits
    gpu_transfer_us: float | None = None  # inputs in from pageable memory, compute, result out: synchronized
    notes: tuple[str, ...] = ()

    def time(self, scenario: str) -> float | None:
        return getattr(self, f"{scenario}_us")


@dataclass(frozen=True)
class Crossover:
    """From `size` on (every measured size from there up) the GPU is faster than the CPU in `scenario`;
    None: the GPU never wins from some size on within the sizes measured. `estimate` interpolates the
    size where the two curves cross on log-log axes."""

    op: str
    scenario: str
    size: int | None
    estimate: float | None
    speedup_at_largest: float | None


@dataclass(frozen=True)
class ExploreResult:
    device_name: str | None
    cpu_name: str
    dtype: str
    points: tuple[ExplorePoint, ...]
    crossovers: tuple[Crossover, ...]
    environment: Environment
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **to_jsonable(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExploreResult:
        check_schema(data, SCHEMA, "a gpudoctor explore result")  # its version is a field of its own
        if data.get("schema_version") != SCHEMA_VERSION:
            raise UsageError("not a gpudoctor explore result of this version")
        return from_jsonable(cls, {k: v for k, v in data.items() if k != "schema"})

    def op_points(self, op: str) -> list[ExplorePoint]:
        return sorted((p for p in self.points if p.op == op), key=lambda p: p.size)


def crossover(points: Sequence[ExplorePoint], scenario: str) -> Crossover:
    """Where the GPU (in `scenario`) starts to beat the CPU and keeps beating it up to the largest size."""
    pts = sorted((p for p in points if p.cpu_us and p.time(scenario)), key=lambda p: p.size)
    op = points[0].op if points else ""
    if not pts:
        return Crossover(op, scenario, None, None, None)
    wins = [p.time(scenario) < p.cpu_us for p in pts]  # type: ignore[operator]
    largest = pts[-1].cpu_us / pts[-1].time(scenario)  # type: ignore[operator]
    if not wins[-1]:
        return Crossover(op, scenario, None, None, largest)
    first = len(wins)
    while first > 0 and wins[first - 1]:
        first -= 1
    size = pts[first].size
    estimate = float(size) if first == 0 else _log_cross(pts[first - 1], pts[first], scenario)
    return Crossover(op, scenario, size, estimate, largest)


def _log_cross(a: ExplorePoint, b: ExplorePoint, scenario: str) -> float:
    """The size between a and b where log(cpu/gpu) crosses zero, interpolated in log(size)."""
    ra = math.log(a.cpu_us / a.time(scenario))  # type: ignore[operator]
    rb = math.log(b.cpu_us / b.time(scenario))  # type: ignore[operator]
    t = ra / (ra - rb) if ra != rb else 0.5
    return math.exp(math.log(a.size) + t * (math.log(b.size) - math.log(a.size)))


def explore(
    ops: Sequence[str] | None = None,
    *,
    quick: bool = False,
    sizes: Sequence[int] | None = None,
    dtype: str = "float32",
    transfers: bool = True,
    cpu: bool = True,
    gpu: bool = True,
    progress: Callable[[str], None] | None = None,
    point_options: dict[str, Any] | None = None,
) -> ExploreResult:
    """Time each op at each size on the CPU and the GPU (where there is one)."""
    import torch

    names = list(ops or OPS)
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise UsageError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS)}")
    tdtype = getattr(torch, dtype, None)
    if not isinstance(tdtype, torch.dtype) or not tdtype.is_floating_point:
        raise UsageError(f"dtype must be a floating-point torch dtype, not {dtype!r}")
    notes: list[str] = []
    gpu_device = None
    if gpu and torch.cuda.is_available():
        gpu_device = resolve_device("cuda")
    elif gpu:
        notes.append("no CUDA GPU: CPU times only, no crossover")
    options = {**POINT_OPTIONS, **(point_options or {})}
    points = []
    for name in names:
        spec = OPS[name]
        for size in sizes or (spec.quick_sizes if quick else spec.sizes):
            if progress:
                progress(f"{name} {size}")
            points.append(_measure_point(spec, size, tdtype, cpu, gpu_device, transfers, options))
    crossovers = tuple(
        crossover([p for p in points if p.op == name], scenario)
        for name in names
        for scenario in SCENARIOS
        if gpu_device and cpu and (scenario != "gpu_transfer" or transfers)
    )
    return ExploreResult(
        device_name=torch.cuda.get_device_name(torch.device(gpu_device)) if gpu_device else None,
        cpu_name=f"{cpu_name()} ({torch.get_num_threads()} threads)",
        dtype=dtype,
        points=tuple(points),
        crossovers=crossovers,
        environment=Environment.capture(driver=driver_version() if gpu_device else None),
        notes=tuple(notes),
    )


def _measure_point(
    spec: OpSpec, size: int, dtype: Any, cpu: bool, gpu_device: str | None, transfers: bool, options: dict
) -> ExplorePoint:
    import torch

    fn, inputs, nbytes, flops = build_op(spec.name, size, dtype)
    cpu_us = gpu_us = sync_us = transfer_us = None
    notes: list[str] = []
    label = f"{spec.name}[{size}]"
    if cpu:
        cpu_us = bench(fn, *inputs, device="cpu", label=label, **options).median_us
    if gpu_device:
        dev_inputs = [x.to(gpu_device) for x in inputs]
        m = bench(fn, *dev_inputs, device=gpu_device, label=label, **options)
        gpu_us = m.median_us
        sync_us = m.host_stats.median if m.host_stats else None
        notes.extend(m.notes)
        if transfers:

            def round_trip(*host: Any) -> Any:
                return fn(*(x.to(gpu_device) for x in host)).to("cpu")

            t = bench(round_trip, *inputs, device=gpu_device, method="host", host_latency=False, label=label,
                      **options)  # fmt: skip
            transfer_us = t.median_us
        del dev_inputs
        torch.cuda.empty_cache()
    return ExplorePoint(spec.name, size, nbytes, flops, cpu_us, gpu_us, sync_us, transfer_us, tuple(notes))


def build_op(name: str, size: int, dtype: Any) -> tuple[Callable[..., Any], list[Any], int, float]:
    """(fn, CPU inputs, bytes moved, FLOPs) for op `name` at `size`. Inputs are random normal."""
    import torch

    item = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(size)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    if name == "matmul":
        n = size
        return torch.mm, [randn(n, n), randn(n, n)], 3 * n * n * item, 2.0 * n**3
    if name == "add":
        return torch.add, [randn(size), randn(size)], 3 * size * item, float(size)
    if name == "sum":
        return torch.sum, [randn(size)], size * item, float(size)
    if name == "softmax":
        cols = min(size, 1024)
        return _softmax, [randn(size // cols, cols)], 2 * size * item, 5.0 * size
    if name == "sort":
        return _sort_values, [randn(size)], 2 * size * item, size * math.log2(size)
    if name == "conv2d":
        n, c, k = 8, 64, 3
        x, w = randn(n, c, size, size), randn(c, c, k, k)
        nbytes = (2 * n * c * size * size + c * c * k * k) * item
        return torch.nn.functional.conv2d, [x, w], nbytes, 2.0 * n * c * c * k * k * size * size
    raise UsageError(f"unknown op {name!r}")


def _softmax(x: Any) -> Any:
    return x.softmax(dim=-1)


def _sort_values(x: Any) -> Any:
    return x.sort().values


__all__ = ["OPS", "Crossover", "ExplorePoint", "ExploreResult", "build_op", "crossover", "explore"]
