"""The real `NvmlBackend`, over nvidia-ml-py (`pynvml`). Every NVML call goes through one wrapper,
`NvmlQuery.call`, that turns an NVML error into a None value plus a reason; a call the GPU or driver does
not support is not made again, and a costly one is paced by its measured CPU cost. NVML is initialized in
the constructor and shut down by `close()`."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from gpudoctor.device.clock_reasons import decode_clock_events
from gpudoctor.monitor.backend import PERMANENT_ERRORS, NvmlUnavailable, nvml_reason, resolve_device
from gpudoctor.monitor.gpm import GpmReader
from gpudoctor.monitor.nvml_calls import (
    ARCHITECTURES,
    CLOCK_MEM,
    CLOCK_SM,
    LIVE_FIELDS,
    PCIE_FIELDS,
    SUMMARY_FIELDS,
    TEMPERATURE_GPU,
    VIOLATION_FIELDS,
    NvmlQuery,
    Pace,
    decode_field_values,
    events_function,
    read_system,
    text,
)
from gpudoctor.monitor.procs import process_name
from gpudoctor.monitor.samples import ClockState, GpuInfo, GpuProcess, GpuSample, SystemInfo

# Costly calls are paced so that each takes at most this share of one core (see `Pace`).
COSTLY_CALL_SHARE = 0.002
LIVE_FIELDS_MAX_S = 50e-6  # the live fields are read every time when one call costs less than this
SUMMARY_EVERY_S = 30.0  # summary counters: at the first and at `full` readings, and at most this often
SUMMARY_SHARE = 0.0005
PCIE_EVERY_S = 1.0  # PCIe byte counters (for rates) and nvmlDeviceGetPcieThroughput (20 ms per counter)


@dataclass
class _Fields:
    """A group of field ids read in one nvmlDeviceGetFieldValues call; `pace` None: every reading."""

    ids: dict[str, int]
    pace: Pace | None = None
    values: dict[str, float] = field(default_factory=dict)  # of the last call


def import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(f"NVML is not available: {missing_pynvml()}") from None
    return pynvml


def missing_pynvml(driver: Path = Path("/proc/driver/nvidia")) -> str:
    """Why NVML cannot be read without nvidia-ml-py: on a machine with no NVIDIA driver, that first
    (installing the package would not help), else the package to install."""
    extra = "pip install 'gpudoctor[nvml]'"
    if not driver.exists():
        return f"no NVIDIA driver on this machine (no GPU to watch); on one with a GPU: {extra}"
    return f"nvidia-ml-py is not installed ({extra})"


@dataclass
class _Device:
    """Per-GPU state of the backend: the handle, what NVML refused for good, the values of the paced
    calls between two of their readings, and the counters that a rate needs from the previous one."""

    index: int
    handle: Any
    info: GpuInfo
    process_pace: Pace
    throughput_pace: Pace
    live: _Fields = field(default_factory=lambda: _Fields({}))
    pcie: _Fields = field(default_factory=lambda: _Fields({}))
    summary: _Fields = field(default_factory=lambda: _Fields({}))
    skip: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    memory_version: Any = None
    events_fn: Any = None
    gpm: GpmReader | None = None
    last_pcie: tuple[float, int, int] | None = None  # mono_s, tx bytes, rx bytes
    pcie_rate: tuple[float | None, float | None] = (None, None)
    processes: tuple[GpuProcess, ...] | None = None
    processes_missing: str | None = None
    process_util_ts: int = 0  # µs: NVML returns per-process samples newer than this


class PynvmlBackend:
    """NVML over pynvml. Construct to initialize NVML; `close()` shuts it down (also via `with`).

    Args:
        nvml: the pynvml module (tests pass a stand-in); imported when None.
        gpm: read NVML GPM metrics where the GPU supports them.
        process_interval_s: the process list is read at most this often; cheap metrics every read.
    """

    def __init__(self, nvml: ModuleType | None = None, *, gpm: bool = True, process_interval_s: float = 0.5):
        self._nvml = nvml if nvml is not None else import_pynvml()
        self._process_interval_s = process_interval_s
        self._names: dict[int, str] = {}
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML is not available: {nvml_reason(err)}") from None
        self._open = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
            if count == 0:
                raise NvmlUnavailable("NVML is not available: it sees no NVIDIA GPU")
            self._system = read_system(self._nvml)
            self._devices = [self._open_device(i, gpm) for i in range(count)]
        except BaseException as err:
            self.close()
            if isinstance(err, self._nvml.NVMLError):
                raise NvmlUnavailable(f"NVML is not available: {nvml_reason(err)}") from None
            raise

    def __enter__(self) -> PynvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not getattr(self, "_open", False):
            return
        self._open = False
        for dev in getattr(self, "_devices", []):
            if dev.gpm is not None:
                dev.gpm.close()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def system(self) -> SystemInfo:
        return self._system

    def devices(self) -> tuple[GpuInfo, ...]:
        return tuple(d.info for d in self._devices)

    def resolve(self, device: int | str) -> int:
        return resolve_device(self.devices(), device)

    def pacing(self, index: int) -> dict[str, float]:
        """The current intervals of the paced calls of one GPU, in seconds (for reports and tests)."""
        dev = self._devices[index]
        return {
            "live_fields": dev.live.pace.interval_s if dev.live.pace else 0.0,
            "pcie_counters": dev.pcie.pace.interval_s if dev.pcie.pace else 0.0,
            "summary_counters": dev.summary.pace.interval_s if dev.summary.pace else 0.0,
            "processes": dev.process_pace.interval_s,
            "pcie_throughput": dev.throughput_pace.interval_s,
        }

    # --- readings ----------------------------------------------------------------------------------

    def read(self, index: int, *, full: bool = False) -> GpuSample:
        """One reading; `full` also makes the paced calls (counters, processes) now."""
        dev = self._devices[index]
        nvml, h = self._nvml, dev.handle
        with dev.lock:
            start = time.perf_counter()
            mono, unix = time.monotonic(), time.time()
            missing = dict(dev.skip)
            q = NvmlQuery(nvml, dev.skip, missing)
            util = q.call(("gpu_util_pct", "mem_util_pct"), nvml.nvmlDeviceGetUtilizationRates, h)
            mem = q.call(("mem_used_bytes", "mem_total_bytes"), self._memory, dev)
            power = q.call(("power_w",), nvml.nvmlDeviceGetPowerUsage, h)
            limit = q.call(("power_limit_w",), nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            temp = q.call(("temp_c",), nvml.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU)
            sm = q.call(("sm_clock_mhz",), nvml.nvmlDeviceGetClockInfo, h, CLOCK_SM)
            mem_clock = q.call(("mem_clock_mhz",), nvml.nvmlDeviceGetClockInfo, h, CLOCK_MEM)
            mask = q.call(("clock_event_mask", "clock_events"), dev.events_fn, h) if dev.events_fn else None
            live_fresh = self._read_fields(dev, dev.live, q, mono, full)
            summary = dev.summary.values if self._read_fields(dev, dev.summary, q, mono, full) else None
            pcie_fresh = self._read_fields(dev, dev.pcie, q, mono, full)
            gpm, gpm_pcie = self._gpm(dev, mono, missing)
            tx, rx = self._pcie(dev, q, mono, pcie_fresh, gpm_pcie, full)
            processes = self._processes(dev, q, mono, full)
            live = dev.live.values
            energy = summary.get("energy_mj") if summary is not None else None
            if not live_fresh and "power_instant_mw" in dev.live.ids:
                missing["power_instant_w"] = f"costly here: read every {dev.live.pace.interval_s:.1f} s"  # type: ignore[union-attr]
            if summary is None and "energy_mj" in dev.summary.ids:
                missing["energy_j"] = (
                    f"a costly counter here: read at the start, the end and every {SUMMARY_EVERY_S:.0f} s"
                )
            return GpuSample(
                index=index,
                mono_s=mono,
                unix_s=unix,
                gpu_util_pct=int(util.gpu) if util is not None else None,
                mem_util_pct=int(util.memory) if util is not None else None,
                mem_used_bytes=int(mem.used) if mem is not None else None,
                mem_total_bytes=int(mem.total) if mem is not None else None,
                power_w=power / 1000 if power is not None else None,
                power_instant_w=live["power_instant_mw"] / 1000
                if live_fresh and "power_instant_mw" in live
                else None,
                power_limit_w=limit / 1000 if limit is not None else None,
                temp_c=int(temp) if temp is not None else None,
                mem_temp_c=int(live["mem_temp_c"]) if "mem_temp_c" in live else None,
                sm_clock_mhz=int(sm) if sm is not None else None,
                mem_clock_mhz=int(mem_clock) if mem_clock is not None else None,
                clock_event_mask=int(mask) if mask is not None else None,
                clock_events=decode_clock_events(mask),
                pcie_tx_bytes_per_s=tx,
                pcie_rx_bytes_per_s=rx,
                energy_j=energy / 1000 if energy is not None else None,
                violation_ns={k: int(v) for k, v in (summary or {}).items() if k in VIOLATION_FIELDS},
                processes=processes,
                gpm=gpm,
                read_ms=(time.perf_counter() - start) * 1e3,
                missing={k: v for k, v in missing.items() if not k.startswith("_")},
            )

    def read_clocks(self, index: int) -> ClockState:
        """Clocks, clock-event reasons, temperature and power only: the cheap calls, fit to make around
        a timed region. Does not wait for a `read` in progress."""
        dev = self._devices[index]
        nvml, h = self._nvml, dev.handle
        missing: dict[str, str] = {}
        q = NvmlQuery(nvml, dict(dev.skip), missing)
        mask = q.call(("event_mask", "events"), dev.events_fn, h) if dev.events_fn else None
        power = q.call(("power_w",), nvml.nvmlDeviceGetPowerUsage, h)
        limit = q.call(("power_limit_w",), nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        return ClockState(
            index=index,
            sm_mhz=q.call(("sm_mhz",), nvml.nvmlDeviceGetClockInfo, h, CLOCK_SM),
            sm_max_mhz=dev.info.sm_max_mhz,
            mem_mhz=q.call(("mem_mhz",), nvml.nvmlDeviceGetClockInfo, h, CLOCK_MEM),
            mem_max_mhz=dev.info.mem_max_mhz,
            event_mask=int(mask) if mask is not None else None,
            events=decode_clock_events(mask),
            temp_c=q.call(("temp_c",), nvml.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU),
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            missing=missing,
        )

    def _memory(self, dev: _Device) -> Any:
        if dev.memory_version is not None:
            return self._nvml.nvmlDeviceGetMemoryInfo(dev.handle, version=dev.memory_version)
        return self._nvml.nvmlDeviceGetMemoryInfo(dev.handle)

    def _read_fields(self, dev: _Device, group: _Fields, q: NvmlQuery, mono: float, full: bool) -> bool:
        """Read a group of field values when its pace says so (or `full`); True when read now. Ids that
        NVML refuses for good leave the group."""
        if not group.ids or not (full or group.pace is None or group.pace.due(mono)):
            return False
        names = list(group.ids)
        cpu0 = time.thread_time()
        values = q.call(
            ("_fields",), self._nvml.nvmlDeviceGetFieldValues, dev.handle, [group.ids[n] for n in names]
        )
        if group.pace is not None:
            group.pace.done(mono, time.thread_time() - cpu0)
        if values is None:
            return False
        group.values, refused = decode_field_values(names, values)
        for name in refused:
            group.ids.pop(name, None)
        return True

    def _gpm(self, dev: _Device, mono: float, missing: dict[str, str]) -> tuple[Any, tuple[Any, Any]]:
        if dev.gpm is None:
            missing["gpm"] = dev.info.missing.get("gpm", "GPM is off")
            return None, (None, None)
        metrics, pcie, reason = dev.gpm.read(mono)
        if reason:
            missing["gpm"] = reason
        return metrics, pcie

    def _pcie(
        self,
        dev: _Device,
        q: NvmlQuery,
        mono: float,
        fresh: bool,
        gpm_pcie: tuple[float | None, float | None],
        full: bool,
    ) -> tuple[float | None, float | None]:
        source = dev.info.pcie_source
        if source == "gpm":
            rate = gpm_pcie
        elif source == "counters":
            counters = dev.pcie.values
            if fresh and "pcie_tx_bytes" in counters and "pcie_rx_bytes" in counters:
                tx, rx = int(counters["pcie_tx_bytes"]), int(counters["pcie_rx_bytes"])
                last, dev.last_pcie = dev.last_pcie, (mono, tx, rx)
                if last is not None and mono > last[0]:
                    dt = mono - last[0]
                    dev.pcie_rate = (max(tx - last[1], 0) / dt, max(rx - last[2], 0) / dt)
            rate = dev.pcie_rate
        elif source == "throughput":
            if full or dev.throughput_pace.due(mono):
                nvml, cpu0 = self._nvml, time.thread_time()
                tx_kb = q.call(("pcie_tx_bytes_per_s",), nvml.nvmlDeviceGetPcieThroughput, dev.handle, 0)
                rx_kb = q.call(("pcie_rx_bytes_per_s",), nvml.nvmlDeviceGetPcieThroughput, dev.handle, 1)
                dev.throughput_pace.done(mono, time.thread_time() - cpu0)
                dev.pcie_rate = (
                    tx_kb * 1024 if tx_kb is not None else None,
                    rx_kb * 1024 if rx_kb is not None else None,
                )
            rate = dev.pcie_rate
        else:
            rate = (None, None)
        if rate == (None, None):
            if source == "gpm":
                reason = q.missing.get("gpm", "no GPM reading yet")
            elif source == "counters":
                reason = "needs two readings of the byte counters"
            else:
                reason = dev.info.missing.get("pcie", "no PCIe reading yet")
            q.missing.setdefault("pcie_tx_bytes_per_s", reason)
            q.missing.setdefault("pcie_rx_bytes_per_s", reason)
        return rate

    def _processes(
        self, dev: _Device, q: NvmlQuery, mono: float, full: bool
    ) -> tuple[GpuProcess, ...] | None:
        if not (full or dev.process_pace.due(mono)):
            if dev.processes_missing:
                q.missing["processes"] = dev.processes_missing
            return dev.processes
        cpu0 = time.thread_time()
        try:
            return self._read_processes(dev, q)
        finally:
            dev.process_pace.done(mono, time.thread_time() - cpu0)

    def _read_processes(self, dev: _Device, q: NvmlQuery) -> tuple[GpuProcess, ...] | None:
        nvml, h = self._nvml, dev.handle
        failed: dict[str, str] = {}
        compute = NvmlQuery(nvml, dev.skip, failed).call(
            ("processes",), nvml.nvmlDeviceGetComputeRunningProcesses, h
        )
        graphics = NvmlQuery(nvml, dev.skip, {}).call(
            ("_graphics",), nvml.nvmlDeviceGetGraphicsRunningProcesses, h
        )
        if compute is None and graphics is None:
            dev.processes, dev.processes_missing = None, failed.get("processes", dev.skip.get("processes"))
            q.missing["processes"] = dev.processes_missing or "NVML lists no processes"
            return None
        kinds: dict[int, set[str]] = {}
        memory: dict[int, int | None] = {}
        for kind, procs in (("compute", compute or ()), ("graphics", graphics or ())):
            for p in procs:
                kinds.setdefault(p.pid, set()).add(kind)
                used = p.usedGpuMemory
                if used is not None:
                    memory[p.pid] = max(int(used), memory.get(p.pid) or 0)
                else:
                    memory.setdefault(p.pid, None)
        utils = self._process_utilization(dev) if kinds else {}
        dev.processes = tuple(
            GpuProcess(
                pid=pid,
                name=self._process_name(pid),
                used_memory_bytes=memory.get(pid),
                kind="+".join(sorted(kinds[pid])),
                sm_util_pct=utils.get(pid),
            )
            for pid in sorted(kinds)
        )
        dev.processes_missing = None
        return dev.processes

    def _process_utilization(self, dev: _Device) -> dict[int, int]:
        """SM utilization per process from NVML's per-process samples since the last call."""
        nvml = self._nvml
        if "_process_util" in dev.skip:
            return {}
        since = dev.process_util_ts or int(time.time() * 1e6) - 1_000_000
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(dev.handle, since)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) in PERMANENT_ERRORS:
                dev.skip.setdefault("_process_util", nvml_reason(err))
            return {}  # NOT_FOUND: no process ran a kernel since `since`
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            if s.pid not in latest or s.timeStamp >= latest[s.pid][0]:
                latest[s.pid] = (int(s.timeStamp), int(s.smUtil))
            dev.process_util_ts = max(dev.process_util_ts, int(s.timeStamp))
        return {pid: util for pid, (_, util) in latest.items()}

    def _process_name(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            name = process_name(pid) or self._nvml_process_name(pid)
            if len(self._names) > 4096:
                self._names.clear()
            self._names[pid] = name
        return name

    def _nvml_process_name(self, pid: int) -> str:
        try:
            raw = self._nvml.nvmlSystemGetProcessName(pid)
        except self._nvml.NVMLError:
            return ""
        return (text(raw) or "").rsplit("/", 1)[-1]

    # --- opening -----------------------------------------------------------------------------------

    def _open_device(self, index: int, gpm: bool) -> _Device:
        nvml = self._nvml
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        missing: dict[str, str] = {}
        q = NvmlQuery(nvml, {}, missing)
        dev = _Device(
            index=index,
            handle=h,
            info=GpuInfo(index=index, name="?"),
            process_pace=Pace(self._process_interval_s, COSTLY_CALL_SHARE),
            throughput_pace=Pace(PCIE_EVERY_S, COSTLY_CALL_SHARE),
        )
        if (
            q.call(("_mem_v2",), nvml.nvmlDeviceGetMemoryInfo, h, getattr(nvml, "nvmlMemory_v2", 0))
            is not None
        ):
            dev.memory_version = nvml.nvmlMemory_v2
        mem = q.call(("memory_total_bytes",), self._memory, dev)
        dev.events_fn = events_function(nvml, h)
        if dev.events_fn is None:
            missing["clock_events"] = "this driver's NVML reports no clock-event reasons"
        arch = q.call(("architecture",), nvml.nvmlDeviceGetArchitecture, h)
        cc = q.call(("compute_capability",), nvml.nvmlDeviceGetCudaComputeCapability, h)
        mig = q.call(("mig_enabled",), nvml.nvmlDeviceGetMigMode, h)
        limit = q.call(("power_limit_w",), nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        pci = q.call(("pci_bus_id",), nvml.nvmlDeviceGetPciInfo, h)
        supported = self._probe_fields(h, {**LIVE_FIELDS, **PCIE_FIELDS, **SUMMARY_FIELDS})
        mig_on = bool(mig[0]) if mig is not None else None
        if gpm and not mig_on:
            dev.gpm, reason = GpmReader.open(nvml, h)
            if reason:
                missing["gpm"] = reason
        else:
            missing["gpm"] = (
                "MIG is on: gpudoctor reads GPM for whole GPUs only" if gpm else "GPM reading turned off"
            )
        dev.info = GpuInfo(
            index=index,
            name=text(q.call(("name",), nvml.nvmlDeviceGetName, h)) or "NVIDIA GPU",
            uuid=text(q.call(("uuid",), nvml.nvmlDeviceGetUUID, h)),
            pci_bus_id=text(pci.busId) if pci is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            sm_max_mhz=q.call(("sm_max_mhz",), nvml.nvmlDeviceGetMaxClockInfo, h, CLOCK_SM),
            mem_max_mhz=q.call(("mem_max_mhz",), nvml.nvmlDeviceGetMaxClockInfo, h, CLOCK_MEM),
            power_limit_w=limit / 1000 if limit is not None else None,
            architecture=ARCHITECTURES.get(arch, f"arch {arch}") if arch is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            gpm_supported=dev.gpm is not None,
            pcie_source=self._pcie_source(dev, supported, missing),
            mig_enabled=mig_on,
            missing={k: v for k, v in missing.items() if not k.startswith("_")},
        )
        self._group_fields(dev, supported)
        return dev

    def _probe_fields(self, handle: Any, wanted: dict[str, int]) -> dict[str, int]:
        """The field ids this GPU answers."""
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(handle, list(wanted.values()))
        except (self._nvml.NVMLError, AttributeError):
            return {}
        return {
            name: fid for (name, fid), v in zip(wanted.items(), values, strict=False) if v.nvmlReturn == 0
        }

    def _group_fields(self, dev: _Device, supported: dict[str, int]) -> None:
        """Sort the supported ids into the live, PCIe and summary groups and set their paces; the live
        group is read every time only if one call of it is cheap on this GPU."""
        dev.live = _Fields({k: v for k, v in supported.items() if k in LIVE_FIELDS})
        dev.summary = _Fields(
            {k: v for k, v in supported.items() if k in SUMMARY_FIELDS}, Pace(SUMMARY_EVERY_S, SUMMARY_SHARE)
        )
        if dev.info.pcie_source == "counters":
            dev.pcie = _Fields(
                {k: v for k, v in supported.items() if k in PCIE_FIELDS},
                Pace(PCIE_EVERY_S, COSTLY_CALL_SHARE),
            )
        if dev.live.ids:
            ids = list(dev.live.ids.values())
            cost = math.inf
            for _ in range(2):
                cpu0 = time.thread_time()
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlDeviceGetFieldValues(dev.handle, ids)
                cost = min(cost, time.thread_time() - cpu0)
            if cost > LIVE_FIELDS_MAX_S:
                dev.live.pace = Pace(PCIE_EVERY_S, COSTLY_CALL_SHARE, cost_s=cost)

    def _pcie_source(self, dev: _Device, supported: dict[str, int], missing: dict[str, str]) -> str | None:
        """GPM's PCIe rates (over each interval) first, then the byte counters, then the 20 ms windows."""
        if dev.gpm is not None:
            return "gpm"
        if "pcie_tx_bytes" in supported and "pcie_rx_bytes" in supported:
            return "counters"
        try:
            self._nvml.nvmlDeviceGetPcieThroughput(dev.handle, 0)
        except self._nvml.NVMLError as err:
            missing["pcie"] = nvml_reason(err)
            return None
        return "throughput"
