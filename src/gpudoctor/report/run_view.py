"""A whole `RunReport` rendered: in the terminal, the run's header when gpudoctor ran the code (one step
count, the step time without and with the profiler, memory, NVML), the ranks side by side where there
are several, the trace's analysis with the findings first (or the memory alone when nothing was
traced), the GPU's busy share without the profiler; as HTML, the report of `report.html`, or the
terminal text where there is no analysis to draw. Renders only."""

from __future__ import annotations

from html import escape
from io import StringIO
from typing import Any

from rich.console import Console
from rich.text import Text

from gpudoctor.doctor.report import RunReport
from gpudoctor.report.findings_view import render_diagnosis
from gpudoctor.report.memory_view import render_memory_run
from gpudoctor.report.ranks_view import RanksView, view_of
from gpudoctor.report.terminal import render_analysis, render_rank_overview
from gpudoctor.rules.finding import SCHEMA as FINDINGS_SCHEMA
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.record import PROFILE_ARGV0, RunRecord
from gpudoctor.util.text import printable
from gpudoctor.util.units import fmt_bytes, fmt_us

CPU_NOTE = (
    "on the CPU: step times are the host's wall time, and the profiler's cost here says nothing about a "
    "GPU run (run it on a GPU for GPU figures)"
)


def ranks_view(report: RunReport) -> RanksView | None:
    """The ranks side by side, where there are several."""
    if report.ranks is None or len(report.ranks.summaries) < 2:
        return None
    detailed = report.analysis.trace.rank if report.analysis else report.ranks.ranks[0]
    return view_of(report.ranks, detailed)


def render_report(report: RunReport, console: Console, top: int = 10) -> None:
    """The whole report in the terminal."""
    if report.record is not None and report.alignment is None:  # combined ranks: each rank has its own
        render_run_header(report, console)
    view = ranks_view(report)
    if view is not None:
        render_rank_overview(view, console)
        console.print()
    if report.analysis is not None and report.diagnosis is not None:
        render_analysis(report.analysis, console, top=top, diagnosis=report.diagnosis)
    elif report.memory is not None:
        render_memory_only(report, console)
    observer = report.observer
    if observer is not None and observer.busy_pct_unprofiled is not None:
        console.print(
            f"\nGPU busy {observer.busy_pct_unprofiled:.0f}% of each unprofiled step "
            f"(the trace read alone says {observer.busy_pct_traced:.0f}%: the profiler's overhead taken out)"
        )
    if report.alignment is not None:
        render_alignment(report.alignment, console)
    if report.run_dir is not None and (report.record is not None or report.alignment is not None):
        console.print(f"\nrun directory: {printable(report.run_dir)}")


