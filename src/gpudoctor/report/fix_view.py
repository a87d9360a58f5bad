"""`gpudoctor fix`'s report in the terminal (rich), Markdown and HTML: the table of fixes tried (fix,
predicted saving, measured saving with its 95% interval, numerics, kept or reverted and why), the kept
fixes together, compile time and its payback, the permanent change as a diff (or snippets), and the
changes left to the user with their source lines. Renders only; every string from the user's script is
escaped (HTML, Markdown) or printed as plain text (terminal)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from rich.cells import cell_len
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from gpudoctor.fixes.budget import RAN_OUT
from gpudoctor.fixes.candidates import ManualFix
from gpudoctor.fixes.result import FixReport, FixVerdict
from gpudoctor.fixes.verify import NumericsCheck
from gpudoctor.report.html_style import CSS
from gpudoctor.report.markdown import md_text
from gpudoctor.report.style import dim_line, section
from gpudoctor.runner.userfiles import SHOWN, WrittenFiles
from gpudoctor.util.text import printable
from gpudoctor.util.units import fmt_bytes, fmt_us

NEVER_RUN = ("does not apply", RAN_OUT)  # reasons of fixes never applied
HEAD = ("fix", "predicted saving", "measured saving (95% CI)", "numerics", "", "why")


def saving_cell(v: FixVerdict) -> str:
    if v.stalled is not None:
        return "stalled: no figure"  # one stall dominates it (the reason says which)
    if v.measured_saving_pct is None:
        return "-"
    lo, hi = v.ci_low_pct, v.ci_high_pct
    ci = f" ({lo:.1f} to {hi:.1f})" if lo is not None and hi is not None else ""
    return f"{v.measured_saving_pct:.1f}%{ci}" + (" /sample" if v.per_sample else "")


def predicted_cell(v: FixVerdict) -> str:
    return "-" if v.predicted_saving_pct is None else f"≤{v.predicted_saving_pct:g}%"


def numerics_cell(n: NumericsCheck | None) -> str:
    if n is None:
        return "-"
    if n.max_rel_diff is None:
        return "finite" if n.ok and n.kind != "none" else ("not checked" if n.kind == "none" else "broken")
    diff = "inf" if math.isinf(n.max_rel_diff) else f"{100 * n.max_rel_diff:.2g}%"
    allowed = n.allowed
    if not n.ok:
        return f"{diff} (too far)"
    # no tolerance: a loader fix, judged on speed, its results held only to stay finite
    return f"{diff} ≤ {100 * allowed:.2g}%" if allowed is not None else f"{diff} (finite)"


def status_cell(v: FixVerdict) -> str:
    """kept; reverted (applied, and taken back: timed and not kept, or failed); not run (it does not
    apply, or the budget ran out before its first round: nothing was applied, nothing to take back)."""
    if v.kept:
        return "kept"
    never = v.reason.startswith(NEVER_RUN) and v.rounds == 0 and v.verdict is None
    return "not run" if never else "reverted"


def rows(report: FixReport) -> list[tuple[FixVerdict, list[str]]]:
    verdicts = [*report.verdicts, *([report.combination] if report.combination else []), *report.stacked]
    return [(v, [v.title, predicted_cell(v), saving_cell(v), numerics_cell(v.numerics), status_cell(v), why_cell(v)])
            for v in verdicts]  # fmt: skip


def why_cell(v: FixVerdict) -> str:
    """Why kept or reverted, and what its rounds show of its effect (bfloat16's share of the matmul work,
    graphs compiled) where that is not already the reason."""
    shown = [e for e in v.evidence if "did not take effect" not in v.reason]
    return "; ".join([v.reason, *shown])


def machine(report: FixReport) -> tuple[str, ...]:
    """The device and torch the rounds ran on, as far as any round ran (none where the script failed
    before its first round)."""
    parts = [] if report.device in (None, "", "unknown") else [str(report.device)]
    return (*parts, f"torch {report.torch}") if report.torch else tuple(parts)


def headline(report: FixReport) -> str:
    if not report.baseline_rounds or report.baseline_us is None:
        return "the script as written timed no step: nothing was measured (see below for why)."
    n = report.baseline_rounds
    base = f"baseline {fmt_us(report.baseline_us)} per step over {n} process{'es' if n > 1 else ''}"
    if report.baseline_spread_pct is not None:
        base += f" (up to {report.baseline_spread_pct:.1f}% apart)"
    if not report.final and not rows(report):
        if report.manual:
            return f"{base}; no fix applies to this script (see below for what is left to you)."
        why = " (see below for why)" if report.notes else ""
        return f"{base}; no fix applies to this script{why}."
    if not report.final:
        return f"{base}; no fix was faster beyond noise with the same results."
    fixes = ", ".join(report.final)
    h, proof = report.headline, report.proof
    if h is not None and h.source == "proof" and proof is not None:
        if not h.recommended:
            return f"{base}; not recommended: {fixes} — {proof.reason}."
        harness = f"; the harness measured {h.harness_speedup:.2f}×" if h.harness_speedup else ""
        return (
            f"{base}; recommended: {fixes} — {h.speedup:.2f}× faster as you run it (95% CI "
            f"{h.speedup_low:.2f}–{h.speedup_high:.2f}×, the diff applied and timed in plain processes{harness})."
        )
    saving = report.final_saving_pct
    speedup = f", {100 / (100 - saving):.2f}× faster" if saving is not None and saving < 100 else ""
    unproven = " by the harness, not proven as you run it" if proof is not None else ""
    return f"{base}; recommended: {fixes} — saves {saving:.1f}% of the step{speedup}{unproven}."


def diff_title(report: FixReport, title: str) -> str:
    """The diff's heading: not recommended where the proof refuted it (it is not in fix.diff then)."""
    return title if report.recommended else f"{title} the harness kept — not recommended (see above)"


