"""The user's files while gpudoctor runs their script many times (`gpudoctor fix`, `gpudoctor batch`): the
script writes what it writes each time, so `UserFiles.protect` copies the regular files under the working
directory and the script's directory (up to `BACKUP_CAP_BYTES` and `BACKUP_MAX_FILES`, a walk of at most
`WALK_S`) before the first process, and `finish()` — once, after every process is gone, also on Ctrl-C,
SIGTERM and errors — puts back each one the script changed or deleted and says what it wrote
(`WrittenFiles`). Copies, not hard links: a checkpoint `torch.save` overwrites is truncated in place."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.util.outfile import write_json

WALK_S = 1.0  # the longest a look over the directories may take
MAX_ENTRIES = 200_000
BACKUP_CAP_BYTES = 2 << 30
BACKUP_MAX_FILES = 20_000
# gpudoctor's own output roots (earlier runs' traces and fix rounds) are not the user's: copied, every
# session copied all the sessions before it, and they took the cap's room from the user's files
SKIP_NAMES = frozenset({".git", ".hg", ".svn", "__pycache__", "gpudoctor-runs", "gpudoctor-fixes"})
BACKUP_DIR = "user-files"  # under the command's output directory
LEFT_DIR = "left-by-script"
MANIFEST = "manifest.json"
SHOWN = 8  # paths named in a note at most


@dataclass(frozen=True)
class WrittenFiles:
    """What the script wrote under the watched directories while gpudoctor ran it, and what was put back.
    Paths are relative to the working directory where they lie under it."""

    roots: tuple[str, ...]
    restored: tuple[str, ...] = ()  # files the user had, changed or deleted by the script, put back
    lost: tuple[str, ...] = ()  # files the user had, changed with no copy to put back ("path: why")
    created: tuple[str, ...] = ()  # new files, a new directory as one entry ("runs/ (1,413 files)")
    created_files: int = 0
    created_bytes: int = 0
    left_at: str | None = None  # where the versions the script left of the restored files are
    at_risk: tuple[str, ...] = ()  # files the user had that were not copied (past the cap)
    capped: str | None = None  # the walk stopped before it saw every file: why
    copied: int = 0
    copied_bytes: int = 0

    @property
    def wrote(self) -> bool:
        return bool(self.restored or self.lost or self.created)


@dataclass(frozen=True)
class _Stat:
    size: int
    mtime_ns: int


def roots_of(script: str | None, cwd: Path | None = None) -> tuple[Path, ...]:
    """The working directory and the script's directory (a .py file), neither inside the other."""
    found = [(cwd or Path.cwd()).resolve()]
    if script and script.endswith(".py") and Path(script).is_file():
        found.append(Path(script).resolve().parent)
    out: list[Path] = []
    for root in sorted(set(found), key=lambda p: len(p.parts)):
        if not any(root.is_relative_to(r) for r in out):
            out.append(root)
    return tuple(out)


def own_outputs() -> frozenset[tuple[int, int]]:
    """(device, inode) of the regular files this process's stdout and stderr write to: gpudoctor's own
    log where the user sends it to a file here (`gpudoctor fix train.py > fix.log 2>&1`), which the
    script does not write and which is not put back over what gpudoctor wrote."""
    own = set()
    for fd in (1, 2):
        with contextlib.suppress(OSError, ValueError):
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                own.add((st.st_dev, st.st_ino))
    return frozenset(own)


def _walk(
    roots: tuple[Path, ...],
    skip: tuple[Path, ...],
    deadline: float,
    own: frozenset[tuple[int, int]] = frozenset(),
) -> tuple[dict[Path, _Stat], str | None]:
    """Size and mtime of every regular file under `roots` (symbolic links not followed) but the files
    `own` names, and why the walk stopped early, if it did."""
    files: dict[Path, _Stat] = {}
    seen = 0
    for root in roots:
        stack = [root]
        while stack:
            folder = stack.pop()
            if folder in skip or folder.name in SKIP_NAMES or (folder / "pyvenv.cfg").exists():
                continue
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                if seen > MAX_ENTRIES or time.monotonic() > deadline:
                    return files, f"looked at {seen - 1:,} entries and stopped there"
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        if own and (st.st_dev, st.st_ino) in own:
                            continue
                        files[Path(entry.path)] = _Stat(st.st_size, st.st_mtime_ns)
                except OSError:
                    continue
    return files, None


