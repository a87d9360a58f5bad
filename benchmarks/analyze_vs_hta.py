"""gpudoctor vs Holistic Trace Analysis on the same traces, on this machine, in one run.

For each trace: wall time of loading + every analysis (gpudoctor: `load_trace` + `analyze`; HTA: load +
temporal breakdown + idle-time breakdown + kernel breakdown + kernel launch stats), peak RSS (each
tool in a fresh process), and both tools' temporal and idle-time figures side by side — HTA as it
runs by default, HTA with its µs rounding off, and gpudoctor under HTA's window convention and its own.

Set-up (HTA is installed only for benchmarking; it needs pandas < 3, see docs/hta_reference.md):
    python3 -m venv benchmarks/.venv-hta
    benchmarks/.venv-hta/bin/pip install holistictraceanalysis 'pandas<3'
Run:
    .venv/bin/python benchmarks/analyze_vs_hta.py [--repeats 3] [TRACE ...]
Default traces: the 10-step ResNet-50 benchmark trace (benchmarks/traces/, decompressed to
benchmarks/data/) and every fixture in tests/fixtures/traces/. Results: benchmarks/results/analyze_vs_hta.json.

`--cli` measures what a user feels instead: the wall time of whole processes, start-up and imports
included — `gpudoctor analyze TRACE` against the script a user would write for HTA's view of the
trace (benchmarks/hta_cli.py: load, the same four analyses, print them) — with `python -c pass` and
`gpudoctor --help` beside them, run interleaved (one of each, then again), each process's CPU time
too (less sensitive to a busy machine than wall time), and the load average around every round.
Results: benchmarks/results/analyze_vs_hta_cli.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_TRACE = ROOT / "benchmarks/traces/resnet50_10steps.json.gz"
HTA_PYTHON = ROOT / "benchmarks/.venv-hta/bin/python"
HTA_STAGES = ("load", "temporal_breakdown", "idle_time_breakdown", "kernel_breakdown", "kernel_launch_stats")


def default_traces() -> list[Path]:
    data = ROOT / "benchmarks/data"
    data.mkdir(parents=True, exist_ok=True)
    big = data / "resnet50_10steps.json"
    if not big.exists():
        with gzip.open(BENCH_TRACE, "rb") as src, open(big, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return [big, *sorted((ROOT / "tests/fixtures/traces").glob("*.json.gz"))]


def run_json(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    try:
        proc = subprocess.run([*cmd, "--json", out], capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0 and not Path(out).stat().st_size:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def ours(trace: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return run_json([sys.executable, str(ROOT / "benchmarks/gpudoctor_side.py"), str(trace)], env)


def hta(trace: Path, no_rounding: bool = False) -> dict[str, Any]:
    cmd = [str(HTA_PYTHON), str(ROOT / "benchmarks/hta_side.py"), str(trace)]
    return run_json([*cmd, "--no-ns-rounding"] if no_rounding else cmd)


def hta_total(res: dict[str, Any]) -> float:
    return sum(res["timings_s"].get(s, 0.0) for s in HTA_STAGES)


def hta_figures(res: dict[str, Any]) -> dict[str, Any] | None:
    """HTA's rank-0 figures as % of its window; its per-stream idle categories summed over streams."""
    temporal = (res.get("temporal") or {}).get("0")
    idle = (res.get("idle") or {}).get("0")
    if not temporal:
        return None
    window = temporal["window_us"]
    out = {
        "window_us": window,
        "busy_pct": 100 * temporal["busy_us"] / window,
        "idle_pct": temporal["idle_pct"],
    }
    if idle:
        cats = idle["categories"]
        out["host_wait_pct"] = 100 * cats["host_wait"]["time_us"] / window
        out["kernel_wait_plus_other_pct"] = (
            100 * (cats["kernel_wait"]["time_us"] + cats["other"]["time_us"]) / window
        )
    return out


