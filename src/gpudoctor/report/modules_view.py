"""Where in the model, rendered: the module view of an analysis as an indented table in the terminal and
a sortable table in the HTML report. Renders only; module names come from the trace and are escaped."""

from __future__ import annotations

import math
from html import escape

from rich.console import Console
from rich.text import Text

from gpudoctor.analysis.modules import ModuleStat, ModuleView
from gpudoctor.report.style import count, cut, dim_line, dur, not_available, pct, section, table
from gpudoctor.util.units import fmt_pct, fmt_us

MAX_ROWS = 40  # terminal rows: the modules with the most GPU and host time, kept in tree order
NO_MODULES = "no module calls in this trace (record with with_stack=True, or run under gpudoctor run)"
# a compiled model runs its modules inside the compiled graph: there are no module calls to see
COMPILED = "the model runs compiled (torch.compile): its modules run inside the compiled graph, unseen"


def why_no_modules(compiled: bool) -> str:
    """Why a trace has no module view: a compiled model, else no module calls recorded."""
    return COMPILED if compiled else NO_MODULES


def leaf(m: ModuleStat, view: ModuleView) -> str:
    """The module's own name, its place in the tree given by indentation (the root's path in full)."""
    if m.depth == 0:
        return m.path
    if view.source.startswith("gpudoctor.module") and "." not in m.path:
        return m.path
    return m.path.rsplit(".", 1)[-1]


def shown_rows(view: ModuleView, limit: int = MAX_ROWS) -> tuple[ModuleStat, ...]:
    """At most `limit` modules, the heaviest (GPU, then host time), in tree order."""
    if len(view.modules) <= limit:
        return view.modules
    heaviest = sorted(
        range(len(view.modules)), key=lambda i: -(view.modules[i].gpu_us + view.modules[i].host_us)
    )
    keep = set(heaviest[:limit])
    return tuple(m for i, m in enumerate(view.modules) if i in keep)


def render_modules(
    view: ModuleView | None, console: Console, why: str = NO_MODULES, gpu: bool = True
) -> None:
    """The module view; `gpu` False (a trace with no GPU activity): its host time alone, without the
    GPU's columns, which would be empty."""
    section(console, "Where in the model")
    if view is None:
        not_available(console, why)
        return
    per = "per step" if view.per == "step" else "in the traced time"
    gpu_head = ("GPU fwd", "GPU bwd", "GPU share") if gpu else ()
    t = table("module", "calls", *gpu_head, "host", *(("kernels",) if gpu else ()), flexible=0)
    rows = shown_rows(view)
    for m in rows:
        gpu_cells = (
            (
                dur(m.gpu_forward_us),
                dur(m.gpu_backward_us) if view.backward else "n/a",
                pct(m.gpu_us / view.gpu_us) if view.gpu_us > 0 else "-",
            )
            if gpu
            else ()
        )
        kernels = (count(round(m.kernels)),) if gpu else ()
        t.add_row(cut("  " * m.depth + leaf(m, view)), f"{m.calls:.3g}", *gpu_cells, dur(m.host_us), *kernels)
    console.print(t)
    if len(rows) < len(view.modules):
        dim_line(
            console,
            f"{len(view.modules) - len(rows)} lighter modules left out (all in --json and the HTML report)",
        )
    outside = (
        f" Outside any module: {fmt_us(view.unattributed_gpu_us)} of GPU time (optimizer, loss, copies)."
        if gpu
        else ""
    )
    console.print(
        Text(
            f"  {per}, children included; from {view.source}, {view.depth} level(s) below the root "
            f"(--module-depth).{outside}",
            style="dim",
        )
    )
    if not view.backward and gpu:
        not_available(console, "backward per module: no autograd sequence numbers in this trace")


def modules_html(view: ModuleView | None, why: str = NO_MODULES, gpu: bool = True) -> str:
    """The section body: a sortable table, indented by depth; the module's full path on hover. `gpu`
    False (a trace with no GPU activity): the host time alone, without the GPU's columns."""
    if view is None:
        return f'<p class="na">not available: {escape(why)}</p>'
    head = ("module", "calls", "GPU fwd", "GPU bwd", "GPU total", "GPU share", "host", "kernels")
    if not gpu:
        head = ("module", "calls", "host")
    body = []
    for m in view.modules:
        name = escape(leaf(m, view))
        share = m.gpu_us / view.gpu_us if view.gpu_us > 0 else None
        cells = [
            f'<td class="name" title="{escape(m.path)}" '
            f'style="padding-left:{0.4 + 1.2 * m.depth:.1f}em">{name}</td>',
            _num(m.calls, f"{m.calls:.3g}"),
            _num(m.gpu_forward_us, _dur(m.gpu_forward_us)),
            _num(m.gpu_backward_us, _dur(m.gpu_backward_us) if view.backward else "n/a"),
            _num(m.gpu_us, _dur(m.gpu_us)),
            _num(share, fmt_pct(share) if share is not None else "-"),
            _num(m.host_us, _dur(m.host_us)),
            _num(m.kernels, f"{round(m.kernels):,}"),
        ]
        if not gpu:
            cells = [*cells[:2], cells[6]]
        body.append(f"<tr>{''.join(cells)}</tr>")
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    per = "per step" if view.per == "step" else "in the traced time"
    note = f"{per}, children included; from {view.source}, {view.depth} level(s) below the root."
    if gpu:
        note += f" GPU time outside any module (optimizer, loss, copies): {fmt_us(view.unattributed_gpu_us)}."
    if not view.backward and gpu:
        note += " Backward per module not available: no autograd sequence numbers in this trace."
    return (
        f'<p class="note">{escape(note)}</p><div class="scroll"><table class="sortable modules"><thead><tr>'
        f"{ths}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def _dur(us: float) -> str:
    return "-" if us == 0 else fmt_us(us)


def _num(value: float | None, shown: str) -> str:
    key = "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:g}"
    return f'<td class="num" data-v="{key}">{escape(shown)}</td>'