def _shown(path: Path, cwd: Path) -> str:
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def _clone(src: Path, dst: Path) -> None:
    """A copy of `src` at `dst` with its mtime: a reflink where the filesystem makes one, else bytes."""
    try:
        import fcntl

        with open(src, "rb") as s, open(dst, "wb") as d:
            fcntl.ioctl(d.fileno(), 0x40049409, s.fileno())  # FICLONE
        shutil.copystat(src, dst)
    except (OSError, ImportError):
        shutil.copy2(src, dst)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while files are put back (delivered after)."""
    held = {signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())}
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class UserFiles:
    """Copies of the user's files before gpudoctor runs their script, put back by `finish()`."""

    def __init__(self, roots: tuple[Path, ...], skip: tuple[Path, ...], backup: Path, cwd: Path) -> None:
        self.roots, self.skip, self.backup, self.cwd = roots, skip, backup, cwd
        self.own = own_outputs()  # gpudoctor's own output, sent to a file here: not the script's
        self.before: dict[Path, _Stat] = {}
        self.capped: str | None = None
        self.copies: dict[Path, tuple[Path, _Stat]] = {}  # original -> (copy, its size and mtime then)
        self.at_risk: list[Path] = []
        self.copied_bytes = 0
        self._result: WrittenFiles | None = None

    @classmethod
    def protect(
        cls,
        script: str | None,
        out: Path,
        *,
        cap_bytes: int = BACKUP_CAP_BYTES,
        max_files: int = BACKUP_MAX_FILES,
        walk_s: float = WALK_S,
    ) -> UserFiles:
        cwd = Path.cwd().resolve()
        guard = cls(roots_of(script, cwd), (out.resolve(),), out.resolve() / BACKUP_DIR, cwd)
        guard.before, guard.capped = _walk(guard.roots, guard.skip, time.monotonic() + walk_s, guard.own)
        originals = guard.backup / "originals"
        total = 0
        for i, (path, st) in enumerate(sorted(guard.before.items(), key=lambda kv: (kv[1].size, str(kv[0])))):
            if total + st.size > cap_bytes or len(guard.copies) >= max_files:
                guard.at_risk.append(path)
                continue
            copy = originals / f"{i:06d}-{path.name}"
            try:
                copy.parent.mkdir(parents=True, exist_ok=True)
                _clone(path, copy)
            except OSError:
                guard.at_risk.append(path)
                continue
            guard.copies[path] = (copy, st)
            total += st.size
        if guard.copies:  # to put them back by hand, should gpudoctor itself be killed
            manifest = {_shown(p, cwd): str(c) for p, (c, _) in guard.copies.items()}
            write_json(guard.backup / MANIFEST, manifest)
        guard.copied_bytes = total
        return guard

    def warning(self) -> str | None:
        """Before the first process: the files the user has that are not copied, if any."""
        if not self.at_risk:
            return None
        size = sum(self.before[p].size for p in self.at_risk)
        names = ", ".join(
            _shown(p, self.cwd) for p in sorted(self.at_risk, key=lambda p: -self.before[p].size)[:SHOWN]
        )
        more = f" and {len(self.at_risk) - SHOWN} more" if len(self.at_risk) > SHOWN else ""
        return (
            f"{len(self.at_risk)} file(s) here ({_mib(size)}) are past what is copied before the script runs "
            f"({_mib(BACKUP_CAP_BYTES)}, {BACKUP_MAX_FILES:,} files): {names}{more} — if the script writes "
            f"them, its runs under gpudoctor change them for good"
        )

    def finish(self) -> WrittenFiles:
        """Put back what the script changed of the copied files, and say what it wrote. Once; call it
        after every process gpudoctor started for the script has ended."""
        if self._result is None:
            with _signals_held():
                self._result = self._finish()
        return self._result

    def _finish(self) -> WrittenFiles:
        restored, lost = [], []
        left = self.backup / LEFT_DIR
        for path, (copy, was) in sorted(self.copies.items()):
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            except OSError as err:
                lost.append(f"{_shown(path, self.cwd)}: {err.strerror or err} (its copy: {copy})")
                continue
            if st is not None and stat.S_ISREG(st.st_mode) and _Stat(st.st_size, st.st_mtime_ns) == was:
                continue
            shown = _shown(path, self.cwd)
            try:
                if st is not None:
                    if stat.S_ISDIR(st.st_mode):
                        lost.append(f"{shown}: a directory is there now (its copy: {copy})")
                        continue
                    kept = left / shown.lstrip(os.sep)
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(path, kept)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".gpudoctor-restore-{path.name}")
                _clone(copy, tmp)
                os.replace(tmp, path)
                restored.append(shown)
            except OSError as err:
                lost.append(f"{shown}: not put back, {err.strerror or err} (its copy: {copy})")
        after, capped = _walk(self.roots, self.skip, time.monotonic() + WALK_S, self.own)
        risky = set(self.at_risk)
        for path in sorted(risky):
            now = after.get(path)
            if now != self.before[path] and (now is not None or not capped):
                lost.append(f"{_shown(path, self.cwd)}: changed, and not copied before (past the cap)")
        new = {p: s for p, s in after.items() if p not in self.before}
        created = _grouped(new, self.before, self.roots, self.cwd)
        if not lost:  # every copy is back in place or unchanged: the copies are not needed
            shutil.rmtree(self.backup / "originals", ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (self.backup / MANIFEST).unlink()
        with contextlib.suppress(OSError):
            self.backup.rmdir()  # only when empty
        return WrittenFiles(
            roots=tuple(_shown(r, self.cwd) for r in self.roots),
            restored=tuple(restored),
            lost=tuple(lost),
            created=created,
            created_files=len(new),
            created_bytes=sum(s.size for s in new.values()),
            left_at=str(left) if restored else None,
            at_risk=tuple(_shown(p, self.cwd) for p in self.at_risk),
            capped=self.capped or capped,
            copied=len(self.copies),
            copied_bytes=self.copied_bytes,
        )


def _grouped(
    new: dict[Path, _Stat], before: dict[Path, _Stat], roots: tuple[Path, ...], cwd: Path
) -> tuple[str, ...]:
    """New files, those under a directory that held none of the user's files as one entry each."""
    old_dirs = {parent for p in before for parent in p.parents}
    groups: dict[Path, list[_Stat]] = {}
    for path, st in sorted(new.items()):
        top = path
        for parent in path.parents:  # the outermost new directory above it, under its root
            if parent in old_dirs or parent in roots or not any(parent.is_relative_to(r) for r in roots):
                break
            top = parent
        groups.setdefault(top, []).append(st)
    out = []
    for top, stats in groups.items():
        shown = _shown(top, cwd)
        if top in new:
            out.append(shown)
        else:
            n = len(stats)
            out.append(
                f"{shown}{os.sep} ({n:,} file{'s' if n != 1 else ''}, {_mib(sum(s.size for s in stats))})"
            )
    return tuple(out)


def _mib(n: int) -> str:
    from gpudoctor.util.units import fmt_bytes

    return fmt_bytes(n)
