"""The trace loader's contract, on the H200-recorded fixtures and variants derived from them: every format a
Kineto/Chrome trace comes in loads to the same columns; damaged events are counted in `Trace.skipped`, never
fatal; a file that is not a trace raises `TraceFormatError` with a one-line message."""

from __future__ import annotations

import dataclasses
import gzip
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TRACE_NAMES, WriteTrace
from gpudoctor.trace import Kind, Trace, jsonstream, load_trace, load_traces
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.steps import find_steps
from gpudoctor.util.errors import TraceFormatError

ARRAY_COLUMNS = tuple(
    f.name
    for f in dataclasses.fields(Trace)
    if f.name
    not in (
        "meta",
        "names",
        "memory",
        "labels",
        "op_inputs",
        "thread_names",
        "skipped",
        "comm_calls",
        "_memo",
    )
)
TIME_COLUMNS = ("ts",)
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
OLD_CATEGORY = {
    "kernel": "Kernel",
    "cuda_runtime": "Runtime",
    "cpu_op": "Operator",
    "gpu_memcpy": "Memcpy",
    "gpu_memset": "Memset",
}
KERNEL_ARGS_NOT_ON_ROCM = (
    "grid",
    "block",
    "registers per thread",
    "shared memory",
    "blocks per SM",
    "warps per SM",
    "est. achieved occupancy %",
)
BASELINE_SKIPS = {"flow events (links come from correlation ids)", "instant events"}


# ---- helpers ---------------------------------------------------------------------------------------------
def row_names(trace: Trace) -> list[str]:
    return [trace.names[i] for i in trace.name.tolist()]


def assert_same_columns(got: Trace, want: Trace, ts_atol: float = 0.0) -> None:
    """Row for row the same events: every column, the names, the memory events and the skip counts."""
    assert len(got) == len(want)
    assert row_names(got) == row_names(want)
    for column in ARRAY_COLUMNS:
        a, b = getattr(got, column), getattr(want, column)
        assert a.dtype == b.dtype, column
        if column in TIME_COLUMNS and ts_atol:
            np.testing.assert_allclose(a, b, rtol=0, atol=ts_atol, err_msg=column)
        else:
            np.testing.assert_array_equal(a, b, err_msg=column)
    for column in ("ts", "bytes", "total_allocated", "total_reserved", "device_type", "device_id"):
        a, b = getattr(got.memory, column), getattr(want.memory, column)
        np.testing.assert_allclose(a, b, rtol=0, atol=ts_atol if column == "ts" else 0, err_msg=column)
    assert got.labels == want.labels
    assert got.op_inputs == want.op_inputs
    for column in (
        "external_id",
        "ts",
        "in_nelems",
        "out_nelems",
        "group_size",
        "collective",
        "dtype",
        "group",
    ):
        a, b = getattr(got.comm_calls, column), getattr(want.comm_calls, column)
        np.testing.assert_allclose(a, b, atol=ts_atol) if column == "ts" else np.testing.assert_array_equal(
            a, b
        )
    assert got.thread_names == want.thread_names
    assert got.skipped == want.skipped


def test_collective_calls_keep_what_they_moved() -> None:
    # GIVEN a DDP rank's trace: THEN every record_param_comms op, with its args, in time order
    import gzip
    import json

    path = Path(__file__).parent / "fixtures" / "ddp" / "rank0.json.gz"
    with gzip.open(path, "rt") as f:
        ops = sorted(
            (e for e in json.load(f)["traceEvents"] if e.get("name") == "record_param_comms"),
            key=lambda e: e["ts"],
        )
    calls = load_trace(path).comm_calls
    assert len(calls) == len(ops) == 21
    assert calls.external_id.tolist() == [e["args"]["External id"] for e in ops]
    assert calls.in_nelems.tolist() == [e["args"]["In msg nelems"] for e in ops]
    assert (
        set(calls.collective) == {"allreduce"} and set(calls.dtype) == {"Float"} and set(calls.group) == {"0"}
    )
    assert calls.group_size.tolist() == [2] * 21


def assert_well_formed(trace: Trace) -> None:
    n = len(trace)
    for column in ARRAY_COLUMNS:
        assert len(getattr(trace, column)) == n, column
    assert trace.grid.shape == trace.block.shape == (n, 3)
    assert np.all(np.diff(trace.ts) >= 0), "rows are sorted by start time"
    assert np.all(trace.dur >= 0)
    assert np.all(np.isfinite(trace.ts))
    assert np.all(trace.name < len(trace.names))
    assert np.all(np.diff(trace.memory.ts) >= 0)


