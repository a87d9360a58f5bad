"""The step breakdown rendered (`analysis.step_breakdown`): each step's time by what happened in it, as
TensorBoard's PyTorch profiler plugin showed it, and its kernels' estimated SM efficiency and occupancy —
a terminal table and an HTML section body. Renders only."""

from __future__ import annotations

from html import escape

from rich.console import Console

from gpudoctor.analysis.step_breakdown import ROLE_LABELS, ROLES, KernelEfficiency, StepBreakdown
from gpudoctor.report.style import dim_line, dur, not_available, pct, section, table
from gpudoctor.util.units import fmt_pct, fmt_us

MAX_STEP_COLUMNS = 6  # beyond, the per-step columns are left out (the mean stays)
NOTE = (
    "as TensorBoard's PyTorch profiler showed it: each moment goes to the first of these happening "
    "(GPU kernels, copies and memsets before the host's runtime calls, DataLoader and CPU ops), else Other; "
    "the parts add to the step"
)
EFFICIENCY_NOTE = (
    "est. SM efficiency: the running kernels' Kineto blocks per SM summed, capped at 1, over the whole step "
    "(idle included); est. occupancy: Kineto's estimated achieved occupancy and warps per SM, weighted by "
    "kernel time (as the plugin: an occupancy of 0 counts)"
)
MISSING = "no step and no GPU work to break down (or an analysis saved before gpudoctor made one)"
_EFFICIENCY_ROWS = (
    ("est. SM efficiency", "sm_efficiency_pct", "pct"),
    ("est. achieved occupancy", "occupancy_pct", "pct"),
    ("warps per SM", "warps_per_sm", "num"),
)


def _shown(b: StepBreakdown) -> tuple[list[str], list[str]]:
    """The roles with time in some step, and those zero in every step."""
    used = [r for r in ROLES if any(s.roles_us[r] > 0 for s in b.steps)]
    return used, [ROLE_LABELS[r] for r in ROLES if r not in used]


def _efficiency_cell(e: KernelEfficiency, field: str, kind: str) -> str:
    value = getattr(e, field)
    if value is None:
        return "n/a"
    return f"{value:.0f}%" if kind == "pct" else f"{value:,.1f}"


def _mean_cell(b: StepBreakdown, field: str, kind: str) -> str:
    value = b.mean_sm_efficiency_pct if field == "sm_efficiency_pct" else b.mean_of(field)
    if value is None:
        return "n/a"
    return f"{value:.0f}%" if kind == "pct" else f"{value:,.1f}"


def _coverage(b: StepBreakdown) -> str | None:
    """Where part of the kernel time carries no estimate: how much."""
    kernel = sum(e.kernel_us for e in b.efficiency)
    estimated = sum(e.estimated_us for e in b.efficiency)
    if kernel <= 0 or estimated >= 0.995 * kernel:
        return None
    if estimated == 0:
        return "no kernel in the trace carries Kineto's blocks per SM or occupancy estimates"
    return (
        f"{fmt_pct(1 - estimated / kernel)} of kernel time carries no blocks-per-SM estimate (counted as 0)"
    )


def render_breakdown(b: StepBreakdown | None, console: Console) -> None:
    section(console, "Step breakdown")
    if b is None or not b.steps:
        not_available(console, MISSING)
        return
    used, zero = _shown(b)
    whole = _whole(b)
    cols = b.steps if len(b.steps) <= MAX_STEP_COLUMNS and not whole else ()
    effs = b.efficiency if cols else ()
    mean, step_us = b.mean_us, b.mean_step_us
    t = table("", "traced time" if whole else "mean per step", "share", *(f"#{s.number}" for s in cols))
    for r in used:
        cells = [dur(s.roles_us[r]) for s in cols]
        t.add_row(ROLE_LABELS[r], dur(mean[r]), pct(mean[r] / step_us if step_us > 0 else None), *cells)
    t.add_row("step", fmt_us(step_us), "100%", *(fmt_us(s.duration_us) for s in cols))
    for label, field, kind in _EFFICIENCY_ROWS:
        t.add_row(label, _mean_cell(b, field, kind), "", *(_efficiency_cell(e, field, kind) for e in effs))
    console.print(t)
    dim_line(console, NOTE)
    if zero:
        dim_line(console, "zero in every step: " + ", ".join(zero))
    dim_line(console, EFFICIENCY_NOTE)
    cover = _coverage(b)
    if cover:
        dim_line(console, cover)
    if len(b.steps) > MAX_STEP_COLUMNS:
        dim_line(console, f"per-step columns left out: {len(b.steps)} steps (at most {MAX_STEP_COLUMNS})")


def breakdown_html(b: StepBreakdown | None) -> str:
    """The section body: one row per part (and the kernels' efficiency), a column per step."""
    if b is None or not b.steps:
        return f'<p class="na">not available: {escape(MISSING)}</p>'
    used, zero = _shown(b)
    whole = _whole(b)
    steps = () if whole else b.steps
    mean, step_us = b.mean_us, b.mean_step_us
    head = ["", "traced time" if whole else "mean per step", "share", *(f"#{s.number}" for s in steps)]
    rows = []
    for r in used:
        share = fmt_pct(mean[r] / step_us) if step_us > 0 else "-"
        cells = [ROLE_LABELS[r], _us(mean[r]), share, *(_us(s.roles_us[r]) for s in steps)]
        rows.append(cells)
    rows.append(["step", fmt_us(step_us), "100%", *(fmt_us(s.duration_us) for s in steps)])
    for label, field, kind in _EFFICIENCY_ROWS:
        effs = [] if whole else list(b.efficiency)
        rows.append(
            [label, _mean_cell(b, field, kind), "", *(_efficiency_cell(e, field, kind) for e in effs)]
        )
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(_cell(c, i > 0) for i, c in enumerate(r)) + "</tr>" for r in rows)
    notes = [_sentence(NOTE), *([_sentence("zero in every step: " + ", ".join(zero))] if zero else [])]
    notes.append(_sentence(EFFICIENCY_NOTE))
    cover = _coverage(b)
    if cover:
        notes.append(_sentence(cover))
    return (
        f'<div class="scroll"><table class="breakdown"><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody>'
        f"</table></div>" + "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    )


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def _cell(text: str, number: bool) -> str:
    return f'<td class="num">{escape(text)}</td>' if number else f"<td>{escape(text)}</td>"


def _whole(b: StepBreakdown) -> bool:
    """The traced time as one (no steps): no per-step columns."""
    return len(b.steps) == 1 and b.steps[0].number == 0


def _us(us: float) -> str:
    return "-" if us == 0 else fmt_us(us)
