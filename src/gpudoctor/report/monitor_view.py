"""Terminal views of the GPU monitor (rich): the live table of every GPU with its processes and alerts,
the one-line alert of `monitor -- cmd`, and the end-of-run summary. Renders only: every figure comes
from a `Snapshot`, an `Alert` or a `MonitorSummary` as it is."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpudoctor.device import clock_reasons as reasons
from gpudoctor.monitor.alerts import Alert, AlertEpisode
from gpudoctor.monitor.sampler import SamplerStats
from gpudoctor.monitor.samples import GpuInfo, GpuSample, fmt_memory
from gpudoctor.monitor.session import Snapshot
from gpudoctor.monitor.summary import DeviceSummary, MonitorSummary
from gpudoctor.report.style import cut, dim_line, line, not_available, section, table
from gpudoctor.util.text import printable
from gpudoctor.util.units import fmt_rate

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
# the driver's violation counters that are slowdowns (the others count idle time as well)
THROTTLE_COUNTERS = {
    "power": "power cap",
    "thermal": "thermal",
    "sw_thermal": "SW thermal",
    "hw_thermal": "HW thermal",
    "hw_power_brake": "power brake",
    "sync_boost": "sync boost",
    "board_limit": "board limit",
    "reliability": "reliability",
}
ALERT_LABELS = {
    "contention": "contention",
    "clocks_throttled": "clocks held down",
    "low_utilization": "GPU starved",
    "low_sm_activity": "SMs idle",
    "memory_high": "memory nearly full",
}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _size(n: int | None) -> str:
    return "-" if n is None else fmt_memory(n)


# --- live view and --once --------------------------------------------------------------------------


def device_table(devices: tuple[GpuInfo, ...], latest: tuple[GpuSample, ...]) -> Table:
    """One row per GPU. Units sit in the headers so that the cells stay narrow."""
    t = table(
        "GPU",
        "busy",
        "mem busy",
        "memory GiB",
        "SM MHz",
        "power W",
        "temp",
        "SM act",
        "tensor",
        "DRAM",
        "PCIe GB/s",
        "clock events",
        flexible=11,
    )
    t.columns[1].justify = "left"
    t.columns[-1].justify = "left"
    infos = {d.index: d for d in devices}
    for s in latest:
        info = infos.get(s.index)
        gpm = s.gpm
        t.add_row(
            str(s.index),
            _util_cell(s.gpu_util_pct),
            _pct(s.mem_util_pct),
            _memory_cell(s),
            _pair(s.sm_clock_mhz, info.sm_max_mhz if info else None, "{:.0f}"),
            _pair(s.power_w, s.power_limit_w, "{:.0f}"),
            "-" if s.temp_c is None else f"{s.temp_c}°C",
            _pct(gpm.sm_active_pct if gpm else None),
            _pct(gpm.tensor_active_pct if gpm else None),
            _pct(gpm.dram_bw_pct if gpm else None),
            _pcie_cell(s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s),
            _events_cell(s.clock_events),
        )
    return t


def device_names(devices: tuple[GpuInfo, ...]) -> Text:
    out = Text()
    for i, d in enumerate(devices):
        if i:
            out.append("\n")
        out.append(f"  GPU {d.index}: {d.name}", style="bold")
        details = [x for x in (d.architecture, d.pci_bus_id) if x]
        if details:
            out.append(" · " + " · ".join(details), style="dim")
    return out


def _util_cell(pct: int | None) -> Text:
    if pct is None:
        return Text("-", style="dim")
    style = "green" if pct >= 80 else "yellow" if pct >= 50 else "red"
    filled = round(max(0, min(100, pct)) / 100 * 8)
    return Text(f"{pct:>3}% ", style=style) + Text("█" * filled + "·" * (8 - filled), style=style)


def _memory_cell(s: GpuSample) -> Text:
    if s.mem_used_bytes is None:
        return Text("-", style="dim")
    gib = 1 << 30
    total = f"{s.mem_total_bytes / gib:.0f}" if s.mem_total_bytes else "?"
    share = s.mem_used_share
    return Text(
        f"{s.mem_used_bytes / gib:.1f}/{total}", style="yellow" if share is not None and share > 0.9 else ""
    )


def _pair(value: float | None, limit: float | None, spec: str) -> str:
    if value is None:
        return "-"
    return spec.format(value) + ("/" + spec.format(limit) if limit else "")


def _pcie_cell(tx: float | None, rx: float | None) -> str:
    if tx is None and rx is None:
        return "-"
    return "/".join("-" if v is None else f"{v / 1e9:.2f}" for v in (tx, rx))


def _events_cell(events: tuple[str, ...]) -> Text:
    if not events:
        return Text("none", style="dim")
    out = Text()
    for i, name in enumerate(events):
        if i:
            out.append(", ")
        severity = reasons.severity(name)
        out.append(reasons.label(name), style=SEVERITY_STYLE.get(severity, "dim"))
    return out


def process_table(latest: tuple[GpuSample, ...]) -> Table | None:
    rows = [(s.index, p) for s in latest for p in s.processes or ()]
    if not rows:
        return None
    t = table("GPU", "pid", "process", "memory", "SM", "kind", first_left=1, flexible=2)
    t.columns[2].justify = "left"
    t.columns[5].justify = "left"
    for gpu, p in rows:
        t.add_row(
            str(gpu),
            str(p.pid),
            cut(p.name or "?"),
            _size(p.used_memory_bytes),
            _pct(p.sm_util_pct),
            p.kind,
        )
    return t


def alert_text(alert: Alert, *, hint: bool = True) -> Text:
    out = Text()
    out.append(f"{alert.severity:8}", style=SEVERITY_STYLE.get(alert.severity, ""))
    out.append(f" {ALERT_LABELS.get(alert.kind, alert.kind)}: ", style="bold")
    out.append(printable(alert.message))
    if hint:
        out.append(f"\n          {alert.hint}", style="dim")
    return out


def alert_line(alert: Alert) -> str:
    """One plain line for an alert raised while following a command (printed on stderr)."""
    return printable(
        f"gpudoctor: {alert.severity}: {ALERT_LABELS.get(alert.kind, alert.kind)}: {alert.message}"
    )


def render_live(snap: Snapshot, *, footer: str = "") -> RenderableType:
    """The live view: GPUs, their processes, active alerts and the sampler's cost."""
    parts: list[RenderableType] = [device_names(snap.devices), device_table(snap.devices, snap.latest)]
    procs = process_table(snap.latest)
    parts.append(Text(""))
    parts.append(procs if procs is not None else Text("  no processes on the GPUs", style="dim"))
    parts.append(Text(""))
    if snap.alerts:
        parts.extend(alert_text(a) for a in snap.alerts)
    else:
        parts.append(Text("  no alerts", style="dim"))
    gpm_missing = [
        f"GPU {d.index}: {d.missing['gpm']}"
        for d in snap.devices
        if not d.gpm_supported and "gpm" in d.missing
    ]
    if gpm_missing:
        parts.append(Text("  SM act / tensor / DRAM not available: " + "; ".join(gpm_missing), style="dim"))
    parts.append(Text(_stats_text(snap.stats) + (f" · {footer}" if footer else ""), style="dim"))
    return Group(*parts)


