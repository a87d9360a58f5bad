"""The memory of a `gpudoctor run` in the terminal and in HTML: peaks per step, the peak of the step
recorded in detail by category, by module and by line, what the objects hold (census), and the memory
over that step stacked by category. Renders only."""

from __future__ import annotations

import statistics
from html import escape

from rich.console import Console

from gpudoctor.analysis.memory_breakdown import MemoryBreakdown, compact_names, split_level
from gpudoctor.analysis.memory_frames import CATEGORIES, CATEGORY_LABELS
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.report import memory_svg
from gpudoctor.report.style import cut, dim_line, line, not_available, section, table
from gpudoctor.util.units import fmt_bytes, fmt_pct, fmt_us

TOP_ROWS = 8


def render_memory_run(m: MemoryAnalysis, console: Console) -> None:
    """The terminal section."""
    section(console, "Memory of the run (by category)")
    cap = m.capacity
    of = (lambda b: f" ({fmt_pct(b / cap)})") if cap else (lambda b: "")
    if m.steps:
        light = [s.peak_allocated for s in m.steps if s.phase == "light"] or [
            s.peak_allocated for s in m.steps
        ]
        line(
            console,
            f"peak allocated {fmt_bytes(m.peak_allocated)}{of(m.peak_allocated)}",
            f"peak reserved {fmt_bytes(m.peak_reserved)}{of(m.peak_reserved)}",
            f"capacity {fmt_bytes(cap)}" if cap else "capacity not recorded",
            f"{len(m.steps)} steps, median step peak {fmt_bytes(statistics.median(light))}",
        )
    elif m.breakdown is None and m.census is None and m.oom is None:
        not_available(console, "no CUDA memory statistics (the script did not use a GPU)")
    c = m.census
    if c is not None and m.breakdown is None:  # with the peak by category, its table gives the figures
        opt = f" ({', '.join(c.optimizers)})" if c.optimizers else ""
        line(
            console,
            f"parameters {fmt_bytes(c.parameters)}",
            f"gradients {fmt_bytes(c.gradients)}",
            f"optimizer state {fmt_bytes(c.optimizer_state)}{opt}",
            f"counted at step {c.step}",
        )
    if m.breakdown is not None:
        _render_breakdown(m.breakdown, console)
        if c is not None and c.optimizers:
            dim_line(console, f"optimizer: {', '.join(c.optimizers)}")
    else:
        dim_line(console, "peak by category: not recorded (" + _why_no_breakdown(m) + ")")
    dim_line(console, f"allocator history: {m.history}" if m.history else "allocator history: not recorded")
    for note in m.notes:
        dim_line(console, f"note: {note}")


def _why_no_breakdown(m: MemoryAnalysis) -> str:
    if m.device.startswith("cuda"):
        return "the detail step after the light phase did not run: --light, or the script ended first"
    return "on the CPU, run with --profile-memory --record-shapes --with-stack for torch's categories"


def _render_breakdown(b: MemoryBreakdown, console: Console) -> None:
    step = f"step {b.step}" if b.step is not None else "the traced steps"
    line(console, f"peak of {step}: {fmt_bytes(b.peak)}, from the {b.source}")
    t = table("category", "bytes", "share")
    for c in CATEGORIES:
        if b.categories.get(c, 0) > 0:
            t.add_row(
                CATEGORY_LABELS[c], fmt_bytes(b.categories[c]), fmt_pct(b.categories[c] / max(b.peak, 1))
            )
    console.print(t)
    level = split_level(b.modules)
    if level:
        names = compact_names([m.name for m in level]) if len(level) > 6 else None
        shown = ", ".join(f"{m.name} {fmt_bytes(m.activations)}" for m in level[:TOP_ROWS])
        line(console, f"activations by module ({names or len(level)}): {shown}")
    if b.sites:
        t = table("held at the peak by", "bytes", "tensors", "category", first_left=1, flexible=0)
        for s in b.sites[:TOP_ROWS]:
            where = (
                s.site
                + (f" ({s.inner})" if s.inner else "")
                + (f" ← {s.script_line}" if s.script_line else "")
            )
            t.add_row(
                cut(where), fmt_bytes(s.bytes), f"{s.blocks:,}", CATEGORY_LABELS.get(s.category, s.category)
            )
        console.print(t)


