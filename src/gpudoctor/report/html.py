"""The self-contained HTML report: one file, no network (inline CSS, SVG and a few lines of JS for
sortable tables). Findings first, then (with several ranks) the ranks side by side, where the step time
goes, the GPU timeline of a representative step, top kernels and their roofline, ops, transfers, syncs,
memory and the environment. Renders only: every string from a trace is escaped, and none is ever placed
inside executable script."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from gpudoctor.analysis.summary import Analysis
from gpudoctor.analysis.timeline_view import StepTimeline
from gpudoctor.monitor.samples import GpuSample
from gpudoctor.report import svg
from gpudoctor.report.html_style import CSS, SORT_JS
from gpudoctor.report.memory_view import html_section
from gpudoctor.report.modules_view import modules_html, why_no_modules
from gpudoctor.report.ranks_svg import rank_distribution
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
from gpudoctor.report.traced import (
    GPU_SECTIONS,
    counted,
    memory_peaks,
    memory_tile,
    per_call_sentence,
    per_second,
    steps_count,
    steps_sentence,
)
from gpudoctor.rules.finding import Diagnosis, Finding
from gpudoctor.util.units import fmt_bytes, fmt_flops, fmt_pct, fmt_rate, fmt_us
from gpudoctor.util.version import __version__

TOP_ROWS = 25
MAX_NVML_POINTS = 1500
NVML_COLORS = {"GPU utilization": "#4c78a8", "memory utilization": "#72b7b2", "power, % of limit": "#f58518"}


def render_html(
    analysis: Analysis,
    diagnosis: Diagnosis,
    timeline: StepTimeline | None = None,
    nvml: Sequence[GpuSample] = (),
    ranks: RanksView | None = None,
) -> str:
    """The whole report of one trace as an HTML document. `timeline`: the GPU timeline of one step
    (from `analysis.timeline_view.step_timeline`); without it, that section says how to get it.
    `nvml`: one GPU's NVML samples of the run, where `gpudoctor run` recorded them. `ranks`: with
    several ranks, all of them side by side (the analysis is then of `ranks.detailed`)."""
    name = Path(analysis.trace.path).name
    # a trace with no GPU activity: its GPU sections are left out and named once, as in the terminal
    gpu = bool(analysis.trace.gpu_activities)
    modules = _section(
        "Where in the model",
        modules_html(analysis.modules, why_no_modules(analysis.trace.compiled), gpu=gpu),
        "modules",
    )
    body = [
        _header(analysis, name),
        f'<p class="bound">{escape(diagnosis.bound)}</p>',
        _figures(analysis, diagnosis, ranks),
        _diagnosis(diagnosis),
        _ranks(ranks) if ranks is not None else "",
        _step_chart(analysis),
        *(
            (_timeline(analysis, timeline), modules, _kernels(analysis), _roofline(analysis))
            if gpu
            else (f'<p class="na">left out, for want of GPU activity: {escape(GPU_SECTIONS)}</p>', modules)
        ),
        _ops(analysis),
        *((_transfers_syncs(analysis),) if gpu else ()),
        _memory(analysis) if gpu or analysis.memory is not None else _memory_run(analysis),
        _nvml(nvml) if nvml else "",
        _environment(analysis),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>gpudoctor · {escape(name)}</title><style>{CSS}</style></head><body><main>"
        + "".join(body)
        + f"<footer>gpudoctor {escape(__version__)}</footer></main>"
        + f'<script type="application/json" id="gpudoctor-data">{json_for_html(_data(diagnosis, ranks))}</script>'
        + f"<script>{SORT_JS}</script></body></html>\n"
    )


def json_for_html(value: Any) -> str:
    """JSON safe inside a <script type="application/json">: no '<', '>' or '&' can end the element."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _data(diagnosis: Diagnosis, ranks: RanksView | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "bound": diagnosis.bound,
        "findings": [
            {"id": f.id, "severity": f.severity.value, "title": f.title, "est_saving_pct": f.est_saving_pct}
            for f in diagnosis.findings
        ],
    }
    if ranks is not None:
        slowest = ranks.overview.slowest
        data["ranks"] = {
            "detailed": ranks.detailed,
            "ranks": [
                {
                    "rank": r.rank,
                    "step_p50_us": _finite(r.step_p50_us),
                    "busy_fraction": _finite(r.busy_fraction),
                    "work_us": _finite(r.work_us),
                    "top_finding": top.id if top is not None else None,
                }
                for r, top in zip(ranks.overview.ranks, ranks.top_findings, strict=True)
            ],
            "findings": [
                {
                    "id": f.id,
                    "severity": f.severity.value,
                    "title": f.title,
                    "est_saving_pct": f.est_saving_pct,
                }
                for f in (ranks.diagnosis.findings if ranks.diagnosis is not None else ())
            ],
            "slowest": None
            if slowest is None
            else {
                "rank": slowest.rank,
                "spread": _finite(slowest.spread),
                "straggler": slowest.straggler,
                "comm_wait_us": _finite(slowest.comm_wait_us),
            },
        }
    return data


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _header(a: Analysis, name: str) -> str:
    t = a.trace
    device = a.device.name if a.device else "device not recorded"
    steps = steps_count(a)
    rank = f"rank {t.rank}" + (f" of {t.world_size}" if t.world_size else "")
    meta = " · ".join(
        (device, rank, counted(t.events, "event"), f"{t.gpu_activities:,} GPU activities", steps)
    )
    sentence = steps_sentence(a)
    how = f'<p class="meta">{escape(sentence)}</p>' if sentence else ""
    return (
        f'<header><h1>gpudoctor <span class="file">{escape(name)}</span></h1>'
        f'<p class="meta">{escape(meta)}</p>{how}<p class="path">{escape(t.path)}</p></header>'
    )


