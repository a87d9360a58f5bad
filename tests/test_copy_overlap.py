"""`copy_overlap` on crafted traces (its recorded zoo case, H100, is checked in test_zoo.py): pinned copies
that run alone on the compute stream are named with their saving bounded by the compute they could hide
behind; copies already beside compute, pageable copies (pageable_copy's) and tiny copies are not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudoctor.analysis.summary import analyze
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace

MiB = 1 << 20


def _trace(tmp: Path, *, copy_us: float, compute_us: float, side_stream: bool, pinned: bool = True) -> Path:
    """Three ProfilerSteps: a 64 MiB H2D copy and one kernel each. On the compute stream the copy runs
    first and the kernel after it; on a side stream the next step's copy runs beside this kernel."""
    events: list[dict[str, Any]] = []
    corr = 0
    t = 0.0
    step = copy_us + compute_us if not side_stream else max(copy_us, compute_us)
    kind = "Pinned" if pinned else "Pageable"

    def launch(name: str, at: float) -> int:
        nonlocal corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": at,
                       "dur": 5.0, "args": {"correlation": corr, "External id": corr}})  # fmt: skip
        return corr

    for n in range(3):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                       "ts": t, "dur": step})  # fmt: skip
        c = launch("cudaMemcpyAsync", t + 1)
        copy_at = t + 10 if not side_stream else t + 10 + (compute_us if n == 0 else 0)
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy HtoD ({kind} -> Device)", "pid": 0,
                       "tid": 20 if side_stream else 7, "ts": copy_at, "dur": copy_us,
                       "args": {"correlation": c, "device": 0, "stream": 20 if side_stream else 7,
                                "bytes": 64 * MiB}})  # fmt: skip
        k = launch("cudaLaunchKernel", t + 2)
        kernel_at = t + 10 + (copy_us if not side_stream else 0)
        events.append({"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm_bf16_128x128", "pid": 0,
                       "tid": 7, "ts": kernel_at, "dur": compute_us,
                       "args": {"correlation": k, "device": 0, "stream": 7, "grid": [264, 1, 1],
                                "block": [128, 1, 1]}})  # fmt: skip
        t += step + 10
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
           "traceEvents": events}  # fmt: skip
    path = tmp / "copies.json"
    path.write_text(json.dumps(doc))
    return path


def test_pinned_copies_alone_on_the_compute_stream_are_named_and_bounded(tmp_path: Path) -> None:
    # GIVEN each step copying for 2 ms and then computing for 4 ms, in order on one stream
    d = diagnose(analyze(load_trace(_trace(tmp_path, copy_us=2000, compute_us=4000, side_stream=False))))
    f = d.get("copy_overlap")
    # THEN the copy's 2 ms could hide behind the 4 ms of compute: about a third of the step
    assert f is not None and d.findings[0].id == "copy_overlap"
    assert 30 <= f.est_saving_pct <= 34
    assert "on a stream that also runs the kernels" in f.evidence[0] and "side stream" in f.evidence[1]
    assert "copy_stream" in f.fix.snippet and "non_blocking=True" in f.fix.snippet


def test_the_saving_is_bounded_by_the_compute_to_hide_behind(tmp_path: Path) -> None:
    # GIVEN copies longer than the compute: overlapped, the step still lasts the copy
    d = diagnose(analyze(load_trace(_trace(tmp_path, copy_us=4000, compute_us=1000, side_stream=False))))
    f = d.get("copy_overlap")
    assert f is not None and f.values["compute_us"] == 1000 and 19 <= f.est_saving_pct <= 21


def test_copies_beside_compute_are_not_a_finding(tmp_path: Path) -> None:
    d = diagnose(analyze(load_trace(_trace(tmp_path, copy_us=2000, compute_us=4000, side_stream=True))))
    assert d.get("copy_overlap") is None


def test_pageable_copies_are_left_to_pageable_copy(tmp_path: Path) -> None:
    path = _trace(tmp_path, copy_us=2000, compute_us=4000, side_stream=False, pinned=False)
    d = diagnose(analyze(load_trace(path)))
    assert d.get("copy_overlap") is None and d.get("pageable_copy") is not None