def html_section(m: MemoryAnalysis) -> str:
    """The report's memory section for a run (its title and anchor are the caller's)."""
    parts = [f'<p class="note">{escape(_summary(m))}</p>']
    b = m.breakdown
    if b is not None:
        chart, keys = memory_svg.stacked_area(b.series_t_us, b.series)
        step = f"step {b.step}" if b.step is not None else "the traced steps"
        parts.append(
            f'<p class="note">{escape(f"Memory over {step} by category ({b.source}); the dashed line marks the peak, {fmt_bytes(b.peak)}.")}</p>'
        )
        parts.append(chart + memory_svg.category_legend(keys))
        parts.append(
            _table(
                ("category", "bytes", "share of the peak"),
                [
                    (
                        CATEGORY_LABELS[c],
                        fmt_bytes(b.categories[c]),
                        fmt_pct(b.categories[c] / max(b.peak, 1)),
                    )
                    for c in CATEGORIES
                    if b.categories.get(c, 0) > 0
                ],
            )
        )
        if b.modules:
            parts.append('<p class="note">Modules: what each forward keeps alive, its children included.</p>')
            parts.append(
                _table(
                    ("module", "type", "activations", "inputs", "forward"),
                    [
                        (
                            x.name,
                            x.type,
                            fmt_bytes(x.activations),
                            fmt_bytes(x.inputs),
                            fmt_us(x.forward_us) if x.forward_us is not None else "n/a",
                        )
                        for x in b.modules[:24]
                    ],
                )
            )
        if b.sites:
            parts.append(
                _table(
                    (
                        "held at the peak by",
                        "inside",
                        "from the script's line",
                        "bytes",
                        "tensors",
                        "category",
                    ),
                    [
                        (
                            s.site,
                            s.inner or "",
                            s.script_line or "",
                            fmt_bytes(s.bytes),
                            f"{s.blocks:,}",
                            CATEGORY_LABELS.get(s.category, s.category),
                        )
                        for s in b.sites
                    ],
                )
            )
    if m.steps:
        parts.append(_steps_chart(m))
    return "".join(parts)


def _summary(m: MemoryAnalysis) -> str:
    parts = [f"peak allocated {fmt_bytes(m.peak_allocated)}", f"peak reserved {fmt_bytes(m.peak_reserved)}"]
    if m.capacity:
        parts.append(f"of {fmt_bytes(m.capacity)}")
    if m.census is not None:
        c = m.census
        parts.append(
            f"parameters {fmt_bytes(c.parameters)}, gradients {fmt_bytes(c.gradients)}, optimizer state "
            f"{fmt_bytes(c.optimizer_state)}"
        )
    return " · ".join(parts)


def _steps_chart(m: MemoryAnalysis) -> str:
    steps = sorted(m.steps, key=lambda s: s.step)
    xs = list(range(1, len(steps) + 1))
    series = [
        memory_svg.Series("peak reserved", "#9ecae9", [s.peak_reserved for s in steps]),
        memory_svg.Series("peak allocated", "#4c78a8", [s.peak_allocated for s in steps]),
        memory_svg.Series(
            "allocated at the step's end", "#f58518", [s.allocated for s in steps], dashed=True
        ),
    ]
    chart = (
        memory_svg.xy_chart(
            "GPU memory per step",
            [float(x) for x in xs],
            series,
            fmt_bytes,
            x_label="recorded step (1 = first light step)",
            log_x=False,
        )
        if len(steps) > 1
        else ""
    )
    note = '<p class="note">Per step: the allocator\'s peaks (reset at each step boundary) and what is left allocated at its end (a leak rises here).</p>'
    return note + chart + memory_svg.series_legend(series) if chart else ""


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table></div>'
