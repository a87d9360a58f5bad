"""runner.child: the one way gpudoctor starts a process for the user's script — a child with a result
file (`run_child`) and one in the foreground (`run_attached`, torchrun and its ranks): a process group of
its own, its exit status back, and nothing it started left running."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.runner.child import run_attached, run_child

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="process groups are read from /proc")

# starts a grandchild that would outlive it (as torchrun's workers or a DataLoader's might), writes its
# pid, and exits with status 3
LEAVES_ONE = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(p.pid))
sys.exit(3)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"  # a zombie is ended


def _gone(pid: int, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_foreground_command_gives_its_exit_status_and_leaves_nothing_running(tmp_path: Path) -> None:
    # GIVEN a command that starts a process of its own and exits 3 without stopping it
    pid_file = tmp_path / "pid"
    code = run_attached([sys.executable, "-c", LEAVES_ONE, str(pid_file)], dict(os.environ))
    # THEN its exit status comes back and what it left is ended with it
    assert code == 3
    assert _gone(int(pid_file.read_text()))


def test_a_child_with_a_result_file_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the same as a module child that writes no result
    (tmp_path / "leaves_one.py").write_text(LEAVES_ONE.replace("sys.argv[1]", "sys.argv[-1]"))
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    run = run_child(
        "leaves_one", [str(pid_file)], result=tmp_path / "r.json", log=tmp_path / "log", timeout_s=60
    )
    # THEN it says why there is no result, counts what it left, and ends it
    assert run.exit_code == 3 and run.result is None and "exit status 3" in (run.error or "")
    assert run.leftover >= 1
    assert _gone(int(pid_file.read_text()))


def test_a_command_that_cannot_start_is_a_one_line_error(tmp_path: Path) -> None:
    from gpudoctor.util.errors import GpudoctorError

    with pytest.raises(GpudoctorError, match="cannot start"):
        run_attached([str(tmp_path / "no-such-program")])
