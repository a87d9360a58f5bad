"""The terminal summary of an `Analysis` (rich): header, step time, GPU time, then the detail tables
of `report.tables`. Renders only; a part the analysis could not produce prints a dim
"not available: <reason>" line instead of disappearing — except on a trace with no GPU activity at all,
whose GPU sections are left out and named once in the header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from gpudoctor.analysis.summary import Analysis, StepSummary
from gpudoctor.analysis.timeline import IDLE_CAUSES, TimeBreakdown
from gpudoctor.report import tables
from gpudoctor.report.findings_view import render_diagnosis, render_findings
from gpudoctor.report.memory_view import render_memory_run
from gpudoctor.report.modules_view import render_modules, why_no_modules
from gpudoctor.report.ranks_view import (
    COLLECTIVE_HEAD,
    WORK_NOTE,
    RanksView,
    collective_rows,
    hidden_note,
    link_note,
    rank_table,
    slowest_sentence,
)
from gpudoctor.report.style import (
    count,
    cut,
    dim_line,
    dur,
    idle_label,
    kind_label,
    line,
    not_available,
    pct,
    section,
    table,
)
from gpudoctor.report.traced import (
    GPU_SECTIONS,
    counted,
    memory_peaks,
    per_call_sentence,
    per_second,
    steps_count,
    steps_sentence,
)
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.util.text import printable
from gpudoctor.util.units import fmt_bytes, fmt_us

MAX_STEP_ROWS = 12


_GPU_MEMORY_NOTES = ("memory events only for the CPU", "no GPU memory events")  # said with what is left out


def render_analysis(
    analysis: Analysis, console: Console, top: int = 10, diagnosis: Diagnosis | None = None
) -> None:
    """The whole summary of one trace, the doctor's findings first when given; `top` caps the rows of
    the kernel and op tables. A trace with no GPU activity leaves the GPU sections out (its header says
    which, once)."""
    gpu = bool(analysis.trace.gpu_activities)
    render_header(analysis, console)
    if diagnosis is not None:
        render_diagnosis(diagnosis, console)
    render_step_time(analysis, console)
    if gpu:
        render_gpu_time(analysis, console)
    render_modules(analysis.modules, console, why_no_modules(analysis.trace.compiled), gpu)
    if gpu:
        tables.render_kernels(analysis.kernels, console, top)
        tables.render_roofline(analysis.roofline, console, top)
        tables.render_launches(analysis.kernels, console)
        tables.render_transfers(analysis.transfers, console)
        tables.render_syncs(analysis.syncs, console)
    tables.render_ops(analysis.ops, console, top)
    render_memory(analysis, console)


def render_header(analysis: Analysis, console: Console) -> None:
    t = analysis.trace
    title = Text("gpudoctor ", style="bold")
    title.append(printable(Path(t.path).name), style="bold cyan")
    title.append(f"  {printable(t.path)}", style="dim")
    console.print(title)
    rank = f"rank {t.rank}" + (f" of {t.world_size}" if t.world_size else "")
    line(console, _device_text(analysis), rank)
    line(
        console,
        counted(t.events, "event"),
        f"{count(t.gpu_activities)} GPU activities",
        f"{fmt_us(t.span_us)} traced",
        steps_count(analysis),
    )
    sentence = steps_sentence(analysis)
    if sentence:
        line(console, sentence)
    options = profiler_options(t.profiler_config)
    if options:
        line(console, options)
    else:
        dim_line(console, "profiler options: not recorded in the trace")
    if t.skipped:
        dim_line(console, "not kept: " + ", ".join(f"{count(n)} {why}" for why, n in t.skipped.items()))
    gpu = bool(t.gpu_activities)
    for note in analysis.notes:
        if not gpu and note.startswith(_GPU_MEMORY_NOTES):
            continue  # said with the sections left out
        console.print(Text("  note: ", style="yellow") + Text(printable(note)))
    if not gpu:
        dim_line(console, f"left out below, for want of GPU activity: {GPU_SECTIONS}")


def _device_text(analysis: Analysis) -> str:
    d = analysis.device
    if d is None:
        return "no GPU recorded"
    parts = [d.name]
    acc = analysis.trace.accelerator
    if d.sm_count:
        parts.append(f"{d.sm_count} {'CUs' if acc is not None and acc.vendor == 'AMD' else 'SMs'}")
    if d.total_memory_bytes:
        parts.append(fmt_bytes(d.total_memory_bytes))
    if acc is not None and acc.vendor != "NVIDIA":
        parts.append(f"{acc.vendor} {acc.arch}" if acc.arch else acc.vendor)
    elif d.compute_capability:
        parts.append(f"sm_{d.compute_capability[0]}{d.compute_capability[1]}")
    return ", ".join(parts)


def profiler_options(config: dict[str, Any]) -> str:
    """The options the trace was recorded with, in words: "recorded with with_stack; without
    profile_memory, record_shapes" (empty when the trace does not say)."""
    shown = [k if v in (1, True) else f"{k}={v}" for k, v in config.items() if v not in (0, False, None)]
    off = [k for k, v in config.items() if v in (0, False)]
    parts = ([f"with {', '.join(shown)}"] if shown else []) + ([f"without {', '.join(off)}"] if off else [])
    return f"torch.profiler recorded {'; '.join(parts)}" if parts else ""


