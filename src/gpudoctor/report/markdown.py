"""`gpudoctor report --format md`: the verdict as Markdown for an issue or a pull request — what bounds
the step, the findings table, the ranks side by side (with several), key figures, top kernels and their
roofline, then each finding's evidence and fix. Renders only; text from a trace is escaped so that it
cannot break the table or inject HTML."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.analysis.summary import Analysis
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
    memory_tile,
    per_call_sentence,
    per_second,
    steps_count,
    steps_sentence,
)
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.util.text import printable, printable_block
from gpudoctor.util.units import fmt_bytes, fmt_flops, fmt_pct, fmt_rate, fmt_us

TOP_KERNELS = 5


def md_text(text: str) -> str:
    """Inline text that renders as itself: control characters shown escaped, HTML and Markdown syntax
    characters escaped."""
    text = printable(" ".join(text.split())).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_[]|#":
        text = text.replace(ch, "\\" + ch)
    return " ".join(text.split())


def render_markdown(analysis: Analysis, diagnosis: Diagnosis, ranks: RanksView | None = None) -> str:
    """The report of one analysis; `ranks`: with several ranks, all of them side by side (the analysis
    is then of `ranks.detailed`)."""
    name = Path(analysis.trace.path).name
    device = analysis.device.name if analysis.device else "device not recorded"
    meta = f"{md_text(device)} · {steps_count(analysis)}"
    if ranks is not None:
        meta += f" · rank {ranks.detailed} of {len(ranks.overview.ranks)} ranks"
    out = [f"## gpudoctor: {md_text(name)}", "", meta, ""]
    sentence = steps_sentence(analysis)
    if sentence:
        out += [md_text(sentence[0].upper() + sentence[1:]) + ".", ""]
    out += [f"**{md_text(diagnosis.bound)}**", ""]
    if diagnosis.findings:
        if diagnosis.saving_of != "step":
            out += [f"Savings are shares of the {md_text(diagnosis.saving_of)}: the trace has no steps.", ""]
        out += ["| severity | finding | up to | id |", "|---|---|--:|---|"]
        for f in diagnosis.findings:
            saving = f"{f.est_saving_pct:g}%" if f.est_saving_pct > 0 else "-"
            if f.est_memory_bytes:
                saving = f"frees {fmt_bytes(f.est_memory_bytes)}"
            out.append(f"| {f.severity.value} | {md_text(f.title)} | {saving} | `{f.id}` |")
    elif diagnosis.judged:
        out.append("No bottleneck found that a change would shorten by 2% or more.")
    if ranks is not None:
        out += _ranks(ranks)
    out += ["", "### Key figures", "", "| | |", "|---|--:|"]
    out += [f"| {k} | {v} |" for k, v in _figures(analysis)]
    if analysis.kernels.top:
        out += ["", "### Top kernels", "", "| kernel | calls | total | share |", "|---|--:|--:|--:|"]
        for k in analysis.kernels.top[:TOP_KERNELS]:
            short = k.name if len(k.name) <= 80 else k.name[:79] + "…"
            out.append(f"| {md_text(short)} | {k.calls:,} | {fmt_us(k.total_us)} | {fmt_pct(k.share)} |")
    out += _roofline(analysis)
    for f in diagnosis.findings:
        out += ["", f"### {md_text(f.title)} (`{f.id}`)", ""]
        out += [f"- {md_text(e)}" for e in f.evidence]
        out += ["", f"**Fix:** {md_text(f.fix.summary)}", "", "```python", _fence_safe(f.fix.snippet), "```"]
    return "\n".join(out) + "\n"


def _ranks(view: RanksView) -> list[str]:
    head, rows = rank_table(view)
    out = ["", "### Ranks", ""]
    sentence = slowest_sentence(view.overview)
    if sentence:
        out += [f"**{md_text(sentence)}**", ""]
    aligns = ["---" if h in ("trace", "top finding") else "--:" for h in head]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join(aligns) + "|"]
    for row in rows:
        rank, *rest = row.cells
        mark = f" **{row.mark}**" if row.mark else ""
        cells = [f"{rank.text}{mark}", *(md_text(c.text) for c in rest)]
        out.append("| " + " | ".join(cells) + " |")
    hidden = hidden_note(view)
    out += ["", *([md_text(hidden), ""] if hidden else []), md_text(WORK_NOTE)]
    if view.diagnosis is not None:
        for f in view.diagnosis.findings:
            out += ["", f"**{md_text(f.title)}** (`{f.id}`, up to {f.est_saving_pct:g}% of the step)", ""]
            out += [f"- {md_text(e)}" for e in f.evidence]
            out += ["", f"Fix: {md_text(f.fix.summary)}"]
    rows = collective_rows(view)
    if rows:
        out += ["", "| " + " | ".join(COLLECTIVE_HEAD) + " |", "|---|" + "--:|" * (len(COLLECTIVE_HEAD) - 1)]
        out += [
            "| " + " | ".join(md_text(getattr(r, f)) for f in r.__dataclass_fields__) + " |" for r in rows
        ]
        note = link_note(view)
        if note:
            out += ["", md_text(note)]
    out += ["", f"Below: rank {view.detailed} in detail."]
    return out


def _roofline(a: Analysis) -> list[str]:
    r = a.roofline
    if r is None or not r.kernel_us:
        return []
    out = ["", "### Roofline of the top kernels", ""]
    if not r.points:
        return [*out, f"Not available: {md_text(r.note)}."]
    out += [
        f"FLOPs and bytes known for {fmt_pct(r.coverage)} of kernel time. "
        + (f"Ceilings: {md_text(r.note)}." if r.ceilings else f"{md_text(r.note)}."),
        "",
        "| kernel | op | time | FLOP/s | bandwidth | FLOPs/byte | bound | of ceiling |",
        "|---|---|--:|--:|--:|--:|---|--:|",
    ]
    for p in r.points[:TOP_KERNELS]:
        short = p.kernel if len(p.kernel) <= 60 else p.kernel[:59] + "…"
        share = fmt_pct(p.ceiling_share) if p.ceiling_share is not None else "n/a"
        share += "\\*" if p.beyond_ceiling else ""
        out.append(
            f"| {md_text(short)} | {md_text(p.op)} | {fmt_us(p.time_us)} | {fmt_flops(p.flops_per_s)} | "
            f"{fmt_rate(p.bytes_per_s)} | {p.intensity:.3g} | {p.bound or '?'} | {share} |"
        )
    beyond = [p for p in r.points[:TOP_KERNELS] if p.beyond_ceiling]
    if beyond:
        out.append("")
        out += [f"\\* {md_text(p.kernel[:60])}: {md_text(p.beyond_ceiling or '')}." for p in beyond]
    return out


def _figures(a: Analysis) -> list[tuple[str, str]]:
    rows = []
    # the step the user's loop pays, measured without the profiler, first; the traced steps' median
    # (the profiler slows them) beside it, named as such
    if a.unprofiled_step_us:
        rows.append(("step time, no profiler", fmt_us(a.unprofiled_step_us)))
    if a.step_time_us is not None:
        traced = "traced step (median)" if a.unprofiled_step_us else "step time (median)"
        rows.append((traced, fmt_us(a.step_time_us.p50)))
    per_call = per_call_sentence(a)
    if per_call:
        rows.append(("per model call", md_text(per_call)))
    rows += [(label, value) for label, value in per_second(a) if label != "GPU busy"]
    w = a.window
    if w is not None:
        rows.append(("GPU busy", fmt_pct(w.busy_fraction)))
        for cause, us in w.idle_by_cause_us.items():
            if us > 0:
                rows.append((f"GPU idle: {cause.replace('_', ' ')}", fmt_pct(us / w.window_us)))
    if a.kernels.count:
        rows.append(("kernels", f"{a.kernels.count:,}"))
    if a.memory is not None:
        label, value = memory_tile(a.memory)
        rows.append((label.replace("memory", "GPU memory", 1), value))
    return rows


def _fence_safe(code: str) -> str:
    return printable_block(code).replace("```", "`\u200b``")
