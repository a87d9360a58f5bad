"""Shared look of the terminal report: section rules, compact tables, the "not available" line and
value formats. Formatting only: every number shown comes from the result as it is."""

from __future__ import annotations

import math

from rich.console import Console
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from gpudoctor.util.text import printable
from gpudoctor.util.units import fmt_pct, fmt_us

IDLE_LABELS = {"host_wait": "host wait", "sync": "sync", "launch_gap": "launch gap", "other": "other"}


def section(console: Console, title: str) -> None:
    console.print()
    console.print(Rule(Text(title, style="bold"), align="left", style="dim"))


def not_available(console: Console, reason: str) -> None:
    console.print(Text(f"  not available: {printable(reason)}", style="dim"))


def dim_line(console: Console, text: str) -> None:
    console.print(Text(f"  {printable(text)}", style="dim"))


def line(console: Console, *parts: str | Text) -> None:
    """One indented line of `·`-separated parts (strings are plain text, never markup)."""
    out = Text("  ")
    for i, part in enumerate(parts):
        if i:
            out.append(" · ", style="dim")
        out.append(part if isinstance(part, Text) else Text(printable(part)))
    console.print(out)


def table(*headers: str, first_left: int = 1, flexible: int | None = None) -> Table:
    """A borderless table; the first `first_left` columns are left-aligned, the rest right-aligned.
    Only the `flexible` column gives way when the terminal is narrow (fill it with `cut(...)`)."""
    t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold", show_edge=False)
    for i, header in enumerate(headers):
        left = i < first_left
        t.add_column(header, justify="left" if left else "right", no_wrap=i != flexible, overflow="ellipsis")
    return t


def cut(text: str) -> Text:
    """A cell that is cut with an ellipsis rather than wrapped (control characters shown escaped)."""
    return Text(printable(text), no_wrap=True, overflow="ellipsis")


def dur(us: float | None) -> str:
    """A duration; an exact zero is a dash so that the figures that matter stand out."""
    if us is not None and not (isinstance(us, float) and math.isnan(us)) and us == 0:
        return "-"
    return fmt_us(us)


def pct(share: float | None) -> str:
    return "-" if share == 0 else fmt_pct(share)


def count(n: int) -> str:
    return f"{n:,}"


def idle_label(cause: str) -> str:
    return IDLE_LABELS.get(cause, cause.replace("_", " "))


def kind_label(kind: str) -> str:
    """'memcpy_h2d' → 'memcpy h2d'."""
    return kind.replace("_", " ")
