"""The terminal edge: a rich `Console` for text that may come from a trace or a user's script, with markup
and emoji codes off and every control character it writes shown escaped (`\x1b`), so a crafted name cannot
retitle, clear or write the clipboard of the terminal; rich's own style codes pass through. Written to a
file or a pipe, no line ends in spaces."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment

from gpudoctor.util.text import has_unsafe, printable_block


class SafeConsole(Console):
    def __init__(self, **options: Any) -> None:
        options.setdefault("markup", False)
        options.setdefault("emoji", False)
        options.setdefault("highlight", False)
        super().__init__(**options)

    def render_str(self, text: str, **options: Any) -> Any:
        # str cells and lines become Text here: escaped before rich measures them, so tables align
        return super().render_str(printable_block(text), **options)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        text = super()._render_buffer(_safe_segments(buffer))
        if self.is_terminal:
            return text
        return "\n".join(line.rstrip(" ") for line in text.split("\n"))


def _safe_segments(buffer: Iterable[Segment]) -> Iterable[Segment]:
    for segment in buffer:
        text, style, control = segment
        if control is None and text and has_unsafe(text):
            yield Segment(printable_block(text), style, control)
        else:
            yield segment
