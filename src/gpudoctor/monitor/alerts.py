"""Alerts: what a window of recent samples says about a GPU. `evaluate` is a pure function of the window;
`AlertTracker` feeds it sample by sample and keeps, per GPU and kind, the episodes (when raised, how
long active) for the end-of-run summary. Alert kinds are stable ids (JSON consumers rely on them)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpudoctor.device import clock_reasons as reasons
from gpudoctor.monitor.samples import GpuInfo, GpuProcess, GpuSample, fmt_memory

LOW_UTILIZATION = "low_utilization"
CLOCKS_THROTTLED = "clocks_throttled"
CONTENTION = "contention"
MEMORY_HIGH = "memory_high"
LOW_SM_ACTIVITY = "low_sm_activity"
KINDS = (CONTENTION, CLOCKS_THROTTLED, LOW_UTILIZATION, LOW_SM_ACTIVITY, MEMORY_HIGH)
SEVERITIES = ("info", "warning", "critical")


class Ownership(Protocol):
    """Whether a pid belongs to the followed command: True, False, or None when it cannot be told."""

    def owns(self, pid: int) -> bool | None: ...


@dataclass(frozen=True)
class AlertPolicy:
    low_util_pct: float = 50.0  # mean GPU utilization below this ...
    low_util_window_s: float = 5.0  # ... over this long, while a process holds the GPU
    window_coverage: float = 0.8  # a window counts once samples span this share of it
    memory_high_share: float = 0.9
    throttle_window_s: float = 1.0  # a slowdown reason seen in this window keeps the alert up
    busy_util_pct: float = 80.0  # "the GPU is busy" for the SM-activity check
    low_sm_active_pct: float = 25.0  # GPM SM activity below this while busy: kernels too small
    evaluate_every_s: float = 0.25  # the tracker re-evaluates a GPU's alerts at most this often

    @property
    def max_window_s(self) -> float:
        return max(self.low_util_window_s, self.throttle_window_s)


@dataclass(frozen=True)
class Alert:
    kind: str  # one of KINDS
    gpu: int
    severity: str  # "info", "warning" or "critical"
    message: str  # what was seen, with its numbers, on one line
    hint: str  # what it usually means and what to do

    @property
    def key(self) -> tuple[int, str]:
        return (self.gpu, self.kind)


@dataclass(frozen=True)
class AlertEpisode:
    """One kind of alert on one GPU over a run: how often it was raised and how long it stayed up."""

    kind: str
    gpu: int
    severity: str  # the worst seen
    raised: int  # times it went from clear to active
    active_s: float  # total time active
    first_s: float  # seconds from the first sample to the first raise
    message: str  # the message when it was last raised or worst
    hint: str


def evaluate(
    window: Sequence[GpuSample],
    info: GpuInfo | None,
    policy: AlertPolicy,
    owner: Ownership | None = None,
    busy_since_s: float | None = None,
) -> list[Alert]:
    """The alerts active at the last sample of `window` (samples of one GPU, oldest first).

    `busy_since_s`: when the work first ran kernels on this GPU; the utilization checks look only at
    samples from then on, so that a process starting up (CUDA context made, no kernels yet) is not
    taken for a starved one. None: look at the whole window."""
    if not window:
        return []
    if busy_since_s is not None:
        working = [s for s in window if s.mono_s >= busy_since_s]
    else:
        working = list(window)
    checks = (
        _contention(window[-1], owner),
        _throttled(window, info, policy),
        _low_utilization(working, policy, owner) if working else None,
        _low_sm_activity(working, policy, owner) if working else None,
        _memory_high(window[-1], policy),
    )
    return [a for a in checks if a is not None]


# --- the checks ------------------------------------------------------------------------------------


def _ours_and_others(
    procs: tuple[GpuProcess, ...], owner: Ownership | None
) -> tuple[list[GpuProcess], list[GpuProcess]] | None:
    """Split the GPU's processes into (ours, others); None when ownership cannot be told, in which
    case every process counts as a peer. A pid not visible from here beside one of ours is another's
    (a process of another container, say)."""
    if owner is None:
        return None
    verdicts = [(p, owner.owns(p.pid)) for p in procs]
    if any(v is None for _, v in verdicts) and not any(v for _, v in verdicts):
        return None  # NVML's pids live in another PID namespace: fall back to counting
    return [p for p, v in verdicts if v], [p for p, v in verdicts if not v]


def _active(sample: GpuSample, owner: Ownership | None) -> bool:
    """Whether the GPU is in use by the work being watched (the command, or anyone when standalone)."""
    procs = sample.processes or ()
    split = _ours_and_others(procs, owner)
    return bool(split[0]) if split is not None else bool(procs)


def _contention(latest: GpuSample, owner: Ownership | None) -> Alert | None:
    procs = latest.processes or ()
    split = _ours_and_others(procs, owner)
    if split is None:
        if len(procs) < 2:
            return None
        message = f"{len(procs)} processes share GPU {latest.index}: " + "; ".join(
            _describe(p) for p in procs
        )
    else:
        ours, others = split
        if not ours or not others:
            return None
        message = f"another process on GPU {latest.index} beside the command: " + "; ".join(
            _describe(p) for p in others
        )
    return Alert(
        CONTENTION,
        latest.index,
        "warning",
        message,
        "processes on one GPU time-share its SMs and memory bandwidth: step times stretch and vary",
    )


def _describe(p: GpuProcess) -> str:
    parts = [f"pid {p.pid}"]
    if p.name:
        parts.append(p.name)
    if p.used_memory_bytes is not None:
        parts.append(fmt_memory(p.used_memory_bytes))
    if p.sm_util_pct is not None:
        parts.append(f"SM {p.sm_util_pct}%")
    return " ".join(parts[:1]) + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def _throttled(window: Sequence[GpuSample], info: GpuInfo | None, policy: AlertPolicy) -> Alert | None:
    latest = window[-1]
    recent = _since(window, latest.mono_s - policy.throttle_window_s)
    held = [s for s in recent if s.slowdowns]
    if not held:
        return None
    seen: dict[str, int] = {}
    for s in held:
        for name in s.slowdowns:
            seen[name] = seen.get(name, 0) + 1
    worst = max(seen, key=lambda n: reasons.SEVERITY_RANK[reasons.severity(n)])
    names = ", ".join(
        reasons.label(n) + ("" if c == len(recent) else f" in {c} of {len(recent)} readings")
        for n, c in seen.items()
    )
    # the figures of the readings that were held down, not of the latest one (which may have recovered)
    parts = []
    clocks = [s.sm_clock_mhz for s in held if s.sm_clock_mhz is not None]
    if clocks:
        clock = _mean(clocks)
        share = f" ({clock / info.sm_max_mhz:.0%})" if info is not None and info.sm_max_mhz else ""
        parts.append(
            f"SM {clock:.0f}"
            + (f" of {info.sm_max_mhz}" if info and info.sm_max_mhz else "")
            + f" MHz{share}"
        )
    powers = [s.power_w for s in held if s.power_w is not None]
    if "sw_power_cap" in seen and powers and latest.power_limit_w:
        parts.append(f"power {_mean(powers):.0f} of {latest.power_limit_w:.0f} W")
    temps = [s.temp_c for s in held if s.temp_c is not None]
    if any("thermal" in n for n in seen) and temps:
        parts.append(f"{max(temps)} °C")
    message = f"GPU {latest.index} held down by {names}" + (": " + ", ".join(parts) if parts else "")
    return Alert(CLOCKS_THROTTLED, latest.index, reasons.severity(worst), message, reasons.meaning(worst))


def _covered(window: Sequence[GpuSample], span_s: float, policy: AlertPolicy) -> list[GpuSample] | None:
    """The samples of the last `span_s`, if they cover enough of it to judge."""
    latest = window[-1]
    recent = _since(window, latest.mono_s - span_s)
    if latest.mono_s - recent[0].mono_s < policy.window_coverage * span_s:
        return None
    return recent


def _low_utilization(
    window: Sequence[GpuSample], policy: AlertPolicy, owner: Ownership | None
) -> Alert | None:
    if not _active(window[-1], owner):
        return None
    recent = _covered(window, policy.low_util_window_s, policy)
    utils = [s.gpu_util_pct for s in recent or () if s.gpu_util_pct is not None]
    if not utils:
        return None
    mean = _mean(utils)
    if mean >= policy.low_util_pct:
        return None
    return Alert(
        LOW_UTILIZATION,
        window[-1].index,
        "warning",
        f"GPU {window[-1].index} busy {mean:.0f}% over the last {policy.low_util_window_s:g} s "
        f"(under {policy.low_util_pct:g}%) while a process holds it",
        "the GPU waits for the host: input pipeline (data loading, preprocessing, host-to-device copies),"
        " host syncs or Python overhead; `gpudoctor analyze` on a trace says which",
    )


def _low_sm_activity(
    window: Sequence[GpuSample], policy: AlertPolicy, owner: Ownership | None
) -> Alert | None:
    if not _active(window[-1], owner):
        return None
    recent = _covered(window, policy.low_util_window_s, policy) or ()
    pairs = [
        (s.gpu_util_pct, s.gpm.sm_active_pct)
        for s in recent
        if s.gpu_util_pct is not None and s.gpm is not None and s.gpm.sm_active_pct is not None
    ]
    if not pairs:
        return None
    util = _mean([u for u, _ in pairs])
    active = _mean([a for _, a in pairs])
    if util < policy.busy_util_pct or active >= policy.low_sm_active_pct:
        return None
    return Alert(
        LOW_SM_ACTIVITY,
        window[-1].index,
        "info",
        f"GPU {window[-1].index} runs kernels {util:.0f}% of the time but keeps only {active:.0f}% of its SMs "
        f"busy (GPM SM activity)",
        "kernels too small to fill the GPU (small batch, many tiny launches): larger batches, fused kernels"
        " (torch.compile) or CUDA graphs",
    )


def _memory_high(latest: GpuSample, policy: AlertPolicy) -> Alert | None:
    share = latest.mem_used_share
    if share is None or share <= policy.memory_high_share:
        return None
    return Alert(
        MEMORY_HIGH,
        latest.index,
        "warning",
        f"GPU {latest.index} memory {share:.0%} used ({fmt_memory(latest.mem_used_bytes)} of "
        f"{fmt_memory(latest.mem_total_bytes)})",
        "close to out-of-memory: a larger batch or sequence will fail. NVML counts what PyTorch's caching"
        " allocator holds, not only live tensors: torch.cuda.memory_summary() tells them apart",
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _since(window: Sequence[GpuSample], start_s: float) -> list[GpuSample]:
    out = [s for s in window if s.mono_s >= start_s]
    return out or [window[-1]]


# --- tracking over a run ---------------------------------------------------------------------------


@dataclass
class _Episodes:
    first: Alert
    raised: int = 1
    active_s: float = 0.0
    first_s: float = 0.0
    worst: Alert | None = None


@dataclass
class AlertTracker:
    """Feeds `evaluate` sample by sample; knows which alerts are active and the episodes of the run."""

    devices: dict[int, GpuInfo]
    policy: AlertPolicy = field(default_factory=AlertPolicy)
    owner: Ownership | None = None

    def __post_init__(self) -> None:
        self._windows: dict[int, deque[GpuSample]] = {}
        self._active: dict[tuple[int, str], Alert] = {}
        self._episodes: dict[tuple[int, str], _Episodes] = {}
        self._raised: list[Alert] = []
        self._start_s: float | None = None
        self._busy_since: dict[int, float | None] = {}
        self._evaluated_s: dict[int, float] = {}

    def update(self, sample: GpuSample) -> list[Alert]:
        """Take one sample; return the alerts active on its GPU now."""
        if self._start_s is None:
            self._start_s = sample.mono_s
        window = self._windows.setdefault(sample.index, deque())
        window.append(sample)
        horizon = sample.mono_s - self.policy.max_window_s - 1.0
        while window and window[0].mono_s < horizon:
            window.popleft()
        if not _active(sample, self.owner):
            self._busy_since[sample.index] = None
        elif self._busy_since.get(sample.index) is None and (sample.gpu_util_pct or 0) > 0:
            self._busy_since[sample.index] = sample.mono_s
        last = self._evaluated_s.get(sample.index)
        if last is not None and sample.mono_s - last < self.policy.evaluate_every_s:
            return [a for k, a in self._active.items() if k[0] == sample.index]
        dt = sample.mono_s - last if last is not None else 0.0
        self._evaluated_s[sample.index] = sample.mono_s
        busy_since = self._busy_since.get(sample.index)
        current = evaluate(
            window,
            self.devices.get(sample.index),
            self.policy,
            self.owner,
            busy_since_s=math.inf if busy_since is None else busy_since,
        )
        keys = {a.key for a in current}
        for key in [k for k in self._active if k[0] == sample.index and k not in keys]:
            del self._active[key]
        for alert in current:
            episodes = self._episodes.get(alert.key)
            if episodes is None:
                episodes = self._episodes[alert.key] = _Episodes(
                    first=alert, first_s=sample.mono_s - self._start_s
                )
                self._raised.append(alert)
            elif alert.key not in self._active:
                episodes.raised += 1
                self._raised.append(alert)
            else:
                episodes.active_s += dt
            if episodes.worst is None or _rank(alert) >= _rank(episodes.worst):
                episodes.worst = alert
            self._active[alert.key] = alert
        return current

    def active(self) -> list[Alert]:
        return sorted(self._active.values(), key=lambda a: (-_rank(a), a.gpu, KINDS.index(a.kind)))

    def drain_raised(self) -> list[Alert]:
        """Alerts raised since the last call (for printing them as they happen)."""
        raised, self._raised = self._raised, []
        return raised

    def episodes(self) -> list[AlertEpisode]:
        out = []
        for (gpu, kind), e in self._episodes.items():
            worst = e.worst or e.first
            out.append(
                AlertEpisode(
                    kind=kind,
                    gpu=gpu,
                    severity=worst.severity,
                    raised=e.raised,
                    active_s=e.active_s,
                    first_s=e.first_s,
                    message=worst.message,
                    hint=worst.hint,
                )
            )
        return sorted(out, key=lambda e: (-SEVERITIES.index(e.severity), e.gpu, KINDS.index(e.kind)))


def _rank(alert: Alert) -> int:
    return SEVERITIES.index(alert.severity)
