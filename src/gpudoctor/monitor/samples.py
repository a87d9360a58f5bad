"""What the monitor records: the static `GpuInfo` of each GPU, one `GpuSample` per GPU per tick, and a
`MonitorRecord` (system + devices + samples) that round-trips through JSON and JSON lines. A value NVML
could not give is None and its field name maps to the reason in `missing`."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from gpudoctor.device.clock_reasons import slowdowns
from gpudoctor.util.errors import UsageError
from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.monitor/1"


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None  # e.g. "13.0": the CUDA version the driver supports
    nvml_binding: str | None = None  # e.g. "nvidia-ml-py 13.610.1", or "replay of <file>"
    hostname: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    """What does not change while sampling. `index` is NVML's (PCI order), not necessarily CUDA's."""

    index: int
    name: str
    uuid: str | None = None  # "GPU-xxxxxxxx-..."; torch's `get_device_properties(i).uuid` without "GPU-"
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    sm_max_mhz: int | None = None  # nvidia-smi clocks.max.sm
    mem_max_mhz: int | None = None  # nvidia-smi clocks.max.memory
    power_limit_w: float | None = None  # enforced limit when sampling began (power.limit)
    architecture: str | None = None  # "hopper", "ampere", ...
    compute_capability: tuple[int, int] | None = None
    gpm_supported: bool = False  # SM / tensor / DRAM activity through NVML GPM (Hopper and newer)
    pcie_source: str | None = None  # "counters", "gpm", "throughput" (20 ms windows) or None
    mig_enabled: bool | None = None
    missing: dict[str, str] = field(default_factory=dict)  # field -> why NVML could not give it


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str  # from /proc/<pid>/comm, else NVML's process name; "" when neither is readable
    used_memory_bytes: int | None  # None where NVML cannot attribute memory (e.g. another container)
    kind: str = "compute"  # "compute", "graphics" or "compute+graphics"
    sm_util_pct: int | None = None  # nvmlDeviceGetProcessUtilization, over the last second or so


@dataclass(frozen=True)
class GpmMetrics:
    """NVML GPM metrics over the interval between two GPM samples (Hopper and newer), each 0-100."""

    interval_s: float  # between the two GPM samples
    sm_active_pct: float | None = None  # SMs with a warp resident, averaged (DCGM's SM_ACTIVE)
    sm_occupancy_pct: float | None = None  # resident warps vs the maximum (DCGM's SM_OCCUPANCY)
    tensor_active_pct: float | None = None  # any tensor-core pipe active (DCGM's PIPE_TENSOR_ACTIVE)
    dram_bw_pct: float | None = None  # DRAM bandwidth used vs peak (DCGM's DRAM_ACTIVE)
    fp64_pct: float | None = None  # non-tensor FP64 pipe
    fp32_pct: float | None = None  # non-tensor FP32 pipe
    fp16_pct: float | None = None  # non-tensor FP16 pipe


# The percentages of GpmMetrics, in field order (summaries and log columns share them).
GPM_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GpmMetrics) if f.name != "interval_s")


@dataclass(frozen=True)
class GpuSample(Serialized):
    """One reading of one GPU. Percentages are 0-100 as NVML gives them (nvidia-smi's columns)."""

    index: int
    mono_s: float  # time.monotonic() at the reading: for intervals
    unix_s: float  # time.time() at the reading: for logs
    gpu_util_pct: int | None = None  # time a kernel was running, over NVML's last period (utilization.gpu)
    mem_util_pct: int | None = None  # time device memory was read or written (utilization.memory)
    mem_used_bytes: int | None = None  # memory.used
    mem_total_bytes: int | None = None  # memory.total
    power_w: float | None = None  # power.draw (a 1 s average on Ampere and newer)
    power_instant_w: float | None = None  # power.draw.instant
    power_limit_w: float | None = None  # enforced.power.limit
    temp_c: int | None = None  # temperature.gpu
    mem_temp_c: int | None = None  # temperature.memory (HBM)
    sm_clock_mhz: int | None = None  # clocks.sm
    mem_clock_mhz: int | None = None  # clocks.mem
    clock_event_mask: int | None = None  # clocks_event_reasons.active, as a bit mask
    clock_events: tuple[str, ...] = ()  # the mask decoded (see device.clock_reasons)
    pcie_tx_bytes_per_s: float | None = None  # out of the GPU
    pcie_rx_bytes_per_s: float | None = None  # into the GPU
    energy_j: float | None = None  # total since the driver loaded (a counter; see violation_ns)
    # time held below the requested clocks, per policy: cumulative counters. Like energy_j, present only
    # in the readings that read them (costly on some GPUs: the first, the last, and now and then)
    violation_ns: dict[str, int] = field(default_factory=dict)
    processes: tuple[GpuProcess, ...] | None = None  # None when NVML could not list them
    gpm: GpmMetrics | None = None
    read_ms: float = 0.0  # how long this reading took
    missing: dict[str, str] = field(default_factory=dict)  # field -> why it is None

    @property
    def slowdowns(self) -> tuple[str, ...]:
        """The active clock-event reasons that hold the clocks down (all but `gpu_idle`)."""
        return slowdowns(self.clock_events)

    @property
    def mem_used_share(self) -> float | None:
        if self.mem_used_bytes is None or not self.mem_total_bytes:
            return None
        return self.mem_used_bytes / self.mem_total_bytes


@dataclass(frozen=True)
class ClockState(Serialized):
    """The clocks of one GPU right now, and why they are where they are (for benchmarks)."""

    index: int
    sm_mhz: int | None = None
    sm_max_mhz: int | None = None
    mem_mhz: int | None = None
    mem_max_mhz: int | None = None
    event_mask: int | None = None
    events: tuple[str, ...] = ()  # decoded clock-event reasons, `gpu_idle` included
    temp_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def slowdowns(self) -> tuple[str, ...]:
        """Reasons that hold the clocks below what the work asks for (all but `gpu_idle`)."""
        return slowdowns(self.events)

    @property
    def throttled(self) -> bool:
        return bool(self.slowdowns)

    @property
    def sm_share(self) -> float | None:
        """SM clock as a share of its maximum (1.0 = full boost)."""
        if self.sm_mhz is None or not self.sm_max_mhz:
            return None
        return self.sm_mhz / self.sm_max_mhz


@dataclass(frozen=True)
class MonitorRecord(Serialized):
    """A recorded series: what `--log x.jsonl` writes and the fake backend replays."""

    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor monitor record"

    system: SystemInfo
    devices: tuple[GpuInfo, ...]
    interval_s: float
    samples: tuple[GpuSample, ...] = ()
    schema: str = SCHEMA

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MonitorRecord:
        try:
            return super().from_json(data)
        except UsageError:
            raise
        except (ValueError, TypeError, KeyError) as err:
            raise UsageError(f"a malformed gpudoctor monitor record ({err})") from None

    def header_json(self) -> dict[str, Any]:
        """The first line of the JSON-lines form: everything but the samples."""
        doc = self.to_json()
        doc.pop("samples")
        return doc

    def for_device(self, index: int) -> tuple[GpuSample, ...]:
        return tuple(s for s in self.samples if s.index == index)

    def with_samples(self, samples: Iterable[GpuSample]) -> MonitorRecord:
        return dataclasses.replace(self, samples=tuple(samples))

    def write_jsonl(self, path: Path) -> None:
        with open_text(path, "w") as f:
            f.write(json.dumps(self.header_json(), separators=(",", ":")) + "\n")
            for s in self.samples:
                f.write(json.dumps(s.to_json(), separators=(",", ":"), allow_nan=False) + "\n")

    @classmethod
    def read_jsonl(cls, path: Path) -> MonitorRecord:
        """Read a JSON-lines log (plain or .gz): a header line, then one sample a line. A truncated last
        line (the writer was killed) is dropped; anything else malformed is a `UsageError`."""
        try:
            with open_text(path, "r") as f:
                lines = f.read().splitlines()
        except (OSError, EOFError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read {path}: {err}") from None
        header = _parse_line(path, lines[0] if lines else "", 1)
        header["samples"] = []
        record = cls.from_json(header)
        samples = []
        for number, text in enumerate(lines[1:], start=2):
            if not text.strip():
                continue
            try:
                samples.append(GpuSample.from_json(json.loads(text)))
            except (ValueError, TypeError, KeyError) as err:
                if number == len(lines):
                    break  # a partly written last line
                raise UsageError(f"{path}:{number}: not a monitor sample ({err})") from None
        return record.with_samples(samples)


def fmt_memory(n: float | None) -> str:
    """GPU memory as people read it: "980 MiB", "1.0 GiB", "79.6 GiB" (binary units)."""
    if n is None:
        return "n/a"
    if n < 1 << 30:
        return f"{n / (1 << 20):.0f} MiB"
    return f"{n / (1 << 30):.1f} GiB"


def _parse_line(path: Path, text: str, number: int) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UsageError(f"{path}:{number}: not a gpudoctor monitor log (JSON lines with a header)")
    return data


def open_text(path: Path, mode: str) -> IO[str]:
    """A text file, gzipped when its name ends in .gz."""
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")  # type: ignore[arg-type]
    return open(path, mode, encoding="utf-8")
