"""A 1 GB trace within the machine's memory: build one by repeating the steps of the recorded 10-step
ResNet-50 trace (times shifted, ids renumbered, step numbers continued), then load and analyze it with
gpudoctor in a fresh process and record wall time and peak RSS.

    .venv/bin/python benchmarks/big_trace.py [--target-gb 1.0] [--keep]
Results: benchmarks/results/big_trace.json. The generated trace goes to benchmarks/data/ (git-ignored).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "benchmarks/traces/resnet50_10steps.json.gz"
ID_ARGS = ("correlation", "External id", "Python id", "Python parent id")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def shifted(events: list[dict[str, Any]], k: int, span: float, id_stride: int, step_stride: int) -> list[Any]:
    out = []
    for e in events:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + k * span
        if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
            e["id"] = e["id"] + k * id_stride
        m = _STEP.match(str(e.get("name", "")))
        if m:
            e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_stride}"
        args = e.get("args")
        if isinstance(args, dict):
            args = dict(args)
            for key in ID_ARGS:
                if isinstance(args.get(key), int) and args[key] > 0:
                    args[key] += k * id_stride
            e["args"] = args
        out.append(e)
    return out


def build(target_bytes: int, dest: Path) -> dict[str, Any]:
    with gzip.open(SOURCE, "rb") as f:
        doc = msgspec.json.decode(f.read())
    everything = doc.pop("traceEvents")
    events = [e for e in everything if e.get("ph") != "M"]
    meta = [e for e in everything if e.get("ph") == "M"]
    ts = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000.0
    id_stride = 1 + max(
        (v for e in events for k, v in (e.get("args") or {}).items() if k in ID_ARGS and isinstance(v, int)),
        default=0,
    )
    steps = [int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    step_stride = max(steps) - min(steps) + 1 if steps else 0
    header = {
        k: v for k, v in doc.items() if k not in ("traceName", "displayTimeUnit", "baseTimeNanoseconds")
    }
    trailer = {k: v for k, v in doc.items() if k in ("traceName", "displayTimeUnit", "baseTimeNanoseconds")}
    written, copies = 0, 0
    with open(dest, "wb") as out:
        out.write(msgspec.json.encode(header)[:-1] + b',\n"traceEvents": [\n')
        first = True
        for e in meta:
            out.write((b"" if first else b",\n") + msgspec.json.encode(e))
            first = False
        while written < target_bytes:
            body = b",\n".join(
                msgspec.json.encode(e) for e in shifted(events, copies, span, id_stride, step_stride)
            )
            out.write((b"" if first else b",\n") + body)
            first = False
            written += len(body)
            copies += 1
        out.write(b"\n]," + msgspec.json.encode(trailer)[1:])
    return {"copies": copies, "events": copies * len(events), "bytes": dest.stat().st_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-gb", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the generated trace")
    args = ap.parse_args()
    dest = ROOT / "benchmarks/data" / f"resnet50_repeated_{args.target_gb:g}gb.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    made = build(int(args.target_gb * 1e9), dest)
    print(f"built {dest.name}: {made['bytes'] / 1e9:.2f} GB, {made['events']:,} events, "
          f"{made['copies']} copies in {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpudoctor_side.py"), str(dest)],
        capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    ours = json.loads(proc.stdout)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trace_bytes": made["bytes"],
        "events": ours["events"],
        "steps": ours["steps"],
        "timings_s": ours["timings_s"],
        "peak_rss_bytes": ours["peak_rss_bytes"],
        "peak_rss_over_json": ours["peak_rss_bytes"] / made["bytes"],
        "busy_pct": ours["gpu_window"]["busy_pct"],
    }
    out = ROOT / "benchmarks/results/big_trace.json"
    out.write_text(json.dumps(result, indent=1))
    print(
        f"gpudoctor on {made['bytes'] / 1e9:.2f} GB: load {ours['timings_s']['load']:.1f} s, "
        f"analyze {ours['timings_s']['analyze']:.1f} s, peak RSS {ours['peak_rss_bytes'] / 2**30:.2f} GiB "
        f"({result['peak_rss_over_json']:.2f}x the JSON); {ours['steps']} steps"
    )
    if not args.keep:
        dest.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
