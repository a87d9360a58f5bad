"""Planted causes first on marker-less traces of loops the zoo's recordings do not cover (crafted here, as
torch.profiler writes them without prof.step()): a loop of tiny launch-bound ops, whose inferred iteration
is a single op, comes out `launch_overhead` (not `unfused_elementwise`); a loop that reads a metric back
every step comes out `host_sync` (its `.item()`), not the Python that the sync leaves exposed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudoctor.analysis.summary import analyze
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace

MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, MulFunctor<float> > >(int)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


class _Trace:
    """Kineto events on one host thread and one stream; the GPU runs each piece of work when both its
    launch has happened and the previous piece is done."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0
        self.gpu_free = 0.0

    def op(self, name: str, ts: float, dur: float) -> int:
        self.corr += 1
        self.events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
             "args": {"External id": self.corr}}
        )  # fmt: skip
        return self.corr

    def launch(self, ext: int, call: str, ts: float, gpu_cat: str, gpu_name: str, gpu_us: float) -> float:
        self.corr += 1
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": call, "pid": 1, "tid": 1, "ts": ts, "dur": 4.0,
             "args": {"correlation": self.corr, "External id": ext}}
        )  # fmt: skip
        start = max(self.gpu_free, ts + 6.0)
        self.events.append(
            {"ph": "X", "cat": gpu_cat, "name": gpu_name, "pid": 0, "tid": 7, "ts": start, "dur": gpu_us,
             "args": {"correlation": self.corr, "device": 0, "stream": 7, "bytes": 4, "grid": [264, 1, 1],
                      "block": [128, 1, 1]}}
        )  # fmt: skip
        self.gpu_free = start + gpu_us
        return self.gpu_free

    def write(self, path: Path) -> Path:
        device = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}
        path.write_text(
            json.dumps({"schemaVersion": 1, "deviceProperties": [device], "traceEvents": self.events})
        )
        return path


def test_a_loop_of_tiny_launch_bound_ops_is_launch_overhead_first(tmp_path: Path) -> None:
    # GIVEN 600 identical multiplies, each 2 µs on the GPU and 12 µs of host time, no step markers
    t = _Trace()
    for i in range(600):
        ext = t.op("aten::mul", 12.0 * i, 9.0)
        t.launch(ext, "cudaLaunchKernel", 12.0 * i + 3, "kernel", MUL, 2.0)
    a = analyze(load_trace(t.write(tmp_path / "tiny.json")))
    d = diagnose(a)
    # THEN the iteration inferred is one op, and the GPU's wait for the launches is named first
    assert a.steps_source is not None and a.steps_source.kind == "launch_sequence" and len(a.steps) == 600
    assert d.findings[0].id == "launch_overhead", [(f.id, f.est_saving_pct) for f in d.findings]
    unfused = d.get("unfused_elementwise")
    assert unfused is None or unfused.est_saving_pct < d.findings[0].est_saving_pct


def test_a_loop_reading_a_metric_back_every_step_is_host_sync_first(tmp_path: Path) -> None:
    # GIVEN 6 steps of 30 matmuls, then loss.item() (a copy and a sync that waits for the GPU), then
    # 1.5 ms of Python (logging, the next batch), no step markers
    t = _Trace()
    now = 0.0
    for _ in range(6):
        for _ in range(30):
            ext = t.op("aten::addmm", now, 8.0)
            t.launch(ext, "cudaLaunchKernel", now + 1, "kernel", GEMM, 60.0)
            now += 10.0
        done = t.gpu_free
        item = t.op("aten::item", now, done - now + 30)
        t.launch(item, "cudaMemcpyAsync", now + 2, "gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 2.0)
        t.corr += 1
        t.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
             "ts": now + 7, "dur": t.gpu_free - now + 5, "args": {"correlation": t.corr, "External id": item}}
        )  # fmt: skip
        now = t.gpu_free + 30 + 1500.0
    d = diagnose(analyze(load_trace(t.write(tmp_path / "metric.json"))))
    # THEN the sync is named first: it drains the queue, so the Python after it shows as GPU idle
    assert d.findings[0].id == "host_sync", [(f.id, f.est_saving_pct) for f in d.findings]
    python = d.get("host_python")
    assert python is None or python.est_saving_pct < d.findings[0].est_saving_pct
