"""A batch-size sweep in the terminal and as one self-contained HTML page: a row per size (step time,
throughput, time per sample, peak memory, status), the memory model and the largest batch that fits
(predicted and confirmed), the throughput knee, and for inference the latency and a latency target;
charts of throughput and peak memory against the batch (and latency, for inference). Renders only."""

from __future__ import annotations

from html import escape

from rich.console import Console

from gpudoctor.analysis.batch import BatchSweep
from gpudoctor.report import memory_svg
from gpudoctor.report.html_style import CSS
from gpudoctor.report.style import dim_line, line, section, table
from gpudoctor.util.units import fmt_bytes, fmt_us
from gpudoctor.util.version import __version__

NOISY_SPREAD = 0.5  # a point whose step times' interquartile range exceeds this share of its median


def sentences(s: BatchSweep) -> list[str]:
    """What the sweep concluded, in sentences (the terminal and the HTML page say the same)."""
    out = []
    m = s.memory_model
    if m is not None and s.budget:
        confirmed = _confirmation(s)
        out.append(
            f"Memory: {fmt_bytes(m.fixed)} fixed + {fmt_bytes(m.per_sample)} per sample (fitted on sizes "
            f"{m.batches[0]} and {m.batches[1]}) within {fmt_bytes(s.budget)} the allocator can get: "
            f"the largest batch that fits is {s.predicted_max} predicted{confirmed}."
            + (
                f" (From the smaller sizes alone it was {s.prediction_tried}.)"
                if s.prediction_tried is not None and s.prediction_tried != s.predicted_max
                else ""
            )
        )
    elif s.largest_fit is not None:
        out.append(
            f"Largest size that ran: {s.largest_fit}"
            + (
                f"; {s.smallest_oom} ran out of memory."
                if s.smallest_oom
                else " (no memory figures: not on a GPU)."
            )
        )
    if s.knee is not None:
        change = f"gains {100 * s.knee.gain:.0f}%" if s.knee.gain >= 0 else f"loses {-100 * s.knee.gain:.0f}%"
        seen = (
            "under 10% from there on, on the two larger sizes measured"
            if s.knee.sizes_past >= 2
            else "under 10% on the one larger size measured: a single point, unconfirmed"
        )
        out.append(
            f"Throughput knee at batch {s.knee.batch}: doubling it {change} of throughput ({seen}); "
            "larger batches cost memory for little speed."
        )
        if s.knee.doubtful:
            out.append(
                "Doubtful: a batch twice as large took over four times as long a step, which batches do "
                "not do short of memory pressure; each size is timed in one process, so the larger ones "
                "more likely ran while something else used the machine. Sweep again on a quiet machine."
            )
    elif len([p for p in s.points if p.fits and p.step_us]) < 2:
        out.append("No knee can be told: fewer than two sizes ran.")
    elif s.largest_fit is not None:
        out.append(f"No knee: throughput still grows by 10% or more per doubling up to {s.largest_fit}.")
    noisy = [p for p in s.points if p.fits and p.spread is not None and p.spread > NOISY_SPREAD]
    if noisy:
        spans = ", ".join(f"{p.batch} ({fmt_us(p.step_p25_us)}–{fmt_us(p.step_p75_us)})" for p in noisy)
        out.append(
            f"Noisy: the middle half of the step times spans more than {NOISY_SPREAD:.0%} of their median "
            f"at batch {spans}; another process or more threads than cores, likely. A drop within a "
            "point's own spread is not taken for a knee."
        )
    ran = len([p for p in s.points if p.fits and p.step_us])
    if not s.training and s.sublinear_until and ran >= 2:
        out.append(
            f"Latency grows sublinearly with the batch up to {s.sublinear_until}: serving requests in "
            "batches up to there costs little latency per request."
        )
    if s.latency_target_us is not None:
        pick = next((p for p in s.points if p.batch == s.latency_pick), None)
        out.append(
            f"Latency target {fmt_us(s.latency_target_us)}: the largest batch meeting it is {s.latency_pick} "
            f"({fmt_us(pick.step_us)})."
            if pick is not None and pick.step_us is not None
            else f"Latency target {fmt_us(s.latency_target_us)}: no batch size measured meets it."
        )
    return out


def _confirmation(s: BatchSweep) -> str:
    fit, oom = s.largest_fit, s.smallest_oom
    parts = []
    if fit is not None and s.predicted_max is not None and fit >= s.predicted_max:
        parts.append(f"{fit} ran")
    if oom is not None:
        parts.append(f"{oom} ran out of memory")
    if not parts:
        return ""
    truth = f"; tried: {', '.join(parts)}"
    if fit is not None and oom is not None:
        truth += f" (the truth lies in {fit}–{oom - 1})"
    return truth


