"""Vendor HTA's own test traces (facebookresearch/HolisticTraceAnalysis, `tests/data`, MIT licence) as
gpudoctor test fixtures: small files copied as they are, large ones cut to an excerpt that keeps the
top-level keys, every metadata event and the first events of each category in time order.

    python tools/excerpt_hta.py HTA_REPO/tests/data tests/fixtures/hta
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

# source (under tests/data) -> fixture name, and the most events of one category an excerpt keeps
# (None: the whole file).
FILES: dict[str, tuple[str, int | None]] = {
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": ("amd_mi250.json.gz", None),
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": ("alexnet.json.gz", None),
    "critical_path/cuda_event_sync/event_sync_trace.json.gz": ("cuda_event_sync.json.gz", None),
    "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz": ("cupti_profiler.json.gz", None),
    "trace_compare/base/base.json.gz": ("trace_compare_base.json.gz", None),
    "trace_compare/test/test.json.gz": ("trace_compare_test.json.gz", None),
    "mtia_inference_trace/mtia_inference_rank_0.json.gz": ("mtia_inference_excerpt.json.gz", 400),
    "mtia_trace_single_rank/mtia_rank_0.json.gz": ("mtia_single_rank_excerpt.json.gz", 400),
}


def excerpt(doc: dict[str, Any], per_category: int) -> dict[str, Any]:
    """The document with at most `per_category` duration events of each category (the earliest), the
    metadata events that name the processes and threads of those events, and no flow events (gpudoctor
    links by ids, not flows)."""
    kept: list[dict[str, Any]] = []
    seen: dict[str, int] = defaultdict(int)
    for e in sorted(doc["traceEvents"], key=lambda e: e.get("ts") or 0):
        if e.get("ph") == "X":
            cat = str(e.get("cat"))
            if seen[cat] < per_category:
                seen[cat] += 1
                kept.append(e)
    where = {(e.get("pid"), e.get("tid")) for e in kept} | {(e.get("pid"), 0) for e in kept}
    named: dict[
        tuple[Any, Any, Any], dict[str, Any]
    ] = {}  # one of each metadata event per (name, pid, tid): the full files repeat them by the 10,000
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and (e.get("pid"), e.get("tid")) in where:
            named.setdefault((e.get("name"), e.get("pid"), e.get("tid")), e)
    kept[:0] = named.values()
    out = {k: v for k, v in doc.items() if k not in ("traceEvents", "INFO", "ERROR")}
    out["traceEvents"] = kept
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("source", type=Path, help="HTA's tests/data")
    p.add_argument("dest", type=Path)
    args = p.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    for src, (name, limit) in FILES.items():
        target = args.dest / name
        if limit is None:
            shutil.copyfile(args.source / src, target)
            continue
        with gzip.open(args.source / src, "rb") as f:
            doc = json.load(f)
        data = json.dumps(excerpt(doc, limit), separators=(",", ":")).encode()
        target.write_bytes(gzip.compress(data, mtime=0))


if __name__ == "__main__":
    main()
