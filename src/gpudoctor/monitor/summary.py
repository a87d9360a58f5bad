"""The summary of a monitored run: per GPU, what it did over the whole run (utilization distribution,
clocks while busy, power and energy, slowdown reasons by share of time, peak memory, GPM activity,
processes seen) and the alert episodes. Built online, sample by sample, in constant memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.monitor.alerts import AlertEpisode, AlertPolicy, AlertTracker, Ownership
from gpudoctor.monitor.sampler import SamplerStats
from gpudoctor.monitor.samples import GPM_FIELDS, GpmMetrics, GpuInfo, GpuSample, MonitorRecord, SystemInfo
from gpudoctor.util.serial import from_jsonable, to_jsonable

SUMMARY_SCHEMA = "gpudoctor.monitor-summary/1"


@dataclass(frozen=True)
class ProcessSummary:
    pid: int
    name: str
    peak_memory_bytes: int | None
    seen_share: float  # share of the GPU's samples in which it was listed
    owned: bool | None  # belongs to the followed command (None: standalone, or cannot be told)
    sm_util_mean_pct: float | None  # mean of its per-process SM utilization readings


@dataclass(frozen=True)
class DeviceSummary:
    index: int
    name: str
    samples: int
    duration_s: float  # first to last sample
    gpu_util_mean_pct: float | None
    gpu_util_p50_pct: float | None
    gpu_util_p10_pct: float | None
    low_util_share: float | None  # share of samples under the policy's threshold while a process held the GPU
    mem_util_mean_pct: float | None
    sm_clock_busy_mean_mhz: float | None  # mean SM clock over samples with utilization >= 50%
    sm_clock_min_mhz: int | None
    sm_max_mhz: int | None
    power_mean_w: float | None
    power_max_w: float | None
    power_limit_w: float | None
    energy_j: float | None  # from the driver's energy counter, between its first and last readings
    temp_max_c: int | None
    mem_temp_max_c: int | None
    mem_used_peak_bytes: int | None
    mem_total_bytes: int | None
    slowdown_shares: dict[str, float]  # reason -> share of samples with it active (gpu_idle excluded)
    violation_shares: dict[str, float]  # policy -> share of the run held below clocks (driver counters)
    gpm_means: GpmMetrics | None  # means over samples that had GPM
    gpm_reason: str | None  # why there is no GPM, when there is none
    pcie_tx_mean_bytes_per_s: float | None
    pcie_rx_mean_bytes_per_s: float | None
    processes: tuple[ProcessSummary, ...]


@dataclass(frozen=True)
class MonitorSummary:
    system: SystemInfo
    devices: tuple[DeviceSummary, ...]
    episodes: tuple[AlertEpisode, ...]
    interval_s: float
    sampler: SamplerStats | None = None
    command: tuple[str, ...] | None = None  # `monitor -- cmd`: the command and its exit status
    exit_code: int | None = None
    schema: str = SUMMARY_SCHEMA

    def device(self, index: int) -> DeviceSummary:
        return next(d for d in self.devices if d.index == index)

    def used_by_command(self) -> MonitorSummary:
        """Only the GPUs the followed command had a process on (all of them if none was seen)."""
        used = {d.index for d in self.devices if any(p.owned for p in d.processes)}
        if not used:
            return self
        return dataclasses.replace(
            self,
            devices=tuple(d for d in self.devices if d.index in used),
            episodes=tuple(e for e in self.episodes if e.gpu in used),
        )

    def to_json(self) -> dict[str, Any]:
        doc = to_jsonable(self)
        if self.sampler is not None:
            doc["sampler"]["cpu_share"] = self.sampler.cpu_share
        return doc

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MonitorSummary:
        data = dict(data)
        if isinstance(data.get("sampler"), dict):
            data["sampler"] = {k: v for k, v in data["sampler"].items() if k != "cpu_share"}
        return from_jsonable(cls, data)


@dataclass
class _Mean:
    total: float = 0.0
    n: int = 0
    peak: float | None = None
    low: float | None = None

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.total += value
        self.n += 1
        self.peak = value if self.peak is None else max(self.peak, value)
        self.low = value if self.low is None else min(self.low, value)

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class _Proc:
    name: str
    seen: int = 0
    peak: int | None = None
    util: _Mean = field(default_factory=_Mean)


@dataclass
class _DeviceAcc:
    info: GpuInfo
    policy: AlertPolicy
    n: int = 0
    first: GpuSample | None = None
    last: GpuSample | None = None
    # counters as (mono_s, value) at their first and last readings: they are not in every sample
    counters_first: dict[str, tuple[float, float]] = field(default_factory=dict)
    counters_last: dict[str, tuple[float, float]] = field(default_factory=dict)
    util_hist: list[int] = field(default_factory=lambda: [0] * 101)
    low_util: int = 0
    held: int = 0
    metrics: dict[str, _Mean] = field(default_factory=dict)
    slowdowns: dict[str, int] = field(default_factory=dict)
    gpm: dict[str, _Mean] = field(default_factory=dict)
    gpm_reason: str | None = None
    procs: dict[int, _Proc] = field(default_factory=dict)
    mem_total: int | None = None

    def add(self, s: GpuSample) -> None:
        self.n += 1
        self.first = self.first or s
        self.last = s
        counters: dict[str, float] = {f"violation_{k}": v for k, v in s.violation_ns.items()}
        if s.energy_j is not None:
            counters["energy_j"] = s.energy_j
        for name, value in counters.items():
            self.counters_first.setdefault(name, (s.mono_s, value))
            self.counters_last[name] = (s.mono_s, value)
        m = self.metrics
        if s.gpu_util_pct is not None:
            self.util_hist[max(0, min(100, s.gpu_util_pct))] += 1
            if s.processes:
                self.held += 1
                self.low_util += s.gpu_util_pct < self.policy.low_util_pct
            if s.gpu_util_pct >= 50:
                m.setdefault("sm_busy", _Mean()).add(s.sm_clock_mhz)
        for name in (
            "mem_util_pct",
            "sm_clock_mhz",
            "power_w",
            "temp_c",
            "mem_temp_c",
            "mem_used_bytes",
            "pcie_tx_bytes_per_s",
            "pcie_rx_bytes_per_s",
        ):
            m.setdefault(name, _Mean()).add(getattr(s, name))
        m.setdefault("power_limit_w", _Mean()).add(s.power_limit_w)
        self.mem_total = s.mem_total_bytes or self.mem_total
        for reason in s.slowdowns:
            self.slowdowns[reason] = self.slowdowns.get(reason, 0) + 1
        if s.gpm is not None:
            for name in GPM_FIELDS:
                self.gpm.setdefault(name, _Mean()).add(getattr(s.gpm, name))
        elif "gpm" in s.missing and not self.gpm:
            self.gpm_reason = s.missing["gpm"]
        for p in s.processes or ():
            proc = self.procs.setdefault(p.pid, _Proc(name=p.name))
            proc.seen += 1
            proc.name = proc.name or p.name
            if p.used_memory_bytes is not None:
                proc.peak = max(proc.peak or 0, p.used_memory_bytes)
            proc.util.add(p.sm_util_pct)

    def _counter_delta(self, name: str) -> float | None:
        if name not in self.counters_first:
            return None
        (t0, v0), (t1, v1) = self.counters_first[name], self.counters_last[name]
        return v1 - v0 if t1 > t0 and v1 >= v0 else None

    def _violation_shares(self) -> dict[str, float]:
        """Share of the time between their first and last readings that each clock policy held the
        clocks down, from the driver's counters. A share outside [0, 1] means the counter is not what
        nvml.h says (or wrapped): left out."""
        out = {}
        for name, (t0, v0) in self.counters_first.items():
            if not name.startswith("violation_"):
                continue
            t1, v1 = self.counters_last[name]
            if t1 <= t0:
                continue
            share = (v1 - v0) / 1e9 / (t1 - t0)
            if 0.0 <= share <= 1.05:
                out[name.removeprefix("violation_")] = min(share, 1.0)
        return out

    def summary(self, owner: Ownership | None) -> DeviceSummary:
        m = self.metrics

        def get(name: str) -> _Mean:
            return m.get(name, _Mean())

        first, last = self.first, self.last
        duration = last.mono_s - first.mono_s if first and last else 0.0
        counted = sum(self.util_hist)
        return DeviceSummary(
            index=self.info.index,
            name=self.info.name,
            samples=self.n,
            duration_s=duration,
            gpu_util_mean_pct=sum(i * c for i, c in enumerate(self.util_hist)) / counted if counted else None,
            gpu_util_p50_pct=_percentile(self.util_hist, 0.5),
            gpu_util_p10_pct=_percentile(self.util_hist, 0.1),
            low_util_share=self.low_util / self.held if self.held else None,
            mem_util_mean_pct=get("mem_util_pct").mean,
            sm_clock_busy_mean_mhz=get("sm_busy").mean,
            sm_clock_min_mhz=_int(get("sm_clock_mhz").low),
            sm_max_mhz=self.info.sm_max_mhz,
            power_mean_w=get("power_w").mean,
            power_max_w=get("power_w").peak,
            power_limit_w=get("power_limit_w").peak or self.info.power_limit_w,
            energy_j=self._counter_delta("energy_j"),
            temp_max_c=_int(get("temp_c").peak),
            mem_temp_max_c=_int(get("mem_temp_c").peak),
            mem_used_peak_bytes=_int(get("mem_used_bytes").peak),
            mem_total_bytes=self.mem_total or self.info.memory_total_bytes,
            slowdown_shares={k: v / self.n for k, v in sorted(self.slowdowns.items(), key=lambda kv: -kv[1])},
            violation_shares=self._violation_shares(),
            gpm_means=_gpm_means(self.gpm, duration / max(self.n - 1, 1)),
            gpm_reason=None if self.gpm else (self.gpm_reason or self.info.missing.get("gpm")),
            pcie_tx_mean_bytes_per_s=get("pcie_tx_bytes_per_s").mean,
            pcie_rx_mean_bytes_per_s=get("pcie_rx_bytes_per_s").mean,
            processes=tuple(
                ProcessSummary(
                    pid=pid,
                    name=p.name,
                    peak_memory_bytes=p.peak,
                    seen_share=p.seen / self.n,
                    owned=owner.owns(pid) if owner is not None else None,
                    sm_util_mean_pct=p.util.mean,
                )
                for pid, p in sorted(self.procs.items(), key=lambda kv: -(kv[1].peak or 0))
            ),
        )


class RunSummarizer:
    """Takes samples as they come (from the sampler's callback or a record) and gives the summary."""

    def __init__(
        self,
        system: SystemInfo,
        devices: Iterable[GpuInfo],
        interval_s: float,
        *,
        policy: AlertPolicy | None = None,
        owner: Ownership | None = None,
    ) -> None:
        self.system, self.interval_s = system, interval_s
        self.policy = policy or AlertPolicy()
        self.owner = owner
        infos = {d.index: d for d in devices}
        self.tracker = AlertTracker(infos, self.policy, owner)
        self._devices = {i: _DeviceAcc(info, self.policy) for i, info in infos.items()}

    def add(self, sample: GpuSample) -> None:
        acc = self._devices.get(sample.index)
        if acc is None:
            return
        acc.add(sample)
        self.tracker.update(sample)

    def summary(
        self,
        *,
        sampler: SamplerStats | None = None,
        command: tuple[str, ...] | None = None,
        exit_code: int | None = None,
    ) -> MonitorSummary:
        return MonitorSummary(
            system=self.system,
            devices=tuple(acc.summary(self.owner) for acc in self._devices.values() if acc.n),
            episodes=tuple(self.tracker.episodes()),
            interval_s=self.interval_s,
            sampler=sampler,
            command=command,
            exit_code=exit_code,
        )


def summarize_record(
    record: MonitorRecord, policy: AlertPolicy | None = None, owner: Ownership | None = None
) -> MonitorSummary:
    """The summary of a recorded series, as the live monitor would have made it."""
    summarizer = RunSummarizer(record.system, record.devices, record.interval_s, policy=policy, owner=owner)
    for sample in sorted(record.samples, key=lambda s: (s.mono_s, s.index)):
        summarizer.add(sample)
    return summarizer.summary()


def _percentile(hist: list[int], q: float) -> float | None:
    total = sum(hist)
    if not total:
        return None
    target = q * (total - 1)
    seen = 0
    for value, count in enumerate(hist):
        seen += count
        if seen > target:
            return float(value)
    return 100.0


def _gpm_means(gpm: dict[str, _Mean], interval_s: float) -> GpmMetrics | None:
    if not gpm:
        return None
    return GpmMetrics(interval_s=interval_s, **{k: v.mean for k, v in gpm.items()})


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None
