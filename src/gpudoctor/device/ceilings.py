"""Measured ceilings of a device: copy bandwidth (bytes read + written per second) and matmul FLOP/s
per dtype, measured once per device, torch version and thread count, and cached as JSON under
~/.cache/gpudoctor (or $GPUDOCTOR_CACHE_DIR). The timer is injected: `gpudoctor.timing` passes its
own; without one a plain median of CUDA events / perf_counter is used. `ceilings_for_device` finds a
device's ceilings by name (a trace's GPU): the cache, or the table of devices gpudoctor measured."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpudoctor.util.errors import GpudoctorError
from gpudoctor.util.outfile import write_json
from gpudoctor.util.serial import Serialized

SCHEMA_VERSION = 1
CACHE_ENV = "GPUDOCTOR_CACHE_DIR"
CACHE_FILE = "ceilings.json"

GPU_COPY_BYTES = 1 << 30  # per buffer: far past any L2, so the copy runs from DRAM
CPU_COPY_BYTES = 256 << 20
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 2048
GPU_DTYPES = ("bfloat16", "float16", "tf32", "float32")
CPU_DTYPES = ("float32",)

TimeUs = Callable[[Callable[[], object]], float]  # median µs of one call of a callable


@dataclass(frozen=True)
class Ceilings(Serialized):
    """What a device reaches on plain, large operations; the denominators of "share of peak"."""

    device_key: str
    device_name: str
    copy_bytes_per_s: float  # a large device-to-device copy (memcpy or kernel), bytes read + written
    matmul_flops: dict[str, float] = field(default_factory=dict)  # dtype name -> FLOP/s of an n³ matmul
    copy_bytes: int = 0  # the buffer size the copy used
    matmul_n: int = 0
    torch: str = ""
    measured_at: str = ""
    schema_version: int = SCHEMA_VERSION
    source: str = ""  # where the figures come from, for a reader (empty: measured here)

    def flops_for(self, dtype: str | None) -> float | None:
        if dtype is None:
            return None
        value = self.matmul_flops.get(dtype)
        return value if value is not None and math.isfinite(value) and value > 0 else None


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpudoctor"


def device_identity(device: str) -> tuple[str, str]:
    """(cache key, readable name) of "cpu" or "cuda[:N]": the key changes with the physical device,
    the torch build (which brings cuBLAS) and, on the CPU, the thread count."""
    import torch

    if device.startswith("cuda"):
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        props = torch.cuda.get_device_properties(index)
        uuid = str(getattr(props, "uuid", "")) or f"index{index}"
        return f"cuda|{props.name}|{uuid}|torch {torch.__version__}", props.name
    name = cpu_name()
    return f"cpu|{name}|threads {torch.get_num_threads()}|torch {torch.__version__}", name


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def load_cached(device: str, directory: Path | None = None) -> Ceilings | None:
    """The cached ceilings of this device, or None (also for an unreadable or outdated cache)."""
    key, _ = device_identity(device)
    entry = _read_cache(directory or cache_dir()).get(key)
    if not isinstance(entry, dict) or entry.get("schema_version") != SCHEMA_VERSION:
        return None
    try:
        return Ceilings.from_json(entry)
    except (TypeError, ValueError, KeyError):
        return None


def store(ceilings: Ceilings, directory: Path | None = None) -> Path:
    """Add or replace this device's entry; the file is replaced atomically."""
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CACHE_FILE
    entries = _read_cache(directory)
    entries[ceilings.device_key] = ceilings.to_json()
    return write_json(path, entries)  # the one writer: replaced whole


