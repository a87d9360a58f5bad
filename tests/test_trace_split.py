"""A large trace read by two processes (`trace.split`) is the trace one pass reads, column for column;
and where the two parts could not be joined exactly (a cut that is not between two events, a damaged
part, a failed helper) the file is read in one pass instead, errors included. The recorded fixtures are
cut small here (small blocks, no minimum size) so that each is split as a large file would be."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudoctor.trace import jsonstream, split
from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES, load_trace
from gpudoctor.util.errors import TraceFormatError

TRACES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 16 << 10)
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(split, "_WINDOW", 32 << 10)
    monkeypatch.setattr(split, "_cpus", lambda: 2)
    # threads an earlier test in this worker left running are not this test's: a helper is forked only
    # in a process of one thread, and those would stop every split here
    count, before = threading.active_count, threading.active_count()
    monkeypatch.setattr(split.threading, "active_count", lambda: count() - before + 1)


@pytest.fixture
def one_pass_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every time `split` falls back to reading the file in one pass."""
    calls: list[str] = []

    def counted(path: Any, max_bytes: Any = DEFAULT_MAX_TRACE_BYTES) -> Any:
        calls.append(str(path))
        return load_trace(path, max_bytes)

    monkeypatch.setattr(split, "load_trace", counted)
    return calls


def plain(tmp_path: Path, name: str) -> Path:
    out = tmp_path / f"{name}.json"
    out.write_bytes(gzip.decompress((TRACES / f"{name}.json.gz").read_bytes()))
    return out


def assert_same(a: Any, b: Any, where: str = "trace") -> None:
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            if f.name != "_memo":
                assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    else:
        assert a == b, where
        if isinstance(a, dict):
            assert list(a) == list(b), f"{where}: order"


def loaded_in_parts(path: Path) -> Any:
    started = split.start_load(path, DEFAULT_MAX_TRACE_BYTES)
    assert started.split
    return started.result()


@pytest.mark.parametrize("name", ["sync_every_step_stack", "transformer_train", "conv_bf16_train"])
def test_two_parts_joined_are_the_one_pass_trace(
    name: str, tmp_path: Path, one_pass_calls: list[str]
) -> None:
    path = plain(tmp_path, name)
    assert_same(loaded_in_parts(path), load_trace(path))
    assert one_pass_calls == []  # joined, not read again


def test_the_bare_array_form_is_split_too(tmp_path: Path, one_pass_calls: list[str]) -> None:
    doc = json.loads(gzip.decompress((TRACES / "transformer_train.json.gz").read_bytes()))
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(doc["traceEvents"]))
    assert_same(loaded_in_parts(path), load_trace(path))
    assert one_pass_calls == []


def events_file(tmp_path: Path, events: list[dict[str, Any]], after: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "made.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **(after or {})}))
    return path


def kernels(n: int, name: str = "k") -> list[dict[str, Any]]:
    return [
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10.0 * i, "dur": 5.0,
         "args": {"correlation": i, "device": 0, "stream": 7}}
        for i in range(n)
    ]  # fmt: skip


def test_a_cut_inside_a_string_is_read_in_one_pass(tmp_path: Path, one_pass_calls: list[str]) -> None:
    # every event's name holds "},{": wherever the cut falls, it may fall inside a string
    path = events_file(tmp_path, kernels(4000, name='x"},{"y'))
    trace = split.start_load(path, DEFAULT_MAX_TRACE_BYTES).result()
    assert_same(trace, load_trace(path))


def test_a_cut_after_the_events_is_read_in_one_pass(tmp_path: Path, one_pass_calls: list[str]) -> None:
    # a large array of objects after traceEvents: the cut falls in it, not between two events
    path = events_file(tmp_path, kernels(50), after={"zz": [{"a": i} for i in range(20000)]})
    started = split.start_load(path, DEFAULT_MAX_TRACE_BYTES)
    assert started.split
    assert_same(started.result(), load_trace(path))
    assert one_pass_calls == [str(path)]


