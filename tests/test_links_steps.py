"""Links between rows and step detection, on the H200-recorded fixtures: GPU work → the runtime call that
launched it (correlation) → the CPU op around it (External id); the profiled steps follow the recorder's
schedule; Python stacks lead from a sync call back to the user's line. The nesting algorithms are checked
against a plain stack sweep on the fixtures and on random intervals."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TRACE_NAMES, TRACES_DIR
from gpudoctor.trace import Kind, Trace, load_trace
from gpudoctor.trace.links import (
    enclosing_rows,
    gpu_rows_of_launch,
    launch_rows,
    op_parents,
    op_rows,
    python_stack,
    user_frame,
)
from gpudoctor.trace.steps import find_steps

MANIFEST = json.loads((TRACES_DIR / "manifest.json").read_text())["fixtures"]
LAUNCH_NAMES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    return {name: load_trace(TRACES_DIR / f"{name}.json.gz") for name in TRACE_NAMES}


def naive_parents(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The reference: one stack per thread over rows sorted by (thread, start, longest first)."""
    parent = np.full(len(rows), -1, dtype=np.int64)
    ts, dur = trace.ts[rows], trace.dur[rows]
    order = np.lexsort((-dur, ts, trace.tid[rows], trace.pid[rows]))
    stack: list[int] = []
    thread = None
    for k in order.tolist():
        here = (int(trace.pid[rows[k]]), int(trace.tid[rows[k]]))
        if here != thread:
            stack, thread = [], here
        while stack and ts[stack[-1]] + dur[stack[-1]] <= ts[k]:
            stack.pop()
        if stack:
            parent[k] = stack[-1]
        stack.append(k)
    return parent


# ---- correlation and External id ------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_every_kernel_links_to_the_launch_call_that_started_it(name: str, traces) -> None:
    trace = traces[name]
    kernels = trace.rows(Kind.KERNEL)
    launches = launch_rows(trace, kernels)
    linked = launches >= 0
    # Kernels launched before the profiling window opened have no launch in the trace; nothing else
    first_launch = trace.correlation[trace.rows(Kind.RUNTIME, Kind.DRIVER)].clip(min=0)
    first_launch = first_launch[first_launch > 0].min()
    assert np.all(trace.correlation[kernels[~linked]] < first_launch)
    assert linked.mean() > 0.97
    k, call = kernels[linked], launches[linked]
    assert np.all(trace.correlation[call] == trace.correlation[k])
    assert np.all(trace.ts[call] < trace.ts[k]), "a launch starts before its kernel"
    assert np.isin(trace.kind[call], [Kind.RUNTIME, Kind.DRIVER]).all()
    assert {trace.name_of(r) for r in call.tolist()} <= LAUNCH_NAMES
    # and back: the launch call's GPU work is the kernel
    back = gpu_rows_of_launch(trace, call)
    assert np.all(trace.correlation[back] == trace.correlation[k])


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_copies_link_to_their_runtime_call(name: str, traces) -> None:
    trace = traces[name]
    copies = trace.rows(Kind.MEMCPY, Kind.MEMSET)
    calls = launch_rows(trace, copies)
    assert (calls >= 0).mean() > 0.9
    linked = calls[calls >= 0]
    assert np.all(trace.ts[linked] <= trace.ts[copies[calls >= 0]])


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_most_kernels_link_to_the_cpu_op_that_launched_them(name: str, traces) -> None:
    trace = traces[name]
    kernels = trace.rows(Kind.KERNEL)
    ops = op_rows(trace, kernels)
    assert (ops >= 0).mean() > 0.95
    assert np.all(trace.kind[ops[ops >= 0]] == Kind.CPU_OP)
    # the op (by External id) is the innermost op around the launch call
    calls = launch_rows(trace, kernels)
    calls = calls[calls >= 0]
    by_id = op_rows(trace, calls)
    assert np.all(by_id >= 0)
    around = enclosing_rows(trace, trace.rows(Kind.CPU_OP), calls)
    np.testing.assert_array_equal(around, by_id)
    assert np.all(trace.ts[by_id] <= trace.ts[calls])
    assert np.all(trace.ts[by_id] + trace.dur[by_id] >= trace.ts[calls] + trace.dur[calls])


def test_rows_without_ids_link_to_nothing(traces) -> None:
    trace = traces["inference"]
    cpu = trace.rows(Kind.CPU_OP)
    assert np.all(launch_rows(trace, cpu[trace.correlation[cpu] < 0]) == -1)
    assert len(launch_rows(trace, np.empty(0, dtype=np.int64))) == 0


# ---- nesting ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_op_parents_match_a_stack_sweep(name: str, traces) -> None:
    trace = traces[name]
    for kinds in [(Kind.CPU_OP,), (Kind.PYTHON,), (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME)]:
        rows = trace.rows(*kinds)
        parents = op_parents(trace, rows)
        np.testing.assert_array_equal(parents, naive_parents(trace, rows), err_msg=str(kinds))
        child, parent = rows[parents >= 0], rows[parents[parents >= 0]]
        assert np.all(trace.tid[child] == trace.tid[parent])
        assert np.all(trace.ts[parent] <= trace.ts[child])


