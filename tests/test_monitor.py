"""The monitor's behaviour without a GPU: clock-event decoding, samples through JSON and JSON lines, the
background sampler (schedule, stop, errors, its own CPU cost), alerts on windows of samples, run
summaries, CSV / JSON-lines logs, and telling a followed command's processes from others."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudoctor.monitor import (
    AlertPolicy,
    GpmMetrics,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MonitorRecord,
    MonitorSession,
    ReplayBackend,
    Sampler,
    decode_clock_events,
    read_clocks,
    summarize_record,
)
from gpudoctor.monitor.alerts import AlertTracker, evaluate
from gpudoctor.monitor.clocks import ClockWatch
from gpudoctor.monitor.logfile import CSV_COLUMNS, SampleLog, log_format
from gpudoctor.monitor.procs import ProcessTree, parent_pid, process_name
from gpudoctor.monitor.samples import SystemInfo
from gpudoctor.util.errors import OutputError, UsageError

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
H100 = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", sm_max_mhz=1980, mem_max_mhz=2619, power_limit_w=700.0,
               memory_total_bytes=80 << 30, architecture="hopper", gpm_supported=True)  # fmt: skip
GIB = 1 << 30


def sample(t: float, *, util: int | None = 100, gpu: int = 0, procs: tuple[tuple[int, int], ...] = ((100, GIB),),
           events: tuple[str, ...] = (), sm: int = 1980, mem_used: int = 10 * GIB, sm_active: float | None = None,
           energy_j: float | None = None) -> GpuSample:  # fmt: skip
    return GpuSample(
        index=gpu, mono_s=t, unix_s=1e9 + t, gpu_util_pct=util, mem_util_pct=30, mem_used_bytes=mem_used,
        mem_total_bytes=80 * GIB, power_w=400.0, power_limit_w=700.0, temp_c=50, sm_clock_mhz=sm,
        mem_clock_mhz=2619, clock_event_mask=None, clock_events=events, energy_j=energy_j,
        processes=tuple(GpuProcess(pid=p, name=f"proc{p}", used_memory_bytes=m) for p, m in procs),
        gpm=GpmMetrics(interval_s=0.1, sm_active_pct=sm_active, tensor_active_pct=50.0) if sm_active is not None
        else None,
    )  # fmt: skip


def series(seconds: float, dt: float = 0.1, **kw: object) -> list[GpuSample]:
    return [sample(i * dt, **kw) for i in range(round(seconds / dt) + 1)]  # type: ignore[arg-type]


def record(samples: list[GpuSample], devices: tuple[GpuInfo, ...] = (H100,)) -> MonitorRecord:
    return MonitorRecord(system=SystemInfo(driver_version="580"), devices=devices, interval_s=0.1,
                         samples=tuple(samples))  # fmt: skip


class Owner:
    def __init__(self, ours: set[int], unknown: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.ours, self.unknown = ours, unknown

    def owns(self, pid: int) -> bool | None:
        return None if pid in self.unknown else pid in self.ours


# --- clock-event reasons ---------------------------------------------------------------------------


def test_clock_event_bits_decode_to_names() -> None:
    assert decode_clock_events(0) == () and decode_clock_events(None) == ()
    assert decode_clock_events(0x1) == ("gpu_idle",)
    assert decode_clock_events(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    assert decode_clock_events(0x1000 | 0x8) == ("hw_slowdown", "unknown_0x1000")


def test_idle_is_not_a_slowdown() -> None:
    s = sample(0, events=("gpu_idle", "sw_power_cap"))
    assert s.slowdowns == ("sw_power_cap",)


# --- samples and records ---------------------------------------------------------------------------


def test_a_sample_survives_json() -> None:
    s = dataclasses.replace(sample(1.5, sm_active=40.0), violation_ns={"power": 5}, missing={"temp_c": "why"})
    assert GpuSample.from_json(s.to_json()) == s


def test_a_record_survives_json_lines_gzipped(tmp_path: Path) -> None:
    rec = record(series(1.0))
    rec.write_jsonl(tmp_path / "r.jsonl.gz")
    assert MonitorRecord.read_jsonl(tmp_path / "r.jsonl.gz") == rec


def test_a_truncated_last_line_is_dropped_but_garbage_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    record(series(0.5)).write_jsonl(path)
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # the writer was killed mid-line
    assert len(MonitorRecord.read_jsonl(path).samples) == 5
    lines = text.splitlines()
    path.write_text("\n".join([lines[0], lines[1].replace('"index":0', '"index":"x"'), *lines[2:]]))
    with pytest.raises(UsageError, match=r"r\.jsonl:2: not a monitor sample"):
        MonitorRecord.read_jsonl(path)
    path.write_text(lines[0].replace('"index":0', '"index":"x"') + "\n")
    with pytest.raises(UsageError, match="malformed gpudoctor monitor record"):
        MonitorRecord.read_jsonl(path)
    path.write_text("not json\n")
    with pytest.raises(UsageError, match="not a gpudoctor monitor log"):
        MonitorRecord.read_jsonl(path)


# --- the replay backend and the sampler ------------------------------------------------------------


def test_replay_returns_recorded_samples_in_order_then_loops() -> None:
    rec = record(series(0.3))
    backend = ReplayBackend(rec, retime=False)
    assert [backend.read(0).mono_s for _ in range(6)] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.0, 0.1])
    held = ReplayBackend(rec, retime=False, loop=False)
    assert [held.read(0).mono_s for _ in range(6)][-2:] == pytest.approx([0.3, 0.3])


def test_replay_restamps_with_the_current_time() -> None:
    clock = iter([500.0, 600.0])
    backend = ReplayBackend(record(series(0.3)), clock=lambda: next(clock))
    assert backend.read(0).mono_s == 500.0 and backend.read(0).mono_s == 600.0


def test_the_sampler_reads_every_gpu_on_schedule_and_stops() -> None:
    other = dataclasses.replace(H100, index=1)
    rec = record(series(0.5) + series(0.5, gpu=1), devices=(H100, other))
    seen: list[GpuSample] = []
    with Sampler(ReplayBackend(rec), interval_s=0.02, on_sample=seen.append) as sampler:
        time.sleep(0.3)
    stats = sampler.stats()
    assert not sampler.running
    # every round reads both GPUs, and stopping takes one last full round
    assert 8 <= stats.ticks <= 17 and stats.reads == 2 * (stats.ticks + 1) == len(seen)
    assert {s.index for s in seen} == {0, 1} and set(sampler.latest()) == {0, 1}
    assert 0 <= stats.cpu_share < 1 and stats.wall_s >= 0.3
    times = [s.mono_s for s in sampler.samples(0)]
    assert times == sorted(times)


def test_an_error_in_the_callback_stops_the_thread_and_is_raised_on_stop() -> None:
    def broken(_: GpuSample) -> None:
        raise ValueError("consumer bug")

    sampler = Sampler(ReplayBackend(record(series(0.3))), interval_s=0.01, on_sample=broken).start()
    time.sleep(0.1)
    assert not sampler.running and isinstance(sampler.error, ValueError)
    with pytest.raises(ValueError, match="consumer bug"):
        sampler.stop()


def test_leaving_with_on_an_exception_stops_the_thread_and_keeps_the_exception() -> None:
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt), Sampler(ReplayBackend(record(series(0.3))), interval_s=0.01):
        raise KeyboardInterrupt
    time.sleep(0.05)
    assert threading.active_count() == before


def test_an_interval_under_10_ms_is_refused() -> None:
    with pytest.raises(UsageError, match="at least 10 ms"):
        Sampler(ReplayBackend(record(series(0.3))), interval_s=0.001)


def test_a_slow_reading_counts_late_ticks() -> None:
    class Slow(ReplayBackend):
        def read(self, index: int, *, full: bool = False) -> GpuSample:
            time.sleep(0.03)
            return super().read(index, full=full)

    with Sampler(Slow(record(series(0.3))), interval_s=0.01) as sampler:
        time.sleep(0.2)
    assert sampler.stats().late_ticks >= 3


# --- alerts ----------------------------------------------------------------------------------------


def test_a_busy_gpu_alone_raises_nothing() -> None:
    assert evaluate(series(6.0), H100, AlertPolicy()) == []


def test_two_processes_on_a_gpu_are_contention() -> None:
    (alert,) = evaluate([sample(0, procs=((100, GIB), (200, 2 * GIB)))], H100, AlertPolicy())
    assert alert.kind == "contention" and "pid 100" in alert.message and "pid 200" in alert.message


def test_following_a_command_only_others_are_contention() -> None:
    both = [sample(0, procs=((100, GIB), (200, GIB)))]
    (alert,) = evaluate(both, H100, AlertPolicy(), Owner({100}))
    assert "pid 200" in alert.message and "pid 100" not in alert.message
    # the command's own two processes are not contention, nor are others on a GPU it does not use
    assert evaluate(both, H100, AlertPolicy(), Owner({100, 200})) == []
    assert evaluate(both, H100, AlertPolicy(), Owner({999})) == []
    # pids from another PID namespace cannot be told apart: count them
    (counted,) = evaluate(both, H100, AlertPolicy(), Owner(set(), unknown={100, 200}))
    assert counted.kind == "contention"
    # beside the command, a pid invisible from here is someone else's (another container)
    (hidden,) = evaluate(both, H100, AlertPolicy(), Owner({100}, unknown={200}))
    assert "pid 200" in hidden.message


def test_low_utilization_needs_a_full_window_and_a_process() -> None:
    policy = AlertPolicy()
    assert evaluate(series(3.0, util=20), H100, policy) == []  # 3 s of a 5 s window: too early to say
    (alert,) = evaluate(series(5.0, util=20), H100, policy)
    assert alert.kind == "low_utilization" and "busy 20%" in alert.message and "input pipeline" in alert.hint
    assert evaluate(series(6.0, util=20, procs=()), H100, policy) == []  # idle GPU, nobody waiting on it
    assert evaluate(series(6.0, util=60), H100, policy) == []


def test_a_throttle_reason_is_named_with_the_clock_it_costs() -> None:
    window = series(1.0, events=("sw_power_cap",), sm=1755)
    (alert,) = evaluate(window, H100, AlertPolicy())
    assert alert.kind == "clocks_throttled" and alert.severity == "warning"
    assert "power cap" in alert.message and "SM 1755 of 1980 MHz (89%)" in alert.message
    assert "power 400 of 700 W" in alert.message
    (hot,) = evaluate(series(1.0, events=("hw_thermal_slowdown",)), H100, AlertPolicy())
    assert hot.severity == "critical" and "50 °C" in hot.message and "cooling" in hot.hint
    assert evaluate(series(1.0, events=("gpu_idle",)), H100, AlertPolicy()) == []


def test_memory_over_90_percent() -> None:
    (alert,) = evaluate([sample(0, mem_used=75 * GIB)], H100, AlertPolicy())
    assert alert.kind == "memory_high" and "94% used" in alert.message


def test_busy_gpu_with_idle_sms_is_low_sm_activity() -> None:
    (alert,) = evaluate(series(5.0, sm_active=8.0), H100, AlertPolicy())
    assert alert.kind == "low_sm_activity" and alert.severity == "info" and "8% of its SMs" in alert.message
    assert evaluate(series(5.0, sm_active=80.0), H100, AlertPolicy()) == []


def test_the_tracker_counts_episodes_and_active_time() -> None:
    tracker = AlertTracker({0: H100}, AlertPolicy(evaluate_every_s=0.0))
    for s in series(2.0, procs=((1, GIB), (2, GIB))) + [sample(2.1 + i / 10) for i in range(10)]:
        tracker.update(s)
    for s in [sample(3.1 + i / 10, procs=((1, GIB), (2, GIB))) for i in range(5)]:
        tracker.update(s)
    (episode,) = tracker.episodes()
    assert episode.kind == "contention" and episode.raised == 2
    assert episode.active_s == pytest.approx(2.0 + 0.4)
    assert [a.kind for a in tracker.drain_raised()] == ["contention", "contention"]
    assert tracker.drain_raised() == [] and [a.kind for a in tracker.active()] == ["contention"]


def test_the_tracker_evaluates_at_its_own_pace() -> None:
    # GIVEN contention from t=0 and readings every 0.1 s WHEN the tracker re-evaluates every 0.25 s
    tracker = AlertTracker({0: H100}, AlertPolicy(evaluate_every_s=0.25))
    for s in series(2.0, procs=((1, GIB), (2, GIB))):
        assert [a.kind for a in tracker.update(s)] == ["contention"]  # between evaluations: the last verdict
    # THEN it still counts the time active, to the evaluation points (0, 0.3, ..., 1.8)
    (episode,) = tracker.episodes()
    assert episode.active_s == pytest.approx(1.8)


def test_a_process_starting_up_is_not_a_starved_gpu() -> None:
    # GIVEN a process that holds the GPU 6 s with no kernel (CUDA context, loading), then runs at 20%
    tracker = AlertTracker({0: H100}, AlertPolicy(evaluate_every_s=0.0))
    startup = series(6.0, util=0)
    kinds = [[a.kind for a in tracker.update(s)] for s in startup]
    assert not any(kinds)  # no kernel yet: not starved, just starting
    later = [sample(6.1 + i / 10, util=20) for i in range(60)]
    raised_at = next(s.mono_s for s in later if "low_utilization" in [a.kind for a in tracker.update(s)])
    assert raised_at == pytest.approx(6.1 + 0.8 * 5.0, abs=0.11)  # once 80% of the 5 s window is covered


# --- summaries -------------------------------------------------------------------------------------


def test_a_summary_has_the_distribution_clocks_and_energy() -> None:
    samples = [sample(i / 10, util=100 if i % 2 else 0, sm=1800 if i % 2 else 345, energy_j=1000.0 + 50 * i,
                      events=("sw_power_cap",) if i % 4 == 1 else ()) for i in range(21)]  # fmt: skip
    d = summarize_record(record(samples)).device(0)
    assert d.samples == 21 and d.duration_s == pytest.approx(2.0)
    assert d.gpu_util_mean_pct == pytest.approx(1000 / 21) and d.gpu_util_p50_pct == 0.0
    assert d.low_util_share == pytest.approx(11 / 21)
    assert d.sm_clock_busy_mean_mhz == 1800 and d.sm_clock_min_mhz == 345 and d.sm_max_mhz == 1980
    assert d.energy_j == pytest.approx(1000.0) and d.slowdown_shares == {
        "sw_power_cap": pytest.approx(5 / 21)
    }
    (proc,) = d.processes
    assert proc.pid == 100 and proc.peak_memory_bytes == GIB and proc.seen_share == 1.0


def test_counters_read_now_and_then_count_between_their_readings() -> None:
    # GIVEN energy and violation counters present only in the first, a middle and the last readings
    samples = series(10.0)
    for i, energy, power_ns in ((0, 1000.0, 0), (50, 1500.0, 2_000_000_000), (100, 2000.0, 2_000_000_000)):
        samples[i] = dataclasses.replace(samples[i], energy_j=energy, violation_ns={"power": power_ns})
    d = summarize_record(record(samples)).device(0)
    # THEN energy and shares come from the first and last readings of each counter
    assert d.energy_j == pytest.approx(1000.0) and d.violation_shares == {"power": pytest.approx(0.2)}


def test_violation_counters_become_shares_and_nonsense_is_dropped() -> None:
    first = dataclasses.replace(sample(0.0), violation_ns={"power": 0, "thermal": 0, "bogus": 0})
    last = dataclasses.replace(
        sample(10.0), violation_ns={"power": 2_500_000_000, "thermal": 0, "bogus": 10**12}
    )
    d = summarize_record(record([first, last])).device(0)
    assert d.violation_shares == {"power": pytest.approx(0.25), "thermal": 0.0}


def test_a_commands_summary_keeps_the_gpus_it_used() -> None:
    other = dataclasses.replace(H100, index=1)
    samples = series(1.0, procs=((7, GIB),)) + series(1.0, gpu=1, procs=((8, GIB),))
    summary = summarize_record(record(samples, devices=(H100, other)), owner=Owner({8}))
    assert [d.index for d in summary.used_by_command().devices] == [1]
    assert [
        d.index for d in summarize_record(record(samples, devices=(H100, other))).used_by_command().devices
    ] == [0, 1]


def test_a_summary_survives_json() -> None:
    from gpudoctor.monitor import MonitorSummary

    summary = summarize_record(record(series(6.0, util=10, procs=((1, GIB), (2, GIB)))))
    doc = summary.to_json()
    assert doc["schema"] == "gpudoctor.monitor-summary/1"
    assert {e["kind"] for e in doc["episodes"]} == {"contention", "low_utilization"}
    assert MonitorSummary.from_json(doc) == summary


def test_a_session_feeds_alerts_summary_and_log(tmp_path: Path) -> None:
    rec = record(series(1.0, procs=((1, GIB), (2, GIB))))
    backend = ReplayBackend(rec)
    log = SampleLog(tmp_path / "s.jsonl", rec.system, rec.devices, 0.02)
    with MonitorSession(backend, interval_s=0.02, log=log) as session:
        time.sleep(0.15)
        snap = session.snapshot()
        raised = session.raised()
    summary = session.stop() if session.sampler.running else None
    assert snap.latest and [a.kind for a in snap.alerts] == ["contention"] and raised
    assert summary is None  # the with block already stopped it
    logged = MonitorRecord.read_jsonl(tmp_path / "s.jsonl")
    assert len(logged.samples) >= 5 and logged.devices == rec.devices


# --- logs ------------------------------------------------------------------------------------------


def test_the_log_format_follows_the_file_name(tmp_path: Path) -> None:
    assert log_format(Path("a.csv")) == "csv" and log_format(Path("a.CSV.gz")) == "csv"
    assert log_format(Path("a.jsonl")) == "jsonl" and log_format(Path("a.ndjson.gz")) == "jsonl"
    with pytest.raises(UsageError, match=r"name it \.csv or \.jsonl"):
        log_format(Path("a.txt"))


def test_csv_rows_have_every_column(tmp_path: Path) -> None:
    import csv

    with SampleLog(tmp_path / "s.csv", SystemInfo(), (H100,), 0.1) as log:
        for s in series(0.2, sm_active=30.0, events=("sw_power_cap", "gpu_idle")):
            log.write(s)
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert len(rows) == 3 and tuple(rows[0]) == CSV_COLUMNS
    assert rows[1]["elapsed_s"] == "0.100" and rows[1]["sm_max_mhz"] == "1980"
    assert rows[0]["clock_events"] == "sw_power_cap|gpu_idle" and rows[0]["processes"] == f"100:{GIB}"
    assert rows[0]["sm_active_pct"] == "30.00" and rows[0]["pcie_tx_bytes_per_s"] == ""


def test_an_unwritable_log_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OutputError, match=r"cannot write .*s\.csv: .*a-file is not a directory"):
        SampleLog(tmp_path / "a-file" / "s.csv", SystemInfo(), (H100,), 0.1)
    # a missing directory is made, as for every other output
    SampleLog(tmp_path / "missing" / "s.csv", SystemInfo(), (H100,), 0.1).close()
    assert (tmp_path / "missing" / "s.csv").read_text().startswith("unix_s")


# --- clocks API ------------------------------------------------------------------------------------


def test_read_clocks_and_clock_watch_on_a_backend() -> None:
    backend = ReplayBackend(record(series(0.5, events=("sw_power_cap",), sm=1700)))
    backend.read(0)
    state = read_clocks(0, backend)
    assert state.sm_mhz == 1700 and state.sm_max_mhz == 1980 and state.throttled
    assert state.sm_share == pytest.approx(1700 / 1980)
    with ClockWatch(0, backend=backend, interval_s=0.01) as watch:
        time.sleep(0.05)
    assert watch.report.samples >= 3 and watch.report.slowdown_shares == {"sw_power_cap": 1.0}
    assert watch.report.sm_min_share == pytest.approx(1700 / 1980)
    # part of the region by time.monotonic(): what another process timed in it
    assert watch.report_between(0.0, time.monotonic()).samples == watch.report.samples
    assert watch.report_between(time.monotonic(), time.monotonic() + 1).samples == 0


def test_a_childs_clocks_never_fail_what_they_watch() -> None:
    from gpudoctor.runner.samplers import ChildClocks, child_clocks

    backend = ReplayBackend(record(series(0.5, events=("sw_power_cap",), sm=1700)))
    with ChildClocks(ClockWatch(0, backend=backend, interval_s=0.01)) as clocks:
        time.sleep(0.03)
    report = clocks.between(0.0, time.monotonic())
    assert clocks.failed is None and report is not None and report.samples >= 2

    class Broken:  # a sampler thread that failed: ClockWatch raises its error at the block's end
        def __enter__(self) -> None: ...

        def __exit__(self, *exc: object) -> None:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    with ChildClocks(Broken()) as lost:
        pass
    assert lost.failed == "RuntimeError: NVML_ERROR_GPU_IS_LOST" and lost.between(0.0, 1.0) is None
    # no device to read, or a MIG slice: no clocks asked for, the host's readings alone (Linux /proc)
    for env in ({"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "MIG-4f1c"}):
        alone = child_clocks(env)
        assert alone is not None and alone.failed == "no NVML" and alone.between(0.0, 1.0) is None


# --- process ownership -----------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_commands_children_are_its_own_and_others_are_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import subprocess,sys,time;"
                              "p=subprocess.Popen(['sleep','5']);print(p.pid,flush=True);time.sleep(5)"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        grandchild = int(child.stdout.readline())  # type: ignore[union-attr]
        tree = ProcessTree(child.pid)
        assert tree.owns(child.pid) is True and tree.owns(grandchild) is True
        assert tree.owns(os.getpid()) is False and tree.owns(2**22 + 12345) is None
        assert parent_pid(grandchild) == child.pid
        deadline = time.monotonic() + 5  # the fork has its pid before it has exec'd `sleep`
        while process_name(grandchild) != "sleep 5" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_name(grandchild) == "sleep 5"
    finally:
        child.kill()
        child.wait()


def test_process_names_are_cut(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cmdline").write_bytes(b"/usr/bin/python3\0/home/me/proj/train.py\0" + b"--x\0" * 40)
    name = process_name(7, proc=tmp_path)
    assert name.startswith("python3 train.py --x") and len(name) == 60 and name.endswith("…")
    assert process_name(8, proc=tmp_path) == ""