def proof_lines(report: FixReport) -> list[str]:
    """The proof under the headline: what ran, what it measured or why it was not made, and the
    harness's baseline beside the plain processes of the script."""
    proof = report.proof
    out = []
    if proof is not None:  # none where nothing was kept, or --no-proof: the harness's level alone
        if proof.speedup is not None:
            out.append(
                f"proof: {proof.script_us / 1e3:.4g} ms a step as written, {proof.patched_us / 1e3:.4g} ms "
                f"patched ({len(proof.pairs)} process pairs, A B, B A, …; {proof.test}; p {proof.p_value:.2g}); "
                f"steps: {proof.step}"
            )
            out.append(
                f"proof commands: {' '.join(proof.script_command)}  |  {' '.join(proof.patched_command)}"
            )
            if proof.clocks:
                out.append(proof.clocks)
        elif proof.recommended is None:
            out.append(f"proof not made: {proof.reason}")
        elif not (report.headline and report.headline.source == "proof"):
            out.append(f"proof: {proof.reason}")
    level, alone = report.harness_level, [p for p in report.plain_script if p.mean_step_us]
    if level is not None:
        how = f" (the script alone, {len(alone)} plain processes: nothing proven)" if alone else ""
        out.append(
            f"the harness's baseline: {level.harness_us / 1e3:.4g} ms a step in its rounds, "
            f"{level.plain_us / 1e3:.4g} ms as a plain process{how} ({level.ratio:.2f}×"
            + (
                f", 95% CI {level.ratio_low:.2f}–{level.ratio_high:.2f}×)"
                if level.ratio_low is not None and level.ratio_high is not None
                else ")"
            )
        )
    return out


def compile_lines(report: FixReport) -> list[str]:
    out = []
    for v in [*report.verdicts, *([report.combination] if report.combination else []), *report.stacked]:
        if v.compile_s:
            # what a kept fix's compile costs, against what it saves; a fix not kept saves nothing
            payback = f", paid back after {v.payback_steps:,.0f} steps" if v.payback_steps and v.kept else ""
            out.append(f"{v.title}: compiling took {v.compile_s:.1f} s (not in the step times){payback}")
    return out