def events_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["traceEvents"]


def count(trace: Trace, kind: Kind) -> int:
    return len(trace.rows(kind))


def load_error(path: Path) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message, "a one-line message"
    assert path.name in message, "the message names the file"
    return info.value


@pytest.fixture(scope="module")
def loaded() -> dict[str, Trace]:
    from conftest import TRACES_DIR

    return {name: load_trace(TRACES_DIR / f"{name}.json.gz") for name in TRACE_NAMES}


# ---- the recorded fixtures ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_fixture_loads_every_duration_event_of_the_file(
    name: str, loaded: dict[str, Trace], trace_doc
) -> None:
    # GIVEN a trace recorded on an H200, WHEN loaded, THEN one row per complete ('X') event, by category
    trace, events = loaded[name], events_of(trace_doc(name))
    assert_well_formed(trace)
    durations = [e for e in events if e.get("ph") == "X"]
    assert len(trace) == len(durations)
    for cat, kind in [("kernel", Kind.KERNEL), ("cuda_runtime", Kind.RUNTIME), ("cpu_op", Kind.CPU_OP)]:
        assert count(trace, kind) == sum(e.get("cat") == cat for e in durations), cat
    kernel_durs = sorted(e["dur"] for e in durations if e.get("cat") == "kernel")
    np.testing.assert_array_equal(np.sort(trace.dur[trace.rows(Kind.KERNEL)]), kernel_durs)
    assert set(trace.skipped) <= BASELINE_SKIPS
    assert trace.meta.schema_version == 1
    assert trace.meta.base_time_ns is not None and trace.meta.epoch_origin_ns is not None


def test_fixture_kernels_carry_their_launch_configuration(loaded: dict[str, Trace]) -> None:
    trace = loaded["conv_bf16_train"]
    kernels = trace.rows(Kind.KERNEL)
    assert np.all(trace.grid[kernels] > 0) and np.all(trace.block[kernels] > 0)
    assert np.all(trace.device[kernels] == 0) and np.all(trace.stream[kernels] >= 0)
    assert np.all(trace.registers[kernels] > 0)
    copies = trace.rows(Kind.MEMCPY, Kind.MEMSET)
    assert len(copies) and np.all(trace.bytes[copies] > 0)
    cpu = trace.rows(Kind.CPU_OP)
    assert np.all(trace.device[cpu] == -1) and np.all(trace.grid[cpu] == 0)


def test_stack_fixture_has_python_frames_memory_events_and_its_profiler_options(
    loaded: dict[str, Trace],
) -> None:
    trace = loaded["sync_every_step_stack"]
    python = trace.rows(Kind.PYTHON)
    assert len(python) > 1000
    assert np.all(trace.python_id[python] >= 0)
    assert (trace.python_parent_id[python] == -1).sum() >= 1, "a root frame has no parent"
    assert len(trace.memory) == 546
    assert (trace.memory.bytes > 0).any() and (trace.memory.bytes < 0).any()
    assert set(trace.memory.device_type.tolist()) <= {0, 1} and (trace.memory.total_allocated >= 0).all()
    assert trace.meta.profiler_config == {"with_stack": True, "profile_memory": True}
    assert trace.thread_names, "thread_name metadata is kept"


def test_device_properties_become_device_info(loaded: dict[str, Trace]) -> None:
    trace = loaded["inference"]
    (device,) = trace.meta.devices
    assert device.name == "NVIDIA H200"
    assert device.sm_count == 132
    assert device.total_memory_bytes == 150109880320
    assert device.compute_capability == (9, 0)
    assert device.max_threads_per_sm == 2048
    assert trace.device_info == device


def test_nanosecond_fractions_of_the_file_survive(loaded: dict[str, Trace], trace_doc) -> None:
    # Relative timestamps (baseTimeNanoseconds) keep ns resolution: ts - origin is exact in float64
    trace, events = loaded["sync_every_step"], events_of(trace_doc("sync_every_step"))
    want = np.sort([e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"])
    got = np.sort(trace.ts[trace.rows(Kind.KERNEL)] + trace.meta.origin_us)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert np.any(np.abs(got - np.round(got)) > 1e-3), "the fixture has sub-µs timestamps"


def test_small_nanosecond_values_are_exact(write_trace: WriteTrace) -> None:
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000.0, "dur": 1.001},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1123.456, "dur": 0.999},
        ]
    }
    trace = load_trace(write_trace(doc))
    np.testing.assert_allclose(trace.ts, [0.0, 123.456], rtol=0, atol=1e-9)
    np.testing.assert_allclose(trace.dur, [1.001, 0.999], rtol=0, atol=1e-12)


