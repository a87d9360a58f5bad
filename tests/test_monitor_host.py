"""The host beside a timed process (`monitor.host`): /proc's counts read into cores busy outside
gpudoctor's process tree, the hypervisor's steal, and a fixed probe's time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.monitor.host import HostState, HostWatch, host_report, machine_cpu_s, tree_cpu_s

HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def fake_proc(tmp: Path, cpu: str, processes: dict[int, tuple[int, int]]) -> Path:
    """A /proc with its `stat` line and, per pid, a stat with its parent and CPU ticks (utime)."""
    (tmp / "stat").write_text(f"{cpu}\ncpu0 1 2 3 4\n")
    for pid, (ppid, ticks) in processes.items():
        (tmp / str(pid)).mkdir()
        # comm with a space and a parenthesis, as a process may name itself
        fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0", "0", "0"] + ["0"] * 10
        (tmp / str(pid) / "stat").write_text(f"{pid} (py (worker) 1) " + " ".join(fields) + "\n")
    (tmp / "self").mkdir()
    return tmp


def test_the_counts_are_read_from_proc(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        f"cpu  {3 * HZ} 0 {HZ} {50 * HZ} {HZ} 0 0 {2 * HZ} 0 0",
        {10: (1, 5 * HZ), 11: (10, 2 * HZ), 12: (11, HZ), 20: (1, 7 * HZ)},
    )
    assert machine_cpu_s(proc) == (pytest.approx(4.0), pytest.approx(2.0))  # user + system; steal
    # the root and everything under it, not its siblings
    assert tree_cpu_s(10, proc) == pytest.approx(8.0) and tree_cpu_s(20, proc) == pytest.approx(7.0)
    assert tree_cpu_s(99, proc) == 0.0  # gone: nothing of it counts
    (proc / "stat").write_text("intr 1 2 3\n")
    with pytest.raises(OSError, match="cpu line"):
        machine_cpu_s(proc)


def test_a_span_is_read_between_the_readings_around_it() -> None:
    def at(t: float, busy: float, tree: float, steal: float = 0.0, probe: float = 100.0) -> HostState:
        return HostState(at=t, busy_s=busy, steal_s=steal, tree_s=tree, probe_us=probe)

    states = [at(0.0, 10.0, 1.0), at(1.0, 13.0, 2.0, 0.5, 120.0), at(2.0, 16.0, 3.0, 1.0, 140.0),
              at(3.0, 17.0, 4.0, 1.0, 300.0)]  # fmt: skip
    r = host_report(states, 0.5, 2.5)
    # from the last reading before the span (t=0) to the last within it (t=2): 6 s busy, 2 of them ours
    assert r.samples == 2 and r.others_cores == pytest.approx(2.0) and r.steal_cores == pytest.approx(0.5)
    assert r.probe_us == pytest.approx(130.0)  # the median of the readings within
    # a span with no reading in it: nothing to tell
    assert host_report(states, 3.5, 4.0).others_cores is None
    # our own CPU above the machine's (counts read a moment apart): never below none
    assert host_report([at(0.0, 10.0, 1.0), at(1.0, 10.0, 3.0)], 0.0, 1.0).others_cores == 0.0


@pytest.mark.skipif(not HostWatch.available(), reason="needs Linux /proc")
def test_a_busy_process_outside_the_watched_tree_is_seen_as_others() -> None:
    # the watched tree: a sleeping child; the busy one beside it is not under it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"]
    )
    try:
        time.sleep(0.3)
        with HostWatch(sleeper.pid, interval_s=0.1) as watch:
            t0 = time.monotonic()
            time.sleep(1.2)
            t1 = time.monotonic()
        r = watch.report_between(t0, t1)
        assert r.samples >= 5 and r.others_cores is not None and r.others_cores >= 0.6
        assert r.probe_us is not None and r.probe_us > 0
    finally:
        for p in (sleeper, busy):
            p.kill()
            p.wait()