# (tid, ts, dur), at least 1 µs: a zero-length row at the instant one op ends and the next begins is
# inside both or neither depending on whether intervals are closed or half-open; no spec to hold it to.
OP = st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(1, 15))
QUERY = OP


def interval_trace(path: Path, ops: list[tuple[int, int, int]], queries: list[tuple[int, int, int]]) -> Trace:
    events = [
        {"ph": "X", "cat": cat, "name": f"{cat}{i}", "pid": 1, "tid": tid, "ts": float(ts), "dur": float(dur)}
        for cat, items in [("cpu_op", ops), ("cuda_runtime", queries)]
        for i, (tid, ts, dur) in enumerate(items)
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return load_trace(path)


def brute_enclosing(trace: Trace, candidates: np.ndarray, q: int, outermost: bool) -> int:
    t0, t1 = trace.ts[q], trace.ts[q] + trace.dur[q]
    inside = [
        c
        for c in candidates.tolist()
        if c != q and trace.tid[c] == trace.tid[q] and trace.ts[c] <= t0 and trace.ts[c] + trace.dur[c] >= t1
    ]
    if not inside:
        return -1
    key = [(trace.ts[c], -trace.dur[c], c) for c in inside]
    return inside[key.index(min(key) if outermost else max(key))]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(OP, min_size=1, max_size=25), queries=st.lists(QUERY, min_size=1, max_size=8))
def test_nesting_on_random_intervals(tmp_path_factory, ops, queries) -> None:
    trace = interval_trace(tmp_path_factory.mktemp("nest") / "t.json", ops, queries)
    cpu, calls = trace.rows(Kind.CPU_OP), trace.rows(Kind.RUNTIME)
    np.testing.assert_array_equal(op_parents(trace, cpu), naive_parents(trace, cpu))
    for outermost in (False, True):
        got = enclosing_rows(trace, cpu, calls, outermost=outermost).tolist()
        want = [brute_enclosing(trace, cpu, q, outermost) for q in calls.tolist()]
        assert got == want, f"outermost={outermost}"


# ---- steps --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_steps_follow_the_recorders_schedule(name: str, traces) -> None:
    # GIVEN torch.profiler's schedule(wait=1, warmup=2, active=3): steps 0-2 are not recorded
    schedule = MANIFEST[name]["profiler_schedule"]
    first = schedule["wait"] + schedule["warmup"]
    steps = find_steps(traces[name])
    assert [s.number for s in steps] == list(range(first, first + schedule["active"]))
    for step, after in pairwise(steps):
        assert step.start_us < step.end_us <= after.start_us, "increasing, non-overlapping CPU spans"
        assert step.gpu_end_us is not None and after.gpu_start_us is not None
        assert step.gpu_end_us <= after.gpu_start_us, "non-overlapping GPU spans"
    for step in steps:
        assert step.gpu_start_us is not None and step.gpu_end_us is not None
        assert step.start_us <= step.gpu_start_us < step.gpu_end_us, "the GPU works after the CPU launches"
        assert step.duration_us > 0


def test_gpu_spans_come_from_launches_when_kineto_wrote_no_gpu_annotation(
    traces, trace_doc, write_trace
) -> None:
    doc = trace_doc("sync_every_step")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "gpu_user_annotation"]
    without = find_steps(load_trace(write_trace(doc)))
    with_annotation = find_steps(traces["sync_every_step"])
    assert [s.number for s in without] == [3, 4, 5]
    for a, b in zip(without, with_annotation, strict=True):
        assert (a.start_us, a.end_us) == (b.start_us, b.end_us)
        # the launches' kernels lie inside the annotated GPU span
        assert b.gpu_start_us <= a.gpu_start_us < a.gpu_end_us <= b.gpu_end_us + 1e-6


# ---- Python stacks ------------------------------------------------------------------------------------
def test_python_stack_of_each_sync_call_leads_to_the_users_line(traces) -> None:
    trace = traces["sync_every_step_stack"]
    syncs = [r for r in trace.rows(Kind.RUNTIME).tolist() if trace.name_of(r) == "cudaStreamSynchronize"]
    assert len(syncs) == 6
    for row in syncs:
        stack = python_stack(trace, row)
        assert stack, "with_stack=True records the Python frames around the call"
        assert any("sync_every_step.py" in frame for frame in stack)
        assert stack[-1].endswith("<module>"), "outermost last"
        frame = user_frame(stack)
        assert frame is not None and "sync_every_step.py" in frame


def test_python_stack_is_empty_without_with_stack(traces) -> None:
    trace = traces["sync_every_step"]
    row = int(trace.rows(Kind.RUNTIME)[0])
    assert python_stack(trace, row) == []


def test_user_frame_skips_library_frames() -> None:
    stack = [
        "<built-in method item of Tensor object at 0x7f>",
        "torch/nn/modules/module.py(1751): _call_impl",
        "/usr/lib/python3.12/contextlib.py(81): inner",
        "train.py(42): step",
        "train.py(99): <module>",
    ]
    assert user_frame(stack) == "train.py(42): step"
    assert user_frame(["<built-in method item>", "torch/x.py(1): f"]) == "torch/x.py(1): f"
    assert user_frame([]) is None
