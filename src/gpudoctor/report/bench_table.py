"""Terminal rendering of benchmark results: measurements, comparisons (verdicts in colour), the
explorer's table and a device's ceilings. Renders only; every figure comes from the result objects."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from gpudoctor.device.ceilings import Ceilings
from gpudoctor.report.style import cut, dim_line, section, table
from gpudoctor.timing.compare import Comparison, RegressionCheck, Verdict
from gpudoctor.timing.explore import SCENARIO_LABELS, ExploreResult
from gpudoctor.timing.measurement import Measurement
from gpudoctor.util.units import fmt_bytes, fmt_flops, fmt_pct, fmt_rate, fmt_us

VERDICT_STYLE = {
    Verdict.FASTER: "bold green",
    Verdict.SLOWER: "bold red",
    Verdict.SAME: "cyan",
    Verdict.AMBIGUOUS: "yellow",
}
METHOD_LABELS = {
    "cuda_graph": "CUDA graph replay",
    "cuda_events": "CUDA events, eager calls",
    "host_sync": "host clock + synchronize",
    "host_timer": "host clock",
}


def how_measured(m: Measurement) -> str:
    calls = f"{m.calls_per_sample} call{'s' if m.calls_per_sample != 1 else ''}/sample"
    cooldown = m.options.cooldown
    rest = "" if cooldown is None else f", cooldown {cooldown:g}×"
    return f"{METHOD_LABELS.get(m.method, m.method)}, {calls}, {m.mode} cache{rest}"


def render_measurements(measurements: list[Measurement], console: Console) -> None:
    """One row per measurement: device time (median, its 95% interval, IQR), host latency, samples;
    the achieved rates where bytes or FLOPs were given; then each one's notes and warnings."""
    if not measurements:
        return
    first = measurements[0]
    console.print(
        Text.assemble(("gpudoctor bench", "bold"), f"  {first.device_name} ({first.device})", style="")
    )
    gpu = first.device.startswith("cuda")
    rates = any(m.nbytes or m.flops for m in measurements)
    kernels = any(m.kernel_stats for m in measurements)
    headers = ["", "device time" if gpu else "time", "±95% CI", "IQR", *(["host latency"] if gpu else []),
               *(["kernel time"] if kernels else []), "samples",
               *(["achieved", "of ceiling"] if rates else [])]  # fmt: skip
    t = table(*headers, flexible=0)
    for m in measurements:
        s = m.stats
        row = [cut(m.label), fmt_us(s.median), f"±{fmt_pct(s.rel_ci, 2)}", fmt_pct(s.rel_iqr)]
        if gpu:
            row.append(fmt_us(m.host_stats.median) if m.host_stats else "n/a")
        if kernels:
            row.append(fmt_us(m.kernel_stats.median) if m.kernel_stats else "n/a")
        row.append(f"{s.n}×{m.calls_per_sample}")
        if rates:
            row.extend(_rate_cells(m))
        t.add_row(*row)
    console.print(t)
    for m in measurements:
        prefix = f"{m.label}: " if len(measurements) > 1 else ""
        dim_line(console, f"{prefix}{how_measured(m)}; {_clock_text(m)}; stopped by {m.stop_reason}")
        if m.kernels:
            k = m.kernels
            per_call = f"{k.kernels_per_call:g} GPU activit{'y' if k.kernels_per_call == 1 else 'ies'}/call"
            names = ", ".join(_short(n) for n in k.names[:3])
            dim_line(console, f"{prefix}kernel time (CUPTI, single synchronized calls): {per_call}: {names}")
        for note in m.notes:
            dim_line(console, f"{prefix}{note}")
        for warning in m.warnings:
            console.print(Text(f"  warning: {prefix}{warning}", style="yellow"))


def _short(name: str, limit: int = 48) -> str:
    """A kernel name without its template arguments and parameters, cut to `limit` characters."""
    base = name.split("<", 1)[0].split("(", 1)[0].strip() or name
    base = base.removeprefix("void ").strip()
    return base if len(base) <= limit else base[: limit - 1] + "…"


def _rate_cells(m: Measurement) -> list[str]:
    achieved, share = [], []
    if m.nbytes:
        achieved.append(fmt_rate(m.bandwidth))
        share.append(fmt_pct(m.bandwidth_share) + " copy" if m.bandwidth_share is not None else "n/a")
    if m.flops:
        achieved.append(fmt_flops(m.flop_rate))
        share.append(fmt_pct(m.flops_share) + f" {m.dtype}" if m.flops_share is not None else "n/a")
    return [", ".join(achieved), ", ".join(share)]