# ---- format variants: the same events load to the same columns ---------------------------------------
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_plain_json_loads_like_its_gzip(name: str, trace_paths, loaded, write_trace: WriteTrace) -> None:
    with gzip.open(trace_paths[name], "rb") as f:
        path = write_trace(f.read(), f"{name}.json")
    assert_same_columns(load_trace(path), loaded[name])


@pytest.mark.parametrize("layout", ["one_line", "indent4"])
@pytest.mark.parametrize("name", ["sync_every_step_stack", "dataloader_bound"])
def test_whitespace_layout_does_not_matter(name: str, layout: str, loaded, trace_doc, write_trace) -> None:
    doc = trace_doc(name)
    path = write_trace(
        doc, f"{layout}.json", compact=layout == "one_line", indent=4 if layout == "indent4" else None
    )
    assert (b"\n" in path.read_bytes()) == (layout == "indent4")
    assert_same_columns(load_trace(path), loaded[name])


@pytest.mark.parametrize("name", ["sync_every_step_stack", "inference"])
def test_bare_array_form_loads_the_same_events(name: str, loaded, trace_doc, write_trace) -> None:
    # GIVEN only the events array, as some exporters write it
    path = write_trace(events_of(trace_doc(name)), "bare.json.gz")
    trace = load_trace(path)
    # THEN the same rows, and no metadata beyond the events
    assert_same_columns(trace, loaded[name])
    assert trace.meta.devices == () and trace.meta.base_time_ns is None


