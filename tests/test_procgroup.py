"""What a round left in its process group: counted and killed, but not a zombie (dead already) and not
a process that ends by itself within a moment of its leader (multiprocessing's resource tracker)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.runner.procgroup import end_group, group_members


def fake_proc(tmp_path: Path, members: dict[int, tuple[str, int]]) -> Path:
    """A /proc with each pid's stat: (state, process group)."""
    for pid, (state, pgid) in members.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python (x)) {state} 1 {pgid} {pgid} 0 -1\n")
    (tmp_path / "self").mkdir()
    return tmp_path


def test_a_zombie_in_the_group_is_not_left_running(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {10: ("S", 7), 11: ("Z", 7), 12: ("R", 8), 13: ("X", 7)})
    assert group_members(7, proc) == [10]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_what_ends_by_itself_within_the_grace_is_not_counted_and_the_rest_is_killed() -> None:
    # GIVEN a group whose leader ended, leaving one process that ends 0.2 s later and one that sleeps on
    code = "import subprocess, sys; [subprocess.Popen([sys.executable, '-c', f'import time; time.sleep({s})']) for s in (0.2, 60)]"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    leader.wait()
    time.sleep(0.05)
    # THEN only the one still running after the grace is counted, and killed
    assert end_group(leader.pid, grace_s=1.5) == 1
    deadline = time.monotonic() + 5
    while group_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_members(leader.pid) == []
