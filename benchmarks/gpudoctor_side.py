"""The gpudoctor side of the gpudoctor-vs-HTA benchmark, run in a fresh process per trace so its peak
RSS is its own: time import, load and every analysis; report our timeline figures, both in our own
definitions and recomputed under HTA's conventions (last profiler step dropped, only GPU activity
with a launching call, window = first to last such activity), for a like-for-like comparison.

    python benchmarks/gpudoctor_side.py TRACE [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.perf_counter()
import numpy as np  # noqa: E402

from gpudoctor.analysis.summary import analyze  # noqa: E402
from gpudoctor.analysis.timeline import TimeBreakdown, gpu_timeline  # noqa: E402
from gpudoctor.trace import load_trace  # noqa: E402
from gpudoctor.trace.links import launch_rows  # noqa: E402
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Kind, Trace  # noqa: E402
from gpudoctor.trace.steps import find_steps  # noqa: E402

T_IMPORTED = time.perf_counter()


def rss_now() -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def figures(b: TimeBreakdown | None) -> dict[str, Any] | None:
    if b is None:
        return None
    w = b.window_us
    return {
        "window_us": w,
        "busy_pct": 100 * b.busy_us / w,
        "idle_pct": 100 * b.idle_us / w,
        "compute_pct": 100 * b.busy_by_kind_us.get("compute", 0.0) / w,
        "non_compute_pct": 100 * (b.busy_us - b.busy_by_kind_us.get("compute", 0.0)) / w,
        "idle_by_cause_pct": {k: 100 * v / w for k, v in b.idle_by_cause_us.items()},
        "host_caused_idle_pct": 100 * (b.idle_by_cause_us["host_wait"] + b.idle_by_cause_us["sync"]) / w,
    }


def hta_convention_rows(trace: Trace) -> np.ndarray:
    """GPU rows HTA keeps (docs/hta_reference.md §1): with >= 2 steps, those launched by a call that
    started before the latest `ProfilerStep*` event — which for HTA includes the GPU-side annotation,
    as it has no stream argument and so counts as a CPU event."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    launch = launch_rows(trace, gpu)
    keep = launch >= 0
    if len(find_steps(trace)) >= 2:
        annotations = trace.rows(Kind.USER_ANNOTATION, Kind.GPU_ANNOTATION)
        is_step = trace.name_ids_matching(lambda n: n.startswith("ProfilerStep"))[trace.name[annotations]]
        last = float(trace.ts[annotations[is_step]].max())
        keep &= trace.ts[np.maximum(launch, 0)] < last
    return gpu[keep]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    rss_before = rss_now()
    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    t1 = time.perf_counter()
    analysis = analyze(trace)
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hta_like = gpu_timeline(trace, (), hta_convention_rows(trace)).gpu_window
    out = {
        "tool": "gpudoctor",
        "trace_path": args.trace,
        "json_bytes": None,
        "timings_s": {"import": T_IMPORTED - T_START, "load": t1 - t0, "analyze": t2 - t1, "total": t2 - t0},
        "rss_before_load_bytes": rss_before,
        "peak_rss_bytes": peak,
        "events": int(analysis.trace.events),
        "steps": len(analysis.steps),
        "device": analysis.device.name if analysis.device else None,
        "profiled_steps": figures(analysis.timeline.profiled_steps),
        "gpu_window": figures(analysis.timeline.gpu_window),
        "hta_convention": figures(hta_like),
        "launch_delay_p50_us": analysis.kernels.launch_delay_us.p50
        if analysis.kernels.launch_delay_us
        else None,
    }
    text = json.dumps(out, indent=1)
    if args.json_out:
        Path(args.json_out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
