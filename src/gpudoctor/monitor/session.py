"""A monitoring session: the sampler, the alert tracker, the run summary and the optional log, fed from
one callback on the sampling thread. The CLI (live view, `--once`, `monitor -- cmd`) and library users
(`with MonitorSession(open_backend()) as s: ...`) read consistent snapshots of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.monitor.alerts import Alert, AlertPolicy, Ownership, evaluate
from gpudoctor.monitor.backend import NvmlBackend
from gpudoctor.monitor.logfile import SampleLog
from gpudoctor.monitor.sampler import DEFAULT_INTERVAL_S, Sampler, SamplerStats
from gpudoctor.monitor.samples import GpuInfo, GpuSample, SystemInfo
from gpudoctor.monitor.summary import MonitorSummary, RunSummarizer


@dataclass(frozen=True)
class Snapshot:
    """What a live view draws: the latest sample of each GPU and the alerts active now."""

    system: SystemInfo
    devices: tuple[GpuInfo, ...]
    latest: tuple[GpuSample, ...]  # in device order; a GPU not read yet is absent
    alerts: tuple[Alert, ...]
    stats: SamplerStats | None  # None for a one-off reading (--once)


class MonitorSession:
    """Sampling plus alerts plus summary. Start with `start()` or `with`; `stop()` gives the summary.

    Args:
        backend: the NVML source; the session does not close it.
        interval_s: sampling interval.
        devices: NVML indices to watch (default: all).
        policy: alert thresholds.
        owner: for `monitor -- cmd`, tells the command's processes from others (contention).
        log: where to write each sample, if anywhere; closed by `stop()`.
        keep: samples kept per GPU in memory for `samples()` (None: all).
    """

    def __init__(
        self,
        backend: NvmlBackend,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        devices: Sequence[int] | None = None,
        policy: AlertPolicy | None = None,
        owner: Ownership | None = None,
        log: SampleLog | None = None,
        keep: int | None = 600,
    ) -> None:
        self.backend = backend
        chosen = tuple(devices) if devices is not None else tuple(d.index for d in backend.devices())
        self.devices = tuple(d for d in backend.devices() if d.index in chosen)
        self._summarizer = RunSummarizer(
            backend.system(), self.devices, interval_s, policy=policy, owner=owner
        )
        self._log = log
        self._lock = threading.Lock()
        self.sampler = Sampler(
            backend, interval_s=interval_s, devices=chosen, on_sample=self._take, keep=keep
        )

    def _take(self, sample: GpuSample) -> None:
        with self._lock:
            self._summarizer.add(sample)
            if self._log is not None:
                self._log.write(sample)

    def start(self) -> MonitorSession:
        self.sampler.start()
        return self

    def stop(
        self,
        *,
        command: tuple[str, ...] | None = None,
        exit_code: int | None = None,
        raise_error: bool = True,
    ) -> MonitorSummary:
        try:
            stats = self.sampler.stop(raise_error=raise_error)
        finally:
            if self._log is not None:
                with self._lock:
                    self._log.close()
        with self._lock:
            return self._summarizer.summary(sampler=stats, command=command, exit_code=exit_code)

    def __enter__(self) -> MonitorSession:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.sampler.running:
            self.stop(raise_error=exc is None)

    @property
    def error(self) -> BaseException | None:
        return self.sampler.error

    def snapshot(self) -> Snapshot:
        latest = self.sampler.latest()
        with self._lock:
            alerts = tuple(self._summarizer.tracker.active())
        return Snapshot(
            system=self.backend.system(),
            devices=self.devices,
            latest=tuple(latest[d.index] for d in self.devices if d.index in latest),
            alerts=alerts,
            stats=self.sampler.stats(),
        )

    def raised(self) -> list[Alert]:
        """Alerts raised since the last call."""
        with self._lock:
            return self._summarizer.tracker.drain_raised()

    def samples(self, index: int | None = None) -> list[GpuSample]:
        return self.sampler.samples(index)


def read_once(
    backend: NvmlBackend,
    *,
    devices: Sequence[int] | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    policy: AlertPolicy | None = None,
) -> Snapshot:
    """One snapshot: two readings `interval_s` apart (rates, GPM and utilization need an interval), and
    the alerts that one moment can show (contention, slowdowns, memory; not the sustained ones)."""
    chosen = tuple(devices) if devices is not None else tuple(d.index for d in backend.devices())
    infos = {d.index: d for d in backend.devices()}
    first = {i: backend.read(i) for i in chosen}
    time.sleep(interval_s)
    latest = tuple(backend.read(i) for i in chosen)
    alerts = [
        a for s in latest for a in evaluate([first[s.index], s], infos.get(s.index), policy or AlertPolicy())
    ]
    return Snapshot(
        system=backend.system(),
        devices=tuple(infos[i] for i in chosen),
        latest=latest,
        alerts=tuple(alerts),
        stats=None,
    )