def _diagnosis(d: Diagnosis) -> str:
    out = ['<section id="diagnosis">']
    if not d.findings and d.judged:
        out.append('<p class="ok">No bottleneck found that a change would shorten by 2% or more.</p>')
    out.extend(_finding(f, open_=i < 3, of=d.saving_of) for i, f in enumerate(d.findings))
    out.append("</section>")
    return "".join(out)


def _finding(f: Finding, open_: bool, of: str = "step") -> str:
    sev = f.severity.value
    saving = (
        f'<span class="saving">up to {f.est_saving_pct:g}% of the {escape(of)}</span>'
        if f.est_saving_pct > 0
        else ""
    )
    if f.est_memory_bytes:
        saving += f'<span class="saving">frees up to {escape(fmt_bytes(f.est_memory_bytes))}</span>'
    evidence = "".join(f"<li>{escape(e)}</li>" for e in f.evidence)
    sources = "".join(f"<li><code>{escape(s)}</code></li>" for s in f.sources)
    sources = f'<p class="label">where</p><ul class="sources">{sources}</ul>' if sources else ""
    return (
        f'<details class="finding sev-{sev}"{" open" if open_ else ""}><summary>'
        f'<span class="badge {sev}">{sev}</span><span class="title">{escape(f.title)}</span>{saving}'
        f'<span class="fid">{escape(f.id)}</span></summary>'
        f'<ul class="evidence">{evidence}</ul>{sources}'
        f'<p class="fix"><b>Fix:</b> {escape(f.fix.summary)}</p>'
        f"<pre><code>{escape(f.fix.snippet)}</code></pre></details>"
    )


