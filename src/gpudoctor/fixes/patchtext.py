"""A strict unified-diff applier, in pure Python: what `patch -p1` does with `fix.diff`, without its
tolerance. Every hunk must find its context and removed lines exactly at the line its header names (no
offset, no fuzz, no whitespace leniency); hunks go in order without overlapping; counts in a header
must match its body. A diff that does not apply is one line saying which hunk and why — never a file
half-patched. Files are only read here; the caller writes the patched text where it wants it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = "\\ No newline at end of file"


class PatchError(Exception):
    """The diff cannot be applied: one line saying where and why."""


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based; 0 for an empty side
    old: tuple[str, ...]  # the context and removed lines, as the file must hold them
    new: tuple[str, ...]  # the context and added lines

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{len(self.old)}"


@dataclass(frozen=True)
class FilePatch:
    old_name: str  # as the diff writes it, a/… stripped
    new_name: str
    hunks: tuple[Hunk, ...]


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse(text: str) -> list[FilePatch]:
    """The files of a unified diff and their hunks; a `PatchError` for anything malformed."""
    lines = text.splitlines()
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            if lines[i].startswith(("@@", "+++ ")):
                raise PatchError(f"line {i + 1}: {lines[i][:40]!r} outside a file's header")
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 1}: a '---' header without its '+++' line")
        old, new = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
        if old == "/dev/null" or new == "/dev/null":
            raise PatchError(f"{old if new == '/dev/null' else new}: the diff creates or deletes a file")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            hunk, i = _hunk(lines, i, old)
            hunks.append(hunk)
        if not hunks:
            raise PatchError(f"{old}: a file header with no hunk")
        out.append(FilePatch(old, new, tuple(hunks)))
    if not out:
        raise PatchError("no file in the diff")
    return out


def _hunk(lines: list[str], i: int, name: str) -> tuple[Hunk, int]:
    m = HUNK.match(lines[i])
    if m is None:
        raise PatchError(f"{name}: line {i + 1} is not a hunk header: {lines[i][:40]!r}")
    old_start, old_n = int(m.group(1)), int(m.group(2) or 1)
    new_n = int(m.group(4) or 1)
    old: list[str] = []
    new: list[str] = []
    i += 1
    while i < len(lines) and (len(old) < old_n or len(new) < new_n):
        line = lines[i]
        tag, body = (line[:1], line[1:]) if line else (" ", "")  # an empty context line, its space lost
        if tag == " ":
            old.append(body)
            new.append(body)
        elif tag == "-":
            old.append(body)
        elif tag == "+":
            new.append(body)
        elif line == NO_NEWLINE:
            pass
        else:
            break
        i += 1
    while i < len(lines) and lines[i] == NO_NEWLINE:
        i += 1
    if (len(old), len(new)) != (old_n, new_n):
        raise PatchError(
            f"{name}: hunk at line {old_start} says {old_n} old and {new_n} new lines, its body holds "
            f"{len(old)} and {len(new)}"
        )
    return Hunk(old_start, tuple(old), tuple(new)), i


def apply(text: str, patch: FilePatch) -> str:
    """`text` with every hunk of `patch` applied, each exactly where its header says."""
    lines = text.splitlines(keepends=True)
    ending = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    at = 0  # lines of `text` consumed
    for n, hunk in enumerate(patch.hunks, 1):
        start = hunk.old_start - 1 if hunk.old else hunk.old_start
        if start < at:
            raise PatchError(f"{patch.old_name}: hunk {n} ({hunk.header}) overlaps the hunk before it")
        if start + len(hunk.old) > len(lines):
            raise PatchError(
                f"{patch.old_name}: hunk {n} ({hunk.header}) runs past the file's end ({len(lines)} lines)"
            )
        for k, expected in enumerate(hunk.old):
            found = lines[start + k].rstrip("\r\n")
            if found != expected.rstrip("\r"):
                raise PatchError(
                    f"{patch.old_name}: hunk {n} ({hunk.header}) does not match line {start + k + 1}: the "
                    f"file reads {found[:60]!r}, the diff expects {expected[:60]!r}"
                )
        out.extend(lines[at:start])
        out.extend(line + ending for line in hunk.new)
        at = start + len(hunk.old)
    rest = lines[at:]
    out.extend(rest)
    if not rest and lines and not lines[-1].endswith(("\n", "\r")) and out:
        out[-1] = out[-1].rstrip("\r\n")  # the file ended without a newline: so does the patched one
    return "".join(out)


def resolve(name: str, cwd: Path) -> Path | None:
    """The file a diff's name stands for: relative to `cwd`, or an absolute path written without its
    leading slash (`fixes.diff` writes files outside the working folder so)."""
    for candidate in (cwd / name, Path("/") / name):
        if candidate.is_file():
            return candidate.resolve()
    return None


def patched_files(diff: str, cwd: Path) -> dict[Path, str]:
    """Each file the diff changes (resolved) and its patched text; a `PatchError` where any hunk does
    not apply, a file is missing, or the diff renames one."""
    out: dict[Path, str] = {}
    for patch in parse(diff):
        if patch.old_name != patch.new_name:
            raise PatchError(f"{patch.old_name}: the diff renames it to {patch.new_name}")
        path = resolve(patch.old_name, cwd)
        if path is None:
            raise PatchError(f"{patch.old_name}: no such file here (from {cwd})")
        if path in out:
            raise PatchError(f"{patch.old_name}: two patches for one file")
        try:
            with path.open(encoding="utf-8", newline="") as f:  # line endings as they are
                text = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise PatchError(f"{patch.old_name}: cannot be read ({err})") from None
        out[path] = apply(text, patch)
    return out
