"""The GPU monitor: NVML samples in a background thread, clock-event (throttle) reasons, alerts and run
summaries. Importing it touches nothing: NVML starts when a backend is opened.

For benchmarks: `read_clocks(device)` and `ClockWatch` (see `monitor.clocks`).
For a session: `with MonitorSession(open_backend()) as session: ...; summary = session.stop()`.
"""

from gpudoctor.device.clock_reasons import decode_clock_events
from gpudoctor.monitor.alerts import Alert, AlertEpisode, AlertPolicy
from gpudoctor.monitor.backend import NvmlBackend, NvmlUnavailable, open_backend
from gpudoctor.monitor.clocks import ClockReport, ClockWatch, close_shared_backend, read_clocks
from gpudoctor.monitor.replay import ReplayBackend
from gpudoctor.monitor.sampler import Sampler, SamplerStats
from gpudoctor.monitor.samples import ClockState, GpmMetrics, GpuInfo, GpuProcess, GpuSample, MonitorRecord
from gpudoctor.monitor.session import MonitorSession, Snapshot
from gpudoctor.monitor.summary import MonitorSummary, summarize_record

__all__ = [
    "Alert",
    "AlertEpisode",
    "AlertPolicy",
    "ClockReport",
    "ClockState",
    "ClockWatch",
    "GpmMetrics",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "MonitorRecord",
    "MonitorSession",
    "MonitorSummary",
    "NvmlBackend",
    "NvmlUnavailable",
    "ReplayBackend",
    "Sampler",
    "SamplerStats",
    "Snapshot",
    "close_shared_backend",
    "decode_clock_events",
    "open_backend",
    "read_clocks",
    "summarize_record",
]