def _read_cache(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def get_ceilings(
    device: str,
    *,
    time_us: TimeUs | None = None,
    remeasure: bool = False,
    directory: Path | None = None,
    **sizes: Any,
) -> Ceilings:
    """The cached ceilings, measured (and cached) first if there are none or `remeasure`; `sizes` go to
    `measure_ceilings` (copy_bytes, matmul_n, dtypes)."""
    if not remeasure:
        cached = load_cached(device, directory)
        if cached is not None:
            return cached
    ceilings = measure_ceilings(device, time_us, **sizes)
    store(ceilings, directory)
    return ceilings


def measure_ceilings(
    device: str,
    time_us: TimeUs | None = None,
    *,
    copy_bytes: int | None = None,
    matmul_n: int | None = None,
    dtypes: Iterable[str] | None = None,
) -> Ceilings:
    """Time a large copy and an n³ matmul per dtype on `device` ("cpu" or "cuda[:N]"). Inputs are random
    (zeros can run faster than real data). Backend flags changed for tf32/float32 are restored."""
    import torch

    key, name = device_identity(device)
    gpu = device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise GpudoctorError("no CUDA device: cannot measure GPU ceilings")
    dev = torch.device(device)
    timer = time_us or (_events_median_us if gpu else _perf_median_us)
    nbytes = copy_bytes or _copy_bytes(dev)
    copy_us = _time_copy(torch, dev, nbytes, timer)
    n = matmul_n or (GPU_MATMUL_N if gpu else CPU_MATMUL_N)
    flops: dict[str, float] = {}
    for dtype in dtypes or (GPU_DTYPES if gpu else CPU_DTYPES):
        flops[dtype] = 2 * n**3 / (_time_matmul(torch, dev, dtype, n, timer) * 1e-6)
    return Ceilings(
        device_key=key,
        device_name=name,
        copy_bytes_per_s=2 * nbytes / (copy_us * 1e-6),
        matmul_flops=flops,
        copy_bytes=nbytes,
        matmul_n=n,
        torch=torch.__version__,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _copy_bytes(dev: Any) -> int:
    import torch

    if dev.type != "cuda":
        return CPU_COPY_BYTES
    free, _ = torch.cuda.mem_get_info(dev)
    return int(min(GPU_COPY_BYTES, free // 8))


def _time_copy(torch: Any, dev: Any, nbytes: int, timer: TimeUs) -> float:
    """The faster of a memcpy (`copy_`) and an elementwise kernel that reads and writes as much: on some
    GPUs kernels stream faster than the memcpy path (docs/results.md, "Timing")."""
    src = torch.randn(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    return min(timer(lambda: dst.copy_(src)), timer(lambda: torch.neg(src, out=dst)))


def _time_matmul(torch: Any, dev: Any, dtype: str, n: int, timer: TimeUs) -> float:
    tensor_dtype = {"tf32": torch.float32}.get(dtype) or getattr(torch, dtype)
    a = torch.randn(n, n, device=dev, dtype=tensor_dtype)
    b = torch.randn(n, n, device=dev, dtype=tensor_dtype)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        return timer(lambda: torch.mm(a, b))
    finally:
        torch.set_float32_matmul_precision(previous)


def _events_median_us(fn: Callable[[], object], reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def _perf_median_us(fn: Callable[[], object], reps: int = 10) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return sorted(times)[len(times) // 2]


# Ceilings gpudoctor measured on devices it was developed on (`gpudoctor bench --ceilings`), for traces
# from those devices analyzed elsewhere. Measured, never datasheet figures.
REFERENCE: tuple[Ceilings, ...] = (
    Ceilings(
        device_key="reference|NVIDIA H200",
        device_name="NVIDIA H200",
        copy_bytes_per_s=4.249e12,
        matmul_flops={"bfloat16": 785.6e12, "float16": 754.9e12, "tf32": 408.7e12, "float32": 51.25e12},
        copy_bytes=1 << 30,
        matmul_n=8192,
        torch="2.11.0+cu130",
        measured_at="2026-11-22T02:54:58+00:00",
        source="measured by gpudoctor on an NVIDIA H200 (benchmarks/results/timing_vs_peers_h200.json)",
    ),
    Ceilings(
        device_key="reference|NVIDIA H100 80GB HBM3",
        device_name="NVIDIA H100 80GB HBM3",
        copy_bytes_per_s=3.015e12,
        matmul_flops={"bfloat16": 795.5e12, "float16": 764.0e12, "tf32": 412.1e12, "float32": 51.63e12},
        copy_bytes=1 << 30,
        matmul_n=8192,
        torch="2.11.0+cu130",
        measured_at="2026-11-22T03:51:56+00:00",
        source="measured by gpudoctor on an NVIDIA H100 80GB HBM3 (benchmarks/results/timing_vs_peers.json)",
    ),
)


def reference_ceilings(device_name: str | None) -> Ceilings | None:
    """gpudoctor's measured ceilings of a device with this name, if it has them (no I/O)."""
    return next((c for c in REFERENCE if device_name and c.device_name == device_name), None)


def ceilings_for_device(device_name: str | None, directory: Path | None = None) -> Ceilings | None:
    """The ceilings of a device by name, e.g. a trace's GPU: this machine's cache if it measured a
    device of that name (the latest measurement), else `reference_ceilings`, else None."""
    if not device_name:
        return None
    cached = []
    for entry in _read_cache(directory or cache_dir()).values():
        if not isinstance(entry, dict) or entry.get("schema_version") != SCHEMA_VERSION:
            continue
        if entry.get("device_name") != device_name:
            continue
        try:
            cached.append(Ceilings.from_json(entry))
        except (TypeError, ValueError, KeyError):
            continue
    if cached:
        latest = max(cached, key=lambda c: c.measured_at)
        where = f"measured on this machine {latest.measured_at} (gpudoctor bench --ceilings)"
        return replace(latest, source=latest.source or where)
    return reference_ceilings(device_name)