def compare(trace: Path, repeats: int) -> dict[str, Any]:
    size = trace.stat().st_size
    json_size = size
    if trace.suffix == ".gz":
        with gzip.open(trace, "rb") as f:
            json_size = sum(len(b) for b in iter(lambda: f.read(1 << 22), b""))
    # Interleaved, so that a slow spell of the machine hits both tools alike.
    our_runs, hta_runs = [], []
    for _ in range(repeats):
        our_runs.append(ours(trace))
        hta_runs.append(hta(trace))
    hta_exact = hta(trace, no_rounding=True)
    our_total = statistics.median(r["timings_s"]["total"] for r in our_runs)
    their_total = statistics.median(hta_total(r) for r in hta_runs if "load" in r["timings_s"])
    last = our_runs[-1]
    mine = last["hta_convention"]
    exact = hta_figures(hta_exact)
    default = hta_figures(hta_runs[-1])
    row = {
        "trace": str(trace.relative_to(ROOT)),
        "file_bytes": size,
        "json_bytes": json_size,
        "events": last["events"],
        "device": last["device"],
        "gpudoctor_s": our_total,
        "gpudoctor_load_s": statistics.median(r["timings_s"]["load"] for r in our_runs),
        "gpudoctor_analyze_s": statistics.median(r["timings_s"]["analyze"] for r in our_runs),
        "hta_s": their_total,
        "hta_stages_s": {
            s: statistics.median(r["timings_s"].get(s, float("nan")) for r in hta_runs) for s in HTA_STAGES
        },
        "speedup": their_total / our_total,
        "speedup_best_of": min(hta_total(r) for r in hta_runs if "load" in r["timings_s"])
        / min(r["timings_s"]["total"] for r in our_runs),
        "gpudoctor_peak_rss_bytes": max(r["peak_rss_bytes"] for r in our_runs),
        "gpudoctor_rss_before_load_bytes": last["rss_before_load_bytes"],
        "hta_peak_rss_bytes": max(r["peak_rss_bytes"] for r in hta_runs),
        "hta_errors": {**hta_runs[-1].get("errors", {})},
        "hta_no_rounding_errors": {**hta_exact.get("errors", {})},
        "figures": {
            "gpudoctor_own": last["gpu_window"],
            "gpudoctor_profiled_steps": last["profiled_steps"],
            "gpudoctor_hta_convention": mine,
            "hta_default": default,
            "hta_no_rounding": exact,
        },
    }
    if mine and exact and "host_wait_pct" in exact:
        row["agreement_points"] = {
            "busy": abs(mine["busy_pct"] - exact["busy_pct"]),
            "host_wait": abs(mine["host_caused_idle_pct"] - exact["host_wait_pct"]),
            "device_gaps": abs(
                mine["idle_by_cause_pct"]["launch_gap"]
                + mine["idle_by_cause_pct"]["other"]
                - exact["kernel_wait_plus_other_pct"]
            ),
        }
    return row


def environment() -> dict[str, Any]:
    hta_versions = subprocess.run(
        [str(HTA_PYTHON), "-c", "from importlib import metadata as m; print(m.version('holistictraceanalysis'), m.version('pandas'))"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        None,
    )
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu, "platform": platform.platform()},
        "python": platform.python_version(),
        "gpudoctor": metadata.version("gpudoctor"),
        "msgspec": metadata.version("msgspec"),
        "numpy": metadata.version("numpy"),
        "typer": metadata.version("typer"),
        "rich": metadata.version("rich"),
        "hta": hta_versions[0] if hta_versions else None,
        "hta_pandas": hta_versions[1] if len(hta_versions) > 1 else None,
    }


def pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:5.1f}"


def print_tables(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'trace':34} {'JSON MB':>7} {'events':>7} {'gpudoctor s':>11} {'HTA s':>7} {'speedup':>7} {'our RSS/JSON':>12} {'HTA RSS MB':>10}"
    )
    for r in rows:
        name = Path(r["trace"]).name.replace(".json.gz", "").replace(".json", "")
        print(
            f"{name:34} {r['json_bytes'] / 1e6:7.1f} {r['events']:7d} {r['gpudoctor_s']:11.3f} {r['hta_s']:7.2f} "
            f"{r['speedup']:6.1f}x {r['gpudoctor_peak_rss_bytes'] / r['json_bytes']:11.2f}x {r['hta_peak_rss_bytes'] / 2**20:10.0f}"
        )
    print("\nGPU busy % and idle split, % of HTA's window (HTA: rank 0, per-stream idle summed over streams)")
    print(
        f"{'trace':26} {'busy: HTA':>9} {'HTA exact':>9} {'ours@HTA':>8} {'ours':>6} | {'host: HTA':>9} {'exact':>6} {'ours':>6} | {'gaps: HTA':>9} {'exact':>6} {'ours':>6}"
    )
    for r in rows:
        f = r["figures"]
        d, e, m, o = (
            f["hta_default"] or {},
            f["hta_no_rounding"] or {},
            f["gpudoctor_hta_convention"] or {},
            f["gpudoctor_own"] or {},
        )
        gaps = (m["idle_by_cause_pct"]["launch_gap"] + m["idle_by_cause_pct"]["other"]) if m else None
        name = Path(r["trace"]).name.replace(".json.gz", "").replace(".json", "")
        print(
            f"{name:26} {pct(d.get('busy_pct')):>9} {pct(e.get('busy_pct')):>9} {pct(m.get('busy_pct')):>8} {pct(o.get('busy_pct')):>6} | "
            f"{pct(d.get('host_wait_pct')):>9} {pct(e.get('host_wait_pct')):>6} {pct(m.get('host_caused_idle_pct')):>6} | "
            f"{pct(d.get('kernel_wait_plus_other_pct')):>9} {pct(e.get('kernel_wait_plus_other_pct')):>6} {pct(gaps):>6}"
        )
    print("HTA = default HTA (rounds every event to whole µs); exact = HTA with HTA_DISABLE_NS_ROUNDING=1;")
    print("ours@HTA = gpudoctor on HTA's window (last step dropped); ours = gpudoctor's own GPU window.")


