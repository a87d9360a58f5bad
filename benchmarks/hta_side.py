"""The HTA side of the gpudoctor-vs-HTA benchmark: load a Kineto trace with Holistic Trace Analysis,
time each analysis separately, and emit HTA's numbers as JSON. Run it with the HTA venv's python:

    benchmarks/.venv-hta/bin/python benchmarks/hta_side.py TRACE_PATH [--json OUT.json]

TRACE_PATH is one trace file (.json / .json.gz) or a directory of them. HTA only takes a directory and reads
each file's rank with the regex ``"rank":\\s+(\\d+)``; a file without one becomes rank 0, so two such files
collide and one is silently dropped. Workaround: symlink the input(s) into a temporary directory; when every
file shows a distinct rank HTA can read, load with ``TraceAnalysis(trace_dir=tmp)``; otherwise give each file
its own rank explicitly with ``TraceAnalysis(trace_files={rank: path}, trace_dir=tmp)``. The trace files are
never modified. Units of HTA's outputs: µs (the trace's own unit), whatever its docstrings say.
See docs/hta_reference.md for what each number means.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import re
import resource
import sys
import tempfile
import time
import traceback
import warnings
from importlib import metadata
from typing import Any

HEAD_BYTES = 1 << 16
HTA_RANK_RE = re.compile(r'"rank":\s+(\d+)')  # the pattern hta/common/trace_file.py uses
LOOSE_RANK_RE = re.compile(r'"distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+)')
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


def rss_now_bytes() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def maxrss_bytes(who: int = resource.RUSAGE_SELF) -> int:
    return resource.getrusage(who).ru_maxrss * 1024  # KiB on Linux


def trace_files_in(path: str) -> list[str]:
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    names = sorted(n for n in os.listdir(path) if n.endswith((".json", ".json.gz")))
    return [os.path.abspath(os.path.join(path, n)) for n in names]


def head_text(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return fh.read(HEAD_BYTES).decode("utf-8", errors="replace")


def stage_traces(files: list[str], tmp: str) -> tuple[dict[int, str], bool, list[dict[str, Any]]]:
    """Symlink the files into tmp; return {rank: link}, whether HTA's own rank detection suffices, and notes."""
    found = []  # (file, rank HTA's regex sees, rank in distributedInfo however it is spaced)
    for f in files:
        head = head_text(f)
        m_hta, m_loose = HTA_RANK_RE.search(head), LOOSE_RANK_RE.search(head)
        found.append((f, int(m_hta.group(1)) if m_hta else None, int(m_loose.group(1)) if m_loose else None))
    hta_ranks = [r if r is not None or len(files) > 1 else 0 for _, r, _ in found]  # a lone file: HTA says 0
    hta_ok = None not in hta_ranks and len(set(hta_ranks)) == len(hta_ranks)
    taken: set[int] = set()
    mapping, notes = {}, []
    for (f, r_hta, r_loose), r_used in zip(found, hta_ranks, strict=True):
        if hta_ok:
            rank, why = r_used, "HTA regex" if r_hta is not None else "HTA default for a file without a rank"
        else:
            rank = r_hta if r_hta is not None else r_loose
            why = "HTA regex" if r_hta is not None else "distributedInfo (HTA regex misses it)"
            if rank is None or rank in taken:
                why = "assigned: no rank in file" if rank is None else f"assigned: rank {rank} taken"
                rank = next(i for i in range(len(files) + max(taken, default=0) + 1) if i not in taken)
        taken.add(rank)
        link = os.path.join(tmp, f"rank{rank}" + (".json.gz" if f.endswith(".gz") else ".json"))
        os.symlink(f, link)
        mapping[rank] = link
        notes.append({"file": f, "rank": rank, "rank_source": why, "bytes": os.path.getsize(f)})
    return mapping, hta_ok, notes


def timed(results: dict[str, Any], name: str, fn):
    t0 = time.perf_counter()
    try:
        value = fn()
        results["timings_s"][name] = time.perf_counter() - t0
        return value
    except Exception as exc:  # one failing analysis must not stop the others
        results["timings_s"][name] = time.perf_counter() - t0
        results["errors"][name] = f"{type(exc).__name__}: {exc}".strip()
        results["tracebacks"][name] = traceback.format_exc(limit=6)
        return None


def summarize(res: dict[str, Any], key: str, fn, raw) -> None:
    """Turn one analysis' DataFrames into plain numbers; None where the analysis failed."""
    res[key] = None
    if raw is None:
        return
    try:
        res[key] = fn(raw)
    except Exception as exc:
        res["errors"][f"{key}_summary"] = f"{type(exc).__name__}: {exc}"
        res["tracebacks"][f"{key}_summary"] = traceback.format_exc(limit=6)


