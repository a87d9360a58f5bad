"""A directory of 256 rank traces read in parallel: does the per-rank stage scale with cores, and does
each worker's memory stay that of one trace whatever the number of ranks?

The ranks are made from the two recorded DDP ranks (tests/fixtures/ddp, 2 H200s, rank 1 a planted
straggler): rank k is a copy of the straggler when k % 16 == 5, else of rank 0, with its rank and
world size in distributedInfo, its pids moved, its timestamps shifted by k × 13.7 µs and every
duration scaled by 1 + 0.002 × (7k mod 11) (so no two ranks are identical). Then, for each worker
count, a fresh process runs `gpudoctor.doctor.diagnose_ranks` over the directory with a pool of that
many worker processes (spawned) and reports its wall time, the workers' peak RSS (each worker's
high-water mark, read in the worker), the parent's, and what was found.

    PYTHONPATH=src python3 benchmarks/ranks_parallel.py --out $OUT [--ranks 256] [--workers 1,2,4,8,16]

msgspec must be importable (gpudoctor's loader). The generated traces go to --data (default: a
temporary folder), results to OUT/ranks_parallel.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "tests" / "fixtures" / "ddp"
STRAGGLER_EVERY, STRAGGLER_AT = 16, 5


def make_rank(args: tuple[int, int, Path]) -> int:
    """Write rank k of n to `folder`; its size in bytes."""
    k, n, folder = args
    source = "rank1" if k % STRAGGLER_EVERY == STRAGGLER_AT else "rank0"
    with gzip.open(SOURCES / f"{source}.json.gz", "rt") as f:
        doc = json.load(f)
    doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": k, "world_size": n}
    shift, scale = k * 13.7, 1 + 0.002 * ((7 * k) % 11)
    for e in doc["traceEvents"]:
        if isinstance(e.get("pid"), int) and e["pid"] > 0:
            e["pid"] += 10 * k
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += shift
        if isinstance(e.get("dur"), (int, float)):
            e["dur"] *= scale
    dest = folder / f"rank{k:04d}.json.gz"
    with gzip.open(dest, "wt", compresslevel=1) as f:
        json.dump(doc, f, separators=(",", ":"))
    return dest.stat().st_size


def generate(folder: Path, n: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    existing = sorted(folder.glob("rank*.json.gz"))
    if len(existing) == n:
        return sum(p.stat().st_size for p in existing)
    with ProcessPoolExecutor() as pool:
        return sum(pool.map(make_rank, [(k, n, folder) for k in range(n)], chunksize=4))


def measure(folder: Path, workers: int) -> dict[str, Any]:
    """In this (fresh) process: the directory analyzed with `workers` processes."""
    from gpudoctor.doctor import diagnose_ranks
    from gpudoctor.doctor.rank_pool import peak_rss_bytes

    t0 = time.perf_counter()
    run = diagnose_ranks(folder, workers=workers, engine="processes").ranks
    wall = time.perf_counter() - t0
    assert run is not None
    rss = [s.peak_rss_bytes for s in run.summaries if s.peak_rss_bytes]
    per_rank = [s.seconds for s in run.summaries if s.seconds]
    slowest = run.across.overview.slowest
    return {
        "workers": workers,
        "ranks": len(run.summaries),
        "wall_s": wall,
        "rank_seconds_sum": sum(per_rank),
        "rank_seconds_median": sorted(per_rank)[len(per_rank) // 2],
        "worker_peak_rss_max_bytes": max(rss),
        "worker_peak_rss_min_bytes": min(rss),
        "parent_peak_rss_bytes": peak_rss_bytes(),
        "slowest_rank": slowest.rank if slowest else None,
        "outliers_first": list(run.across.outliers[:8]),
        "findings": [f.id for f in run.diagnosis.findings],
    }


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        import msgspec
        import numpy

        env["numpy"], env["msgspec"] = numpy.__version__, msgspec.__version__
    except ImportError as err:
        env["missing"] = str(err)
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument(
        "--workers", default="1,2,4,8,16", help="comma-separated worker counts (capped at the CPUs)"
    )
    p.add_argument(
        "--data", type=Path, default=None, help="where the rank traces go (default: a temp folder)"
    )
    p.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)  # the child's side
    args = p.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, int(args.workers))))
        return 0
    cpus = environment()["cpus"]
    counts = sorted({min(int(w), cpus) for w in args.workers.split(",")})
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.data or Path(tmp) / "ranks"
        t0 = time.perf_counter()
        total = generate(folder, args.ranks)
        made_s = time.perf_counter() - t0
        print(
            f"{args.ranks} rank traces, {total / 2**20:.0f} MiB gzipped, made in {made_s:.1f} s", flush=True
        )
        rows = []
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        for w in counts:
            cmd = [sys.executable, __file__, "--measure", str(folder), "--workers", str(w)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if done.returncode:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["speedup"] = rows[0]["wall_s"] / row["wall_s"] if rows else 1.0
            rows.append(row)
            print(
                f"{w:3d} workers: {row['wall_s']:6.1f} s (×{row['speedup']:.2f}), worker peak RSS "
                f"{row['worker_peak_rss_max_bytes'] / 2**20:.0f} MiB, parent {row['parent_peak_rss_bytes'] / 2**20:.0f} MiB; "
                f"slowest rank {row['slowest_rank']}, findings {row['findings']}",
                flush=True,
            )
    result = {
        "schema": "gpudoctor.bench.ranks_parallel/1",
        "environment": environment(),
        "ranks": args.ranks,
        "sources": "tests/fixtures/ddp rank0 / rank1 (2× H200, DDP, rank 1 a straggler)",
        "gzipped_bytes": total,
        "generate_s": made_s,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ranks_parallel.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