def _stats_text(stats: SamplerStats | None) -> str:
    if stats is None or stats.ticks == 0:
        return "  one reading"
    return (
        f"  every {stats.interval_s * 1e3:.0f} ms · {stats.ticks} rounds · sampler CPU {stats.cpu_share:.2%} of a core"
        f" · {stats.read_ms_mean:.2f} ms per GPU reading"
    )


def render_snapshot(snap: Snapshot, console: Console) -> None:
    header = Text(
        f"gpudoctor monitor · {len(snap.devices)} GPU{'s' if len(snap.devices) != 1 else ''}", style="bold"
    )
    if snap.system.driver_version:
        header.append(f" · driver {snap.system.driver_version}", style="dim")
    console.print(header)
    console.print(render_live(snap))


# --- the summary -----------------------------------------------------------------------------------


def render_summary(summary: MonitorSummary, console: Console) -> None:
    title = "Run summary" if summary.command else "Monitor summary"
    section(console, title)
    if summary.command:
        status = "?" if summary.exit_code is None else str(summary.exit_code)
        line(console, Text(" ".join(summary.command)), f"exit status {status}")
    if not summary.devices:
        not_available(console, "no samples were taken")
        return
    for d in summary.devices:
        _render_device(d, console)
    section(console, "Alerts")
    if summary.episodes:
        for e in summary.episodes:
            console.print(_episode_text(e))
    else:
        dim_line(console, "none raised")
    if summary.sampler is not None and summary.sampler.ticks:
        dim_line(console, _stats_text(summary.sampler).strip())