def test_a_failed_helper_is_read_in_one_pass(
    tmp_path: Path, one_pass_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any, n: int) -> bytes:
        raise OSError("disk gone")

    monkeypatch.setattr(split._Tail, "read", broken)  # the helper, a copy of this process, fails
    path = plain(tmp_path, "sync_every_step_stack")
    assert_same(loaded_in_parts(path), load_trace(path))
    assert one_pass_calls == [str(path)]


def test_columns_larger_than_the_shared_memory_are_read_in_one_pass(
    tmp_path: Path, one_pass_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(split, "_region_bytes", lambda plan: 4096)
    path = plain(tmp_path, "sync_every_step_stack")
    assert_same(loaded_in_parts(path), load_trace(path))
    assert one_pass_calls == [str(path)]


def test_a_damaged_trace_raises_what_one_pass_raises(tmp_path: Path) -> None:
    path = plain(tmp_path, "transformer_train")
    data = bytearray(path.read_bytes())
    at = len(data) * 3 // 4
    data[at : at + 8] = b"\x00garbage"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as one:
        load_trace(path)
    with pytest.raises(TraceFormatError) as two:
        loaded_in_parts(path)
    assert str(two.value) == str(one.value)


def test_no_helper_for_gzip_small_files_or_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not split.start_load(TRACES / "inference.json.gz", DEFAULT_MAX_TRACE_BYTES).split
    path = plain(tmp_path, "inference")
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", path.stat().st_size + 1)
    assert not split.start_load(path, DEFAULT_MAX_TRACE_BYTES).split
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 0)
    assert not split.start_load(path, path.stat().st_size - 1).split  # over the limit: one pass says so
    stop = threading.Event()
    beside = threading.Thread(target=stop.wait)
    beside.start()
    try:
        assert not split.start_load(path, DEFAULT_MAX_TRACE_BYTES).split  # a fork would copy no thread
    finally:
        stop.set()
        beside.join()
    assert not split.start_load(tmp_path / "missing.json", DEFAULT_MAX_TRACE_BYTES).split


def test_leaving_without_the_result_stops_the_helper(tmp_path: Path) -> None:
    path = plain(tmp_path, "transformer_train")
    with split.start_load(path, DEFAULT_MAX_TRACE_BYTES) as started:
        helper = started._helper
        assert helper is not None and helper.pid is not None
        pid = helper.pid
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left


def parsed(reasons: list[str], labels: list[str], marks: list[tuple[int, int]], top: Any = None) -> Any:
    from gpudoctor.trace.columns import ColumnBuilder
    from gpudoctor.trace.load import Parsed

    builder = ColumnBuilder()
    for r in reasons:
        builder.skip(r)
    for label in labels:
        builder.labels.one(label)
    return Parsed(builder, top or {}, {}, marks)


def test_a_reason_or_label_first_met_about_the_cut_keeps_the_parts_apart() -> None:
    # the order of reasons and labels follows how a pass chunks the events: only those that the
    # head met before its last two chunks, or that the tail meets after its first, keep one pass's order
    plan = split._Plan(Path("t.json"), jsonstream.EventsAt({}, 1, bare=False), cut=10, resume=12)
    head = parsed(["flow"], ["Spans"], [(1, 1), (1, 1), (1, 1), (1, 1)])
    assert split._joinable(plan, head, parsed(["flow", "instant"], [], [(1, 0), (2, 0)]))
    assert not split._joinable(plan, head, parsed(["instant", "flow"], [], [(1, 0), (2, 0)]))
    assert split._joinable(plan, head, parsed([], ["Spans", "GPU"], [(0, 1), (0, 2)]))
    assert not split._joinable(plan, head, parsed([], ["GPU"], [(0, 1)]))
    late = parsed(["flow", "instant"], [], [(1, 0), (1, 0), (2, 0), (2, 0)])
    assert not split._joinable(plan, late, parsed(["flow"], [], [(1, 0)]))  # new in the head's last chunks
    assert split._joinable(
        plan, head, parsed([], [], [(0, 0)], top={"traceName": "t"})
    )  # keys after the events
    ended = parsed(["flow"], ["Spans"], [(1, 1)] * 4, top={"zz": [{"a": 1}]})
    assert not split._joinable(
        plan, ended, parsed([], [], [(0, 0)])
    )  # the head's events ended before the cut
