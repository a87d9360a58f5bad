"""Inline SVG charts for the HTML report, drawn in Python: stacked per-step bars, the GPU timeline of a
step, a line series and the roofline. Renders only; every text from a trace goes through `html.escape`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from gpudoctor.analysis.roofline import Roofline, RooflineCeilings
from gpudoctor.analysis.summary import StepSummary
from gpudoctor.analysis.timeline_view import StepTimeline
from gpudoctor.util.units import fmt_bytes, fmt_flops, fmt_pct, fmt_rate, fmt_us

KIND_COLORS = {
    "compute": "#4c78a8",
    "communication": "#9467bd",
    "memcpy_h2d": "#f58518",
    "memcpy_d2h": "#e45756",
    "memcpy_d2d": "#72b7b2",
    "memcpy_other": "#b279a2",
    "memset": "#9d755d",
}
IDLE_COLORS = {"host_wait": "#eeca3b", "sync": "#d62728", "launch_gap": "#ff9da6", "other": "#c7c7c7"}
IDLE_NAMES = {"host_wait": "idle: host wait", "sync": "idle: sync", "launch_gap": "idle: launch gap"}
FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def label_of(key: str) -> str:
    return IDLE_NAMES.get(key, "idle: other" if key == "other" else key.replace("_", " "))


def color_of(key: str) -> str:
    return KIND_COLORS.get(key) or IDLE_COLORS.get(key, "#888")


def legend(keys: Sequence[str]) -> str:
    items = "".join(
        f'<span class="key"><i style="background:{color_of(k)}"></i>{escape(label_of(k))}</span>'
        for k in keys
    )
    return f'<div class="legend">{items}</div>'


def step_bars(steps: Sequence[StepSummary], width: int = 860, height: int = 220) -> tuple[str, list[str]]:
    """One stacked bar per step: busy time by kind, then idle time by cause; returns (svg, keys used)."""
    rows = [s for s in steps if s.gpu is not None]
    if not rows:
        return "", []
    keys = [k for k in KIND_COLORS if any(s.gpu.busy_by_kind_us.get(k, 0) > 0 for s in rows)]
    keys += [c for c in IDLE_COLORS if any(s.gpu.idle_by_cause_us.get(c, 0) > 0 for s in rows)]
    top = max(s.gpu.window_us for s in rows) or 1.0
    left, bottom, pad = 64, 24, 8
    plot_w, plot_h = width - left - pad, height - bottom - pad
    slot = plot_w / len(rows)
    bar_w = max(min(slot * 0.7, 60), 1)
    out = [_svg_open(width, height, "Step time by busy kind and idle cause")]
    for frac in (0, 0.5, 1):
        y = pad + plot_h * (1 - frac)
        out.append(f'<line x1="{left}" x2="{width - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt_us(top * frac)) if frac else 0}</text>'
        )
    for i, s in enumerate(rows):
        x = left + slot * i + (slot - bar_w) / 2
        y = pad + plot_h
        parts = {**s.gpu.busy_by_kind_us, **s.gpu.idle_by_cause_us}
        for k in keys:
            h = parts.get(k, 0.0) / top * plot_h
            if h <= 0:
                continue
            y -= h
            tip = f"step {s.number}: {label_of(k)} {fmt_us(parts[k])}"
            out.append(
                f'<rect x="{x:.1f}" y="{y:.2f}" width="{bar_w:.1f}" height="{h:.2f}" fill="{color_of(k)}">'
                f"<title>{escape(tip)}</title></rect>"
            )
        if len(rows) <= 40 or i % max(len(rows) // 20, 1) == 0:
            out.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{height - 8}" text-anchor="middle">{s.number}</text>'
            )
    out.append("</svg>")
    return "".join(out), keys


def timeline(view: StepTimeline, width: int = 860) -> tuple[str, list[str]]:
    """One lane per stream (plus an idle lane coloured by cause); returns (svg, keys used)."""
    lane_h, gap, left, top = 22, 6, 92, 8
    n = len(view.lanes) + 1
    height = top + n * (lane_h + gap) + 22
    plot_w = width - left - 8
    scale = plot_w / max(view.duration_us, 1e-9)
    out = [_svg_open(width, height, "GPU timeline of one step")]
    keys: list[str] = []
    for i, lane in enumerate(view.lanes):
        y = top + i * (lane_h + gap)
        name = f"GPU {lane.device} s{lane.stream}"
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(name)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{plot_w}" height="{lane_h}" fill="#f4f4f4"/>')
        for sp in lane.spans:
            if sp.label not in keys:
                keys.append(sp.label)
            w = max((sp.end_us - sp.start_us) * scale, 0.5)
            more = f" (+{sp.count - 1} more)" if sp.count > 1 else ""
            tip = f"{sp.name}{more} · {fmt_us(sp.end_us - sp.start_us)}"
            out.append(
                f'<rect x="{left + sp.start_us * scale:.1f}" y="{y}" width="{w:.1f}" height="{lane_h}" '
                f'fill="{color_of(sp.label)}"><title>{escape(tip)}</title></rect>'
            )
    y = top + len(view.lanes) * (lane_h + gap)
    out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">GPU idle</text>')
    for s, e, cause in view.idle:
        if cause not in keys:
            keys.append(cause)
        out.append(
            f'<rect x="{left + s * scale:.1f}" y="{y}" width="{max((e - s) * scale, 0.5):.1f}" '
            f'height="{lane_h}" fill="{color_of(cause)}"><title>{escape(label_of(cause))} '
            f"{escape(fmt_us(e - s))}</title></rect>"
        )
    axis_y = height - 6
    for frac in (0, 0.25, 0.5, 0.75, 1):
        x = left + plot_w * frac
        anchor = "start" if frac == 0 else "end" if frac == 1 else "middle"
        t = escape(fmt_us(view.duration_us * frac)) if frac else "0"
        out.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="{anchor}">{t}</text>')
    out.append("</svg>")
    return "".join(out), [k for k in (*KIND_COLORS, *IDLE_COLORS) if k in keys]


def memory_lines(
    ts_us: Sequence[float],
    allocated: Sequence[int],
    reserved: Sequence[int],
    width: int = 860,
    height: int = 200,
) -> str:
    """Allocated and reserved GPU memory over time as two polylines."""
    top = max(max(reserved, default=0), max(allocated, default=0), 1)
    series = [("#9ecae9", reserved), ("#4c78a8", allocated)]
    return line_chart("GPU memory over time", ts_us, series, top, fmt_bytes, width, height)


def line_chart(
    title: str,
    ts_us: Sequence[float],
    series: Sequence[tuple[str, Sequence[float | None]]],
    top: float,
    fmt_y: Callable[[float], str],
    width: int = 860,
    height: int = 200,
) -> str:
    """Series of (colour, values) over the same times as polylines from 0 to `top`; a None value
    breaks its line."""
    if len(ts_us) < 2:
        return ""
    left, bottom, pad = 72, 22, 8
    t0, t1 = ts_us[0], ts_us[-1]
    plot_w, plot_h = width - left - pad, height - bottom - pad
    span = max(t1 - t0, 1e-9)
    out = [_svg_open(width, height, title)]
    for frac in (0, 0.5, 1):
        y = pad + plot_h * (1 - frac)
        out.append(f'<line x1="{left}" x2="{width - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt_y(top * frac)) if frac else 0}</text>'
        )
    for color, values in series:
        runs: list[list[str]] = [[]]
        for t, v in zip(ts_us, values, strict=True):
            if v is None:
                runs.append([])
                continue
            y = pad + plot_h * (1 - min(max(v, 0) / top, 1))
            runs[-1].append(f"{left + (t - t0) / span * plot_w:.1f},{y:.1f}")
        for run in runs:
            if len(run) > 1:
                out.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(run)}"/>'
                )
    out.append(f'<text x="{left}" y="{height - 6}">0</text>')
    out.append(f'<text x="{width - pad}" y="{height - 6}" text-anchor="end">{escape(fmt_us(span))}</text>')
    out.append("</svg>")
    return "".join(out)


def _svg_open(width: int, height: int, title: str) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" {FONT} fill="#444">'
    )


FAMILY_COLORS = {
    "matmul": "#4c78a8",
    "convolution": "#f58518",
    "attention": "#54a24b",
    "elementwise": "#b279a2",
}
ROOF_COLOR = "#555"


def roofline(r: Roofline, width: int = 860, height: int = 380) -> tuple[str, list[str]]:
    """Log-log: achieved FLOP/s over FLOPs per byte, one dot per kernel (area by time), under the
    bandwidth slope and one flat compute roof per dtype; returns (svg, families used)."""
    points = [p for p in r.points if p.intensity > 0 and p.flops_per_s > 0]
    if not points:
        return "", []
    c = r.ceilings
    roofs = sorted(c.flops.items(), key=lambda kv: -kv[1]) if c else []
    xs = (
        [p.intensity for p in points] + [v / c.bytes_per_s for _, v in roofs]
        if c
        else [p.intensity for p in points]
    )
    ys = [p.flops_per_s for p in points] + [v for _, v in roofs]
    x_lo, x_hi = _decades(min(xs) / 1.5, max(xs) * 3)  # room on the right for the dots past the ridge
    y_lo, y_hi = _decades(min(ys) / 1.5, max(ys) * 1.2)
    left, right, top, bottom = 90, 150, 10, 40  # room for "100 GFLOP/s"
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * plot_w

    def py(y: float) -> float:
        return (
            top + plot_h - (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * plot_h
        )

    out = [_svg_open(width, height, "Roofline of the top kernels")]
    for e in range(round(math.log10(x_lo)), round(math.log10(x_hi)) + 1):
        x = px(10.0**e)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{_si(10.0**e)}</text>')
    for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1):
        y = py(10.0**e)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt_flops(10.0**e))}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle">'
        "arithmetic intensity, FLOPs per byte</text>"
    )
    if c and roofs:
        out.append(_roofs(c, roofs, (x_lo, y_lo, x_hi), px, py))
    families: list[str] = []
    longest = max(p.time_us for p in points)
    for p in sorted(points, key=lambda p: -p.time_us):  # big dots first, small ones on top
        if p.family not in families:
            families.append(p.family)
        radius = 3 + 9 * math.sqrt(p.time_us / longest)
        share = (
            f", {fmt_pct(p.ceiling_share)} of its {p.bound}-bound ceiling"
            + (f" ({p.beyond_ceiling})" if p.beyond_ceiling else "")
            if p.ceiling_share is not None
            else ""
        )
        tip = (
            f"{p.kernel}\n{p.op} · {p.dtype} · {p.calls:,} calls · {fmt_us(p.time_us)}\n"
            f"{fmt_flops(p.flops_per_s)} · {fmt_rate(p.bytes_per_s)} · {p.intensity:.3g} FLOPs/byte{share}"
        )
        out.append(
            f'<circle cx="{px(p.intensity):.1f}" cy="{py(p.flops_per_s):.1f}" r="{radius:.1f}" '
            f'fill="{FAMILY_COLORS.get(p.family, "#888")}" fill-opacity="0.7" stroke="#fff">'
            f"<title>{escape(tip)}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out), [f for f in FAMILY_COLORS if f in families]


def _roofs(
    c: RooflineCeilings,
    roofs: list[tuple[str, float]],
    corner: tuple[float, float, float],
    px: Callable[[float], float],
    py: Callable[[float], float],
) -> str:
    """The bandwidth slope up to the highest roof, and each dtype's flat roof from its ridge on.
    `corner`: the plot's lowest intensity and FLOP/s and its highest intensity."""
    x_lo, y_lo, x_hi = corner
    bw = c.bytes_per_s
    start = max(x_lo, y_lo / bw)  # where the slope enters the plot
    ridge = roofs[0][1] / bw
    tip = escape(f"memory: {fmt_rate(bw)}")
    out = [
        f'<line x1="{px(start):.1f}" y1="{py(start * bw):.1f}" x2="{px(ridge):.1f}" y2="{py(roofs[0][1]):.1f}" '
        f'stroke="{ROOF_COLOR}" stroke-width="1.5"><title>{tip}</title></line>'
    ]
    at = math.sqrt(start * ridge)  # halfway up the slope, above it
    out.append(
        f'<text x="{px(at) - 4:.1f}" y="{py(at * bw) - 8:.1f}" text-anchor="end" fill="{ROOF_COLOR}">'
        f"{escape(fmt_rate(bw))}</text>"
    )
    label_y = -1e9
    for i, (dtype, peak) in enumerate(roofs):
        y = py(peak)
        label_y = max(y + 4, label_y + 13)  # roofs close together: labels one under the other
        dash = "" if i == 0 else ' stroke-dasharray="4 3"'
        out.append(
            f'<line x1="{px(peak / bw):.1f}" y1="{y:.1f}" x2="{px(x_hi):.1f}" y2="{y:.1f}" '
            f'stroke="{ROOF_COLOR}" stroke-width="1.5"{dash}/>'
        )
        out.append(
            f'<text x="{px(x_hi) + 4:.1f}" y="{label_y:.1f}">{escape(f"{dtype} {fmt_flops(peak)}")}</text>'
        )
    return "".join(out)


def _decades(lo: float, hi: float) -> tuple[float, float]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return 10.0**a, 10.0 ** max(b, a + 1)


def _si(x: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"