def num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if v != v else v  # NaN -> None


def summarize_temporal(df) -> dict[str, Any]:
    out = {}
    for row in df.to_dict("records"):
        window, idle = num(row["kernel_time(us)"]), num(row["idle_time(us)"])
        busy = None if window is None or idle is None else window - idle
        out[str(int(row["rank"]))] = {
            "window_us": window,
            "busy_us": busy,
            "idle_us": idle,
            "compute_us": num(row["compute_time(us)"]),
            "non_compute_us": num(row["non_compute_time(us)"]),
            "busy_pct": None if not window else 100.0 * busy / window,
            "idle_pct": num(row["idle_time_pctg"]),
            "compute_pct": num(row["compute_time_pctg"]),
            "non_compute_pct": num(row["non_compute_time_pctg"]),
        }
    return out


def summarize_idle(df, temporal: dict[str, Any]) -> dict[str, Any]:
    """HTA reports one row per (rank, stream, category); sum the streams of a rank per category."""
    out: dict[str, Any] = {}
    for rank, rdf in df.groupby("rank"):
        key = str(int(rank))
        by_cat = {c: 0.0 for c in IDLE_CATEGORIES}
        for cat, val in rdf.groupby("idle_category")["idle_time"].sum().items():
            by_cat[str(cat)] = by_cat.get(str(cat), 0.0) + float(val)
        total = sum(by_cat.values())
        window = (temporal.get(key) or {}).get("window_us")
        out[key] = {
            "streams": sorted(int(s) for s in rdf["stream"].unique()),
            "idle_sum_over_streams_us": total,
            "categories": {
                c: {
                    "time_us": v,
                    "share_of_idle": v / total if total else None,
                    "share_of_window": v / window if window else None,
                }
                for c, v in by_cat.items()
            },
            "per_stream": [
                {
                    "stream": int(r["stream"]),
                    "category": str(r["idle_category"]),
                    "time_us": num(r["idle_time"]),
                }
                for r in rdf.to_dict("records")
            ],
        }
    return out


def summarize_kernels(type_df, kernel_df, top_k: int) -> dict[str, Any]:
    by_type = {
        str(r["kernel_type"]): {"time_us": num(r["sum"]), "pct": num(r["percentage"])}
        for r in type_df.to_dict("records")
    }
    per_rank: dict[str, list] = {}
    for rank, rdf in kernel_df.groupby("rank"):
        rows = rdf[rdf["name"] != "others"].sort_values("sum (us)", ascending=False).head(top_k)
        per_rank[str(int(rank))] = [
            {
                "name": str(r["name"]),
                "kernel_type": str(r["kernel_type"]),
                "total_us": num(r["sum (us)"]),
                "hta_mean_us": num(r["mean (us)"]),
            }
            for r in rows.to_dict("records")
        ]
    return {
        "by_type_all_ranks": by_type,
        "top_kernels_per_rank": per_rank,
        "note": "by_type: union time per overlap state (e.g. 'COMPUTATION overlapping COMMUNICATION'), % of "
        "busy time; hta_mean_us is HTA's column and equals total_us whenever HTA regrouped the tail into "
        "'others' (more kernels than --top-k): see docs/hta_reference.md",
    }