def render_run_header(report: RunReport, console: Console) -> None:
    """What gpudoctor did with the script, each figure said once."""
    record = report.record
    assert record is not None
    if record.argv[:1] == (PROFILE_ARGV0,):  # a block of the caller's code: gpudoctor.profile()
        title, what = PROFILE_ARGV0, f"a block of {' '.join(record.argv[1:])}"
    else:
        title, what = "gpudoctor run", " ".join(record.argv)
    console.print(Text.assemble("\n", (title, "bold"), f": {printable(what)}"))
    console.print(f"  {steps_sentence(record, report)}")
    for note in (*record.notes, *report.notes):
        console.print(Text(f"  note: {printable(note)}", style="dim"))
    light, traced = record.light, record.traced
    if light is not None and light.times_us:
        times = sorted(light.times_us)
        p10, p90 = times[len(times) // 10], times[(len(times) * 9) // 10 - (len(times) >= 10)]
        console.print(
            f"  without the profiler: {fmt_us(light.mean_us or 0)} per step (median "
            f"{fmt_us(light.median_us or 0)}, p10 {fmt_us(p10)}, p90 {fmt_us(p90)}), timed by {light.clock}"
        )
        per_call = record.step.calls_per_step if record.step else None
        if per_call and per_call > 1.5 and light.mean_us and record.step is not None:
            console.print(
                f"  {per_call:.1f} calls of {record.step.module}.forward per step: "
                f"{fmt_us(light.mean_us / per_call)} per call"
            )
    if light is not None and light.clock == "perf_counter" and record.environment is not None:
        console.print(Text(f"  {CPU_NOTE}", style="dim"))
    elif traced is not None and traced.median_us and light is not None and light.median_us:
        overhead = record.profiler_overhead or 0.0
        console.print(
            f"  with the profiler: median {fmt_us(traced.median_us)} per step: the profiler slows each "
            f"step by {100 * overhead:.0f}% — figures below use the step without it"
        )
    if record.memory and not record.memory_run:  # else the memory section below says it per step
        console.print(
            f"  GPU memory: peak allocated {fmt_bytes(record.memory.get('allocated_bytes.all.peak', 0))}, "
            f"peak reserved {fmt_bytes(record.memory.get('reserved_bytes.all.peak', 0))}, "
            f"allocator retries {record.memory.get('num_alloc_retries', 0)}"
        )
    if record.nvml_missing is None and record.nvml_samples:
        console.print(f"  NVML: {len(record.nvml_samples)} samples")
    else:  # no reason given, and no sample: say so rather than "0 samples"
        why = record.nvml_missing or "no sample was taken in the light phase"
        console.print(Text(f"  NVML: not recorded ({printable(why)})", style="dim"))


def steps_sentence(record: RunRecord, report: RunReport) -> str:
    """The run's one step count: how it ended, after how many steps, of which how many were timed
    without the profiler and how many traced; and what a step is."""
    timed = len(record.light.times_us) if record.light else 0
    if report.analysis is not None and report.analysis.steps:
        traced = len(report.analysis.steps) + len(report.analysis.warmup_steps)
    else:
        traced = len(record.traced.times_us) if record.traced else 0
    parts = [f"{timed} timed without the profiler"] if timed else ["none timed without the profiler"]
    settling = record.light.settling if record.light else None
    if settling is not None and settling.dropped_us:
        parts[0] += f" ({len(settling.dropped_us)} before them left out: not yet settled)"
    if record.options.get("trace_all"):
        parts.append("traced from start to end")
    elif traced or record.trace_files:
        parts.append(f"{traced} traced")
    what = record.step.description if record.step is not None else _no_step(record)
    ended = record.outcome if record.outcome != "stopped" else "stopped once captured"
    return f"{ended} after {record.steps_seen} steps: {', '.join(parts)} · a step is {what}"


def _no_step(record: RunRecord) -> str:
    return "not found (nothing in the script repeated)" if not record.trace_files else "the whole traced run"


def render_memory_only(report: RunReport, console: Console) -> None:
    """The memory findings and figures of a run whose trace could not be analyzed (or has none)."""
    memory = report.memory
    assert memory is not None
    bound = (
        "The script ran out of GPU memory."
        if memory.oom is not None
        else "No trace to judge the step's time by: memory only."
    )
    render_diagnosis(Diagnosis(FINDINGS_SCHEMA, report.memory_findings, bound, {}, judged=False), console)
    render_memory_run(memory, console)


def render_alignment(info: dict[str, Any], console: Console) -> None:
    """Whether the ranks' traces cover the same steps (`doctor.combine.alignment`)."""
    steps = info.get("phase_steps", {})
    traced = info.get("ranks_traced", [])
    if info.get("aligned") and "traced" in steps and "done" in steps:
        console.print(
            f"\n{len(traced)} of {info['world_size']} ranks traced the same steps: {steps['traced'] + 2}–"
            f"{steps['done']} recorded, after one profiler warm-up step"
        )
    elif steps:
        console.print(f"\nthe ranks did not enter their phases at the same steps: {steps}", style="bold red")
    missing = sorted(set(range(info.get("world_size", 0))) - set(traced))
    if missing:
        console.print(f"ranks without a trace: {missing}", style="yellow")
    by_note: dict[str, list[str]] = {}
    for rank, notes in info.get("notes", {}).items():
        for note in notes:
            by_note.setdefault(note, []).append(str(rank))
    for note, ranks in by_note.items():  # each once, with the ranks that say it
        console.print(
            f"note (rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}): {printable(note)}", style="dim"
        )


def report_html(report: RunReport) -> str:
    """report.html: the whole report of the (detailed) trace, with the run's NVML series; a report with
    no analysis is its terminal text, in a page."""
    from gpudoctor.report.html import render_html  # here: the terminal report does without it

    if report.analysis is not None and report.diagnosis is not None:
        return render_html(
            report.analysis, report.diagnosis, report.timeline, report.nvml_samples(), ranks_view(report)
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>gpudoctor</title></head>'
        f"<body><pre>{escape(report_text(report))}</pre></body></html>\n"
    )


def report_text(report: RunReport, width: int = 100) -> str:
    """The terminal report as plain text (no colours): tables laid out in `width` columns, sentences
    one line each."""
    from gpudoctor.report.console import SafeConsole

    buffer = StringIO()
    console = SafeConsole(
        file=buffer, width=width, color_system=None, force_terminal=False, force_jupyter=False, soft_wrap=True
    )
    render_report(report, console)
    return buffer.getvalue()
