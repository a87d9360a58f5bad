"""What the analyses find on real traces recorded on an H200 (tests/fixtures/traces, recorded by
tools/record_fixtures.py), and the invariants every breakdown keeps."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudoctor.analysis.intervals import Disjoint
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.trace import Kind, load_trace
from gpudoctor.trace.links import _parents

TRACES = Path(__file__).parent / "fixtures" / "traces"
FIXTURES = sorted(p.name.removesuffix(".json.gz") for p in TRACES.glob("*.json.gz"))


@functools.cache
def analysis(name: str) -> Analysis:
    return analyze(load_trace(TRACES / f"{name}.json.gz"))


@pytest.mark.parametrize("name", FIXTURES)
def test_breakdowns_add_up(name: str) -> None:
    a = analysis(name)
    assert [s.number for s in a.steps] == [3, 4, 5]
    for b in [s.gpu for s in a.steps] + [a.timeline.profiled_steps, a.timeline.gpu_window]:
        assert b is not None
        assert math.isclose(sum(b.busy_by_kind_us.values()), b.busy_us, rel_tol=1e-9, abs_tol=1e-6)
        assert math.isclose(sum(b.idle_by_cause_us.values()), b.idle_us, rel_tol=1e-6, abs_tol=1e-3)
        assert 0 < b.busy_fraction <= 1
        assert 0 <= b.host_wait_after_sync_us <= b.idle_by_cause_us["host_wait"] + 1e-6
    # Steps are the ProfilerStep spans; the profiler's own bookkeeping between them is in no step.
    total = a.timeline.profiled_steps
    assert sum(s.gpu.window_us for s in a.steps) <= total.window_us
    assert sum(s.gpu.busy_us for s in a.steps) <= total.busy_us + 1e-6


@pytest.mark.parametrize("name", FIXTURES)
def test_json_round_trip(name: str) -> None:
    a = analysis(name)
    assert Analysis.from_json(a.to_json()).to_json() == a.to_json()


def test_dataloader_bound_waits_on_the_host_inside_the_dataloader() -> None:
    a = analysis("dataloader_bound")
    assert a.window.busy_fraction < 0.15
    assert a.window.idle_by_cause_us["host_wait"] > 0.9 * a.window.idle_us
    for step in a.steps:
        assert step.cpu.dataloader_us > 0.7 * step.duration_us


def test_sync_every_step_names_the_calls_ops_and_source() -> None:
    a = analysis("sync_every_step_stack")
    assert a.syncs.per_step == pytest.approx(4.0)
    calls = {(s.call, s.op) for s in a.syncs.sites}
    assert ("cudaStreamSynchronize", "aten::item") in calls
    assert ("cudaDeviceSynchronize", None) in calls
    assert all(s.source and "sync_every_step.py" in s.source for s in a.syncs.sites)
    # the GPU waits for each sync's round trip, then for the host to refill the drained queue
    assert a.window.idle_by_cause_us["sync"] > 0
    assert a.window.host_wait_after_sync_us > 0.5 * a.window.idle_by_cause_us["host_wait"]
    assert a.memory is not None and a.memory.peak_allocated > 0
    assert all(m.allocations > 0 for m in a.memory.steps)
    assert a.memory.capacity and a.memory.peak_allocated < a.memory.capacity


def test_sync_sources_need_stacks() -> None:
    assert all(s.source is None for s in analysis("sync_every_step").syncs.sites)


def test_inference_copies_from_pageable_memory_and_blocks() -> None:
    a = analysis("inference")
    h2d, d2h = a.transfers.get("h2d"), a.transfers.get("d2h")
    assert h2d and d2h
    assert h2d.pageable_count == h2d.count == 3
    assert d2h.blocking_count == d2h.count
    assert h2d.bandwidth and 1e9 < h2d.bandwidth < 100e9
    assert a.window.busy_by_kind_us["memcpy_h2d"] > 0.2 * a.window.busy_us


def test_fp32_mlp_runs_without_tensor_cores_and_bf16_models_with_them() -> None:
    assert analysis("sync_every_step").kernels.tensor_core_share == 0.0
    assert analysis("transformer_train").kernels.tensor_core_share == pytest.approx(1.0)
    conv = analysis("conv_bf16_train").kernels
    assert conv.tensor_core_share == pytest.approx(1.0)
    assert any(k.category == "layout" for k in conv.top), "NCHW convolutions convert layouts"


def test_kernel_table_is_sorted_and_consistent() -> None:
    k = analysis("conv_bf16_train").kernels
    totals = [s.total_us for s in k.top]
    assert totals == sorted(totals, reverse=True)
    assert sum(s.calls for s in k.top) <= k.count
    assert all(s.mean_us * s.calls == pytest.approx(s.total_us) for s in k.top)
    assert 0 < k.short_count_share < 1 and k.launch_delay_us and k.launch_delay_us.p50 > 0


def test_ops_gpu_time_rolls_up_to_the_outer_op() -> None:
    ops = {o.name: o for o in analysis("transformer_train").ops}
    linear = ops.get("aten::linear")
    assert linear is not None and linear.gpu_self_us == 0 < linear.gpu_total_us
    assert all(o.cpu_self_us <= o.cpu_total_us + 1e-6 for o in ops.values())


def test_one_step_selected() -> None:
    a = analyze(load_trace(TRACES / "conv_bf16_train.json.gz"), step=4)
    assert [s.number for s in a.steps] == [4] and a.selected_step == 4


# ---- the primitives, against brute force --------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 20)), min_size=0, max_size=30),
    st.floats(-10, 130),
    st.floats(0, 50),
)
def test_disjoint_covered_matches_a_fine_grid(
    spans: list[tuple[float, float]], a: float, width: float
) -> None:
    start = np.array([s for s, _ in spans])
    end = np.array([s + d for s, d in spans])
    d = Disjoint.of(start, end)
    b = a + width
    grid = np.linspace(a, b, 4001)[:-1] + width / 8000
    inside = np.zeros(len(grid), dtype=bool)
    for s, e in zip(start, end, strict=True):
        inside |= (grid >= s) & (grid < e)
    expected = inside.mean() * width
    assert float(d.covered(np.array([a]), np.array([b]))[0]) == pytest.approx(
        expected, abs=width / 1000 + 1e-9
    )


def _stack_parents(ts: list[float], end: list[float], thread: list[int]) -> list[int]:
    order = sorted(range(len(ts)), key=lambda i: (thread[i], ts[i], -(end[i] - ts[i])))
    parent = [-1] * len(ts)
    stack: list[int] = []
    last = None
    for i in order:
        if thread[i] != last:
            stack, last = [], thread[i]
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


@pytest.mark.parametrize("name", ["sync_every_step_stack", "conv_bf16_train"])
@pytest.mark.parametrize(
    "kinds", [(Kind.CPU_OP,), (Kind.PYTHON,), (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME)]
)
def test_vectorized_nesting_matches_a_stack_sweep(name: str, kinds: tuple[Kind, ...]) -> None:
    trace = load_trace(TRACES / f"{name}.json.gz")
    rows = trace.rows(*kinds)
    got = _parents(trace, rows)
    ts, end = trace.ts[rows], trace.ts[rows] + trace.dur[rows]
    expected = _stack_parents(ts.tolist(), end.tolist(), (trace.tid[rows] * 7 + trace.pid[rows]).tolist())
    assert got.tolist() == expected
