"""Processes seen on a GPU, from the host's side: a readable name for a pid, and whether a pid belongs to
a followed command (the command or one of its descendants) — how `monitor -- cmd` tells its own
processes from contention. Linux /proc; elsewhere the answers are "unknown" (None)."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
NAME_CHARS = 60  # a command line is cut to this many characters


def process_name(pid: int, proc: Path = PROC) -> str:
    """`python3 train.py --lr 3e-4` style: the command line with the directories of the program (and of
    the script it runs) dropped, cut to `NAME_CHARS`; "" when the process is not visible from here."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        raw = b""
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not args:
        try:
            return (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            return ""
    args[0] = os.path.basename(args[0])
    if len(args) > 1 and args[0].startswith("python") and args[1].endswith(".py"):
        args[1] = os.path.basename(args[1])
    text = " ".join(args)
    return text if len(text) <= NAME_CHARS else text[: NAME_CHARS - 1] + "…"


def parent_pid(pid: int, proc: Path = PROC) -> int | None:
    """The parent of `pid`, or None when `pid` is not visible here."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (ValueError, IndexError):
        return None


class ProcessTree:
    """Which pids belong to the process tree under `root` (the followed command). Answers are cached:
    a process that was ours stays ours even after its parent exits and it is re-parented."""

    def __init__(self, root: int, proc: Path = PROC) -> None:
        self.root = root
        self._proc = proc
        self._known: dict[int, bool] = {root: True}

    def owns(self, pid: int) -> bool | None:
        """True for the root and its descendants, False for other visible processes, None for a pid that
        is not visible from here (another PID namespace: NVML reports the host's pids)."""
        if pid in self._known:
            return self._known[pid]
        chain: list[int] = []
        current = pid
        while True:
            if current in self._known:
                answer = self._known[current]
                break
            parent = parent_pid(current, self._proc)
            if parent is None:
                if current == pid:
                    return None  # not visible from here: unknown, and not cached
                answer = False  # an ancestor exited between two reads: not ours
                break
            chain.append(current)
            if parent <= 1 or len(chain) >= 64:
                answer = False
                break
            current = parent
        for p in chain:
            self._known[p] = answer
        return answer