def user_files_lines(w: WrittenFiles | None) -> list[str]:
    """What the script wrote in its directories while gpudoctor ran it (its diagnosis run and rounds,
    or batch points), and which of the user's files were put back; nothing where it wrote nothing."""
    if w is None:
        return []
    out = []

    def names(items: tuple[str, ...]) -> str:
        more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
        return ", ".join(items[:SHOWN]) + more

    if w.wrote:
        parts = []
        if w.restored:
            kept = f" (the versions it left: {w.left_at})" if w.left_at else ""
            parts.append(f"{names(w.restored)} — changed or deleted, put back as before{kept}")
        if w.created:
            total = (
                f" ({_files(w.created_files)}, {fmt_bytes(w.created_bytes)})" if len(w.created) > 1 else ""
            )
            parts.append(f"new: {names(w.created)}{total}, left in place")
        if parts:
            out.append(f"the script wrote, while gpudoctor ran it: {'; '.join(parts)}")
        if w.lost:
            out.append(f"NOT put back, the script changed them: {names(w.lost)}")
    if w.capped:
        out.append(f"the look over {', '.join(w.roots)} for the script's files was cut short ({w.capped}): "
                   f"files past it were neither copied nor watched")  # fmt: skip
    return out


def _files(n: int) -> str:
    return f"{n:,} file{'s' if n != 1 else ''}"


def _notes(report: FixReport) -> list[str]:
    return [*compile_lines(report), *report.notes, *user_files_lines(report.user_files)]


# -- terminal ------------------------------------------------------------------------------------------
# The table of fixes fits the console's width: the fix's name and the reason wrap at words, the figures
# never do. Where the reason would get fewer than WHY_MIN columns beside them, it goes on its own line
# under its row; where not even the name fits beside the figures, each fix is a block of lines.
FIX_MIN = 16
WHY_MIN = 30
GAP = 2  # padding (0, 1) without the outer edges: two spaces between columns
# the headers on two lines, where one line each leaves the name and the reason too little room
NARROW_HEAD = ("fix", "predicted\nsaving", "measured saving\n(95% CI)", "numerics", "", "why")


def _natural(head: tuple[str, ...], cells: list[list[str]]) -> list[int]:
    """Each column's width with nothing wrapped: its widest header line or cell."""
    return [
        max(cell_len(part) for text in (head[i], *(row[i] for row in cells)) for part in text.split("\n"))
        for i in range(len(head))
    ]


