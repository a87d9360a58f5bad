"""The host beside a timed process, read from gpudoctor's own process (nothing in the timed one): how
many of the machine's cores other processes kept busy (/proc/stat's busy time less that of this process
and its descendants — the timed process, its DataLoader workers), the cores the hypervisor took (steal),
and how long a fixed piece of Python took on this host (the probe: its best of three). A host-bound
step — a batch-1 loop launching kernels one by one — runs at the speed of the core that runs it; a host
whose probe is slower, or whose cores others keep busy, makes the same script slower, and makes one
process of it differ from the next. Linux /proc; elsewhere `HostWatch.available()` is false."""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.monitor.sampler import PeriodicThread

PROC = Path("/proc")
PROBE_LOOP = 4_000  # additions in the probe's Python loop: about 0.1 ms on a current server core
PROBE_TRIES = 3  # the probe's best of this many: a try the scheduler interrupted is not the host's speed


@dataclass(frozen=True)
class HostState:
    """One reading: cumulative CPU seconds, as /proc counts them, and the probe's time."""

    at: float  # time.monotonic()
    busy_s: float  # every core's busy time since boot (user, nice, system, irq, softirq)
    steal_s: float  # time the hypervisor ran something else on this machine's cores
    tree_s: float  # this process's and its descendants' CPU time, the reaped ones' included
    probe_us: float


@dataclass(frozen=True)
class HostReport:
    """The host over a watched span: `others_cores` (mean cores busy outside this process's tree),
    `steal_cores`, and the probe's median; None where fewer than two readings span it."""

    samples: int
    others_cores: float | None
    steal_cores: float | None
    probe_us: float | None


def probe_us() -> float:
    """The probe: a fixed Python loop's best time of PROBE_TRIES, in µs."""
    best = float("inf")
    for _ in range(PROBE_TRIES):
        t0 = time.perf_counter()
        total = 0
        for i in range(PROBE_LOOP):
            total += i
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def machine_cpu_s(proc: Path = PROC) -> tuple[float, float]:
    """(busy, steal) CPU seconds of every core since boot, from /proc/stat's first line."""
    fields = (proc / "stat").read_text().split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise OSError(f"{proc / 'stat'} does not start with the machine's cpu line")
    ticks = [int(v) for v in fields[1:]]
    ticks += [0] * (8 - len(ticks))
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def tree_cpu_s(root: int, proc: Path = PROC) -> float:
    """CPU seconds of `root` and every process under it (user + system, their reaped children's too:
    a process that ends moves its time into its parent's count, so the sum goes on)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        fields = raw[raw.rfind(")") + 2 :].split()
        if len(fields) < 15:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def read_host(root: int, proc: Path = PROC) -> HostState:
    busy, steal = machine_cpu_s(proc)
    tree = tree_cpu_s(root, proc)
    return HostState(at=time.monotonic(), busy_s=busy, steal_s=steal, tree_s=tree, probe_us=probe_us())


def host_report(states: list[HostState], start: float, end: float) -> HostReport:
    """The host from `start` to `end`: the CPU counts' differences between the last reading at or
    before `start` (else the first after it) and the last at or before `end`; the probe's median over
    the readings within."""
    inside = [s for s in states if start <= s.at <= end]
    before = [s for s in states if s.at < start]
    first = before[-1] if before else (inside[0] if inside else None)
    last = inside[-1] if inside else None
    probes = [s.probe_us for s in inside]
    probe = statistics.median(probes) if probes else None
    if first is None or last is None or last.at - first.at <= 0:
        return HostReport(samples=len(inside), others_cores=None, steal_cores=None, probe_us=probe)
    span = last.at - first.at
    others = (last.busy_s - first.busy_s) - (last.tree_s - first.tree_s)
    return HostReport(
        samples=len(inside),
        others_cores=max(others, 0.0) / span,
        steal_cores=max(last.steal_s - first.steal_s, 0.0) / span,
        probe_us=probe,
    )


class HostWatch:
    """Reads the host every `interval_s` while the `with` block runs, from a daemon thread of this
    process (`root`, default this one: its descendants are the timed process and its workers).

    with HostWatch() as host:
        run_the_timed_process()
    host.report_between(t0, t1).others_cores
    """

    def __init__(self, root: int | None = None, *, interval_s: float = 0.5, proc: Path = PROC) -> None:
        self._root = os.getpid() if root is None else root
        self._proc = proc
        self._states: list[HostState] = []
        self._lock = threading.Lock()
        self._thread = PeriodicThread(self._read, interval_s, name="gpudoctor-hostwatch")

    @staticmethod
    def available(proc: Path = PROC) -> bool:
        return (proc / "stat").is_file() and (proc / str(os.getpid()) / "stat").is_file()

    def _read(self) -> None:
        state = read_host(self._root, self._proc)
        with self._lock:
            self._states.append(state)

    def __enter__(self) -> HostWatch:
        self._read()  # a reading at the start: a span from the first moment has its "before"
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop()
        if self._thread.error is None:
            self._read()
        elif exc[0] is None:
            raise self._thread.error

    def report_between(self, start: float, end: float) -> HostReport:
        with self._lock:
            states = list(self._states)
        return host_report(states, start, end)