@pytest.mark.parametrize("where", ["first", "last", "middle"])
@pytest.mark.parametrize("block", [None, 1000, 65536])
def test_key_order_does_not_matter(
    where: str, block: int | None, loaded, trace_doc, write_trace, monkeypatch
) -> None:
    # GIVEN traceEvents first (other keys, with lists of objects, after it), last, or in the middle
    doc = trace_doc("sync_every_step")
    events = doc.pop("traceEvents")
    # a second device makes a `},{` after the events when they come first
    doc["deviceProperties"].append({**doc["deviceProperties"][0], "id": 1})
    keys = list(doc.items())
    at = {"first": 0, "last": len(keys), "middle": len(keys) // 2}[where]
    reordered = dict([*keys[:at], ("traceEvents", events), *keys[at:]])
    if block:
        monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    # WHEN loaded THEN the same rows and the same metadata
    trace = load_trace(write_trace(reordered))
    want = loaded["sync_every_step"]
    assert_same_columns(trace, want)
    assert [d.index for d in trace.meta.devices] == [0, 1]
    assert trace.meta.base_time_ns == want.meta.base_time_ns
    assert trace.meta.trace_name == want.meta.trace_name


def test_absolute_microsecond_time_base_of_older_kineto(trace_doc, write_trace) -> None:
    # GIVEN the oldest Kineto layout: integer µs since the epoch, no baseTimeNanoseconds
    doc = trace_doc("sync_every_step")
    base_us = doc.pop("baseTimeNanoseconds") // 1000  # ~1.79e15 µs
    for e in events_of(doc):
        if "ts" in e:
            e["ts"] = round(e["ts"])
        if "dur" in e:
            e["dur"] = round(e["dur"])
    relative = load_trace(write_trace(doc, "relative.json"))
    for e in events_of(doc):
        if "ts" in e:
            e["ts"] += base_us
    absolute = load_trace(write_trace(doc, "absolute.json"))
    # THEN the same times relative to the trace's start, and the same wall clock
    assert_same_columns(absolute, relative, ts_atol=1e-3)
    assert absolute.meta.base_time_ns is None
    assert absolute.meta.epoch_origin_ns == (round(relative.meta.origin_us) + base_us) * 1000


def test_absolute_time_base_with_fractions_is_as_exact_as_float64_allows(
    loaded, trace_doc, write_trace
) -> None:
    # Older Kineto also wrote absolute µs with three decimals; at ~1.8e15 µs a float64 is exact to 0.25 µs,
    # so ns fractions are lost when the file is parsed (by any reader), but nothing worse happens.
    doc = trace_doc("sync_every_step")
    base_us = doc.pop("baseTimeNanoseconds") / 1000
    for e in events_of(doc):
        if "ts" in e:
            e["ts"] += base_us
    absolute = load_trace(write_trace(doc))
    want = loaded["sync_every_step"]
    assert row_names(absolute) == row_names(want) or sorted(row_names(absolute)) == sorted(row_names(want))
    np.testing.assert_allclose(absolute.ts - absolute.ts[0], want.ts - want.ts[0], rtol=0, atol=0.5)
    np.testing.assert_array_equal(np.sort(absolute.dur), np.sort(want.dur))
    assert absolute.meta.epoch_origin_ns == pytest.approx(want.meta.epoch_origin_ns, abs=1000)


def test_events_without_args_still_load(loaded, trace_doc, write_trace) -> None:
    doc = trace_doc("inference")
    for e in events_of(doc):
        e.pop("args", None)
    trace = load_trace(write_trace(doc))
    want = loaded["inference"]
    assert row_names(trace) == row_names(want)
    np.testing.assert_array_equal(trace.dur, want.dur)
    np.testing.assert_array_equal(trace.kind, want.kind)
    # without args there is nothing to link by, and nothing to describe a kernel with
    assert np.all(trace.correlation == -1) and np.all(trace.external_id == -1)
    assert np.all(trace.grid == 0) and np.all(trace.device == -1)
    assert set(trace.skipped) <= BASELINE_SKIPS


def test_rocm_style_kernels_without_launch_dimensions(loaded, trace_doc, write_trace) -> None:
    # GIVEN a ROCm trace: hipLaunchKernel calls, kernels without grid, block or occupancy
    doc = trace_doc("dataloader_bound")
    for e in events_of(doc):
        if e.get("cat") == "kernel":
            for key in KERNEL_ARGS_NOT_ON_ROCM:
                e["args"].pop(key, None)
        if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaLaunchKernel"):
            e["name"] = "hipLaunchKernel"
    trace = load_trace(write_trace(doc))
    want = loaded["dataloader_bound"]
    kernels = trace.rows(Kind.KERNEL)
    # THEN the same kernels and durations, unknown dimensions as 0 / -1 / NaN, and the links intact
    np.testing.assert_array_equal(kernels, want.rows(Kind.KERNEL))
    np.testing.assert_array_equal(trace.dur, want.dur)
    np.testing.assert_array_equal(trace.correlation, want.correlation)
    assert np.all(trace.grid == 0) and np.all(trace.block == 0)
    assert np.all(trace.registers[kernels] == -1) and np.all(np.isnan(trace.occupancy[kernels]))
    launches = launch_rows(trace, kernels)
    np.testing.assert_array_equal(launches, launch_rows(want, kernels))
    linked = launches[launches >= 0].tolist()
    assert len(linked) > 0.9 * len(kernels)
    assert {trace.name_of(r) for r in linked} <= {"hipLaunchKernel", "cuLaunchKernel"}
    assert "hipLaunchKernel" in trace.names


def test_older_capitalized_categories(loaded, trace_doc, write_trace) -> None:
    doc = trace_doc("sync_every_step")
    for e in events_of(doc):
        e["cat"] = OLD_CATEGORY.get(e.get("cat"), e.get("cat"))
    assert sum(e.get("cat") == "Kernel" for e in events_of(doc)) == 219
    trace = load_trace(write_trace(doc))
    assert_same_columns(trace, loaded["sync_every_step"])


def test_cpu_only_trace_has_no_gpu_rows(loaded, trace_doc, write_trace) -> None:
    doc = trace_doc("sync_every_step")
    doc["traceEvents"] = [e for e in events_of(doc) if e.get("cat") not in GPU_CATEGORIES]
    trace = load_trace(write_trace(doc))
    assert_well_formed(trace)
    assert not trace.has_gpu
    assert len(trace.rows(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_ANNOTATION)) == 0
    assert count(trace, Kind.RUNTIME) == count(loaded["sync_every_step"], Kind.RUNTIME)
    assert [s.number for s in find_steps(trace)] == [3, 4, 5]
    assert all(s.gpu_start_us is None for s in find_steps(trace))


def test_trace_without_profiler_steps(loaded, trace_doc, write_trace) -> None:
    doc = trace_doc("inference")
    doc["traceEvents"] = [e for e in events_of(doc) if not str(e.get("name", "")).startswith("ProfilerStep#")]
    trace = load_trace(write_trace(doc))
    assert find_steps(trace) == ()
    assert count(trace, Kind.KERNEL) == count(loaded["inference"], Kind.KERNEL)


# ---- ranks ---------------------------------------------------------------------------------------------
def test_distributed_info_gives_rank_world_size_and_backend(trace_doc, write_trace) -> None:
    doc = trace_doc("sync_every_step")
    doc["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 2}
    dist = load_trace(write_trace(doc)).meta.distributed
    assert dist is not None and (dist.rank, dist.world_size, dist.backend) == (1, 2, "nccl")


def test_directory_of_rank_files_loads_sorted_by_rank(tmp_path: Path, trace_doc) -> None:
    from conftest import write_json

    # GIVEN rank files whose names sort against their ranks, and a file that is not a trace
    for rank, name in [(1, "a_worker.json.gz"), (0, "b_worker.json")]:
        doc = trace_doc("sync_every_step")
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        write_json(tmp_path / "run" / name, doc)
    (tmp_path / "run" / "notes.txt").write_text("not a trace")
    # WHEN the directory is loaded THEN both ranks, in rank order
    traces = load_traces(tmp_path / "run")
    assert [t.meta.rank for t in traces] == [0, 1]
    assert [Path(t.meta.path).name for t in traces] == ["b_worker.json", "a_worker.json.gz"]
    assert all(t.meta.distributed and t.meta.distributed.world_size == 2 for t in traces)


def test_rank_in_the_file_name_when_the_trace_does_not_say(trace_doc, write_trace) -> None:
    doc = trace_doc("sync_every_step")
    trace = load_trace(write_trace(doc, "rank3.json"))
    assert trace.meta.rank == 3
    assert load_trace(write_trace(doc, "worker.json")).meta.rank == 0
    assert load_traces(write_trace(doc, "rank_2.json"))[0].meta.rank == 2


def test_empty_directory_and_directory_to_load_trace_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no trace files"):
        load_traces(tmp_path)
    with pytest.raises(TraceFormatError, match="directory"):
        load_trace(tmp_path)
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "missing.json")


# ---- damaged events are counted, never fatal -----------------------------------------------------------
def kernel(**fields: Any) -> dict[str, Any]:
    args = {"device": 0, "stream": 7, "correlation": 11, "grid": [1, 1, 1], "block": [32, 1, 1]}
    return {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 10.0,
        "dur": 2.0,
        "args": args,
    } | fields


def test_unknown_phases_and_categories_are_counted(write_trace: WriteTrace) -> None:
    doc = {
        "traceEvents": [
            kernel(),
            kernel(cat="mystery_category"),
            kernel(ph="B"),
            kernel(ph="Z"),
            {"ph": "C", "name": "counter", "pid": 0, "ts": 1, "args": {"v": 1}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        ]
    }
    trace = load_trace(write_trace(doc))
    assert list(trace.kind) == [Kind.KERNEL, Kind.OTHER]
    assert trace.skipped == {
        "events of phase 'B'": 1,
        "events of phase 'Z'": 1,
        "events of phase 'C'": 1,
        "unknown category 'mystery_category' (kept as OTHER)": 1,
    }
    assert trace.thread_names == {(0, 7): "stream 7"}


def test_negative_durations_are_clamped_and_counted(write_trace: WriteTrace) -> None:
    trace = load_trace(write_trace({"traceEvents": [kernel(dur=-5.0), kernel(ts=20.0)]}))
    np.testing.assert_array_equal(trace.dur, [0.0, 2.0])
    assert trace.skipped == {"negative duration clamped to 0": 1}


def test_string_pids_and_tids_become_labels(write_trace: WriteTrace) -> None:
    doc = {
        "traceEvents": [
            kernel(pid="GPU 0", tid="stream 7"),
            kernel(pid=0, tid=7, ts=11.0),
            kernel(pid="5", tid="7", ts=12.0),  # numeric strings stay strings, in any chunk
            kernel(pid="GPU 0", tid="stream 7", ts=13.0),
        ]
    }
    trace = load_trace(write_trace(doc))
    labels = [trace.labels[-int(p) - 2] if p < 0 else int(p) for p in trace.pid.tolist()]
    assert labels == ["GPU 0", 0, "5", "GPU 0"]
    assert trace.tid[0] == trace.tid[3] < 0 and trace.tid[1] == 7 and trace.tid[2] < 0
    alone = load_trace(write_trace({"traceEvents": [kernel(pid="5", tid="7")]}, "alone.json"))
    assert alone.labels == ("5", "7") and alone.pid[0] < 0


def test_negative_pids_do_not_collide_with_labels(write_trace: WriteTrace) -> None:
    trace = load_trace(write_trace({"traceEvents": [kernel(pid=-2), kernel(pid="Spans", ts=11.0)]}))
    assert trace.pid[0] != trace.pid[1]
    assert trace.labels[-int(trace.pid[0]) - 2] == "-2"


@pytest.mark.parametrize(
    ("bad_args", "column", "missing"),
    [
        ({"stream": "x"}, "stream", -1),
        ({"device": [0]}, "device", -1),
        ({"grid": "1,1,1"}, "grid", 0),
        ({"grid": [1, 2]}, "grid", 0),
        ({"registers per thread": 3.5}, "registers", -1),
        ({"est. achieved occupancy %": "high"}, "occupancy", np.nan),
    ],
)
def test_args_of_the_wrong_type_are_dropped_and_counted(bad_args, column, missing, write_trace) -> None:
    # GIVEN a kernel one of whose args has the wrong type
    event = kernel()
    event["args"] = event["args"] | bad_args
    trace = load_trace(write_trace({"traceEvents": [event, kernel(ts=11.0)]}))
    # THEN the event is kept with its good args, and the bad value is missing
    assert len(trace) == 2
    assert trace.correlation[0] == 11 and trace.stream[1] == 7
    np.testing.assert_array_equal(np.asarray(getattr(trace, column)[0]).ravel()[0], missing)
    if column != "grid" or bad_args["grid"] != [
        1,
        2,
    ]:  # a list of two ints is the right type, the wrong shape
        assert trace.skipped == {"event args of unexpected types (those args dropped)": 1}


def test_malformed_events_are_skipped_and_counted(write_trace: WriteTrace) -> None:
    doc = {
        "traceEvents": [
            kernel(),
            kernel(ts="yesterday"),
            kernel(name=["a", "list"]),
            kernel(args=[1, 2]),
            "not an event",
            7,
            kernel(ts=None),
            kernel(dur=None, ts=12.0),
        ]
    }
    trace = load_trace(write_trace(doc))
    assert_well_formed(trace)
    assert len(trace) == 2 and trace.dur.tolist() == [2.0, 0.0]
    assert trace.skipped == {
        "malformed event (skipped)": 3,
        "not an event object": 2,
        "duration event without a numeric ts": 1,
    }


def test_absurd_times_are_skipped_not_allowed_to_wreck_the_rest(write_trace: WriteTrace) -> None:
    # GIVEN one event at ts=-1e308 and one lasting 1e308 µs among sane ones
    doc = {"traceEvents": [kernel(ts=-1e308), kernel(ts=10.0), kernel(ts=12.5, dur=1e308), kernel(ts=20.25)]}
    trace = load_trace(write_trace(doc))
    # THEN the sane rows keep their times exactly, and the others are counted
    assert trace.ts.tolist() == [0.0, 10.25] and trace.meta.origin_us == 10.0
    assert trace.skipped == {"duration event with ts or dur beyond 1e+18 µs": 2}


@pytest.mark.parametrize("props", [True, 5, "H200", {"name": "H200"}, [1, "x", None]])
def test_device_properties_of_the_wrong_type_are_ignored(props: Any, write_trace: WriteTrace) -> None:
    trace = load_trace(write_trace({"deviceProperties": props, "traceEvents": [kernel()]}))
    assert trace.meta.devices == () and trace.device_info is None and len(trace) == 1


@pytest.mark.parametrize("dist", [{"rank": "1"}, {"rank": None, "world_size": "2"}, [], 3])
def test_distributed_info_of_the_wrong_type(dist: Any, write_trace: WriteTrace) -> None:
    trace = load_trace(write_trace({"distributedInfo": dist, "traceEvents": [kernel()]}, "rank5.json"))
    assert trace.meta.rank == 5, "falls back to the rank in the file name"


# ---- chunked reading: block size never changes the result -------------------------------------------------
TRICKY_NAMES = [
    'a"}, {"ph": "X", "name": "fake"}',
    "},{",
    "}, {",
    '} , {"',
    'quote \\" and backslash \\\\',
    '\\"}, {\\"',
    "brace { and } and ] and [",
    "]}",
    "}]",
    '"traceEvents": [',
    "ünïcödé 漢字 → ✓",
    "",
]


def tricky_trace() -> dict[str, Any]:
    events = []
    for i in range(300):
        name = TRICKY_NAMES[i % len(TRICKY_NAMES)] + f" #{i}"
        events.append(
            kernel(name=name, ts=float(i), args={"correlation": i, "note": {"x": [{"a": "},{"}, {}]}})
        )
    return {"schemaVersion": 1, "traceEvents": events, "traceName": '}, {"traceEvents": []}'}


@pytest.mark.parametrize("block", [1, 7, 100, 1000, 4096])
def test_names_that_look_like_chunk_boundaries_survive_any_block_size(
    block, write_trace, monkeypatch
) -> None:
    doc = tricky_trace()
    path = write_trace(doc, "tricky.json", compact=block % 2 == 1)
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    trace = load_trace(path)
    assert row_names(trace) == [e["name"] for e in doc["traceEvents"]]
    assert trace.correlation.tolist() == list(range(300))
    assert trace.meta.trace_name == doc["traceName"]


# 1000-byte blocks on the large transformer trace took 52 s of CI's 2 cores: the small blocks on the
# smaller trace, plain and gzipped, and the large one at the sizes that matter
@pytest.mark.parametrize(
    ("name", "suffix", "block"),
    [
        ("sync_every_step_stack", ".json", 1000),
        ("sync_every_step_stack", ".json.gz", 1000),
        ("sync_every_step_stack", ".json", 4096),
        ("sync_every_step_stack", ".json", 65536),
        ("transformer_train", ".json.gz", 4096),
        ("transformer_train", ".json.gz", 65536),
    ],
)
def test_block_size_does_not_change_the_columns(
    block, name, suffix, loaded, trace_doc, write_trace, monkeypatch
) -> None:
    path = write_trace(trace_doc(name), name + suffix)
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    assert_same_columns(load_trace(path), loaded[name])


def test_one_event_larger_than_many_blocks(write_trace, monkeypatch) -> None:
    big = kernel(name="x" * 50_000, args={"correlation": 1, "blob": ["},{"] * 5000})
    path = write_trace({"traceEvents": [kernel(), big, kernel(ts=30.0)]})
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 1000)
    trace = load_trace(path)
    assert [len(n) for n in row_names(trace)] == [1, 50_000, 1]


# ---- not a trace: TraceFormatError, one line ------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b" \n\t\r\n  ", "empty"),
        (b'{"a": 1}', "no 'traceEvents'"),
        (b'{"traceEvents": 5}', "not an array"),
        (b'{"traceEvents": null}', "not an array"),
        (b'{"traceEvents": {"ph": "X"}}', "not an array"),
        (b"[1, 2, 3]", "no events"),
        (b"[]", "no events"),
        (b'{"traceEvents": []}', "no events"),
        (b'[{"a": 1}, {"name": "b"}]', "no events"),
        (b'"a string"', "not JSON"),
        (b"42", "not JSON"),
        (b"hello", "not JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1e400}]}', "out of range"),
        (b'{"traceEvents": [{"ph": "X", "name": "bad \xff utf-8", "ts": 1}]}', "UTF-8"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1}]} trailing', "does not end properly"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1}]}}', "does not end properly"),
        (b'[{"ph": "X", "ts": 1}]]', "does not end properly"),
    ],
)
def test_not_a_trace(content: bytes, message: str, write_trace: WriteTrace) -> None:
    err = load_error(write_trace(content, "input.json"))
    assert message in str(err)


