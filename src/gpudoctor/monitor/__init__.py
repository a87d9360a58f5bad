"""The GPU monitor: NVML samples in a background thread, clock-event (throttle) reasons, alerts and run
summaries. Importing it touches nothing: NVML starts when a backend is opened, and the names below are
imported on first use (a `RunRecord`'s samples need `monitor.samples` alone).

For benchmarks: `read_clocks(device)` and `ClockWatch` (see `monitor.clocks`).
For a session: `with MonitorSession(open_backend()) as session: ...; summary = session.stop()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.util.lazy import lazy_exports

if TYPE_CHECKING:
    from gpudoctor.device.clock_reasons import decode_clock_events
    from gpudoctor.monitor.alerts import Alert, AlertEpisode, AlertPolicy
    from gpudoctor.monitor.backend import NvmlBackend, NvmlUnavailable, open_backend
    from gpudoctor.monitor.clocks import ClockReport, ClockWatch, close_shared_backend, read_clocks
    from gpudoctor.monitor.replay import ReplayBackend
    from gpudoctor.monitor.sampler import Sampler, SamplerStats
    from gpudoctor.monitor.samples import (
        ClockState,
        GpmMetrics,
        GpuInfo,
        GpuProcess,
        GpuSample,
        MonitorRecord,
    )
    from gpudoctor.monitor.session import MonitorSession, Snapshot
    from gpudoctor.monitor.summary import MonitorSummary, summarize_record

# public name -> the module that defines it
_EXPORTS = {
    "Alert": "gpudoctor.monitor.alerts",
    "AlertEpisode": "gpudoctor.monitor.alerts",
    "AlertPolicy": "gpudoctor.monitor.alerts",
    "ClockReport": "gpudoctor.monitor.clocks",
    "ClockState": "gpudoctor.monitor.samples",
    "ClockWatch": "gpudoctor.monitor.clocks",
    "GpmMetrics": "gpudoctor.monitor.samples",
    "GpuInfo": "gpudoctor.monitor.samples",
    "GpuProcess": "gpudoctor.monitor.samples",
    "GpuSample": "gpudoctor.monitor.samples",
    "MonitorRecord": "gpudoctor.monitor.samples",
    "MonitorSession": "gpudoctor.monitor.session",
    "MonitorSummary": "gpudoctor.monitor.summary",
    "NvmlBackend": "gpudoctor.monitor.backend",
    "NvmlUnavailable": "gpudoctor.monitor.backend",
    "ReplayBackend": "gpudoctor.monitor.replay",
    "Sampler": "gpudoctor.monitor.sampler",
    "SamplerStats": "gpudoctor.monitor.sampler",
    "Snapshot": "gpudoctor.monitor.session",
    "close_shared_backend": "gpudoctor.monitor.clocks",
    "decode_clock_events": "gpudoctor.device.clock_reasons",
    "open_backend": "gpudoctor.monitor.backend",
    "read_clocks": "gpudoctor.monitor.clocks",
    "summarize_record": "gpudoctor.monitor.summary",
}

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


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each public name imported when first asked for