def _figures(a: Analysis, d: Diagnosis, ranks: RanksView | None) -> str:
    tiles = []
    # the step the user's loop pays, measured without the profiler, first; the traced steps' median
    # (the profiler slows them) beside it, named as such
    if a.unprofiled_step_us:
        tiles.append(("step time, no profiler", fmt_us(a.unprofiled_step_us)))
    if a.step_time_us is not None:
        traced = "traced step (median)" if a.unprofiled_step_us else "step time (median)"
        tiles.append((traced, fmt_us(a.step_time_us.p50)))
    w = a.window
    if w is not None:
        tiles.append(("GPU busy", fmt_pct(w.busy_fraction)))
        idle = max(w.idle_by_cause_us.items(), key=lambda kv: kv[1], default=None)
        if idle and idle[1] > 0:
            tiles.append((f"top idle cause: {svg.label_of(idle[0])[6:]}", fmt_pct(idle[1] / w.window_us)))
    if a.kernels.count:
        tiles.append(("kernels", f"{a.kernels.count:,}"))
    if a.memory is not None:
        tiles.append(memory_tile(a.memory))
    elif a.memory_run is not None and a.memory_run.peak_allocated:
        tiles.append(("peak memory", fmt_bytes(a.memory_run.peak_allocated)))
    overhead = d.summary.get("profiler_overhead_pct")
    if overhead is not None:
        tiles.append(("profiler overhead", f"{overhead:.0f}%"))
    cells = "".join(f'<div class="tile"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for k, v in tiles)
    if ranks is not None and ranks.overview.slowest is not None:
        s, n = ranks.overview.slowest, len(ranks.overview.ranks)
        spread = f"{s.spread * 100:+.0f}% " + ("GPU work" if s.paced_by == "gpu" else "time outside comm.")
        value, what = (
            (f"rank {s.rank} of {n}", f"straggler: {spread}")
            if s.straggler
            else (f"{n} ranks", f"balanced: the slowest {spread}")
        )
        cells += f'<a class="tile" href="#ranks"><b>{escape(value)}</b><span>{escape(what)}</span></a>'
    return f'<section class="tiles">{cells}</section>'


def _ranks(view: RanksView) -> str:
    """Every rank side by side, the slowest marked; the rest of the report details `view.detailed`."""
    head, rows = rank_table(view)
    body = []
    for row in rows:
        rank, trace, *numbers, finding = row.cells
        mark = f' <span class="badge {_MARKS[row.mark]}">{escape(row.mark)}</span>' if row.mark else ""
        cls = f' class="{row.mark}"' if row.mark else ""
        detailed = ' aria-current="true"' if row.rank == view.detailed else ""
        body.append(
            f'<tr{cls}{detailed}><td data-v="{rank.sort:g}">{escape(rank.text)}{mark}</td>'
            + _text(trace.text, cls="name")
            + "".join(_num(c.sort, c.text) for c in numbers)
            + f'<td class="top" title="{escape(finding.hint)}">{escape(finding.text)}</td></tr>'
        )
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    table = (
        f'<div class="scroll"><table class="sortable ranks"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )
    sentence = slowest_sentence(view.overview)
    lead = f'<p class="verdict">{escape(sentence)}</p>' if sentence else ""
    if view.diagnosis is not None and view.diagnosis.findings:
        lead += "".join(_finding(f, open_=i == 0) for i, f in enumerate(view.diagnosis.findings))
    hidden = hidden_note(view)
    notes = (
        (f'<p class="note">{escape(hidden)}</p>' if hidden else "")
        + f'<p class="note">Shares are of each rank\'s profiled steps (without steps, its GPU window). '
        f"{escape(WORK_NOTE)}</p>"
    )
    plot = rank_distribution(view)
    if plot:
        notes += f"<h3>Time outside communication, every rank</h3>{plot}"
    notes += _collectives(view)
    notes += f'<p class="note">Below: rank {view.detailed} in detail (choose another with --rank).</p>'
    return _section(f"Ranks ({len(view.overview.ranks)})", lead + table + notes, "ranks")


def _collectives(view: RanksView) -> str:
    rows = collective_rows(view)
    if not rows:
        return ""
    ths = "".join(f"<th>{escape(h)}</th>" for h in COLLECTIVE_HEAD)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(getattr(r, f))}</td>" for f in r.__dataclass_fields__) + "</tr>"
        for r in rows
    )
    note = link_note(view)
    return (
        "<h3>Collectives across ranks</h3>"
        f'<div class="scroll"><table class="ranks"><thead><tr>{ths}</tr></thead><tbody>{body}</tbody></table></div>'
        '<p class="note">Transfer: each call\'s shortest kernel over the ranks (the rank that arrived last '
        "waits for no one); longest wait: its longest kernel beyond that (medians over the calls)."
        + (f" {escape(note)}" if note else "")
        + "</p>"
    )


_MARKS = {"straggler": "critical", "slowest": "minor"}


def _step_chart(a: Analysis) -> str:
    chart, keys = svg.step_bars(a.steps)
    if not chart:
        whole = per_second(a)
        if whole:
            body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in whole)
            note = '<p class="note">No repeating step: the figures cover the traced time.</p>'
            return _section("Traced time", f'{note}<table class="kv">{body}</table>', "steps")
        if a.steps:
            return _section("Step time", _step_table(a), "steps")
        return _section(
            "Step time",
            _na("no step markers and no repeating iteration (use torch.profiler's schedule and prof.step())"),
        )
    per_call = per_call_sentence(a)
    note = f'<p class="note">{escape(per_call)}</p>' if per_call else ""
    return _section("Where each step's time goes", note + chart + svg.legend(keys), "steps")


