"""Make the fixtures of traces gpudoctor must read as their users have them, from the recorded ones:

- `pt19_sync_every_step.json.gz`: `traces/sync_every_step_stack` as PyTorch 1.9 (Kineto of May 2021)
  wrote a trace: every CPU range an "Operator" (`ProfilerStep#N` too), "Runtime"/"Kernel"/"Memcpy"/
  "Memset" categories, the CPU op's id as a lower-case `external id` on runtime calls and GPU activity,
  string thread ids, whole epoch microseconds, `[memory]` events with only `Bytes` (no allocator
  totals), no Python-function events, no flow events;
- `pt19_two_steps.json.gz`: the same cut to its first two steps, with the device properties as
  `computeProperties` in `cudaDeviceProp`'s names (`major`, `multiProcessorCount`);
- `warmup_first_step.json.gz`: `zoo/control_cnn` (three steps, GPU-bound, nothing planted) with a
  fourth step before them, 20x as long: a copy of its first step after a warm-up of cudnn autotuning
  kernels and 100 `cudaMalloc`/`cudaFree` calls (its flow events left out);
- `toy_four_kernels.json.gz`: written by hand: four additions, each one kernel (3-92 us).

The format of each field follows Kineto's `output_json.cpp` and `CudaDeviceProperties.cpp` as of
pytorch/kineto#211 (May 2021), the traces its TensorBoard plugin shipped as samples, and (for
`computeProperties`) that plugin's test traces.

    python tools/make_old_traces.py [OUT_DIR]     (default: tests/fixtures/old_traces)
"""

from __future__ import annotations

import argparse
import copy
import gzip
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
OUT = FIXTURES / "old_traces"

Doc = dict[str, Any]
Event = dict[str, Any]

# current category -> what PyTorch 1.9 wrote (None: not written then)
PT19_CATEGORIES: dict[str, str | None] = {
    "cpu_op": "Operator",
    "user_annotation": "Operator",
    "cuda_runtime": "Runtime",
    "cuda_driver": "Runtime",  # Kineto recorded runtime calls only; kept so their kernels keep a launch
    "kernel": "Kernel",
    "gpu_memcpy": "Memcpy",
    "gpu_memset": "Memset",
    "Trace": "Trace",
    "python_function": None,  # the Python tracer came with PyTorch 1.11 (1.9: "Call stack" on ops)
    "gpu_user_annotation": None,
}
OPERATOR_ARGS = ("External id", "Input Dims", "Input type", "Sequence number", "Fwd thread id")
RUNTIME_ARGS = ("cbid", "correlation")
MEMORY_ARGS = ("Device Type", "Device Id", "Bytes")
# deviceProperties as Kineto wrote them from May 2021, and the older computeProperties (cudaDeviceProp's
# own names) of the TensorBoard plugin's test traces
DEVICE_KEYS = (
    "id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "maxThreadsPerBlock",
    "maxThreadsPerMultiprocessor", "regsPerBlock", "regsPerMultiprocessor", "warpSize", "sharedMemPerBlock",
    "sharedMemPerMultiprocessor", "numSms", "sharedMemPerBlockOptin",
)  # fmt: skip
COMPUTE_PROPERTIES = {
    "computeMajor": "major",
    "computeMinor": "minor",
    "numSms": "multiProcessorCount",
    "maxThreadsPerMultiprocessor": "maxThreadsPerMultiProcessor",
}


def read(path: Path) -> Doc:
    with gzip.open(path, "rt") as f:
        doc: Doc = json.load(f)
    return doc