def _render_device(d: DeviceSummary, console: Console) -> None:
    console.print(
        Text(f"  GPU {d.index} · {d.name} · {d.samples} samples over {d.duration_s:.1f} s", style="bold")
    )
    util = f"busy {_pct(d.gpu_util_mean_pct)} mean, {_pct(d.gpu_util_p50_pct)} median, {_pct(d.gpu_util_p10_pct)} p10"
    if d.low_util_share is not None:
        util += f"; under 50% in {d.low_util_share:.0%} of samples while held"
    line(console, util)
    clocks = []
    if d.sm_clock_busy_mean_mhz is not None:
        clocks.append(
            f"SM clock while busy {d.sm_clock_busy_mean_mhz:.0f} MHz"
            + (f" ({d.sm_clock_busy_mean_mhz / d.sm_max_mhz:.0%} of {d.sm_max_mhz})" if d.sm_max_mhz else "")
        )
    if d.sm_clock_min_mhz is not None:
        clocks.append(f"SM clock min {d.sm_clock_min_mhz} MHz")
    if clocks:
        line(console, *clocks)
    power = []
    if d.power_mean_w is not None:
        power.append(
            f"power {d.power_mean_w:.0f} W mean, {d.power_max_w:.0f} W max"
            + (f" of {d.power_limit_w:.0f} W" if d.power_limit_w else "")
        )
    if d.energy_j is not None:
        power.append(f"{d.energy_j / 1e3:.3g} kJ")
    if d.temp_max_c is not None:
        power.append(f"{d.temp_max_c} °C max" + (f" (HBM {d.mem_temp_max_c} °C)" if d.mem_temp_max_c else ""))
    if power:
        line(console, *power)
    if d.mem_used_peak_bytes is not None:
        line(
            console,
            f"memory peak {fmt_memory(d.mem_used_peak_bytes)} of {fmt_memory(d.mem_total_bytes)}",
            f"memory busy {_pct(d.mem_util_mean_pct)} mean",
        )
    if d.gpm_means is not None:
        g = d.gpm_means
        line(
            console,
            f"SM activity {_pct(g.sm_active_pct)}",
            f"occupancy {_pct(g.sm_occupancy_pct)}",
            f"tensor cores {_pct(g.tensor_active_pct)}",
            f"DRAM bandwidth {_pct(g.dram_bw_pct)}",
            f"FP32 {_pct(g.fp32_pct)}",
            f"FP16 {_pct(g.fp16_pct)}",
        )
    elif d.gpm_reason:
        dim_line(console, f"SM / tensor-core / DRAM activity not available: {d.gpm_reason}")
    if d.pcie_tx_mean_bytes_per_s is not None or d.pcie_rx_mean_bytes_per_s is not None:
        line(
            console,
            f"PCIe out {fmt_rate(d.pcie_tx_mean_bytes_per_s)} mean, in {fmt_rate(d.pcie_rx_mean_bytes_per_s)} mean",
        )
    if d.slowdown_shares:
        parts = ", ".join(f"{reasons.label(k)} {v:.0%} of samples" for k, v in d.slowdown_shares.items())
        line(console, Text(f"clocks held down: {parts}", style="yellow"))
    else:
        line(console, "clocks never held down (no slowdown reason seen)")
    shown = {k: v for k, v in d.violation_shares.items() if k in THROTTLE_COUNTERS and v >= 0.005}
    if shown:
        dim_line(
            console,
            "driver counters, share of the run held below the requested clocks: "
            + ", ".join(f"{THROTTLE_COUNTERS[k]} {v:.0%}" for k, v in shown.items()),
        )
    if d.processes:
        t = table("pid", "process", "peak memory", "SM mean", "seen", "", first_left=0, flexible=1)
        t.columns[1].justify = "left"
        t.columns[5].justify = "left"
        for p in d.processes:
            owned = {True: "command", False: "other", None: ""}[p.owned]
            t.add_row(
                str(p.pid),
                cut(p.name or "?"),
                _size(p.peak_memory_bytes),
                _pct(p.sm_util_mean_pct),
                f"{p.seen_share:.0%}",
                owned,
            )
        console.print(t)


def _episode_text(e: AlertEpisode) -> Text:
    out = Text("  ")
    out.append(f"{e.severity:8}", style=SEVERITY_STYLE.get(e.severity, ""))
    out.append(f" {ALERT_LABELS.get(e.kind, e.kind)}", style="bold")
    times = "once" if e.raised == 1 else f"{e.raised} times"
    out.append(f" · raised {times} · active {e.active_s:.1f} s · first at {e.first_s:.1f} s\n", style="dim")
    out.append(f"    {e.message}\n")
    out.append(f"    {e.hint}", style="dim")
    return out
