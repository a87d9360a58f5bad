"""The step broken down as TensorBoard's PyTorch profiler plugin did it (Kernel, Memcpy, Memset,
Communication, Runtime, DataLoader, CPU Exec, Other: each moment to the first that is happening), and the
kernels' estimated SM efficiency and achieved occupancy per step (analysis.step_breakdown); in the terminal
and HTML reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from gpudoctor.analysis.step_breakdown import ROLES
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.report.html import render_html
from gpudoctor.report.terminal import render_analysis
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace
from gpudoctor.trace.model import Kind

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = {
    "conv_bf16_train": FIXTURES / "traces" / "conv_bf16_train.json.gz",
    "dataloader_bound": FIXTURES / "traces" / "dataloader_bound.json.gz",
    "ddp rank0": FIXTURES / "ddp" / "rank0.json.gz",
    "gpt2 with_stack": FIXTURES / "profiler_cost" / "gpt2_compiled__stack_shapes.json.gz",
}


def _kernel(ts: float, dur: float, corr: int, stream: int, bps: float, occ: float, warps: float) -> dict:
    args = {"device": 0, "stream": stream, "correlation": corr, "External id": 2, "blocks per SM": bps,
            "est. achieved occupancy %": occ, "warps per SM": warps, "grid": [64, 1, 1], "block": [128, 1, 1]}  # fmt: skip
    return {"ph": "X", "cat": "kernel", "name": f"kernel_{corr}", "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def _handmade() -> dict:
    """One 1000 µs step: the DataLoader 0–200, an op 200–500 that launches two overlapping kernels
    (300–700 at 0.5 blocks per SM, 50% occupancy, 4 warps; 500–800 at 0.75, 100%, 8) and a copy (650–850)."""

    def host(cat: str, name: str, ts: float, dur: float, **args: int) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    events = [
        host("user_annotation", "ProfilerStep#1", 0, 1000),
        host("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 200, **{"External id": 1}),
        host("cpu_op", "aten::mm", 200, 300, **{"External id": 2}),
        host("cuda_runtime", "cudaLaunchKernel", 250, 50, correlation=10, **{"External id": 2}),
        host("cuda_runtime", "cudaLaunchKernel", 320, 30, correlation=11, **{"External id": 2}),
        host("cuda_runtime", "cudaMemcpyAsync", 400, 20, correlation=12, **{"External id": 2}),
        _kernel(300, 400, 10, 7, 0.5, 50, 4),
        _kernel(500, 300, 11, 8, 0.75, 100, 8),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7,
         "ts": 650, "dur": 200, "args": {"device": 0, "stream": 7, "correlation": 12, "bytes": 1 << 20}},
    ]  # fmt: skip
    return {"schemaVersion": 1, "traceEvents": events}


def test_each_moment_goes_to_the_first_role_happening(tmp_path: Path) -> None:
    # GIVEN the handmade step (its window is 0–1000 µs: the host ends last)
    path = tmp_path / "step.json"
    path.write_text(json.dumps(_handmade()))
    b = analyze(load_trace(path)).step_breakdown
    assert b is not None and len(b.steps) == 1
    s = b.steps[0]
    # THEN kernels 300–800; the copy only where no kernel runs (800–850); runtime calls only outside GPU
    # work (250–300); the DataLoader 0–200; the op where nothing above is (200–250); Other the rest
    assert s.roles_us == pytest.approx({
        "kernel": 500, "memcpy": 50, "memset": 0, "communication": 0, "runtime": 50, "dataloader": 200,
        "cpu_exec": 50, "other": 150,
    })  # fmt: skip
    e = b.efficiency[0]
    # AND SM efficiency: 0.5 (300–500), 1.25 capped to 1 (500–700), 0.75 (700–800) over the 1000 µs step
    assert e.sm_efficiency_pct == pytest.approx(37.5)
    # AND occupancy and warps per SM weighted by kernel time
    assert e.occupancy_pct == pytest.approx((50 * 400 + 100 * 300) / 700)
    assert e.warps_per_sm == pytest.approx((4 * 400 + 8 * 300) / 700)
    assert (e.kernel_us, e.estimated_us, e.occupancy_us) == (700, 700, 700)


@pytest.fixture(scope="module", params=sorted(RECORDED))
def recorded(request: pytest.FixtureRequest) -> Analysis:
    return analyze(load_trace(RECORDED[request.param]))


def test_the_parts_add_to_the_step_and_the_gpu_parts_to_its_busy_time(recorded: Analysis) -> None:
    b = recorded.step_breakdown
    assert b is not None and len(b.steps) == len(recorded.steps)
    for s, summary in zip(b.steps, recorded.steps, strict=True):
        assert s.number == summary.number and s.duration_us == pytest.approx(summary.duration_us)
        assert all(s.roles_us[r] >= 0 for r in ROLES)
        assert sum(s.roles_us.values()) == pytest.approx(s.duration_us, rel=1e-9)
        # the GPU's parts come first: kernels, copies and memsets are its busy time but for collectives,
        # which share their part with the host's communication ops
        assert summary.gpu is not None
        busy, comm = summary.gpu.busy_us, s.roles_us["communication"]
        gpu = s.roles_us["kernel"] + s.roles_us["memcpy"] + s.roles_us["memset"]
        assert gpu <= busy + 0.01 and gpu + comm >= busy - 0.01
        if comm == 0:
            assert gpu == pytest.approx(busy, rel=1e-6, abs=0.01)


def test_sm_efficiency_and_occupancy_are_bounded_by_what_the_kernels_carry(recorded: Analysis) -> None:
    b = recorded.step_breakdown
    assert b is not None
    for e, summary in zip(b.efficiency, recorded.steps, strict=True):
        assert e.sm_efficiency_pct is not None and e.occupancy_pct is not None
        assert summary.gpu is not None
        assert 0 < e.sm_efficiency_pct <= 100 * summary.gpu.busy_fraction + 1e-6
        assert 0 < e.occupancy_pct <= 100


def test_the_occupancy_is_kineto_s_estimate_weighted_by_kernel_time() -> None:
    trace = load_trace(RECORDED["conv_bf16_train"])
    a = analyze(trace)
    assert a.step_breakdown is not None
    step, eff = a.steps[0], a.step_breakdown.efficiency[0]
    window = a.step_breakdown.steps[0]
    k = trace.rows(Kind.KERNEL)
    start, end = trace.ts[k], trace.ts[k] + trace.dur[k]
    lo = a.timeline.steps[0].start_us
    inside = np.clip(np.minimum(end, lo + window.duration_us) - np.maximum(start, lo), 0, None)
    occ = trace.occupancy[k].astype(float)
    ok = ~np.isnan(occ) & (inside > 0)  # as the plugin: a kernel that carries 0 counts
    assert step.number == eff.number
    assert eff.occupancy_pct == pytest.approx(float(np.average(occ[ok], weights=inside[ok])))


def test_the_dataloader_part_is_the_loaders_time_the_gpu_does_not_cover() -> None:
    a = analyze(load_trace(RECORDED["dataloader_bound"]))
    assert a.step_breakdown is not None
    for s, summary in zip(a.step_breakdown.steps, a.steps, strict=True):
        assert (
            0.95 * summary.cpu.dataloader_us <= s.roles_us["dataloader"] <= summary.cpu.dataloader_us + 1e-6
        )
        assert s.roles_us["dataloader"] > 0.85 * s.duration_us


def test_an_analysis_keeps_its_breakdown_through_json() -> None:
    a = analyze(load_trace(RECORDED["conv_bf16_train"]))
    again = Analysis.from_json(json.loads(json.dumps(a.to_json())))
    assert again.step_breakdown == a.step_breakdown


def test_without_steps_the_traced_time_is_broken_down_as_one(tmp_path: Path) -> None:
    # GIVEN the handmade step without its ProfilerStep#1 annotation and its DataLoader call: no steps
    doc = _handmade()
    doc["traceEvents"] = doc["traceEvents"][2:]
    path = tmp_path / "no_steps.json"
    path.write_text(json.dumps(doc))
    a = analyze(load_trace(path))
    assert not a.steps and a.step_breakdown is not None
    # THEN the traced time as gpudoctor reads it without steps (first launch to last GPU activity,
    # 250–850 µs) is broken down as one, numbered 0
    (whole,) = a.step_breakdown.steps
    assert whole.number == 0 and whole.duration_us == pytest.approx(600)
    assert whole.roles_us == pytest.approx({
        "kernel": 500, "memcpy": 50, "memset": 0, "communication": 0, "runtime": 50, "dataloader": 0,
        "cpu_exec": 0, "other": 0,
    })  # fmt: skip


def test_the_breakdown_and_the_efficiency_summary_are_in_the_terminal_and_html_reports() -> None:
    a = analyze(load_trace(RECORDED["conv_bf16_train"]))
    d = diagnose(a)
    console = Console(record=True, width=140)
    render_analysis(a, console, diagnosis=d)
    text = console.export_text()
    html = render_html(a, d)
    b = a.step_breakdown
    assert b is not None
    kernel_share = f"{100 * b.mean_us['kernel'] / b.mean_step_us:.1f}%"
    sm = f"{b.mean_sm_efficiency_pct:.0f}%"
    for out in (text, html):
        assert "Step breakdown" in out and "CPU Exec" in out and "Runtime" in out and "Other" in out
        assert "est. SM efficiency" in out and "est. achieved occupancy" in out
        assert kernel_share in out and sm in out