def summarize_launch(stats: dict, runtime_cutoff: float, delay_cutoff: float) -> dict[str, Any]:
    out = {}
    for rank, df in stats.items():
        d = df["launch_delay"].astype(float)
        if len(d) == 0:
            out[str(rank)] = {"count": 0}
            continue
        cpu, gpu = df["cpu_duration"].astype(float), df["gpu_duration"].astype(float)
        out[str(rank)] = {
            "count": len(d),
            "launch_delay_us": {
                "median": float(d.median()),
                "mean": float(d.mean()),
                "p95": float(d.quantile(0.95)),
                "max": float(d.max()),
            },
            "launch_delay_over_cutoff": int((d > delay_cutoff).sum()),
            "runtime_call_us": {
                "median": float(cpu.median()),
                "mean": float(cpu.mean()),
                "p95": float(cpu.quantile(0.95)),
            },
            "runtime_over_cutoff": int((cpu > runtime_cutoff).sum()),
            "short_kernels": int(((cpu <= runtime_cutoff) & (gpu < cpu)).sum()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_path")
    ap.add_argument("--json", dest="json_out", help="write the JSON here (default: stdout)")
    ap.add_argument("--top-k", type=int, default=10, help="kernels kept per rank in the kernel breakdown")
    ap.add_argument(
        "--consecutive-kernel-delay",
        type=float,
        default=30,
        help="HTA's kernel-wait threshold, compared with gaps in the trace's unit (µs)",
    )
    ap.add_argument("--include-last-step", action="store_true", help="HTA include_last_profiler_step=True")
    ap.add_argument("--no-ns-rounding", action="store_true", help="set HTA_DISABLE_NS_ROUNDING=1")
    ap.add_argument("--verbose", action="store_true", help="let HTA's log through (to stderr)")
    args = ap.parse_args(argv)

    if args.no_ns_rounding:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    files = trace_files_in(args.trace_path) if os.path.exists(args.trace_path) else []
    if not files:
        print(f"no .json / .json.gz trace in {args.trace_path}", file=sys.stderr)
        return 2

    if not args.verbose:  # HTA 0.5 on pandas 2.x prints FutureWarnings from its internals
        warnings.filterwarnings("ignore", category=FutureWarning)
    from hta.trace_analysis import TraceAnalysis  # imported late: its import cost is not load time

    hta_log = logging.getLogger("hta")
    hta_log.setLevel(logging.INFO if args.verbose else logging.ERROR)
    for h in hta_log.handlers:  # hta's logging.config (if set up) points at stdout; keep stdout for the JSON
        if isinstance(h, logging.StreamHandler):
            h.setStream(sys.stderr)

    res: dict[str, Any] = {
        "tool": "hta",
        "hta_version": metadata.version("holistictraceanalysis"),
        "pandas_version": metadata.version("pandas"),  # HTA 0.5.0 breaks on pandas 3: see the docs
        "numpy_version": metadata.version("numpy"),
        "trace_path": os.path.abspath(args.trace_path),
        "options": {k: v for k, v in vars(args).items() if k not in ("trace_path", "json_out")},
        "timings_s": {},
        "errors": {},
        "tracebacks": {},
    }
    with tempfile.TemporaryDirectory(prefix="hta_side_") as tmp:
        mapping, hta_ok, notes = stage_traces(files, tmp)
        res["inputs"] = notes
        res["load_mode"] = "trace_dir" if hta_ok else "trace_files (HTA could not tell the ranks apart)"
        res["rss_before_load_bytes"] = rss_now_bytes()
        res["maxrss_before_load_bytes"] = maxrss_bytes()
        kwargs = {"trace_dir": tmp} if hta_ok else {"trace_files": dict(mapping), "trace_dir": tmp}
        ta = timed(
            res, "load", lambda: TraceAnalysis(include_last_profiler_step=args.include_last_step, **kwargs)
        )
        res["maxrss_after_load_bytes"] = maxrss_bytes()
        if ta is None:
            res["peak_rss_bytes"] = maxrss_bytes()
            res["peak_rss_children_bytes"] = maxrss_bytes(resource.RUSAGE_CHILDREN)
            return finish(res, args.json_out)
        ranks = ta.t.get_ranks()
        res["ranks"] = ranks
        res["events_kept_per_rank"] = {str(r): len(ta.t.get_trace(r)) for r in ranks}

        temporal = timed(res, "temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False))
        summarize(res, "temporal", summarize_temporal, temporal)
        idle = timed(
            res,
            "idle_time_breakdown",
            lambda: ta.get_idle_time_breakdown(
                ranks=ranks, visualize=False, consecutive_kernel_delay=args.consecutive_kernel_delay
            ),
        )
        summarize(res, "idle", lambda r: summarize_idle(r[0], res.get("temporal") or {}), idle)
        kern = timed(
            res,
            "kernel_breakdown",
            lambda: ta.get_gpu_kernel_breakdown(
                visualize=False, duration_ratio=1.0, num_kernels=args.top_k, include_memory_kernels=True
            ),
        )
        summarize(res, "kernels", lambda r: summarize_kernels(r[0], r[1], args.top_k), kern)
        launch = timed(
            res,
            "kernel_launch_stats",
            lambda: ta.get_cuda_kernel_launch_stats(
                ranks=ranks, runtime_cutoff=50, launch_delay_cutoff=100, visualize=False
            ),
        )
        summarize(res, "launch", lambda r: summarize_launch(r, 50, 100), launch)
    res["peak_rss_bytes"] = maxrss_bytes()
    res["peak_rss_children_bytes"] = maxrss_bytes(resource.RUSAGE_CHILDREN)  # HTA forks a pool for >1 rank
    return finish(res, args.json_out)


def finish(res: dict[str, Any], out: str | None) -> int:
    text = json.dumps(res, indent=2, default=str)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0 if res["timings_s"].get("load") is not None and "load" not in res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
