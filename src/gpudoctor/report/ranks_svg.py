"""The per-rank distribution of the HTML report's ranks section, as inline SVG drawn in Python: each
rank's time outside communication per step (its rank on x), the median as a line, the rank furthest
behind and the outliers marked. Every rank is a point, so a slow node (a run of neighbouring ranks)
shows as a step. Renders only."""

from __future__ import annotations

import statistics
from html import escape

from gpudoctor.report.ranks_view import RanksView
from gpudoctor.report.svg import FONT
from gpudoctor.util.units import fmt_us

OUTLIER = 3.0  # median absolute deviations from the median: a point drawn as an outlier

NORMAL, MARKED = "#4c78a8", "#d62728"


def rank_distribution(view: RanksView, width: int = 860, height: int = 200) -> str:
    """The dot plot; empty when fewer than two ranks have the figure."""
    ranks = view.overview.ranks
    points = [(r.rank, r.work_us) for r in ranks if r.work_us is not None]
    if len(points) < 2:
        return ""
    deviation = dict(zip((r.rank for r in ranks), view.across.deviation, strict=True)) if view.across else {}
    slowest = view.overview.slowest.rank if view.overview.slowest else None
    lo_rank, hi_rank = min(p[0] for p in points), max(p[0] for p in points)
    top = max(v for _, v in points) * 1.05 or 1.0
    left, bottom, pad = 64, 26, 10
    plot_w, plot_h = width - left - pad, height - bottom - pad

    def px(rank: int) -> float:
        return left + (rank - lo_rank) / max(hi_rank - lo_rank, 1) * plot_w

    def py(v: float) -> float:
        return pad + plot_h * (1 - v / top)

    title = "Time outside communication per step, by rank"
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}" {FONT}><title>{escape(title)}</title>'
    ]
    for frac in (0, 0.5, 1):
        y = py(top * frac)
        label = escape(fmt_us(top * frac)) if frac else "0"
        out.append(f'<line x1="{left}" x2="{width - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    median = statistics.median(v for _, v in points)
    out.append(
        f'<line x1="{left}" x2="{width - pad}" y1="{py(median):.1f}" y2="{py(median):.1f}" stroke="#888" '
        f'stroke-dasharray="4 3"><title>median {escape(fmt_us(median))}</title></line>'
    )
    radius = 3.5 if len(points) <= 256 else 2.0
    for rank, value in points:
        marked = rank == slowest or (deviation.get(rank) or 0.0) >= OUTLIER
        tip = f"rank {rank}: {fmt_us(value)}"
        out.append(
            f'<circle cx="{px(rank):.1f}" cy="{py(value):.1f}" r="{radius}" fill="{MARKED if marked else NORMAL}">'
            f"<title>{escape(tip)}</title></circle>"
        )
    for rank in sorted({lo_rank, hi_rank}):
        out.append(f'<text x="{px(rank):.1f}" y="{height - 8}" text-anchor="middle">rank {rank}</text>')
    out.append("</svg>")
    return "".join(out)
