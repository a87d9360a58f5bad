"""How long stopping Inductor's compile workers holds the loop: `shutdown_compile_workers()`, which
gpudoctor's stop calls at every warm-up's end (gpudoctor.runner.compile_workers), timed in fresh
processes right after a compile (the first filling a private Inductor cache, the rest served from it),
with the sidecar's child processes counted just before. Each process then compiles something new, to
show a later compile still works. `--how gpudoctor` times gpudoctor's stop, `--how inductor` Inductor's
shutdown called directly (the same today; the result file's "gpudoctor" runs were of a variant, since
reverted, that first terminated the sidecar's children: it found none, and held the loop as long).

    PYTHONPATH=src python3 lab/compile_workers_stop.py --out $OUT/compile_workers_stop.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time
import torch
from gpudoctor.monitor.procs import parent_pid
from gpudoctor.runner.compile_workers import stop_compile_workers

def children(pid):
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit()] if os.path.isdir("/proc") else []
    return [p for p in pids if parent_pid(p) == pid]

how = sys.argv[1]
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512)).to(device)
x = torch.randn(64, 512, device=device)
t0 = time.perf_counter()
torch.compile(model)(x).sum().backward()
if device == "cuda":
    torch.cuda.synchronize()
compile_s = time.perf_counter() - t0
import torch._inductor.async_compile as ac
sidecars = [p.process.pid for p in list(ac._pool_set) if hasattr(p, "process")]
workers = sum(len(children(pid)) for pid in sidecars)
t0 = time.perf_counter()
if how == "gpudoctor":
    stopped = stop_compile_workers()
else:
    stopped = bool(ac._pool_set)
    ac.shutdown_compile_workers()
stop_s = time.perf_counter() - t0
left = sum(len(children(pid)) for pid in sidecars)
y = torch.compile(lambda t: (t * 2).relu() - 1)(x)  # a later compile, with a new pool
ok = bool(torch.isfinite(y).all()) and float(y.min()) >= -1
print(json.dumps({"how": how, "compile_s": compile_s, "pools": len(sidecars), "workers": workers,
                  "stopped": stopped, "stop_s": stop_s, "workers_left": left, "compile_after_ok": ok,
                  "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                  "torch": torch.__version__}))
"""


def one(how: str, cache: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, how], env=env, capture_output=True, text=True, check=False
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    r = (
        json.loads(lines[-1])
        if proc.returncode == 0 and lines
        else {"how": how, "error": proc.stderr[-2000:]}
    )
    r["rc"] = proc.returncode
    r["stderr_traceback"] = "Traceback" in proc.stderr
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=2, help="warm processes of each --how")
    p.add_argument("--how", default="gpudoctor,inductor", help="whose stop: gpudoctor, inductor or both")
    a = p.parse_args()
    hows = [h for h in a.how.split(",") if h in ("gpudoctor", "inductor")] or ["gpudoctor"]
    cache = tempfile.mkdtemp(prefix="inductor-cache-")
    runs = [dict(one(hows[0], cache), cache="cold")]
    for _ in range(a.pairs):
        for how in hows:
            runs.append(dict(one(how, cache), cache="warm"))
    summary = {}
    for how in hows:
        warm = [r["stop_s"] for r in runs if r["cache"] == "warm" and r["how"] == how and "stop_s" in r]
        summary[how] = {"median_stop_s": statistics.median(warm) if warm else None, "n": len(warm)}
    result = {"benchmark": "compile_workers_stop", "python": platform.python_version(),
              "cpus": os.cpu_count(), "runs": runs, "summary": summary}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    for r in runs:
        if "stop_s" in r:
            print(f"{r['cache']:4} {r['how']:9} pools {r['pools']} workers {r['workers']:3} -> left {r['workers_left']:3}"
                  f"  stop {r['stop_s']:6.2f} s  compile {r['compile_s']:5.1f} s  later compile ok {r['compile_after_ok']}"
                  f"  traceback {r['stderr_traceback']}")  # fmt: skip
        else:
            print(f"{r['cache']:4} {r['how']:9} failed (rc {r['rc']}): {r.get('error', '')[-300:]}")
    for how, s in summary.items():
        if s["median_stop_s"] is not None:
            print(f"{how}: median stop {s['median_stop_s']:.2f} s over {s['n']}")
    return 0 if all("stop_s" in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