def render_step_time(analysis: Analysis, console: Console) -> None:
    section(console, "Step time")
    dist = analysis.step_time_us
    if dist is None:
        whole = per_second(analysis)
        if whole:
            line(console, "no repeating step: the figures cover the traced time")
            line(console, *(f"{label} {value}" for label, value in whole))
        else:
            not_available(
                console,
                "no step markers and no repeating iteration (use torch.profiler's schedule and prof.step())",
            )
        return
    numbers = [s.number for s in analysis.steps]
    span = f"#{numbers[0]}" if len(numbers) == 1 else f"#{numbers[0]}–#{numbers[-1]}"
    line(
        console,
        f"{dist.count} step{'s' if dist.count != 1 else ''} ({span})",
        f"median {fmt_us(dist.p50)}",
        f"p90 {fmt_us(dist.p90)}",
        f"mean {fmt_us(dist.mean)}",
        f"max {fmt_us(dist.max)}",
    )
    per_call = per_call_sentence(analysis)
    if per_call:
        line(console, per_call)
    shown = (*analysis.warmup_steps, *analysis.steps)
    if len(shown) > MAX_STEP_ROWS:
        dim_line(console, f"per-step table left out: {len(shown)} steps (at most {MAX_STEP_ROWS})")
        return
    _step_table(shown, console, gpu=bool(analysis.trace.gpu_activities), warmup=len(analysis.warmup_steps))
    if analysis.warmup_steps:
        dim_line(
            console, "warm-up: at the trace's start, left out of the medians and every figure over the steps"
        )


# Per-step columns: header, value of a step (µs, or a share for "GPU busy").
_STEP_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("GPU\nbusy", lambda s: s.gpu.busy_fraction if s.gpu else None),
    *(
        (f"idle\n{idle_label(c)}", lambda s, c=c: s.gpu.idle_by_cause_us.get(c) if s.gpu else None)
        for c in IDLE_CAUSES
    ),
    ("CPU\nDataLoader", lambda s: s.cpu.dataloader_us),
    ("CPU\noptimizer", lambda s: s.cpu.optimizer_us),
    ("CPU\nlaunch", lambda s: s.cpu.launch_us),
    ("CPU\nsync", lambda s: s.cpu.sync_us),
)


def _step_table(steps: tuple[StepSummary, ...], console: Console, gpu: bool, warmup: int = 0) -> None:
    columns = [(h, f) for h, f in _STEP_COLUMNS if any(f(s) for s in steps)]
    missing = [h for h, f in _STEP_COLUMNS if all(f(s) is None for s in steps)]
    zero = [
        h.replace("\n", " ") for h, f in _STEP_COLUMNS if not any(f(s) for s in steps) and h not in missing
    ]
    t = table("step", "duration", *(h for h, _ in columns), "launch\ncalls")
    for i, s in enumerate(steps):
        cells = [pct(f(s)) if h == "GPU\nbusy" else dur(f(s)) for h, f in columns]
        number = f"{s.number} warm-up" if i < warmup else str(s.number)
        t.add_row(number, fmt_us(s.duration_us), *cells, count(s.cpu.launch_count))
    console.print(t)
    if missing and gpu:
        not_available(console, "GPU busy and idle per step: no GPU activity in this trace")
    if zero:
        dim_line(console, "zero in every step shown: " + ", ".join(zero))