def test_an_empty_trace_with_trace_metadata_loads_empty(write_trace: WriteTrace) -> None:
    trace = load_trace(write_trace({"schemaVersion": 1, "traceEvents": []}))
    assert len(trace) == 0 and len(trace.memory) == 0 and trace.meta.schema_version == 1


def test_random_binary(write_trace: WriteTrace) -> None:
    rng = random.Random(0)
    for i, first in enumerate([None, b"{", b"[", b"\x1f\x8b"]):
        data = rng.randbytes(20_000)
        if first:
            data = first + data
        load_error(write_trace(data, f"random{i}.json"))


@pytest.fixture(scope="module")
def raw_json() -> bytes:
    from conftest import TRACES_DIR

    with gzip.open(TRACES_DIR / "sync_every_step.json.gz", "rb") as f:
        return f.read()


CUTS = (
    "in_header",
    "at_events_key",
    "just_after_events_open",
    "mid_events",
    "after_an_event",
    "just_before_close",
    "just_after_close",
    "last_byte_missing",
)


def cut_points(raw: bytes) -> dict[str, int]:
    close = raw.rindex(b"]")
    return {
        "in_header": 40,
        "at_events_key": raw.index(b'"traceEvents"') + 5,
        "just_after_events_open": raw.index(b"[", raw.index(b'"traceEvents"')) + 1,
        "mid_events": len(raw) // 2,
        "after_an_event": raw.rindex(b"}", 0, len(raw) // 2) + 1,
        "just_before_close": close,
        "just_after_close": close + 1,
        "last_byte_missing": len(raw) - 2,  # the file ends with "}\n"
    }


@pytest.mark.parametrize("block", [None, 4096])
@pytest.mark.parametrize("where", CUTS)
def test_truncated_json(where: str, block: int | None, raw_json: bytes, write_trace, monkeypatch) -> None:
    if block:
        monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    cut = cut_points(raw_json)[where]
    err = load_error(write_trace(raw_json[:cut], "cut.json"))
    assert re.search(r"truncated|does not end|ends in the middle", str(err))


@pytest.mark.parametrize("fraction", [0.02, 0.5, 0.98, 0.9999])
def test_truncated_gzip(fraction: float, trace_paths, write_trace) -> None:
    data = trace_paths["sync_every_step"].read_bytes()
    err = load_error(write_trace(data[: int(len(data) * fraction)], "cut.json.gz.part"))
    assert "gzip" in str(err) or "truncated" in str(err)


@pytest.mark.parametrize("at", [0.01, 0.1, 0.5, 0.9, 0.99])
def test_corrupt_gzip(at: float, trace_paths, write_trace) -> None:
    data = bytearray(trace_paths["sync_every_step"].read_bytes())
    i = min(max(64, int(len(data) * at)), len(data) - 5)  # past the header and its file name
    for k in range(4):
        data[i + k] ^= 0x5A
    load_error(write_trace(bytes(data), "flipped.json.gz.bin"))


@pytest.mark.parametrize("block", [None, 1000, 65536])
@pytest.mark.parametrize("stray", [b"\x01", b"#", b"]", b"}", b'"', b":"])
def test_stray_byte_in_the_middle_reports_its_offset(
    stray, block, raw_json, write_trace, monkeypatch
) -> None:
    # GIVEN a stray byte between two events in the middle of the file
    if block:
        monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    at = re.compile(rb"\}\s*,\s*\{").search(raw_json, len(raw_json) // 2).start() + 1
    err = load_error(write_trace(raw_json[:at] + stray + raw_json[at:], "stray.json"))
    # THEN the error says where, within a few bytes
    m = re.search(r"near byte ([\d,]+)", str(err))
    assert m, str(err)
    assert abs(int(m.group(1).replace(",", "")) - at) <= 4


def test_corrupt_value_inside_an_event_reports_its_offset(raw_json, write_trace) -> None:
    at = raw_json.index(b'"dur": ', len(raw_json) // 3) + len(b'"dur": ')
    err = load_error(write_trace(raw_json[:at] + b"+" + raw_json[at:], "bad_number.json"))
    m = re.search(r"near byte ([\d,]+)", str(err))
    assert m and abs(int(m.group(1).replace(",", "")) - at) <= 4


def test_invalid_utf8_reports_its_offset(write_trace: WriteTrace) -> None:
    head = b'{"traceEvents": [{"ph": "X", "ts": 1, "name": "ok"}, {"ph": "X", "ts": 2, "name": "bad '
    err = load_error(write_trace(head + b'\xff"}]}', "utf8.json"))
    assert "UTF-8" in str(err) and f"near byte {len(head)}" in str(err)


def test_loader_errors_are_gpudoctor_errors(write_trace: WriteTrace) -> None:
    from gpudoctor.util.errors import GpudoctorError

    with pytest.raises(GpudoctorError) as info:
        load_trace(write_trace(b"", "empty.json"))
    assert info.value.exit_code == 2