def _clock_text(m: Measurement) -> str:
    c = m.clocks
    if not c.available:
        return f"clocks not read ({c.reason})" if m.device.startswith("cuda") else "CPU"
    clocks = [x for x in m.sample_sm_mhz if x is not None]
    if not clocks:
        return "SM clock not read"
    lo, hi = min(clocks), max(clocks)
    span = f"{lo:.0f} MHz" if lo == hi else f"{lo:.0f}–{hi:.0f} MHz"
    peak = f" of {c.max_sm_mhz:.0f}" if c.max_sm_mhz else ""
    return f"SM clock {span}{peak}"


def verdict_text(v: Verdict) -> Text:
    return Text(v.value, style=VERDICT_STYLE[v])


def render_comparisons(comparisons: list[Comparison], console: Console, title: str = "Comparison") -> None:
    if not comparisons:
        return
    section(console, title)
    t = table("candidate", "baseline", "time ratio", "95% CI", "p", "verdict", first_left=2, flexible=0)
    t.columns[-1].justify = "left"
    for c in comparisons:
        t.add_row(cut(c.candidate), cut(c.baseline), f"{c.ratio:.3f}×", f"{c.ci_low:.3f}–{c.ci_high:.3f}",
                  f"{c.p_value:.2g}", verdict_text(c.verdict))  # fmt: skip
    console.print(t)
    dim_line(
        console,
        f"ratio = candidate / baseline median time; 'same' = 95% CI within ±{comparisons[0].same_within:.0%}; "
        "p from Mann–Whitney U",
    )
    for c in comparisons:
        if c.note:
            console.print(Text(f"  warning: {c.candidate}: {c.note}", style="yellow"))


def render_regressions(checks: list[RegressionCheck], console: Console) -> None:
    render_comparisons([c.comparison for c in checks], console, title="Against the baseline")
    for check in checks:
        if check.regressed:
            console.print(Text(f"  {check.message}", style="bold red"))
        elif check.comparison.verdict is Verdict.SLOWER:  # significant, but within what counts as one
            slower = 100 * (check.comparison.ratio - 1)
            console.print(
                Text(
                    f"  {check.comparison.candidate}: slower by {slower:.1f}%, under the "
                    f"{100 * check.threshold:g}% that counts as a regression (--threshold): not one",
                    style="dim",
                )
            )


def render_explore(result: ExploreResult, console: Console) -> None:
    gpu = result.device_name is not None
    title = f"CPU {result.cpu_name}" + (f" vs GPU {result.device_name}" if gpu else "") + f", {result.dtype}"
    console.print(Text.assemble(("gpudoctor explore", "bold"), f"  {title}"))
    scenarios = [s for s in ("gpu", "gpu_sync", "gpu_transfer") if any(p.time(s) for p in result.points)]
    for op in dict.fromkeys(p.op for p in result.points):
        section(console, op)
        t = table("size", "bytes", "CPU", *(SCENARIO_LABELS[s] for s in scenarios),
                  *(["GPU speedup"] if gpu else []))  # fmt: skip
        for p in result.op_points(op):
            cells = [f"{p.size:,}", fmt_bytes(p.nbytes), fmt_us(p.cpu_us)]
            cells += [_timed_cell(p.time(s), p.cpu_us) for s in scenarios]
            if gpu:
                cells.append(f"{p.cpu_us / p.gpu_us:.3g}×" if p.cpu_us and p.gpu_us else "n/a")
            t.add_row(*cells)
        console.print(t)
        for c in (c for c in result.crossovers if c.op == op):
            where = (
                f"from {c.size:,} (curves cross near {c.estimate:,.0f})"
                if c.size is not None and c.estimate is not None
                else "never, up to the largest size measured"
            )
            dim_line(console, f"GPU wins, {SCENARIO_LABELS[c.scenario]}: {where}")
    for note in result.notes:
        dim_line(console, note)


def _timed_cell(us: float | None, cpu_us: float | None) -> Text:
    style = "green" if us is not None and cpu_us is not None and us < cpu_us else ""
    return Text(fmt_us(us), style=style)


def render_ceilings(c: Ceilings, console: Console) -> None:
    section(console, f"Measured ceilings of {c.device_name}")
    t = table("what", "ceiling")
    t.add_row(f"copy, bytes read + written ({fmt_bytes(c.copy_bytes)} buffer)", fmt_rate(c.copy_bytes_per_s))
    for dtype, rate in c.matmul_flops.items():
        t.add_row(f"matmul {c.matmul_n}³ {dtype}", fmt_flops(rate))
    console.print(t)
    dim_line(console, f"measured {c.measured_at} with torch {c.torch}")