def fix_table_layout(cells: list[list[str]], width: int) -> tuple[str, tuple[str, ...], list[int]]:
    """How the rows' cells are laid out in `width` columns: ("table", headers, widths) where the reason
    gets WHY_MIN columns (or all it needs) beside the rest; ("reason below", headers, widths) for the
    table without the reason, which goes on a line under its row; ("blocks", (), []) where not even the
    fix's name fits beside the figures."""
    cells = [[printable(c) for c in row] for row in cells]
    natural = _natural(HEAD, cells)
    if sum(natural) + GAP * 5 <= width:
        return "table", HEAD, natural
    natural = _natural(NARROW_HEAD, cells)
    figures = sum(natural[1:5])
    room = width - figures - GAP * 5  # for the name and the reason
    fix_w = min(natural[0], max(FIX_MIN, room * 9 // 20))
    why_w = min(natural[5], room - fix_w)
    if why_w >= min(WHY_MIN, natural[5]):
        return "table", NARROW_HEAD, [fix_w, *natural[1:5], why_w]
    fix_w = min(natural[0], width - figures - GAP * 4)
    if fix_w >= min(FIX_MIN, natural[0]):
        return "reason below", NARROW_HEAD[:5], [fix_w, *natural[1:5]]
    return "blocks", (), []


def _fix_table(head: tuple[str, ...], widths: list[int], show_header: bool = True) -> Table:
    t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold", show_edge=False)
    t.show_header = show_header
    for i, (h, w) in enumerate(zip(head, widths, strict=True)):
        figure = i in (1, 2, 3)
        # the name and the reason wrap at words (a word wider than its column is folded); figures never
        t.add_column(
            h, justify="right" if figure else "left", width=w, no_wrap=figure or i == 4, overflow="fold"
        )
    return t


def _status(v: FixVerdict) -> Text:
    return Text(status_cell(v), style="green" if v.kept else "dim")


def _hanging(label: str, text: str) -> Table:
    """`    label text`, the text wrapped at words under its own first word."""
    grid = Table.grid()
    grid.add_column(width=4 + cell_len(label), no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text(f"    {label}"), Text(printable(text)))
    return grid


def _fix_rows(report: FixReport, console: Console) -> None:
    verdict_rows = rows(report)
    layout, head, widths = fix_table_layout([cells for _, cells in verdict_rows], console.width)
    if layout == "table":
        t = _fix_table(head, widths)
        for v, cells in verdict_rows:
            t.add_row(*(Text(printable(c)) for c in cells[:4]), _status(v), Text(printable(cells[5])))
        console.print(t)
    elif layout == "reason below":
        # one table per row, all with the same column widths: the figures line up under the headers
        console.print(_fix_table(head, widths))
        for v, cells in verdict_rows:
            t = _fix_table(head, widths, show_header=False)
            t.add_row(*(Text(printable(c)) for c in cells[:4]), _status(v))
            console.print(t)
            console.print(_hanging("why: ", cells[5]))
    else:
        for v, cells in verdict_rows:
            console.print(Text.assemble((printable(cells[0]), "bold"), " · ", _status(v)))
            figures = f"predicted {cells[1]} · measured {cells[2]} · numerics {cells[3]}"
            console.print(_hanging("", figures))
            console.print(_hanging("why: ", cells[5]))


def render_fix_terminal(report: FixReport, console: Console) -> None:
    section(console, f"gpudoctor fix: {' '.join(report.argv)}")
    console.print(Text(f"  {' · '.join((*machine(report), headline(report)))}"))
    for line in proof_lines(report):
        console.print(Text(f"  {printable(line)}"))
    if rows(report):
        _fix_rows(report, console)
    for note in _notes(report):
        dim_line(console, note)
    if report.diff:
        section(console, diff_title(report, "The change, as a diff"))
        console.print(Syntax(report.diff, "diff", theme="ansi_dark", background_color="default"))
    for snippet in report.snippets:
        section(console, "The change (no call site known: add it where it belongs)")
        console.print(Syntax(snippet, "python", theme="ansi_dark", background_color="default"))
    for why in report.unplaced:
        dim_line(console, f"not in the diff: {why}")
    if report.manual:
        section(console, "Left to you (gpudoctor cannot change these safely)")
        for m, places in manual_groups(report.manual):
            console.print(Text(f"  {m.title} [{m.rule}]", style="bold"))
            for place in places:
                console.print(Text(f"    {place}"))
            console.print(Text(f"    → {m.change}"))


def manual_groups(manual: Sequence[ManualFix]) -> list[tuple[ManualFix, list[str]]]:
    """The changes left to the user, one per kind of change (rule, title and change), each with the
    places it is found at ("file:line: the line", or "file:line" where the line cannot be read: a
    profiler's frame names a function by the line it starts on), in the order first seen: a sync found in
    five functions is one piece of advice with five places, not five."""
    groups: dict[tuple[str, str, str], tuple[ManualFix, list[str]]] = {}
    for m in manual:
        _, places = groups.setdefault((m.rule, m.title, m.change), (m, []))
        if m.where:
            place = f"{m.where}: {m.source_line}" if m.source_line else m.where
            if place not in places:
                places.append(place)
    return list(groups.values())


# -- Markdown ------------------------------------------------------------------------------------------
def render_fix_markdown(report: FixReport) -> str:
    meta = [md_text(" · ".join(machine(report))), ""] if machine(report) else []
    proof = proof_lines(report)
    out = [
        f"## gpudoctor fix: `{_code(' '.join(report.argv))}`",
        "",
        *meta,
        f"**{md_text(headline(report))}**",
        "",
        *[f"- {md_text(line)}" for line in proof],
        *([""] if proof else []),
    ]
    if rows(report):
        out += ["| " + " | ".join(h or "kept" for h in HEAD) + " |", "|---|--:|--:|--:|---|---|"]
        out += ["| " + " | ".join(md_text(c) for c in cells) + " |" for _, cells in rows(report)]
    out += [""] + [f"- {md_text(line)}" for line in _notes(report)]
    if report.diff:
        out += [
            "",
            f"### {diff_title(report, 'The change')}",
            "",
            "```diff",
            _fence(report.diff.rstrip("\n")),
            "```",
        ]
    for snippet in report.snippets:
        out += ["", "```python", _fence(snippet), "```"]
    out += [f"- not in the diff: {md_text(u)}" for u in report.unplaced]
    if report.manual:
        out += ["", "### Left to you", ""]
        for m, places in manual_groups(report.manual):
            where = f" at {'; '.join(f'`{_code(p)}`' for p in places)}" if places else ""
            out.append(f"- **{md_text(m.title)}** (`{m.rule}`){where} — {md_text(m.change)}")
    return "\n".join(out) + "\n"


def _code(text: str) -> str:
    return " ".join(text.replace("`", "'").split())


def _fence(text: str) -> str:
    return text.replace("```", "`\u200b``")


# -- HTML ----------------------------------------------------------------------------------------------
def _why_tried(v: FixVerdict) -> str:
    """Under the fix's name: why it was tried (the finding, what the script does, on top of what)."""
    rules = f" ({', '.join(v.rules)})" if v.rules else ""
    return f'<br><span class="meta">{escape(v.why_tried + rules)}</span>' if v.why_tried else ""


def render_fix_html(report: FixReport) -> str:
    head = "".join(f"<th>{escape(h or 'kept')}</th>" for h in HEAD)
    body = "".join(
        f'<tr class="{"ok" if v.kept else "dim"}">'
        + "".join(f"<td>{escape(c)}{_why_tried(v) if i == 0 else ''}</td>" for i, c in enumerate(cells))
        + "</tr>"
        for v, cells in rows(report)
    )
    parts = [
        f"<header><h1>gpudoctor fix: <code>{escape(' '.join(report.argv))}</code></h1>"
        f'<p class="meta">{escape(" · ".join(machine(report)))}</p></header>',
        f'<p class="bound">{escape(headline(report))}</p>',
        "".join(f'<p class="meta">{escape(line)}</p>' for line in proof_lines(report)),
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
        if body
        else "",
        "".join(f'<p class="meta">{escape(n)}</p>' for n in _notes(report)),
    ]
    if report.diff:
        title = escape(diff_title(report, "The change"))
        parts.append(f"<section><h2>{title}</h2><pre>{escape(report.diff)}</pre></section>")
    parts += [f"<section><h2>The change (no call site known)</h2><pre>{escape(s)}</pre></section>"
              for s in report.snippets]  # fmt: skip
    if report.manual:
        items = "".join(
            f"<li><b>{escape(m.title)}</b> ({escape(m.rule)})"
            + (" at " + "; ".join(f"<code>{escape(p)}</code>" for p in places) if places else "")
            + f" — {escape(m.change)}</li>"
            for m, places in manual_groups(report.manual)
        )
        parts.append(f"<section><h2>Left to you</h2><ul>{items}</ul></section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>gpudoctor fix</title>'
        f"<style>{CSS}</style></head><body><main>{''.join(parts)}</main></body></html>\n"
    )
