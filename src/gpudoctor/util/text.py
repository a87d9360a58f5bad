"""Untrusted text made safe to show: names read from a trace or a user's script may hold control characters
(terminal escape sequences that retitle, clear or write the clipboard, carriage returns, bidirectional
overrides, lone surrogates). `printable` shows each escaped (`\x1b`, `\u202e`); renderers call it where
text leaves for a terminal, Markdown or a trace viewer (HTML escaping is the HTML renderer's own)."""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI on some terminals), the bidirectional marks,
# embeddings, overrides and isolates, the line and paragraph separators, lone surrogates.
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
_UNSAFE_IN_LINE = re.compile(f"[\t\n{_UNSAFE}]")
_UNSAFE_IN_BLOCK = re.compile(f"[{_UNSAFE}]")  # keeps tabs and newlines
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` on one line with every control character, tab and newline shown as its escape."""
    if not isinstance(text, str):
        text = str(text)
    return _UNSAFE_IN_LINE.sub(_escape, text) if _UNSAFE_IN_LINE.search(text) else text


def printable_block(text: str) -> str:
    """Like `printable`, but tabs and newlines stay what they are (multi-line text: code, output)."""
    if not isinstance(text, str):
        text = str(text)
    return _UNSAFE_IN_BLOCK.sub(_escape, text) if _UNSAFE_IN_BLOCK.search(text) else text


def has_unsafe(text: str) -> bool:
    """Whether `printable_block` would change `text`."""
    return _UNSAFE_IN_BLOCK.search(text) is not None
