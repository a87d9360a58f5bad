"""How far apart fresh processes of the same script are, and whether pinning them to the same cores
brings them together: `gpudoctor fix` compares fixes across processes, so the spread between
processes of one configuration is the noise every verdict must beat. Times a workload of
benchmarks/fix_workloads plainly (plain_timer.py: CUDA-synchronized windows, no sync per step) in
`--processes` fresh processes per mode, the modes alternating: left to the scheduler, and pinned
(sched_setaffinity) to `--cores` cores near the GPU (its PCI device's local_cpulist, else the first
ones this process may use).

    PYTHONPATH=src python3 lab/process_spread.py --out $OUT/process_spread.json \\
        --workload per_param_optimizer --processes 6
    .venv/bin/python lab/process_spread.py --out /tmp/spread.json --smoke   # CPU plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from gpu_cores import parse_cpulist  # noqa: E402  (tools/ is not a package)

WORKLOADS = ROOT / "benchmarks" / "fix_workloads"


def gpu_local_cpus() -> list[int]:
    """The cores of the GPU's NUMA node (its PCI device's local_cpulist), among those allowed."""
    allowed = sorted(os.sched_getaffinity(0))
    try:
        import torch

        bus = torch.cuda.get_device_properties(0).pci_bus_id if torch.cuda.is_available() else None
    except Exception:
        bus = None
    if bus:
        path = Path("/sys/bus/pci/devices") / bus.lower() / "local_cpulist"
        try:
            local = set(parse_cpulist(path.read_text()))
            return [c for c in allowed if c in local] or allowed
        except OSError:
            pass
    return allowed


def time_once(workload: str, cores: list[int] | None, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(WORKLOADS / "plain_timer.py"), "--out", str(out), "--warmup", str(a.warmup),
           "--window-s", str(a.window_s), "--windows", str(a.windows), "--",
           str(WORKLOADS / f"{workload}.py"), *(["--small"] if a.smoke else [])]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=pin, check=False)
    if not out.exists():
        return {"error": (proc.stdout + proc.stderr)[-800:]}
    result = json.loads(out.read_text())
    return {"step_ms": [1e3 * s / n for s, n in result["windows"]], "wall_s": result["wall_s"]}


def spread(per_process: list[float]) -> dict[str, float] | None:
    if len(per_process) < 2:
        return None
    mid = statistics.median(per_process)
    return {
        "median_ms": mid,
        "spread_pct": 100 * (max(per_process) - min(per_process)) / mid,
        "cv_pct": 100 * statistics.stdev(per_process) / statistics.mean(per_process),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workload", default="per_param_optimizer")
    p.add_argument("--processes", type=int, default=6, help="per mode")
    p.add_argument("--cores", type=int, default=4, help="cores the pinned processes get")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="the workload's --small size, for the CPU")
    a = p.parse_args()
    cores = gpu_local_cpus()[: a.cores]
    work = a.out.parent / f"{a.out.stem}-runs"
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {"free": [], "pinned": []}
    for k in range(a.processes):
        for mode in ("free", "pinned") if k % 2 == 0 else ("pinned", "free"):
            runs[mode].append(
                time_once(a.workload, cores if mode == "pinned" else None, work / f"{mode}-{k}.json", a)
            )
    summary = {}
    for mode, rs in runs.items():
        medians = [statistics.median(r["step_ms"]) for r in rs if r.get("step_ms")]
        summary[mode] = {"process_medians_ms": medians, **(spread(medians) or {})}
        print(f"{mode:7s} {len(medians)} processes: " + (
            f"median {summary[mode]['median_ms']:.3f} ms, spread {summary[mode]['spread_pct']:.1f}%, "
            f"cv {summary[mode]['cv_pct']:.1f}%" if len(medians) > 1 else "too few"))  # fmt: skip
    doc = {"workload": a.workload, "cores_pinned": cores, "allowed_cores": sorted(os.sched_getaffinity(0)),
           "summary": summary, "runs": runs, "python": platform.python_version(), "command": sys.argv}  # fmt: skip
    try:
        import torch

        doc["torch"] = torch.__version__
        doc["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
