"""The processes left in a round's process group after its leader ended: DataLoader workers, compile
workers or anything else the user's script started and did not stop. Left running they compete for the
cores with the next round (a source of spread between processes), so a round's group is ended with it.
Read from /proc (Linux); elsewhere nothing is found."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")


def group_members(pgid: int, proc: Path = PROC) -> list[int]:
    """The processes whose process group is `pgid`."""
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp …: comm may hold spaces and parentheses, so split after its end
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            found.append(int(entry.name))
    return found


def end_group(pgid: int, proc: Path = PROC) -> int:
    """Kill what is left in the group; how many processes were."""
    left = group_members(pgid, proc)
    if left:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    return len(left)