# The host's share of a step where the trace has no GPU time per step (no GPU activity): header, value.
_CPU_STEP_COLUMNS = (
    ("CPU DataLoader", lambda s: s.cpu.dataloader_us),
    ("CPU optimizer", lambda s: s.cpu.optimizer_us),
    ("CPU launch", lambda s: s.cpu.launch_us),
    ("CPU sync", lambda s: s.cpu.sync_us),
)


def _step_table(a: Analysis) -> str:
    """Each step's duration and host figures (the columns some step has), where there is no GPU time
    per step to chart."""
    d = a.step_time_us
    lead = ""
    if d is not None:
        lead = (
            f'<p class="note">{d.count} step{"s" if d.count != 1 else ""}: median {escape(fmt_us(d.p50))}, '
            f"p90 {escape(fmt_us(d.p90))}, max {escape(fmt_us(d.max))}</p>"
        )
    columns = [(h, f) for h, f in _CPU_STEP_COLUMNS if any(f(s) for s in a.steps)]
    rows = [
        [
            _num(s.number, str(s.number)),
            _num(s.duration_us, fmt_us(s.duration_us)),
            *(_num(f(s), _dur(f(s))) for _, f in columns),
        ]
        for s in a.steps[:TOP_ROWS]
    ]
    more = len(a.steps) - len(rows)
    tail = f'<p class="note">{more:,} more steps (all in --json)</p>' if more > 0 else ""
    return lead + _table(("step", "duration", *(h for h, _ in columns)), rows) + tail


def _timeline(a: Analysis, view: StepTimeline | None) -> str:
    if not a.trace.gpu_activities:
        return _section("GPU timeline", _na("no GPU activity in this trace"))
    if view is None:
        return _section("GPU timeline", _na("render the report from the trace to see the timeline"))
    chart, keys = svg.timeline(view)
    which = f"step {view.step}" if view.step is not None else "the whole trace"
    note = f'<p class="note">{escape(which)} ({escape(fmt_us(view.duration_us))}), the median step</p>'
    return _section("GPU timeline of a representative step", note + chart + svg.legend(keys), "timeline")


def _kernels(a: Analysis) -> str:
    k = a.kernels
    if not k.top:
        return _section("Top kernels", _na("no kernels in this trace"))
    rows = [
        [
            _text(s.name, cls="name"),
            _text(s.category),
            _num(s.calls, f"{s.calls:,}"),
            _num(s.total_us, fmt_us(s.total_us)),
            _num(s.mean_us, fmt_us(s.mean_us)),
            _num(s.share, fmt_pct(s.share)),
            _num(
                s.est_occupancy_pct, "n/a" if s.est_occupancy_pct is None else f"{s.est_occupancy_pct:.0f}%"
            ),
            _text({True: "yes", False: "no", None: "?"}[s.tensor_cores]),
        ]
        for s in k.top[:TOP_ROWS]
    ]
    head = ("kernel", "category", "calls", "total", "mean", "share", "occupancy", "tensor cores")
    note = f"{k.count:,} kernels, {k.distinct:,} distinct, {fmt_us(k.total_us)} in all"
    return _section("Top kernels", f'<p class="note">{escape(note)}</p>' + _table(head, rows), "kernels")


