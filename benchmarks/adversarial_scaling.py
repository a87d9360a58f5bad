"""The pathological inputs of `tests/adversarial_inputs.py`, grown until a quadratic path or an unbounded buffer would show:
analysis time stays linear in the input and the loader's peak RSS within the decompressed-size limit.

Cases (generators in tests/adversarial_inputs.py, each case measured in a fresh process for its RSS):
  equal_timestamps  CPU ops at one timestamp nested one inside the next (and their launches, kernels
                    and synchronize calls) at 1x, 10x, 100x the events
  same_name_chain   aten::mm ops with shapes nested likewise, one with Kineto's FLOPs (the roofline path)
  deep_json         one argument nested 10^4, 10^5, 10^6 levels deep
  whitespace        1 GB of whitespace before the trace, between two events, after it (gzip-streamed)
  gzip_bomb         a few MB of gzip that inflate to twice the limit given (1 GiB here): stops at it

    PYTHONPATH=src python3 benchmarks/adversarial_scaling.py [--quick] [--out benchmarks/results/adversarial_scaling.json]

No GPU needed. Results: per case and size, the events, the seconds of load and of analysis + diagnosis
(CPU time of the process), the peak RSS; per case, the time ratio per 10x of input (linear: about 10).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

SIZES = {
    "equal_timestamps": (2_000, 20_000, 200_000),
    "same_name_chain": (2_000, 20_000, 200_000),
    "deep_json": (10_000, 100_000, 1_000_000),
}
QUICK_SIZES = {name: sizes[:2] for name, sizes in SIZES.items()}
WHITESPACE = ("before", "between", "after")
GB = 1 << 30


def same_name_chain(n: int) -> dict[str, Any]:
    """n aten::mm ops with shapes, each inside the one before at one timestamp; the outermost carries
    Kineto's FLOPs, so every op's work is looked up through the chain (and each launches a kernel)."""
    dims = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}
    events: list[dict[str, Any]] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 3.0 * n + 100,
        }
    ]
    for i in range(n):
        args = {**dims, "External id": i + 1, **({"flops": 1e6} if i == 0 else {})}
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 0.0,
                "dur": 3.0 * n - i,
                "args": args,
            }
        )
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": n + i + 0.1,
                       "dur": 0.2, "args": {"correlation": i + 1, "External id": i + 1}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 1, "tid": 7, "ts": float(n + i), "dur": 0.5,
                       "args": {"correlation": i + 1, "External id": i + 1, "stream": 7, "device": 0}})  # fmt: skip
    return {"schemaVersion": 1, "traceEvents": events}


def make(case: str, size: int, folder: Path) -> tuple[Path, int | None]:
    """The input file of a case, and the size limit to load it with (None: the default)."""
    import adversarial_inputs as adv

    if case == "equal_timestamps":
        return adv.write_doc(folder / "eq.json", adv.equal_timestamps(size)), None
    if case == "same_name_chain":
        return adv.write_doc(folder / "chain.json", same_name_chain(size)), None
    if case == "deep_json":
        path = folder / "deep.json"
        path.write_bytes(adv.deep_json(size, "arg"))
        return path, None
    if case.startswith("whitespace_"):
        where = case.removeprefix("whitespace_")
        return adv.write_stream(folder / "ws.json.gz", adv.whitespace_trace(size, where)), None
    if case == "gzip_bomb":
        return adv.gzip_bomb(folder / "bomb.json.gz", 2 * size), size
    raise ValueError(case)


def measure_in_this_process(path: Path, limit: int | None) -> dict[str, Any]:
    """Load, analyze and diagnose `path` here; CPU seconds of each part, the events, the peak RSS."""
    from gpudoctor.analysis.summary import analyze
    from gpudoctor.rules import diagnose
    from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES, TraceTooLargeError, load_trace

    t0 = time.process_time()
    out: dict[str, Any] = {"file_bytes": path.stat().st_size}
    try:
        trace = load_trace(path, max_bytes=limit if limit is not None else DEFAULT_MAX_TRACE_BYTES)
    except TraceTooLargeError as err:
        out.update(stopped=str(err).split(": ", 1)[-1], load_s=time.process_time() - t0)
    else:
        t1 = time.process_time()
        diagnose(analyze(trace))
        out.update(events=len(trace), load_s=t1 - t0, analyze_s=time.process_time() - t1)
    out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def peak_rss_bytes() -> int:
    """This process's peak RSS since it started (VmHWM): ru_maxrss would carry the parent's over the
    fork (Linux keeps it across exec), and the parent held the generated documents."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_case(case: str, size: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpudoctor-adversarial-") as tmp:
        start = time.perf_counter()
        path, limit = make(case, size, Path(tmp))
        made_s = time.perf_counter() - start
        proc = subprocess.run(
            [sys.executable, __file__, "--measure", str(path), "--limit", str(limit or 0)],
            capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{case} {size}: {proc.stderr[-3000:]}")
    row = {"case": case, "size": size, "generated_s": made_s, **json.loads(proc.stdout)}
    if limit is not None:
        row["limit_bytes"] = limit
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the two smaller sizes, 64 MB of whitespace")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/adversarial_scaling.json")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure_in_this_process(args.measure, args.limit or None)))
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    ws = (64 << 20) if args.quick else GB
    plan = [(case, n) for case, ns in sizes.items() for n in ns]
    plan += [(f"whitespace_{where}", ws) for where in WHITESPACE]
    plan.append(("gzip_bomb", (128 << 20) if args.quick else GB))
    rows = []
    for case, size in plan:
        print(f"… {case} {size:,}", file=sys.stderr, flush=True)
        rows.append(run_case(case, size))
        r = rows[-1]
        print(f"  {r.get('events', '-')} events, load {r['load_s']:.3f} s, analysis {r.get('analyze_s', 0):.3f} s, "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB" + (f", stopped: {r['stopped']}" if "stopped" in r else ""),
              file=sys.stderr)  # fmt: skip
    growth = {}
    for case in sizes:
        mine = [r for r in rows if r["case"] == case]
        growth[case] = [
            {
                "size_ratio": b["size"] / a["size"],
                "load_ratio": b["load_s"] / a["load_s"],
                "analysis_ratio": b["analyze_s"] / a["analyze_s"] if a.get("analyze_s") else None,
            }
            for a, b in itertools.pairwise(mine)
        ]
    doc = {
        "environment": {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],
            "platform": platform.platform(),
        },
        "quick": args.quick,
        "rows": rows,
        "growth_per_step": growth,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    for case, steps in growth.items():
        print(f"{case:18} " + "; ".join(
            f"x{s['size_ratio']:.0f} input: load x{s['load_ratio']:.1f}, analysis x{(s['analysis_ratio'] or 0):.1f}" for s in steps
        ))  # fmt: skip
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
