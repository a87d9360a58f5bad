"""The copy of the user's files that the proof runs: a folder that mirrors the script's folder (or the
folder holding it and every file the diff changes) with symbolic links, the files the diff changes
written patched, the script itself always a real file. So `from model import Net` finds the patched
`model.py` beside the script, data found from `__file__` is the user's through the links, and the
script is run from the copy's path with the user's own working folder, arguments and environment.

The script is never a link: Python puts the folder of the resolved script first on `sys.path`, so a
linked script would import the user's unpatched modules. Folders on the way to a written file are real
folders whose other entries are links; `__pycache__` is left out (a patched module's bytecode would be
written into the user's), and so is the entry holding the copy itself (the fix folder under the
script's folder: a link to it would be a loop)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.util.outfile import write_bytes

SKIPPED = ("__pycache__",)


class ShadowError(Exception):
    """The copy cannot be made: one line saying why."""


@dataclass(frozen=True)
class Shadow:
    root: Path  # the copy
    mirrors: Path  # the user's folder it stands for
    script: Path  # the script, in the copy
    written: tuple[Path, ...]  # files written patched, in the copy


def build_shadow(script: Path, patched: dict[Path, str], into: Path) -> Shadow:
    """The copy at `into` (made afresh) of the folder holding `script` and every file of `patched`
    (resolved paths and their patched texts)."""
    script = script.resolve()
    into = into.resolve()
    mirrors = Path(os.path.commonpath([script.parent, *(p.parent for p in patched)]))
    if mirrors == Path(mirrors.anchor):
        raise ShadowError(
            f"the files the diff changes share no folder with {script.name} but {mirrors}: not copied"
        )
    if into == mirrors or any(into in f.parents for f in (script, *patched)):
        raise ShadowError(f"the copy's folder {into} holds the script's files: choose another --out")
    if into.exists():
        shutil.rmtree(into)  # links are removed, never followed
    real = {mirrors} | {d for f in (script, *patched) for d in f.parents if mirrors in d.parents}
    files = {script, *patched}
    for folder in sorted(real, key=lambda d: len(d.parts)):
        _mirror(folder, into / folder.relative_to(mirrors), real, files, into)
    written = []
    for path, text in patched.items():
        target = into / path.relative_to(mirrors)
        write_bytes(target, text.encode("utf-8"), inputs=[path])
        shutil.copymode(path, target)
        written.append(target)
    if script not in patched:
        shutil.copy2(script, into / script.relative_to(mirrors))
    return Shadow(into, mirrors, into / script.relative_to(mirrors), tuple(written))


def _mirror(folder: Path, copy: Path, real: set[Path], files: set[Path], into: Path) -> None:
    """`copy` made a real folder whose entries link to `folder`'s, but for the folders and files that
    are made real or written, `__pycache__`, and the entry that holds the copy."""
    copy.mkdir(parents=True, exist_ok=True)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        raise ShadowError(f"cannot list {folder}: {err.strerror or err}") from None
    for entry in entries:
        path = Path(entry.path)
        if entry.name in SKIPPED or path in real or path in files:
            continue
        if path == into or path in into.parents:
            continue
        try:
            (copy / entry.name).symlink_to(path, target_is_directory=entry.is_dir())
        except OSError as err:
            raise ShadowError(f"cannot link {path} into the copy: {err.strerror or err}") from None
