"""The processes left in a round's process group after its leader ended (DataLoader workers, compile
workers, anything the script started and did not stop): left running they compete for the cores with the
next round, so a round's group is ended with it. What ends by itself a moment later (multiprocessing's
resource tracker) and zombies are not counted as left. Read from /proc (Linux); elsewhere nothing is found."""

from __future__ import annotations

import contextlib
import os
import signal
import time
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
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in DEAD:
            found.append(int(entry.name))
    return found


DEAD = ("Z", "X")  # zombie, dead: /proc's states of a process that has exited
GRACE_S = 0.5  # how long what is left may take to end by itself before it is killed


def end_group(pgid: int, proc: Path = PROC, grace_s: float = GRACE_S) -> int:
    """Kill what is left in the group after `grace_s` (what ends by itself meanwhile is not counted);
    how many processes were killed."""
    left = group_members(pgid, proc)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = group_members(pgid, proc)
    if left:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    return len(left)