def _roofline(a: Analysis) -> str:
    title = "Roofline of the top kernels"
    r = a.roofline
    if r is None:
        return _section(
            title, _na("this analysis was saved before gpudoctor drew rooflines: analyze the trace")
        )
    if not r.points:
        return _section(title, _na(r.note))
    chart, families = svg.roofline(r)
    keys = "".join(
        f'<span class="key"><i style="background:{svg.FAMILY_COLORS[f]}"></i>{escape(f)}</span>'
        for f in families
    )
    ceilings = f"Ceilings: {r.note}." if r.ceilings else f"{r.note[0].upper()}{r.note[1:]}."
    note = (
        f"FLOPs and bytes are known for {fmt_pct(r.coverage)} of kernel time; the {len(r.points)} kernels "
        f"shown take {fmt_pct(r.shown_us / r.kernel_us if r.kernel_us else 0)}. Dot area: time. {ceilings}"
    )
    rows = [
        [
            _text(p.kernel, cls="name"),
            _text(p.op, cls="name"),
            _text(p.dtype),
            _num(p.time_us, fmt_us(p.time_us)),
            _num(p.flops_per_s, fmt_flops(p.flops_per_s)),
            _num(p.bytes_per_s, fmt_rate(p.bytes_per_s)),
            _num(p.intensity, f"{p.intensity:.3g}"),
            _text(p.bound or "?"),
            _num(
                p.ceiling_share,
                (fmt_pct(p.ceiling_share) + ("*" if p.beyond_ceiling else ""))
                if p.ceiling_share is not None
                else "n/a",
            ),
        ]
        for p in r.points
    ]
    beyond = "".join(
        f'<p class="note">* {escape(p.kernel[:80])}: {escape(p.beyond_ceiling)}.</p>'
        for p in r.points
        if p.beyond_ceiling
    )
    head = ("kernel", "op", "dtype", "time", "FLOP/s", "bandwidth", "FLOPs/byte", "bound", "of ceiling")
    body = f'<p class="note">{escape(note)}</p>{chart}<div class="legend">{keys}</div>' + _table(head, rows)
    return _section(title, body + beyond, "roofline")


def _ops(a: Analysis) -> str:
    if not a.ops:
        return _section("Top ops", _na("no PyTorch ops in this trace"))
    # where no op launched GPU work (a CPU run) the GPU's columns would be empty: left out
    gpu = any(o.gpu_total_us or o.kernels for o in a.ops)
    rows = [
        [
            _text(o.name, cls="name"),
            _num(o.calls, f"{o.calls:,}"),
            *(
                (_num(o.gpu_self_us, _dur(o.gpu_self_us)), _num(o.gpu_total_us, _dur(o.gpu_total_us)))
                if gpu
                else ()
            ),
            _num(o.cpu_self_us, _dur(o.cpu_self_us)),
            _num(o.cpu_total_us, _dur(o.cpu_total_us)),
            *((_num(o.kernels, f"{o.kernels:,}"),) if gpu else ()),
        ]
        for o in a.ops[:TOP_ROWS]
    ]
    # in the terminal's order: self, then total
    head = ("op", "calls", "GPU self", "GPU total", "CPU self", "CPU total", "kernels")
    if not gpu:
        head = ("op", "calls", "CPU self", "CPU total")
    title = "Top ops" if gpu else "Top ops (by CPU time: no GPU work)"
    return _section(title, _table(head, rows), "ops")


def _transfers_syncs(a: Analysis) -> str:
    parts = []
    if a.transfers.directions:
        rows = [
            [
                _text(t.direction),
                _num(t.count, f"{t.count:,}"),
                _num(t.bytes, fmt_bytes(t.bytes)),
                _num(t.time_us, fmt_us(t.time_us)),
                _num(t.bandwidth, fmt_rate(t.bandwidth)),
                _num(t.pageable_count, f"{t.pageable_count:,}"),
            ]
            for t in a.transfers.directions
        ]
        parts.append(_table(("copy", "count", "bytes", "time", "bandwidth", "pageable"), rows))
    if a.syncs.sites:
        rows = [
            [
                _text(s.call, cls="name"),
                _text(s.op or "-", cls="name"),
                _text(s.source or "-", cls="name"),
                _num(s.count, f"{s.count:,}"),
                _num(s.total_us, fmt_us(s.total_us)),
            ]
            for s in a.syncs.sites[:TOP_ROWS]
        ]
        parts.append(_table(("synchronization", "op", "source", "count", "host blocked"), rows))
    if not parts:
        return _section("Transfers and synchronizations", _na("no copies and no host synchronizations"))
    return _section("Transfers and synchronizations", "".join(parts), "transfers")


def _memory(a: Analysis) -> str:
    return _memory_run(a) + _trace_memory(a)


def _memory_run(a: Analysis) -> str:
    return (
        _section("GPU memory by category", html_section(a.memory_run), "memory-run") if a.memory_run else ""
    )