def render_sweep(s: BatchSweep, console: Console) -> None:
    knob = s.knob or {}
    how = f"option {knob.get('option')}" if knob.get("kind") == "option" else "DataLoader batch_size"
    section(console, "Batch sizes")
    line(
        console,
        " ".join(s.script),
        f"set through the {how} (the script's own: {knob.get('default')})",
        "training" if s.training else "inference",
        s.device or "device not recorded",
    )
    t = table("batch", "step time", "samples/s", "per sample", "peak allocated", "peak reserved", "status")
    for p in s.points:
        per = fmt_us(p.step_us / p.batch) if p.step_us else "-"
        t.add_row(
            str(p.batch),
            fmt_us(p.step_us) if p.step_us else "-",
            f"{p.throughput:,.0f}" if p.throughput else "-",
            per,
            fmt_bytes(p.peak_allocated) if p.peak_allocated is not None else "-",
            fmt_bytes(p.peak_reserved) if p.peak_reserved is not None else "-",
            p.status,
        )
    console.print(t)
    for sentence in sentences(s):
        line(console, sentence)
    for note in s.notes:
        dim_line(console, f"note: {note}")


def render_html(s: BatchSweep) -> str:
    """The sweep as one HTML document (no network)."""
    ok = [p for p in s.points if p.fits and p.step_us]
    xs = [float(p.batch) for p in ok]
    throughput = memory_svg.Series("samples per second", "#4c78a8", [p.throughput for p in ok])
    knee = [(float(s.knee.batch), f"knee {s.knee.batch}")] if s.knee else []
    charts = [
        "<h2>Throughput</h2>",
        memory_svg.xy_chart(
            "Throughput against the batch size", xs, [throughput], lambda v: f"{v:,.0f}/s", vlines=knee
        ),
    ]
    mem = [p for p in s.points if p.fits and p.peak_allocated is not None]
    if mem:
        mxs = [float(p.batch) for p in mem]
        series = [
            memory_svg.Series("peak allocated", "#f58518", [p.peak_allocated for p in mem]),
            memory_svg.Series("peak reserved", "#9ecae9", [p.peak_reserved for p in mem]),
        ]
        if s.memory_model is not None:
            series.append(
                memory_svg.Series("memory model", "#888", [s.memory_model.peak(x) for x in mxs], dashed=True)
            )
        hlines = [(float(s.budget), f"allocator budget {fmt_bytes(s.budget)}")] if s.budget else []
        vlines = [(float(s.predicted_max), f"predicted largest {s.predicted_max}")] if s.predicted_max else []
        charts += [
            "<h2>Peak memory</h2>",
            memory_svg.xy_chart(
                "Peak memory against the batch size", mxs, series, fmt_bytes, hlines=hlines, vlines=vlines
            ),
            memory_svg.series_legend(series),
        ]
    if not s.training and ok:
        latency = memory_svg.Series("latency (step time)", "#e45756", [p.step_us for p in ok])
        band = (
            (xs[0], float(s.sublinear_until), "sublinear: latency grows less than the batch")
            if s.sublinear_until
            else None
        )
        target = (
            [(s.latency_target_us, f"target {fmt_us(s.latency_target_us)}")] if s.latency_target_us else []
        )
        charts += [
            "<h2>Latency</h2>",
            memory_svg.xy_chart(
                "Latency against the batch size", xs, [latency], fmt_us, hlines=target, band=band
            ),
            '<p class="note">Shaded: the sizes where latency grows sublinearly with the batch.</p>',
        ]
    rows = "".join(
        f"<tr><td>{p.batch}</td><td>{escape(fmt_us(p.step_us) if p.step_us else '-')}</td>"
        f"<td>{escape(f'{p.throughput:,.0f}' if p.throughput else '-')}</td>"
        f"<td>{escape(fmt_bytes(p.peak_allocated) if p.peak_allocated is not None else '-')}</td>"
        f"<td>{escape(p.status)}</td></tr>"
        for p in s.points
    )
    table_html = (
        '<div class="scroll"><table><thead><tr><th>batch</th><th>step time</th><th>samples/s</th>'
        f"<th>peak allocated</th><th>status</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )
    said = "".join(f"<li>{escape(x)}</li>" for x in sentences(s))
    title = escape(" ".join(s.script))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>gpudoctor batch · {title}</title><style>{CSS}</style></head><body><main>"
        f'<header><h1>gpudoctor batch <span class="file">{title}</span></h1>'
        f'<p class="meta">{escape(s.device or "")} · {"training" if s.training else "inference"}</p></header>'
        f'<section><ul class="evidence">{said}</ul>{table_html}</section><section>{"".join(charts)}</section>'
        f"<footer>gpudoctor {escape(__version__)}</footer></main></body></html>\n"
    )
