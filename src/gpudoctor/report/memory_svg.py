"""Inline SVG charts of memory and batch sweeps for the HTML reports: memory over a step stacked by
category, and x-y line charts (a log2 batch axis) with marks and a shaded band. Renders only; every
text goes through `html.escape`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from gpudoctor.analysis.memory_frames import CATEGORIES, CATEGORY_LABELS
from gpudoctor.util.units import fmt_bytes, fmt_us

FONT = 'font-family="system-ui,sans-serif" font-size="11"'
CATEGORY_COLORS = {
    "parameters": "#4c78a8",
    "gradients": "#72b7b2",
    "optimizer_state": "#54a24b",
    "activations": "#f58518",
    "inputs": "#eeca3b",
    "temporaries": "#e45756",
    "other": "#b279a2",
    "unattributed": "#bab0ac",
}


def _open(width: int, height: int, title: str) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" {FONT} fill="#444">'
    )


def category_legend(keys: Sequence[str]) -> str:
    items = "".join(
        f'<span class="key"><i style="background:{CATEGORY_COLORS.get(k, "#888")}"></i>'
        f"{escape(CATEGORY_LABELS.get(k, k))}</span>"
        for k in keys
    )
    return f'<div class="legend">{items}</div>'


def stacked_area(
    times_us: Sequence[float], series: Mapping[str, Sequence[int]], width: int = 860, height: int = 240
) -> tuple[str, list[str]]:
    """Memory over time, one band per category (in CATEGORIES order, from the bottom); returns (svg,
    categories drawn)."""
    keys = [c for c in CATEGORIES if c in series and any(series[c])]
    if len(times_us) < 2 or not keys:
        return "", []
    totals = [sum(series[c][i] for c in keys) for i in range(len(times_us))]
    top = max(max(totals), 1)
    left, bottom, pad = 72, 22, 8
    plot_w, plot_h = width - left - pad, height - bottom - pad
    t0, span = times_us[0], max(times_us[-1] - times_us[0], 1e-9)

    def x(t: float) -> float:
        return left + (t - t0) / span * plot_w

    def y(v: float) -> float:
        return pad + plot_h * (1 - v / top)

    out = [_open(width, height, "GPU memory over the step, by category")]
    for frac in (0, 0.5, 1):
        yy = y(top * frac)
        out.append(f'<line x1="{left}" x2="{width - pad}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e3e3e3"/>')
        label = escape(fmt_bytes(top * frac)) if frac else "0"
        out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
    base = [0] * len(times_us)
    for c in keys:
        upper = [b + v for b, v in zip(base, series[c], strict=True)]
        pts = [f"{x(t):.1f},{y(u):.1f}" for t, u in zip(times_us, upper, strict=True)]
        pts += [f"{x(t):.1f},{y(b):.1f}" for t, b in zip(reversed(times_us), reversed(base), strict=True)]
        tip = f"{CATEGORY_LABELS.get(c, c)}: up to {fmt_bytes(max(series[c]))}"
        out.append(
            f'<polygon points="{" ".join(pts)}" fill="{CATEGORY_COLORS.get(c, "#888")}" fill-opacity="0.85">'
            f"<title>{escape(tip)}</title></polygon>"
        )
        base = upper
    peak_i = totals.index(max(totals))
    out.append(
        f'<line x1="{x(times_us[peak_i]):.1f}" x2="{x(times_us[peak_i]):.1f}" y1="{pad}" y2="{pad + plot_h}" '
        f'stroke="#333" stroke-dasharray="3 3"><title>peak {escape(fmt_bytes(top))}</title></line>'
    )
    out.append(f'<text x="{left}" y="{height - 6}">0</text>')
    out.append(f'<text x="{width - pad}" y="{height - 6}" text-anchor="end">{escape(fmt_us(span))}</text>')
    out.append("</svg>")
    return "".join(out), keys


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    ys: Sequence[float | None]
    dashed: bool = False


def xy_chart(
    title: str,
    xs: Sequence[float],
    series: Sequence[Series],
    fmt_y: Callable[[float], str],
    *,
    x_label: str = "batch size",
    hlines: Sequence[tuple[float, str]] = (),
    vlines: Sequence[tuple[float, str]] = (),
    band: tuple[float, float, str] | None = None,
    log_x: bool = True,
    width: int = 860,
    height: int = 240,
) -> str:
    """Lines over a log2 x axis (batch sizes; `log_x=False`: linear), y from 0; `hlines`/`vlines`:
    labelled marks (a capacity, a target, a knee); `band`: an x range shaded with a label."""
    points = [x for x in xs if x > 0]
    scale = math.log2 if log_x else float
    if len(points) < 2:
        return ""
    values = [v for s in series for v in s.ys if v is not None] + [v for v, _ in hlines]
    top = max(max(values, default=1.0), 1e-12) * 1.08
    left, right, bottom, pad = 80, 16, 36, 10
    plot_w, plot_h = width - left - right, height - bottom - pad
    lo, hi = scale(min(points)), scale(max(points))
    hi = max(hi, lo + 1e-9)

    def px(x: float) -> float:
        return left + (scale(x) - lo) / (hi - lo) * plot_w

    def py(v: float) -> float:
        return pad + plot_h * (1 - min(max(v, 0) / top, 1))

    out = [_open(width, height, title)]
    if band is not None:
        a, b, label = band
        out.append(
            f'<rect x="{px(a):.1f}" y="{pad}" width="{max(px(b) - px(a), 1):.1f}" height="{plot_h}" '
            f'fill="#e8f1fa"><title>{escape(label)}</title></rect>'
        )
    for frac in (0, 0.5, 1):
        yy = py(top * frac)
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e3e3e3"/>')
        out.append(
            f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{escape(fmt_y(top * frac)) if frac else 0}</text>'
        )
    every = max(len(points) // 16, 1)
    for x in points[::every]:
        out.append(f'<text x="{px(x):.1f}" y="{pad + plot_h + 14}" text-anchor="middle">{x:g}</text>')
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">{escape(x_label)}</text>'
    )
    for value, label in hlines:
        yy = py(value)
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#d62728" '
            f'stroke-dasharray="5 3"/><text x="{width - right - 4}" y="{yy - 4:.1f}" text-anchor="end" '
            f'fill="#d62728">{escape(label)}</text>'
        )
    for value, label in vlines:
        xx = px(value)
        out.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{pad}" y2="{pad + plot_h}" stroke="#333" '
            f'stroke-dasharray="3 3"/><text x="{xx + 4:.1f}" y="{pad + 12}">{escape(label)}</text>'
        )
    for s in series:
        pts = [(px(x), py(v)) for x, v in zip(xs, s.ys, strict=True) if v is not None and x > 0]
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        if len(pts) > 1:
            joined = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
            out.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="2"{dash} points="{joined}"/>')
        for (a, b), (x, v) in zip(
            pts, [(x, v) for x, v in zip(xs, s.ys, strict=True) if v is not None and x > 0], strict=True
        ):
            out.append(
                f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{s.color}">'
                f"<title>{escape(f'{s.label} at {x:g}: {fmt_y(v)}')}</title></circle>"
            )
    out.append("</svg>")
    return "".join(out)


def series_legend(series: Sequence[Series]) -> str:
    items = "".join(
        f'<span class="key"><i style="background:{s.color}"></i>{escape(s.label)}</span>' for s in series
    )
    return f'<div class="legend">{items}</div>'