def _trace_memory(a: Analysis) -> str:
    m = a.memory
    if m is None:
        return _section("GPU memory", _na("no GPU memory events: record with profile_memory=True"))
    reserved = m.series_reserved if m.reserved_recorded else [0] * len(m.series_ts_us)
    chart = svg.memory_lines(m.series_ts_us, m.series_allocated, reserved)
    cap = f", capacity {fmt_bytes(m.capacity)}" if m.capacity else ""
    note = ", ".join(memory_peaks(m)) + cap
    allocated = "allocated, from 0 at the trace's start" if m.is_rise else "allocated"
    keys = f'<div class="legend"><span class="key"><i style="background:#4c78a8"></i>{allocated}</span>'
    if m.reserved_recorded:
        keys += '<span class="key"><i style="background:#9ecae9"></i>reserved</span>'
    keys += "</div>"
    return _section("GPU memory over time", f'<p class="note">{escape(note)}</p>{chart}{keys}', "memory")


def _nvml(samples: Sequence[GpuSample]) -> str:
    """NVML's view of the run: utilization and power over time (the profiler was off for most of it)."""
    step = max(len(samples) // MAX_NVML_POINTS, 1)
    shown = samples[::step]
    ts = [(x.mono_s - shown[0].mono_s) * 1e6 for x in shown]
    limit = next((x.power_limit_w for x in shown if x.power_limit_w), None)
    power = [None if x.power_w is None or not limit else 100 * x.power_w / limit for x in shown]
    series = [
        (NVML_COLORS["GPU utilization"], [x.gpu_util_pct for x in shown]),
        (NVML_COLORS["memory utilization"], [x.mem_util_pct for x in shown]),
        (NVML_COLORS["power, % of limit"], power),
    ]
    chart = svg.line_chart("NVML samples over time", ts, series, 100, lambda v: f"{v:.0f}%")
    keys = "".join(
        f'<span class="key"><i style="background:{c}"></i>{escape(k)}</span>' for k, c in NVML_COLORS.items()
    )
    clocks = [x.sm_clock_mhz for x in samples if x.sm_clock_mhz]
    note = f"{len(samples):,} samples of GPU {samples[0].index}"
    if clocks:
        note += f"; SM clock median {sorted(clocks)[len(clocks) // 2]:,} MHz"
    body = f'<p class="note">{escape(note)}</p>{chart}<div class="legend">{keys}</div>'
    return _section("NVML during the run", body, "nvml")


def _environment(a: Analysis) -> str:
    rows: list[tuple[str, str]] = []
    if a.device is not None:
        d = a.device
        rows.append(("device", d.name))
        if d.total_memory_bytes:
            rows.append(("device memory", fmt_bytes(d.total_memory_bytes)))
        if d.sm_count:
            rows.append(("SMs", str(d.sm_count)))
        acc = a.trace.accelerator
        if acc is not None and acc.vendor != "NVIDIA":
            rows.append(("vendor, architecture", f"{acc.vendor}, {acc.arch or 'not recorded'}"))
        elif d.compute_capability:
            rows.append(("compute capability", ".".join(map(str, d.compute_capability))))
    for key, value in sorted(a.trace.profiler_config.items()):
        # Kineto writes the switches as 1 and 0 ("with_stack": 1)
        said = "on" if value in (1, True) else "off" if value in (0, False) else str(value)
        rows.append((f"profiler {key}", said))
    rows.extend(("note", n) for n in a.notes)
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return _section(
        "Environment", f'<table class="kv">{body}</table>' if body else _na("not recorded"), "env"
    )


def _section(title: str, body: str, anchor: str = "") -> str:
    ident = f' id="{anchor}"' if anchor else ""
    return f"<section{ident}><h2>{escape(title)}</h2>{body}</section>"


def _na(reason: str) -> str:
    return f'<p class="na">not available: {escape(reason)}</p>'


def _text(value: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return (
        f'<td{c} title="{escape(value)}">{escape(value)}</td>'
        if cls == "name"
        else f"<td{c}>{escape(value)}</td>"
    )


def _dur(us: float) -> str:
    return "-" if us == 0 else fmt_us(us)


def _num(value: float | None, shown: str) -> str:
    key = "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:g}"
    return f'<td class="num" data-v="{key}">{escape(shown)}</td>'


def _table(head: tuple[str, ...], rows: list[list[str]]) -> str:
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    trs = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<div class="scroll"><table class="sortable"><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table></div>'
