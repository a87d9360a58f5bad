"""Crafted inputs that broke gpudoctor once (issue 15), as generators sized by a parameter: the tests
use them small; `benchmarks/adversarial_scaling.py` grows them to show time stays linear and memory
bounded. Each returns a trace document (dict) or writes the bytes of a file."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ESCAPES = (
    "\x1b]0;pwned\x07"  # set the terminal's window title
    "\x1b]52;c;cHduZWQ=\x07"  # write the clipboard (OSC 52)
    "\x1b[2J\x1b[H"  # clear the screen
    "\r\u202e"  # overwrite the line; reverse what follows
)
MARKUP = "[bold red]loud[/bold red] [link=https://evil.example]click[/link] [/] :skull:"


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def gpu_step_trace(steps: int = 3, kernels_per_step: int = 4, names: tuple[str, ...] = ("aten::mm",)) -> dict:
    """A small, well-formed Kineto trace: ProfilerStep#N annotations, ops launching kernels, one
    synchronize per step; `names` are cycled as op and kernel names (to inject text)."""
    events: list[dict[str, Any]] = []
    t, ident = 1000.0, 0
    for s in range(steps):
        start = t
        for _ in range(kernels_per_step):
            ident += 1
            name = names[ident % len(names)]
            events.append(_x("cpu_op", name, t, 20, **{"External id": ident}))
            events.append(
                _x("cuda_runtime", "cudaLaunchKernel", t + 2, 5, correlation=ident, **{"External id": ident})
            )
            events.append(
                _x(
                    "kernel",
                    f"{name}_kernel",
                    t + 10,
                    30,
                    tid=7,
                    correlation=ident,
                    stream=7,
                    device=0,
                    **{"External id": ident},
                )
            )
            t += 40
        ident += 1
        events.append(_x("cuda_runtime", "cudaDeviceSynchronize", t, 30, correlation=ident))
        t += 40
        events.append(_x("user_annotation", f"ProfilerStep#{s}", start, t - start))
        t += 10
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "traceEvents": events,
    }


def equal_timestamps(n: int, launches: bool = True) -> dict:
    """n CPU ops of one name starting at one timestamp, each inside the one before (a chain n deep),
    each launching a kernel, and n/4 synchronize calls at that timestamp around most of the chain:
    what made nesting, the same-name roll-up and the enclosing-op search quadratic."""
    events: list[dict[str, Any]] = [_x("user_annotation", "ProfilerStep#1", 0.0, n + 100.0)]
    for i in range(n):
        events.append(_x("cpu_op", "aten::to", 0.0, float(n - i), **{"External id": i + 1}))
        if launches:
            events.append(
                _x("cuda_runtime", "cudaLaunchKernel", 0.0, 0.5, correlation=i + 1, **{"External id": i + 1})
            )
            events.append(
                _x(
                    "kernel",
                    "copy_kernel",
                    float(i),
                    0.5,
                    tid=7,
                    correlation=i + 1,
                    stream=7,
                    device=0,
                    **{"External id": i + 1},
                )
            )
    for j in range(max(n // 4, 1)):
        events.append(_x("cuda_runtime", "cudaDeviceSynchronize", 0.0, n - 0.5, correlation=10 * n + j))
    return {"schemaVersion": 1, "traceEvents": events}


def zero_length_steps() -> dict:
    """ProfilerStep spans of zero length and overlapping ones, with syncs: the traced step time is 0."""
    doc = gpu_step_trace(steps=3)
    for e in doc["traceEvents"]:
        if e["name"].startswith("ProfilerStep#"):
            e["dur"] = 0.0
    doc["traceEvents"].append(_x("user_annotation", "ProfilerStep#9", 1000.0, 0.0))
    return doc


def deep_json(depth: int, where: str = "arg") -> bytes:
    """A trace whose JSON nests `depth` deep: in an event's args, as an event, or in a top-level key."""
    deep = "[" * depth + "]" * depth
    event = json.dumps(_x("cpu_op", "aten::mm", 1.0, 2.0))
    if where == "arg":
        body = event[:-1] + f', "args": {{"unknown": {deep}, "grid": {deep}}}}}'
        return f'{{"schemaVersion": 1, "traceEvents": [{event}, {body}]}}'.encode()
    if where == "event":
        return f'{{"schemaVersion": 1, "traceEvents": [{event}, {deep}]}}'.encode()
    return f'{{"schemaVersion": 1, "other": {deep}, "traceEvents": [{event}]}}'.encode()


def whitespace_trace(n_bytes: int, where: str) -> Iterator[bytes]:
    """A small trace with `n_bytes` of whitespace before it, between two events, or after it, in
    blocks (never all in memory)."""
    doc = gpu_step_trace(steps=2)
    events = [json.dumps(e).encode() for e in doc["traceEvents"]]
    block = b" \n\t\r" * (1 << 18)

    def spaces() -> Iterator[bytes]:
        left = n_bytes
        while left > 0:
            yield block[: min(left, len(block))]
            left -= len(block)

    if where == "before":
        yield from spaces()
    yield b'{"schemaVersion": 1, "traceEvents": ['
    for i, e in enumerate(events):
        if i:
            yield b","
        if where == "between" and i == len(events) // 2:
            yield from spaces()
        yield e
    yield b"]}"
    if where == "after":
        yield from spaces()


def write_stream(path: Path, parts: Iterator[bytes], compress: bool | None = None) -> Path:
    compress = path.name.endswith(".gz") if compress is None else compress
    with gzip.open(path, "wb", compresslevel=1) if compress else path.open("wb") as f:
        for part in parts:
            f.write(part)
    return path


def gzip_bomb(path: Path, inflated_bytes: int) -> Path:
    """A gzip file of a few KB per 10 MB that inflates to `inflated_bytes` of valid-looking trace."""
    event = json.dumps(_x("cpu_op", "aten::add", 1.0, 1.0)).encode() + b","
    block = event * ((1 << 20) // len(event))

    def parts() -> Iterator[bytes]:
        yield b'{"schemaVersion": 1, "traceEvents": ['
        written = 0
        while written < inflated_bytes:
            yield block
            written += len(block)
        yield event[:-1] + b"]}"

    return write_stream(path, parts(), compress=True)


def jax_trace() -> dict:
    """What jax.profiler writes for a CPU-only run (perfetto_trace.json): no PyTorch event at all."""
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "python3"}},
    ]
    xs = [
        {"ph": "X", "pid": 1, "tid": 1, "name": f"jit_train_step/{i}", "ts": 10.0 * i, "dur": 8.0}
        for i in range(20)
    ]
    return {"displayTimeUnit": "ns", "traceEvents": meta + xs}


def chrome_trace() -> dict:
    """What Chrome DevTools' Performance panel saves: a browser's trace, CPU only."""
    meta = [{"ph": "M", "pid": 5, "tid": 9, "name": "thread_name", "args": {"name": "CrRendererMain"}}]
    xs = [
        {
            "ph": "X",
            "cat": "devtools.timeline",
            "pid": 5,
            "tid": 9,
            "name": "RunTask",
            "ts": 100.0 * i,
            "dur": 50.0,
        }
        for i in range(20)
    ]
    return {"traceEvents": meta + xs, "metadata": {"source": "DevTools"}}


def write_doc(path: Path, doc: dict, *, bom: bool = False) -> Path:
    data = json.dumps(doc, ensure_ascii=False).encode()
    data = (b"\xef\xbb\xbf" if bom else b"") + data
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