def write(doc: Doc, path: Path) -> int:
    """The document gzipped, byte for byte the same on every run; returns its size."""
    data = json.dumps(doc, separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return path.stat().st_size


def as_pytorch_1_9(doc: Doc, properties: str = "deviceProperties") -> Doc:
    """The trace as PyTorch 1.9 wrote it (see the module's docstring); `properties`: the top-level key
    of the device properties, "deviceProperties" or "computeProperties"."""
    base_us = int(doc.get("baseTimeNanoseconds", 0)) // 1000
    events = [e for e in (_pt19_event(e, base_us) for e in doc["traceEvents"]) if e is not None]
    devices = [{k: d[k] for k in DEVICE_KEYS if k in d} for d in doc.get("deviceProperties", [])]
    if properties == "computeProperties":
        devices = [{COMPUTE_PROPERTIES.get(k, k): v for k, v in d.items()} for d in devices]
    return {"schemaVersion": 1, properties: devices, "traceEvents": events}


def _pt19_event(e: Event, base_us: int) -> Event | None:
    ph = e.get("ph")
    if ph == "M":
        return {**e, "ts": round(e.get("ts", 0) + base_us)}
    if ph in ("i", "I") and e.get("name") == "[memory]":
        args = {k: e["args"][k] for k in MEMORY_ARGS if k in e.get("args", {})}
        ts = round(e["ts"] + base_us)
        return {
            "ph": "i",
            "s": "t",
            "name": "[memory]",
            "pid": e["pid"],
            "tid": e["tid"],
            "ts": ts,
            "args": args,
        }
    cat = PT19_CATEGORIES.get(str(e.get("cat")))
    if ph != "X" or cat is None:
        return None  # flow events ("ac2g", "fwdbwd": gpudoctor links by ids), and what 1.9 did not write
    start, end = round(e["ts"] + base_us), round(e["ts"] + e.get("dur", 0) + base_us)
    out = {"ph": "X", "cat": cat, "name": e["name"], "pid": e["pid"], "tid": e["tid"], "ts": start}
    out["dur"] = end - start
    args = e.get("args", {})
    if cat == "Operator":
        out["tid"] = str(e["tid"])
        kept = {k: args[k] for k in OPERATOR_ARGS if k in args}
        out["args"] = {"Device": e["pid"], **kept, "Trace name": "PyTorch Profiler", "Trace iteration": 0}
    elif cat == "Runtime":
        out["tid"] = str(e["tid"])
        out["args"] = {
            **{k: args[k] for k in RUNTIME_ARGS if k in args},
            "external id": args.get("External id", 0),
        }
    elif cat in ("Kernel", "Memcpy", "Memset"):
        out["tid"] = f"stream {e['tid']}"
        out["args"] = {("external id" if k == "External id" else k): v for k, v in args.items()}
    else:  # the profiler's own span
        out["pid"], out["tid"] = "Traces", "PyTorch Profiler"
        out["name"], out["args"] = "PyTorch Profiler (0)", {"Op count": 0}
    return out


def first_steps(doc: Doc, keep: int) -> Doc:
    """A PyTorch 1.9 trace cut after its first `keep` steps: host events that start before the last
    kept step ends, and the GPU activity they launched."""
    steps = sorted(
        (e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )
    cut = steps[keep - 1]["ts"] + steps[keep - 1]["dur"]
    gpu_cats = ("Kernel", "Memcpy", "Memset")
    host = [e for e in doc["traceEvents"] if e.get("cat") not in gpu_cats and e.get("ts", 0) < cut]
    launched = {e["args"]["correlation"] for e in host if e.get("cat") == "Runtime"}
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in gpu_cats and e["args"]["correlation"] in launched]
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": host + gpu}


# ---- a warm-up step ------------------------------------------------------------------------------

ID_OFFSET = 100_000_000  # the copied step's correlation and External ids: clear of the trace's own
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
AUTOTUNE_KERNELS = 50
ALLOCATOR_CALLS = 100


def with_warmup(doc: Doc, factor: float = 20.0) -> Doc:
    """The trace with a step before its first, `factor` times the median step: the first step's work
    copied, after a warm-up phase of cudnn autotuning kernels (the GPU busy) and cudaMalloc/cudaFree
    calls (the host in the allocator)."""
    events = _launched(doc["traceEvents"])
    marks = sorted((e for e in events if _is_step(e, "user_annotation")), key=lambda e: e["ts"])
    starts = [e["ts"] for e in marks]
    period = statistics.median(b - a for a, b in itertools.pairwise(starts))
    first = marks[0]
    copied = _copy_step(events, first["ts"], starts[1])
    gpu = [e for e in copied if e["cat"] in GPU_CATS]
    # a GPU-bound loop's step is as long as its GPU work, which the host runs ahead of
    period = max(period, max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu))
    main = (first["pid"], first["tid"])
    # the copy ends where the first step begins, its GPU work too (the GPU lags the host)
    lag = max(e["ts"] + e["dur"] for e in copied if e["cat"] in GPU_CATS) - first["ts"]
    gpu_first = min(e["ts"] for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X")
    shift = max(starts[1] - first["ts"], lag - (gpu_first - first["ts"]) + 5.0)
    for e in copied:
        e["ts"] -= shift
    warm_us = factor * period - shift
    begin = first["ts"] - shift - warm_us
    filler = _warmup_phase(begin, warm_us, main, min(e["tid"] for e in events if e.get("cat") == "kernel"))
    number = int(first["name"].split("#")[1]) - 1
    step = {**first, "name": f"ProfilerStep#{number}", "ts": begin, "dur": first["ts"] - begin - 1.0}
    step["args"] = {"External id": ID_OFFSET - 1}
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    # flow events left out: gpudoctor links by ids, and the file stays small
    kept = [e for e in events if e.get("ph") == "M" or e.get("cat") in (*HOST_CATS, *GPU_CATS, "Trace")]
    out["traceEvents"] = [*kept, step, *filler, *copied]
    return out


def _launched(events: list[Event]) -> list[Event]:
    """The events less the GPU activity whose launch the trace does not hold: work queued before the
    profiler started recording, which runs at the start of the first step; after a step before it, it
    would run inside that step instead."""
    launches = {
        e["args"].get("correlation") for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
    }
    return [e for e in events if e.get("cat") not in GPU_CATS or e["args"].get("correlation") in launches]


def _is_step(e: Event, cat: str) -> bool:
    return e.get("cat") == cat and str(e.get("name", "")).startswith("ProfilerStep#")


def _copy_step(events: list[Event], start: float, end: float) -> list[Event]:
    """The host events that start inside [start, end) (not the step's own mark) and the GPU activity
    they launched, copied with new ids."""
    host = [
        e for e in events
        if e.get("ph") == "X" and e.get("cat") in HOST_CATS and start <= e["ts"] < end
        and not _is_step(e, "user_annotation")
    ]  # fmt: skip
    launched = {e["args"]["correlation"] for e in host if "correlation" in e.get("args", {})}
    gpu = [
        e for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS and e["args"].get("correlation") in launched
    ]  # fmt: skip
    copies = copy.deepcopy(host + gpu)
    for e in copies:
        for key in ("correlation", "External id"):
            if isinstance(e["args"].get(key), int) and e["args"][key] >= 0:
                e["args"][key] += ID_OFFSET
    return copies


def _warmup_phase(begin: float, length: float, main: tuple[int, int], stream: int) -> list[Event]:
    """cudnn's benchmark mode trying convolution algorithms (one op launching AUTOTUNE_KERNELS kernels
    that fill 40% of the phase on the GPU), then first allocations (one op making ALLOCATOR_CALLS
    cudaMalloc/cudaFree calls through the rest)."""
    pid, tid = main
    tune = 0.4 * length
    out: list[Event] = []
    ext = ID_OFFSET - 2
    out.append(_host("cpu_op", "aten::cudnn_convolution", begin, tune, pid, tid, {"External id": ext}))
    each = tune / AUTOTUNE_KERNELS
    for i in range(AUTOTUNE_KERNELS):
        corr = ID_OFFSET - 1000 + i
        at = begin + 1.0 + i * 10.0
        out.append(_host("cuda_runtime", "cudaLaunchKernel", at, 5.0, pid, tid, _rt(ext, corr, 211)))
        kernel = _host("kernel", "implicit_convolve_sgemm<float, float, 128, 6, 7, 3, 3, 5, 1, false, false, true>",
                       begin + 2.0 + i * each, each - 1.0, 0, stream, {})  # fmt: skip
        kernel["args"] = {"device": 0, "stream": stream, "correlation": corr, "External id": ext}
        out.append(kernel)
    ext -= 1
    alloc_begin = begin + tune
    out.append(
        _host(
            "cpu_op", "aten::empty_strided", alloc_begin, length - tune - 2.0, pid, tid, {"External id": ext}
        )
    )
    each = (length - tune - 4.0) / ALLOCATOR_CALLS
    for i in range(ALLOCATOR_CALLS):
        name = "cudaMalloc" if i % 5 < 3 else "cudaFree"
        corr = ID_OFFSET - 2000 + i
        at = alloc_begin + 1.0 + i * each
        out.append(
            _host(
                "cuda_runtime",
                name,
                at,
                each - 1.0,
                pid,
                tid,
                _rt(ext, corr, 20 if name == "cudaMalloc" else 22),
            )
        )
    return out


def _host(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, args: dict[str, Any]) -> Event:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _rt(external_id: int, correlation: int, cbid: int) -> dict[str, Any]:
    return {"External id": external_id, "cbid": cbid, "correlation": correlation}


# ---- a toy trace ---------------------------------------------------------------------------------


def toy_four_kernels() -> Doc:
    """Four additions on one GPU, one kernel each, as torch.profiler records them outside any loop."""
    events: list[Event] = []
    pid, tid, stream = 4100, 4100, 7
    kernel = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>"
    t = 1000.0
    for i, length in enumerate((3.0, 12.0, 41.0, 92.0)):
        ext, corr = 10 + i, 500 + i
        events.append(_host("cpu_op", "aten::add", t, 30.0, pid, tid, {"External id": ext}))
        events.append(_host("cuda_runtime", "cudaLaunchKernel", t + 8.0, 14.0, pid, tid, _rt(ext, corr, 211)))
        gpu = _host("kernel", kernel, t + 30.0, length, 0, stream, {})
        gpu["args"] = {"device": 0, "stream": stream, "correlation": corr, "External id": ext,
                       "grid": [4, 1, 1], "block": [128, 1, 1]}  # fmt: skip
        events.append(gpu)
        t += 60.0 + length
    props = read(FIXTURES / "traces" / "sync_every_step.json.gz")["deviceProperties"][:1]
    return {"schemaVersion": 1, "deviceProperties": props, "traceEvents": events}


def make(out: Path) -> dict[str, int]:
    """Write every fixture into `out`; returns each file's size."""
    out.mkdir(parents=True, exist_ok=True)
    pt19 = as_pytorch_1_9(read(FIXTURES / "traces" / "sync_every_step_stack.json.gz"))
    two = first_steps(
        as_pytorch_1_9(read(FIXTURES / "traces" / "sync_every_step_stack.json.gz"), "computeProperties"), 2
    )
    made = {
        "pt19_sync_every_step.json.gz": pt19,
        "pt19_two_steps.json.gz": two,
        "warmup_first_step.json.gz": with_warmup(read(FIXTURES / "zoo" / "control_cnn.json.gz")),
        "toy_four_kernels.json.gz": toy_four_kernels(),
    }
    return {name: write(doc, out / name) for name, doc in made.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, nargs="?", default=OUT)
    for name, size in make(p.parse_args().out).items():
        print(f"{name}: {size:,} bytes")


if __name__ == "__main__":
    main()