def gpudoctor_command() -> list[str]:
    script = Path(sys.executable).with_name("gpudoctor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpudoctor"]


def timed_process(cmd: list[str]) -> dict[str, float]:
    """Wall and CPU seconds of one whole process, its output thrown away (as a user reading a screen
    would wait for it, not for a pipe)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def compile_bytecode() -> None:
    """gpudoctor's modules byte-compiled, as `pip install` leaves an installed package (HTA's venv has
    its own from pip): an editable install under PYTHONDONTWRITEBYTECODE=1 would otherwise compile every
    module from source in every process."""
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "gpudoctor"), quiet=1)


def cli_compare(trace: Path, repeats: int) -> dict[str, Any]:
    """Whole processes, interleaved round by round; medians, and the ratios of the medians."""
    compile_bytecode()
    commands = {
        "python_startup": [sys.executable, "-c", "pass"],
        "gpudoctor_help": [*gpudoctor_command(), "--help"],
        "gpudoctor_analyze": [*gpudoctor_command(), "analyze", str(trace)],
        "hta_script": [str(HTA_PYTHON), str(ROOT / "benchmarks/hta_cli.py"), str(trace)],
    }
    for cmd in commands.values():  # once each first: files in the page cache, .pyc written
        timed_process(cmd)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    load = []
    for _ in range(repeats):
        load.append(os.getloadavg()[0])
        for name, cmd in commands.items():
            runs[name].append(timed_process(cmd))
    load.append(os.getloadavg()[0])
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")}
        for name, rs in runs.items()
    }
    ours, theirs = med["gpudoctor_analyze"], med["hta_script"]
    return {
        "trace": str(trace.relative_to(ROOT)) if trace.is_relative_to(ROOT) else str(trace),
        "json_bytes": trace.stat().st_size,
        "commands": {name: " ".join(cmd) for name, cmd in commands.items()},
        "median": med,
        "speedup_wall": theirs["wall_s"] / ours["wall_s"],
        "speedup_cpu": theirs["cpu_s"] / ours["cpu_s"],
        "load_average_1min": {"min": min(load), "max": max(load), "each_round": load},
        "runs": runs,
    }


def cli_main(args: argparse.Namespace) -> int:
    trace = args.traces[0].resolve() if args.traces else default_traces()[0]
    print(f"… {trace.name}: {args.repeats} interleaved rounds", file=sys.stderr, flush=True)
    row = cli_compare(trace, args.repeats)
    out = args.out if args.out != DEFAULT_OUT else ROOT / "benchmarks/results/analyze_vs_hta_cli.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = environment()
    out.write_text(json.dumps({"environment": env, "repeats": args.repeats, **row}, indent=1))
    print(f"\n{'process':20} {'wall s':>8} {'CPU s':>8}   (medians of {args.repeats}, interleaved)")
    for name, m in row["median"].items():
        print(f"{name:20} {m['wall_s']:8.3f} {m['cpu_s']:8.3f}")
    print(f"HTA / gpudoctor: {row['speedup_wall']:.1f}x wall, {row['speedup_cpu']:.1f}x CPU; load average "
          f"{row['load_average_1min']['min']:.1f}-{row['load_average_1min']['max']:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"full results: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


DEFAULT_OUT = ROOT / "benchmarks/results/analyze_vs_hta.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--cli", action="store_true", help="whole processes as a user runs them (see the docstring)"
    )
    args = ap.parse_args()
    if not HTA_PYTHON.exists():
        print(f"HTA is not installed: see the set-up in {__file__}", file=sys.stderr)
        return 2
    if args.cli:
        return cli_main(args)
    traces = [t.resolve() for t in args.traces] or default_traces()
    rows = []
    for trace in traces:
        print(f"… {trace.name}", file=sys.stderr, flush=True)
        rows.append(compare(trace, args.repeats))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"environment": environment(), "repeats": args.repeats, "traces": rows}, indent=1)
    )
    print_tables(rows)
    print(f"\nfull results: {args.out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
