"""The fake `NvmlBackend`: replays a `MonitorRecord` recorded on a GPU machine (a `--log x.jsonl` file or a
test fixture), one recorded sample per `read`, in order. By default each replayed sample is re-stamped
with the current time, so that everything downstream (windows, alerts, summaries) runs as it would live."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from gpudoctor.monitor.backend import NvmlUnavailable, resolve_device
from gpudoctor.monitor.samples import ClockState, GpuInfo, GpuSample, MonitorRecord, SystemInfo


class ReplayBackend:
    """Replays recorded samples. `loop=True` starts again at the end; otherwise the last sample repeats.

    Args:
        record: what to replay; every device of `record.devices` needs at least one sample.
        retime: stamp replayed samples with the time of the `read` (else keep the recorded times).
        clock: the monotonic clock used to re-stamp (tests pass a fake one).
    """

    def __init__(
        self, record: MonitorRecord, *, loop: bool = True, retime: bool = True, clock: object = time.monotonic
    ) -> None:
        self._record = record
        self._series = {d.index: record.for_device(d.index) for d in record.devices}
        empty = [i for i, s in self._series.items() if not s]
        if empty:
            raise NvmlUnavailable(f"the recorded series has no samples for GPU {empty[0]}")
        self._position = dict.fromkeys(self._series, 0)
        self._loop, self._retime, self._clock = loop, retime, clock
        self._lock = threading.Lock()
        self.closed = False
        self.reads = 0

    @classmethod
    def from_file(cls, path: Path, **options: object) -> ReplayBackend:
        return cls(MonitorRecord.read_jsonl(path), **options)  # type: ignore[arg-type]

    def system(self) -> SystemInfo:
        return self._record.system

    def devices(self) -> tuple[GpuInfo, ...]:
        return self._record.devices

    def resolve(self, device: int | str) -> int:
        return resolve_device(self.devices(), device)

    def read(self, index: int, *, full: bool = False) -> GpuSample:
        with self._lock:
            series = self._series[index]
            pos = self._position[index]
            sample = series[pos % len(series)] if self._loop else series[min(pos, len(series) - 1)]
            self._position[index] = pos + 1
            self.reads += 1
        if not self._retime:
            return sample
        now = self._clock()  # type: ignore[operator]
        return dataclasses.replace(sample, mono_s=now, unix_s=time.time())

    def read_clocks(self, index: int) -> ClockState:
        with self._lock:
            series = self._series[index]
            sample = series[max(self._position[index] - 1, 0) % len(series)]
        info = next(d for d in self._record.devices if d.index == index)
        return ClockState(
            index=index,
            sm_mhz=sample.sm_clock_mhz,
            sm_max_mhz=info.sm_max_mhz,
            mem_mhz=sample.mem_clock_mhz,
            mem_max_mhz=info.mem_max_mhz,
            event_mask=sample.clock_event_mask,
            events=sample.clock_events,
            temp_c=sample.temp_c,
            power_w=sample.power_w,
            power_limit_w=sample.power_limit_w,
        )

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> ReplayBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
