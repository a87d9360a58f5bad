"""Probe: how different timing methods read tiny kernels, against Nsight Compute's gpu__time_duration.

For a set of ops (spin kernels of known cycle counts, a 1-element fill, a 4 KB add, a 4 MB add, a 256 MB add),
measured hot: graph back-to-back per call; events around one eager call queued behind a spin kernel; events
around one replay of a one-call graph behind a spin; an empty event pair behind a spin; CUPTI's kernel
duration; and ncu's gpu__time_duration (+ elapsed cycles) for the same launches. Prints a table, writes JSON.

    PYTHONPATH=src python lab/probe_small_kernels.py --out DIR
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from timing_vs_peers import capture_graph  # this script's folder is on sys.path

CALLS = 30
SPIN_CYCLES = (0, 1000, 4000, 16000)


def make_ops() -> dict[str, Any]:
    dev = torch.device("cuda")
    a4k, b4k = torch.randn(1024, device=dev), torch.randn(1024, device=dev)
    a4m, b4m = torch.randn(1 << 20, device=dev), torch.randn(1 << 20, device=dev)
    a256, b256 = torch.randn(64 << 20, device=dev), torch.randn(64 << 20, device=dev)
    one = torch.empty(1, device=dev)
    ops: dict[str, Any] = {f"spin_{c}": (lambda c=c: torch.cuda._sleep(c)) for c in SPIN_CYCLES}
    ops["fill_1"] = lambda: one.fill_(1.0)
    ops["add_4KB"] = lambda: a4k + b4k
    ops["add_4MB"] = lambda: a4m + b4m
    ops["add_256MB"] = lambda: a256 + b256
    return ops


def ncu_child() -> None:
    ops = make_ops()
    for fn in ops.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in ops.values():
        one = torch.empty(1, device="cuda")
        one.zero_()  # marker: a 1-element zero fill
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


METRICS = (
    "gpu__time_duration.sum",
    "gpc__cycles_elapsed.max",
    "sm__cycles_active.max",
    "gpc__cycles_elapsed.avg.per_second",
)


def run_ncu(clock: str) -> dict[str, Any]:
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"error": "no ncu"}
    cmd = [ncu, "--metrics", ",".join(METRICS), "--clock-control", clock, "--cache-control", "none",
           "--profile-from-start", "off", "--csv", sys.executable, __file__, "--ncu-child"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    header = next((r for r in rows if r and r[0] == "ID"), None)
    if header is None:
        return {"error": proc.stderr[-800:] + proc.stdout[-800:]}
    col = {n: i for i, n in enumerate(header)}
    kernels: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for r in rows:
        if len(r) != len(header) or r[0] == "ID":
            continue
        kid = r[col["ID"]]
        if kid not in kernels:
            kernels[kid] = {"name": r[col["Kernel Name"]]}
            order.append(kid)
        v = float(r[col["Metric Value"]].replace(",", ""))
        unit = r[col["Metric Unit"]]
        if r[col["Metric Name"]] == "gpu__time_duration.sum":
            v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[unit]
        kernels[kid][r[col["Metric Name"]]] = v
    # each op: one marker kernel, then CALLS launches of one kernel each
    seq = [kernels[k] for k in order]
    groups = [seq[i + 1 : i + 1 + CALLS] for i in range(0, len(seq), CALLS + 1)]
    out: dict[str, Any] = {}
    for name, group in zip(make_ops_names(), groups, strict=False):
        out[name] = {m: statistics.median(k.get(m, float("nan")) for k in group) for m in METRICS}
        out[name]["n"] = len(group)
        out[name]["kernel"] = group[0]["name"][:60] if group else ""
    return out


def make_ops_names() -> list[str]:
    return [f"spin_{c}" for c in SPIN_CYCLES] + ["fill_1", "add_4KB", "add_4MB", "add_256MB"]


def ev() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def behind_spin(body: Any, reps: int = 200, spin: int = 100_000) -> float:
    """Median µs between events around `body`, enqueued while a spin kernel holds the GPU."""
    e1, e2 = ev(), ev()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(spin)
        e1.record()
        body()
        e2.record()
        e2.synchronize()
        times.append(e1.elapsed_time(e2) * 1e3)
    return statistics.median(times)


def cupti(fn: Any, calls: int = 50) -> float:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    d = [
        e.duration_ns() / 1e3
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == DeviceType.CUDA
    ]
    return statistics.median(d) if d else float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--ncu-child", action="store_true")
    a = p.parse_args()
    if a.ncu_child:
        ncu_child()
        return
    ops = make_ops()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ops": {}}
    empty = behind_spin(lambda: None)
    res["empty_event_pair_us"] = empty
    for name, fn in ops.items():
        r: dict[str, Any] = {}
        g1 = capture_graph(fn, 1)
        gk = capture_graph(fn, 200)
        r["graph_b2b_per_call"] = behind_spin(gk.replay, reps=50) / 200
        r["graph_b2b_minus_empty"] = (behind_spin(gk.replay, reps=50) - empty) / 200
        r["eager_one_call"] = behind_spin(fn)
        r["graph_one_call"] = behind_spin(g1.replay)
        r["eager_one_minus_empty"] = r["eager_one_call"] - empty
        r["cupti"] = cupti(fn)
        res["ops"][name] = r
    torch.cuda.synchronize()
    res["ncu_none"] = run_ncu("none")
    res["ncu_base"] = run_ncu("base")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "probe_small_kernels.json").write_text(json.dumps(res, indent=1))
    cols = ["graph_b2b_per_call", "eager_one_call", "graph_one_call", "eager_one_minus_empty", "cupti"]
    print(f"device {res['device']}, empty event pair {empty:.3f} us")
    print(
        "op".ljust(12) + "".join(c[:14].rjust(15) for c in cols) + "  ncu_none  ncu_base  cyc(none) clk(none)"
    )
    for name, r in res["ops"].items():
        nn = res["ncu_none"].get(name, {}) if isinstance(res["ncu_none"], dict) else {}
        nb = res["ncu_base"].get(name, {}) if isinstance(res["ncu_base"], dict) else {}
        print(
            name.ljust(12)
            + "".join(f"{r[c]:15.3f}" for c in cols)
            + f"  {nn.get('gpu__time_duration.sum', float('nan')):8.3f}  {nb.get('gpu__time_duration.sum', float('nan')):8.3f}"
            + f"  {nn.get('gpc__cycles_elapsed.max', float('nan')):8.0f}  {nn.get('gpc__cycles_elapsed.avg.per_second', float('nan')) / 1e9:6.3f}"
        )
    if "error" in res["ncu_none"]:
        print("ncu error:", res["ncu_none"]["error"][-600:])


if __name__ == "__main__":
    main()
