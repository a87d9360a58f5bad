"""The GPU monitor checked on a GPU machine.

Phases, each sampled at 100 ms by gpudoctor's sampler in this process (which never imports torch):
idle; a bf16 matmul burn in a child process (utilization, SM clock, power, tensor-core activity or why
GPM is unavailable, clock-event reasons, sampler CPU overhead, nvidia-smi cross-check); a second burn
process beside the first (contention); a duty-cycled child that leaves the GPU idle most of the time
(low utilization); then `gpudoctor monitor -- CMD` end to end (exit status kept), `--once`, a live run.

    python benchmarks/monitor_acceptance.py --out DIR [--fixtures DIR]
    python benchmarks/monitor_acceptance.py --burn SECONDS [--duty 0.25] [--exit-code N]   (the child)

Writes DIR/monitor_acceptance.json (device, versions, figures, checks) and the recorded phases as
fixtures (DIR/fixtures/*.jsonl.gz, for tests/fixtures/nvml/); prints a short table last.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

INTERVAL_S = 0.1


# --- the child: a bf16 matmul burn -----------------------------------------------------------------


def burn(seconds: float, duty: float, size: int, exit_code: int) -> int:
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    flops = 0.0
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        flops += 10 * 2 * size**3
        if duty < 1.0:
            busy = time.perf_counter() - t0
            time.sleep(busy * (1 - duty) / duty)
    elapsed = time.perf_counter() - start
    print(json.dumps({"pid": os.getpid(), "tflops": flops / elapsed / 1e12, "seconds": elapsed}), flush=True)
    return exit_code


def start_burn(seconds: float, duty: float = 1.0, size: int = 8192) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, "--burn", str(seconds), "--duty", str(duty), "--size", str(size)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


# --- helpers ---------------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "nvidia-ml-py", "rich", "typer", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def wait_until(backend: Any, index: int, predicate: Any, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate(backend.read(index)):
            return time.monotonic() - start
        time.sleep(0.2)
    return -1.0


def record_phase(backend: Any, seconds: float, *, owner: Any = None) -> tuple[Any, Any, Any]:
    """Sample for `seconds` with the full session (alerts, summary); returns (record, summary, stats)."""
    from gpudoctor.monitor import MonitorRecord, MonitorSession

    session = MonitorSession(backend, interval_s=INTERVAL_S, owner=owner, keep=None)
    with session:
        time.sleep(seconds)
        summary = session.stop()
    record = MonitorRecord(
        system=backend.system(),
        devices=backend.devices(),
        interval_s=INTERVAL_S,
        samples=tuple(session.samples()),
    )
    return record, summary, summary.sampler


def mean(values: list[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _cost(fn: Any, reps: int) -> dict[str, float]:
    fn()
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(reps):
        fn()
    return {
        "wall_us": (time.perf_counter() - w0) / reps * 1e6,
        "cpu_us": (time.thread_time() - c0) / reps * 1e6,
    }


def call_costs(backend: Any) -> dict[str, dict[str, float] | dict[str, str]]:
    """Wall and CPU time of each NVML call the sampler makes (and of each field value alone)."""
    import pynvml as n

    from gpudoctor.monitor.gpm import METRIC_IDS
    from gpudoctor.monitor.nvml_calls import LIVE_FIELDS, PCIE_FIELDS, SUMMARY_FIELDS

    h = n.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()

    def gpm() -> None:
        n.nvmlGpmSampleGet(h, s1)
        n.nvmlGpmSampleGet(h, s2)
        req = n.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics, req.sample1, req.sample2 = (
            n.NVML_GPM_METRICS_GET_VERSION,
            len(METRIC_IDS),
            s1,
            s2,
        )
        for slot, (_, metric) in zip(req.metrics, METRIC_IDS, strict=False):
            slot.metricId = metric
        n.nvmlGpmMetricsGet(req)

    calls = {
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "memory_v2": lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2),
        "power": lambda: n.nvmlDeviceGetPowerUsage(h),
        "temperature": lambda: n.nvmlDeviceGetTemperature(h, 0),
        "sm_clock": lambda: n.nvmlDeviceGetClockInfo(h, 1),
        "clock_events": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "compute_processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "process_utilization": lambda: n.nvmlDeviceGetProcessUtilization(
            h, int(time.time() * 1e6) - 1_000_000
        ),
        "gpm_two_samples_and_metrics": gpm,
        "read_paced": lambda: backend.read(0),
        "read_full": lambda: backend.read(0, full=True),
        "read_clocks": lambda: backend.read_clocks(0),
    }
    for name, fid in {**LIVE_FIELDS, **PCIE_FIELDS, **SUMMARY_FIELDS}.items():
        calls[f"field_{name}"] = lambda fid=fid: n.nvmlDeviceGetFieldValues(h, [fid])
    out: dict[str, Any] = {}
    for name, fn in calls.items():
        try:
            out[name] = _cost(fn, 5 if name.startswith(("field_", "read_full")) else 50)
        except Exception as err:
            out[name] = {"error": str(err)}
    n.nvmlGpmSampleFree(s1)
    n.nvmlGpmSampleFree(s2)
    try:
        w0, c0 = time.perf_counter(), time.thread_time()
        n.nvmlDeviceGetPcieThroughput(h, 0)
        out["pcie_throughput_once"] = {
            "wall_us": (time.perf_counter() - w0) * 1e6,
            "cpu_us": (time.thread_time() - c0) * 1e6,
        }
    except Exception as err:
        out["pcie_throughput_once"] = {"error": str(err)}
    out["pacing_s"] = backend.pacing(0)
    return out


def bare_overhead(backend: Any, seconds: float, interval_s: float) -> dict[str, float]:
    """Sampler alone (no callbacks): its thread's CPU share, cross-checked with the process's rusage."""
    from gpudoctor.monitor import Sampler

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.monotonic()
    with Sampler(backend, interval_s=interval_s) as sampler:
        time.sleep(seconds)
    stats = sampler.stats()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - w0
    process_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "interval_ms": interval_s * 1e3,
        "seconds": wall,
        "thread_cpu_share": stats.cpu_share,
        "process_cpu_share": process_cpu / wall,
        "read_ms_mean": stats.read_ms_mean,
        "read_ms_max": stats.read_ms_max,
        "ticks": stats.ticks,
        "late_ticks": stats.late_ticks,
    }


def nvidia_smi(args: list[str] | None = None) -> str:
    query = "utilization.gpu,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"
    args = args or [f"--query-gpu={query}", "--format=csv,noheader"]
    try:
        return subprocess.run(
            ["nvidia-smi", *args],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi failed: {err}"


def phase_figures(record: Any, summary: Any) -> dict[str, Any]:
    s = record.for_device(0)
    d = summary.device(0)
    gpm = [x.gpm for x in s if x.gpm is not None]
    return {
        "samples": len(s),
        "gpu_util_mean_pct": d.gpu_util_mean_pct,
        "gpu_util_p10_pct": d.gpu_util_p10_pct,
        "sm_clock_mean_mhz": mean([x.sm_clock_mhz for x in s]),
        "sm_max_mhz": d.sm_max_mhz,
        "power_mean_w": d.power_mean_w,
        "power_limit_w": d.power_limit_w,
        "temp_max_c": d.temp_max_c,
        "tensor_active_mean_pct": mean([g.tensor_active_pct for g in gpm]),
        "sm_active_mean_pct": mean([g.sm_active_pct for g in gpm]),
        "dram_bw_mean_pct": mean([g.dram_bw_pct for g in gpm]),
        "gpm_reason": d.gpm_reason,
        "slowdown_shares": d.slowdown_shares,
        "violation_shares": d.violation_shares,
        "clock_events_seen": sorted({e for x in s for e in x.clock_events}),
        "processes_max": max((len(x.processes or ()) for x in s), default=0),
        "missing": sorted({k for x in s for k in x.missing}),
        "alerts": [
            {
                "kind": e.kind,
                "severity": e.severity,
                "raised": e.raised,
                "active_s": e.active_s,
                "message": e.message,
            }
            for e in summary.episodes
        ],
        "violation_delta_ns": {k: v - s[0].violation_ns.get(k, v) for k, v in s[-1].violation_ns.items()},
        "duration_s": d.duration_s,
        "power_instant_mean_w": mean([x.power_instant_w for x in s]),
        "read_ms_mean": mean([x.read_ms for x in s]),
        "energy_j": d.energy_j,
        "pcie_rx_mean_bytes_per_s": d.pcie_rx_mean_bytes_per_s,
    }


def run_cli(args: list[str], timeout: float = 120) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "160",
    }
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    return {
        "args": args,
        "rc": p.returncode,
        "seconds": time.monotonic() - t0,
        "stdout": p.stdout[-6000:],
        "stderr": p.stderr[-8000:],
    }


# --- main ------------------------------------------------------------------------------------------


def main(out: Path, fixtures: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    fixtures.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"versions": versions(), "interval_ms": INTERVAL_S * 1e3, "checks": {}}
    try:
        run_phases(results, out, fixtures)
    except BaseException:
        import traceback

        results["error"] = traceback.format_exc()
        (out / "monitor_acceptance.json").write_text(json.dumps(results, indent=1, default=str))
        raise
    (out / "monitor_acceptance.json").write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    return 0


def run_phases(results: dict[str, Any], out: Path, fixtures: Path) -> None:
    from gpudoctor.monitor import ClockWatch, open_backend, read_clocks, summarize_record
    from gpudoctor.monitor.procs import ProcessTree

    backend = open_backend()
    try:
        info = backend.devices()[0]
        results["system"] = json.loads(json.dumps(backend.system().__dict__))
        results["device"] = {
            "name": info.name,
            "architecture": info.architecture,
            "uuid": info.uuid,
            "sm_max_mhz": info.sm_max_mhz,
            "mem_max_mhz": info.mem_max_mhz,
            "power_limit_w": info.power_limit_w,
            "memory_total_bytes": info.memory_total_bytes,
            "gpm_supported": info.gpm_supported,
            "pcie_source": info.pcie_source,
            "missing": info.missing,
            "gpus": len(backend.devices()),
        }
        results["call_costs"] = call_costs(backend)
        results["clocks_idle"] = read_clocks(0, backend).to_json()

        idle, idle_summary, _ = record_phase(backend, 3.0)
        idle.write_jsonl(fixtures / "idle.jsonl.gz")
        results["idle"] = phase_figures(idle, idle_summary)
        results["overhead_idle"] = bare_overhead(backend, 5.0, INTERVAL_S)

        child = start_burn(90)
        results["burn_ramp_s"] = wait_until(backend, 0, lambda s: (s.gpu_util_pct or 0) >= 90, 60)
        burn_rec, burn_summary, burn_stats = record_phase(backend, 10.0, owner=ProcessTree(child.pid))
        results["nvidia_smi_burn"] = nvidia_smi()
        results["nvidia_smi_perf_burn"] = nvidia_smi(["-q", "-d", "PERFORMANCE"])[-3000:]
        results["burn"] = phase_figures(burn_rec, burn_summary)
        results["overhead_burn_session"] = {
            "thread_cpu_share": burn_stats.cpu_share,
            "read_ms_mean": burn_stats.read_ms_mean,
            "read_ms_max": burn_stats.read_ms_max,
            "ticks": burn_stats.ticks,
            "late_ticks": burn_stats.late_ticks,
        }
        results["overhead_burn"] = bare_overhead(backend, 10.0, INTERVAL_S)
        results["overhead_burn_1s"] = bare_overhead(backend, 5.0, 1.0)
        with ClockWatch(0, backend=backend, interval_s=0.05) as watch:
            time.sleep(2.0)
        results["clockwatch_burn"] = {
            "samples": watch.report.samples,
            "sm_min_mhz": watch.report.sm_min_mhz,
            "sm_mean_mhz": watch.report.sm_mean_mhz,
            "slowdown_shares": watch.report.slowdown_shares,
        }
        burn_rec.with_samples(burn_rec.samples[:60]).write_jsonl(fixtures / "burn.jsonl.gz")

        second = start_burn(30)
        results["contention_ramp_s"] = wait_until(backend, 0, lambda s: len(s.processes or ()) >= 2, 60)
        cont, cont_summary, _ = record_phase(backend, 8.0)
        cont.write_jsonl(fixtures / "contention.jsonl.gz")
        results["contention"] = phase_figures(cont, cont_summary)
        followed = summarize_record(cont, owner=ProcessTree(child.pid))
        results["contention_followed"] = [{"kind": e.kind, "message": e.message} for e in followed.episodes]
        results["contention_pids"] = {"first": child.pid, "second": second.pid}
        for p in (second, child):
            p.terminate()
            p.wait(30)
        time.sleep(1.0)

        starved_child = start_burn(14, duty=0.2, size=4096)
        results["starved_ramp_s"] = wait_until(backend, 0, lambda s: bool(s.processes), 60)
        time.sleep(2.0)
        starved, starved_summary, _ = record_phase(backend, 8.0)
        starved.write_jsonl(fixtures / "starved.jsonl.gz")
        results["starved"] = phase_figures(starved, starved_summary)
        starved_child.terminate()
        starved_child.wait(30)
    finally:
        backend.close()

    follow_log = out / "follow.jsonl"
    results["cli_follow"] = run_cli(
        [
            "monitor",
            "--log",
            str(follow_log),
            "--summary",
            str(out / "follow_summary.json"),
            "--",
            sys.executable,
            __file__,
            "--burn",
            "8",
            "--exit-code",
            "3",
        ]
    )
    follow_summary = (
        json.loads((out / "follow_summary.json").read_text())
        if (out / "follow_summary.json").exists()
        else {}
    )
    results["cli_follow_summary"] = follow_summary
    results["cli_once"] = run_cli(["monitor", "--once"])
    results["cli_once_json_rc"] = run_cli(["monitor", "--once", "--json"])["rc"]
    results["cli_live"] = run_cli(["monitor", "--duration", "2", "--log", str(out / "live.csv")])
    results["cli_live_csv_rows"] = (
        len((out / "live.csv").read_text().splitlines()) - 1 if (out / "live.csv").exists() else 0
    )
    results["cli_replay"] = run_cli(["monitor", "--replay", str(follow_log)])

    b, c, st = results["burn"], results["contention"], results["starved"]
    over = results["overhead_burn"]
    results["checks"] = {
        "burn_util_near_100": (b["gpu_util_mean_pct"] or 0) >= 95,
        "burn_sm_clock_and_power_read": b["sm_clock_mean_mhz"] is not None and b["power_mean_w"] is not None,
        "burn_tensor_activity_or_reason": b["tensor_active_mean_pct"] is not None or bool(b["gpm_reason"]),
        "contention_alert": any(a["kind"] == "contention" for a in c["alerts"]),
        "contention_alert_followed": any(a["kind"] == "contention" for a in results["contention_followed"]),
        "starved_low_util_alert": any(a["kind"] == "low_utilization" for a in st["alerts"]),
        "sampler_cpu_under_1pct_at_100ms": over["thread_cpu_share"] < 0.01,
        "session_cpu_under_1pct_at_100ms": results["overhead_burn_session"]["thread_cpu_share"] < 0.01,
        "follow_no_starved_alert_at_startup": not any(
            e["kind"] == "low_utilization" for e in results["cli_follow_summary"].get("episodes", [])
        ),
        "follow_exit_code_kept": results["cli_follow"]["rc"] == 3,
        "once_rc_0": results["cli_once"]["rc"] == 0,
    }


def print_table(r: dict[str, Any]) -> None:
    def f(value: Any, spec: str = "") -> str:
        return "n/a" if value is None else format(value, spec)

    b, over, st = r["burn"], r["overhead_burn"], r["starved"]
    contention = [a["message"][:100] for a in r["contention"]["alerts"] if a["kind"] == "contention"]
    rows = [
        (
            "device",
            f"{r['device']['name']} ({r['device']['architecture']}), driver {r['system'].get('driver_version')}",
        ),
        ("burn: GPU util mean / p10", f"{f(b['gpu_util_mean_pct'], '.1f')}% / {f(b['gpu_util_p10_pct'])}%"),
        ("burn: SM clock mean / max", f"{f(b['sm_clock_mean_mhz'], '.0f')} / {f(b['sm_max_mhz'])} MHz"),
        ("burn: power mean / limit", f"{f(b['power_mean_w'], '.0f')} / {f(b['power_limit_w'], '.0f')} W"),
        (
            "burn: tensor / SM active / DRAM %",
            f"{f(b['tensor_active_mean_pct'], '.1f')} / "
            f"{f(b['sm_active_mean_pct'], '.1f')} / {f(b['dram_bw_mean_pct'], '.1f')} (GPM: {b['gpm_reason'] or 'ok'})",
        ),
        ("burn: clock events seen", f"{b['clock_events_seen']} {b['slowdown_shares']}"),
        ("burn: violation counters", f"{b['violation_delta_ns']} over {f(b['duration_s'], '.1f')} s"),
        ("contention alert", str(contention)),
        (
            "starved: util mean, alerts",
            f"{f(st['gpu_util_mean_pct'], '.1f')}% {[a['kind'] for a in st['alerts']]}",
        ),
        (
            "sampler CPU @100 ms thread/process",
            f"{over['thread_cpu_share']:.3%} / {over['process_cpu_share']:.3%}",
        ),
        ("read ms mean / max", f"{over['read_ms_mean']:.3f} / {over['read_ms_max']:.3f}"),
        ("session (alerts+summary) CPU @100 ms", f"{r['overhead_burn_session']['thread_cpu_share']:.3%}"),
        ("paced intervals s", str({k: round(v, 2) for k, v in r["call_costs"]["pacing_s"].items()})),
        ("follow: rc (want 3)", str(r["cli_follow"]["rc"])),
        ("checks", ", ".join(f"{k}={'ok' if v else 'FAIL'}" for k, v in r["checks"].items())),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--fixtures", type=Path, default=None)
    parser.add_argument("--burn", type=float, default=None, help="(child) burn for this many seconds")
    parser.add_argument("--duty", type=float, default=1.0)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()
    if args.burn is not None:
        sys.exit(burn(args.burn, args.duty, args.size, args.exit_code))
    sys.exit(main(args.out, args.fixtures or args.out / "fixtures"))