def render_gpu_time(analysis: Analysis, console: Console) -> None:
    section(console, "GPU time")
    tl = analysis.timeline
    if tl.gpu_window is None:
        not_available(console, "no GPU activity in this trace")
        return
    windows = [("profiled steps", tl.profiled_steps), ("GPU window (HTA)", tl.gpu_window)]
    shown = [(name, b) for name, b in windows if b is not None]
    t = table("", *(h for name, _ in shown for h in (name, "")))
    for label, value in _gpu_rows([b for _, b in shown]):
        cells = [c for _, b in shown for c in _gpu_cells(b, value, with_share=label != "window")]
        t.add_row(Text(label, style="bold" if not label.startswith(" ") else ""), *cells)
    console.print(t)
    if tl.profiled_steps is None:
        not_available(console, "profiled-steps window: the trace has no steps")
    dim_line(console, "GPU window: first to last GPU activity of the whole trace, as HTA measures it")
    if len(tl.concurrent_kinds_us) > 1:
        each = ", ".join(f"{kind_label(k)} {fmt_us(v)}" for k, v in tl.concurrent_kinds_us.items())
        dim_line(console, f"each kind on its own, overlaps included: {each}")


def _gpu_rows(windows: list[TimeBreakdown]) -> list[tuple[str, Any]]:
    """(label, how to read the value from a breakdown): the same rows for every window, covering the
    kinds and causes of all of them."""
    kinds = list(dict.fromkeys(k for b in windows for k in b.busy_by_kind_us))
    causes = list(dict.fromkeys(c for b in windows for c in b.idle_by_cause_us))
    rows: list[tuple[str, Any]] = [("window", lambda x: x.window_us), ("busy", lambda x: x.busy_us)]
    rows += [(f"  {kind_label(k)}", lambda x, k=k: x.busy_by_kind_us.get(k, 0.0)) for k in kinds]
    rows.append(("idle", lambda x: x.idle_us))
    rows += [(f"  {idle_label(c)}", lambda x, c=c: x.idle_by_cause_us.get(c, 0.0)) for c in causes]
    return rows


def _gpu_cells(b: TimeBreakdown, value: Any, with_share: bool) -> tuple[str, str]:
    us = value(b)
    share = us / b.window_us if b.window_us > 0 else None
    return dur(us), (pct(share) if with_share else "")


def render_memory(analysis: Analysis, console: Console) -> None:
    if analysis.memory_run is not None:
        render_memory_run(analysis.memory_run, console)
    if analysis.memory is None and not analysis.trace.gpu_activities:
        return  # GPU memory: among the sections the header says are left out
    section(console, "Memory")
    m = analysis.memory
    if m is None:
        not_available(console, next((n for n in analysis.notes if "memory" in n), "no GPU memory events"))
        return
    cap = m.capacity
    line(
        console,
        *memory_peaks(m),
        f"capacity {fmt_bytes(cap)}" if cap else "capacity not recorded",
        f"device {m.device}",
    )
    if m.steps:
        per_step = ", ".join(
            f"#{s.number}: {count(s.allocations)} ({fmt_bytes(s.allocated_bytes)})"
            for s in m.steps[:MAX_STEP_ROWS]
        )
        line(console, f"allocations per step: {per_step}")


def render_rank_overview(view: RanksView, console: Console) -> None:
    """One line per rank and the slowest rank, before the detail of one of them: the table of
    `report.ranks_view`, as the HTML and Markdown reports show it."""
    section(console, f"{len(view.overview.ranks)} ranks")
    head, rows = rank_table(view)
    # Two-line headers, no steps column (the detail says them) and the finding's id alone: the table
    # fits in 120 columns.
    shown = [i for i, h in enumerate(head) if h != "steps"]
    t = table(*(_two_lines(head[i]) for i in shown), first_left=2, flexible=len(shown) - 1)
    t.columns[-1].justify = "left"
    for row in rows:
        rank = Text(row.cells[0].text)
        if row.mark:
            rank.append(" ◀", style="bold red" if row.mark == "straggler" else "yellow")
        t.add_row(rank, *(row.cells[i].text for i in shown[1:-1]), cut(row.top_finding))
    console.print(t)
    sentence = slowest_sentence(view.overview)
    if sentence:
        line(console, sentence)
    hidden = hidden_note(view)
    if hidden:
        dim_line(console, hidden)
    dim_line(console, WORK_NOTE)
    if view.diagnosis is not None and view.diagnosis.findings:
        section(console, "Across ranks")
        render_findings(view.diagnosis.findings, console)
    rows = collective_rows(view)
    if rows:
        t = table(*COLLECTIVE_HEAD, first_left=1)
        for r in rows:
            t.add_row(*(getattr(r, f) for f in r.__dataclass_fields__))
        console.print(t)
        note = link_note(view)
        if note:
            dim_line(console, note)
    dim_line(console, f"below: rank {view.detailed} in detail (choose with --rank)")


def _two_lines(header: str) -> str:
    return header.replace(" ", "\n", 1) if len(header) > 6 else header
