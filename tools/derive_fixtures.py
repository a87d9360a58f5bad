"""Derive test fixtures from recorded traces where no GPU of the kind is at hand (deterministic; no GPU).

  v100       an H100/H200 float32 trace (tests/fixtures/traces) as a V100 (sm_70) writes it: the device
             properties of a Tesla V100-SXM2-16GB, blocks and warps per SM for its 80 SMs, and the kernels
             named as cuDNN and cuBLAS name them on Volta (`volta_scudnn_*`, `dgrad_engine<float, …>`,
             `wgrad_alg0_engine<float, …>`, `volta_sgemm_*`, Winograd transforms for the layout passes a
             float32 convolution does not make there). Timings, ops and launches stay as recorded.
  slow-host  a with-stack trace as a slower host and a busier GPU would record it: host time stretched by
             --host-scale, each GPU activity's duration by --gpu-scale (kept in order on its stream), so that
             what the profiler records per step stays the same while the traced step and the GPU's work grow.

    python tools/derive_fixtures.py v100 tests/fixtures/traces/inference.json.gz tests/fixtures/v100/inference_v100.json.gz
    python tools/derive_fixtures.py slow-host tests/fixtures/profiler_cost/gpt2_compiled__stack_shapes.json.gz \\
        tests/fixtures/profiler_cost/derived/gpt2_compiled_slow_host__stack_shapes.json.gz --host-scale 1.35 --gpu-scale 1.68
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

V100 = {
    "id": 0,
    "name": "Tesla V100-SXM2-16GB",
    "totalGlobalMem": 16945512448,
    "computeMajor": 7,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 98304,
    "numSms": 80,
    "sharedMemPerBlockOptin": 98304,
}
# cuDNN's float32 kernels on Volta, by the direction of the convolution (real names, cuDNN 7/8 on V100).
FPROP = (
    "volta_scudnn_128x64_relu_interior_nn_v1",
    "volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1",
    "volta_sgemm_128x64_nn",  # cuDNN's GEMM algorithm: named as a matmul, launched by the convolution
    "volta_scudnn_128x128_relu_small_nn_v1",
    "volta_scudnn_128x64_relu_medium_nn_v1",
    "volta_scudnn_128x32_relu_interior_nn_v1",
)
DGRAD = (
    "void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*, int, "
    "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, "
    "int, int, int)",
    "volta_scudnn_128x64_stridedB_small_nn_v1",
)
WGRAD = (
    "void cudnn::detail::wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>(int, int, int, float "
    "const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)",
    "volta_scudnn_128x128_stridedB_splitK_small_nn_v1",
)
WINOGRAD = {
    ("fwd", "in"): "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"
    "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
    ("fwd", "out"): "void cudnn::winograd_nonfused::winogradForwardOutput4x4<float, float>"
    "(cudnn::winograd_nonfused::WinogradOutputParams<float, float>)",
    ("bwd", "in"): "void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>"
    "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
    ("bwd", "out"): "void cudnn::winograd_nonfused::winogradWgradOutput4x4<float, float>"
    "(cudnn::winograd_nonfused::WinogradWgradOutputParams<float, float>)",
}
CUDNN_OTHER = "void cudnn::ops::scalePackedTensor_kernel<float, float>(cudnnTensor4dStruct, float*, float)"
SGEMM = ("volta_sgemm_64x64_nn", "volta_sgemm_32x32_sliced1x4_nt", "volta_sgemm_128x64_nt")
# What Ampere/Hopper kernels say of their architecture: none may stay in a V100 trace.
NEWER = re.compile(r"sm[89]\d_|sm1\d\d_|ampere|hopper|cutlass_80|nvjet|xmma|cask|tf32|_80_|bf16", re.I)
CONV_OP = re.compile(r"^aten::\w*conv(?!ert)")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def save(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as fh:
        fh.write(json.dumps(doc, separators=(",", ":")).encode())


def launching_ops(events: list[dict[str, Any]]) -> dict[int, str]:
    """Kernel correlation id → the name of the op that launched it (its External id, or its launch's)."""
    ops = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") == "cpu_op" and "args" in e}
    launch_ext = {
        e["args"]["correlation"]: e["args"].get("External id")
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    out = {}
    for e in events:
        if e.get("cat") == "kernel":
            args = e["args"]
            ext = args.get("External id") or launch_ext.get(args.get("correlation"))
            out[args.get("correlation")] = ops.get(ext, "")
    return out


def volta_name(name: str, op: str, picks: dict[str, str]) -> str:
    """The name this kernel has on a V100; the same original name gets the same Volta name."""
    if not CONV_OP.match(op):
        if NEWER.search(name) or "sgemm" in name:
            return picks.setdefault(name, SGEMM[len([v for v in picks.values() if v in SGEMM]) % len(SGEMM)])
        return name
    side = "bwd" if "backward" in op else "fwd"
    if re.search(r"nchwToNhwc|nhwcToNchw", name):
        return WINOGRAD[(side, "in" if "nchwToNhwc" in name else "out")]
    family = FPROP if side == "fwd" else DGRAD if "dgrad" in name else WGRAD if "wgrad" in name else None
    if family is None:
        return CUDNN_OTHER if NEWER.search(name) else name
    if name not in picks:
        used = sum(1 for v in picks.values() if v in family)
        picks[name] = family[used % len(family)]
    return picks[name]


def as_v100(doc: dict[str, Any]) -> dict[str, Any]:
    events = doc["traceEvents"]
    ops = launching_ops(events)
    picks: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        args = e["args"]
        e["name"] = volta_name(e["name"], ops.get(args.get("correlation"), ""), picks)
        grid, block = args.get("grid"), args.get("block")
        if grid and block:
            blocks = math.prod(grid)
            args["blocks per SM"] = round(blocks / V100["numSms"], 6)
            args["warps per SM"] = round(blocks * math.ceil(math.prod(block) / 32) / V100["numSms"], 6)
    left = {e["name"] for e in events if e.get("cat") == "kernel" and NEWER.search(e["name"])}
    if left:
        raise SystemExit(f"kernels still named for a newer GPU: {sorted(left)[:5]}")
    doc["deviceProperties"] = [dict(V100)]
    return doc


def slow_host(doc: dict[str, Any], host_scale: float, gpu_scale: float) -> dict[str, Any]:
    """Every timestamp stretched by `host_scale` from the trace's start; GPU activities' durations by
    `gpu_scale`, each starting no earlier than the one before it on its stream ends."""
    events = doc["traceEvents"]
    t0 = min(float(e["ts"]) for e in events if "ts" in e)
    for e in events:
        if "ts" not in e:
            continue
        e["ts"] = t0 + (float(e["ts"]) - t0) * host_scale
        if "dur" in e:
            e["dur"] = float(e["dur"]) * (gpu_scale if e.get("cat") in GPU_CATS else host_scale)
    free: dict[tuple[Any, Any], float] = {}
    for e in sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"]):
        lane = (e.get("pid"), e.get("tid"))
        e["ts"] = max(e["ts"], free.get(lane, -math.inf))
        free[lane] = e["ts"] + e["dur"]
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("v100", "slow-host"))
    p.add_argument("source", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--host-scale", type=float, default=1.35)
    p.add_argument("--gpu-scale", type=float, default=1.68)
    args = p.parse_args(argv)
    doc = load(args.source)
    doc = as_v100(doc) if args.what == "v100" else slow_host(doc, args.host_scale, args.gpu_scale)
    save(doc, args.dest)
    print(f"wrote {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
