"""Fuzzing the loader with damaged copies of a real trace (sync_every_step, recorded on an H200).

Property: `load_trace` either returns a well-formed `Trace` (equal-length columns, rows sorted by start
time) or raises `TraceFormatError` with a one-line message, never anything else; and `analyze` of a
returned trace raises nothing but a `GpudoctorError`.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import random
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TRACES_DIR
from gpudoctor.analysis.summary import analyze
from gpudoctor.trace import Trace, jsonstream, load_trace
from gpudoctor.util.errors import GpudoctorError, TraceFormatError

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)
RAW: bytes = gzip.decompress((TRACES_DIR / "sync_every_step.json.gz").read_bytes())
DOC: dict[str, Any] = json.loads(RAW)
N_EVENTS = len(DOC["traceEvents"])
BLOCK_SIZES = st.sampled_from([None, 1000, 4096, 65536])

EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s", "bp"]
ARG_KEYS = [
    "correlation",
    "External id",
    "device",
    "stream",
    "bytes",
    "grid",
    "block",
    "registers per thread",
    "shared memory",
    "est. achieved occupancy %",
    "blocks per SM",
    "warps per SM",
    "Python id",
    "Python parent id",
    "name",
]
TOP_KEYS = ["deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "traceName"]
DROP = object()

SPECIAL_VALUES = st.sampled_from(
    [
        None, True, False, 0, -1, -(2**63) - 1, 2**63, 2**64, 10**30, -(10**30), 1e308, -1e308, 1e-320,
        -0.0, 0.5, "", "x", "0", "X", "kernel", "[memory]", "ProfilerStep#3", [], [1, 2, 3], [0, 0, 0],
        [-1, 2**40, 1], {}, {"a": 1}, {"correlation": "x"},
    ]
)  # fmt: skip
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | SPECIAL_VALUES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)


# ---- the property -------------------------------------------------------------------------------------
def assert_loads_or_fails_cleanly(path: Path, block: int | None = None) -> Trace | None:
    with mock.patch.object(jsonstream, "BLOCK_BYTES", block or jsonstream.BLOCK_BYTES):
        try:
            trace = load_trace(path)
        except TraceFormatError as err:
            assert "\n" not in str(err)
            return None
    n = len(trace)
    for column in (
        "kind",
        "name",
        "pid",
        "tid",
        "ts",
        "dur",
        "correlation",
        "external_id",
        "device",
        "stream",
    ):
        assert len(getattr(trace, column)) == n, column
    for column in ("bytes", "registers", "occupancy", "python_id", "python_parent_id", "flops"):
        assert len(getattr(trace, column)) == n, column
    assert trace.grid.shape == trace.block.shape == (n, 3)
    assert np.isfinite(trace.ts).all() and np.isfinite(trace.dur).all()
    assert np.all(trace.ts[1:] >= trace.ts[:-1]), "rows sorted by start time"
    assert np.all(trace.dur >= 0)
    assert np.all((trace.name >= 0) & (trace.name < len(trace.names)))
    assert len(trace.memory.ts) == len(trace.memory.bytes) == len(trace.memory.device_id)
    with contextlib.suppress(GpudoctorError):  # a user error is a fine answer; anything else is a bug
        analyze(trace)
    return trace


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def write(workdir: Path, data: bytes, name: str = "fuzzed.json") -> Path:
    path = workdir / name
    path.write_bytes(data)
    return path


def test_the_unmutated_fixture_passes_the_property(workdir: Path) -> None:
    trace = assert_loads_or_fails_cleanly(write(workdir, RAW))
    assert trace is not None and len(trace) > 1000


# ---- (a) byte level -----------------------------------------------------------------------------------
@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(RAW)), block=BLOCK_SIZES)
def test_truncation_at_any_byte(workdir: Path, cut: int, block: int | None) -> None:
    trace = assert_loads_or_fails_cleanly(write(workdir, RAW[:cut]), block)
    # any cut before the final "}" leaves the JSON unfinished
    assert (trace is not None) == (cut >= len(RAW.rstrip()))


BYTE_EDIT = st.tuples(
    st.sampled_from(["flip", "insert", "delete", "replace"]),
    st.integers(min_value=0, max_value=len(RAW) - 1),
    st.sampled_from(list(b'{}[],:"\\ 0-.eE\x00\xff\n') + list(range(256))),
)


def apply_edits(raw: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(raw)
    for op, at, byte in edits:
        at = min(at, len(data) - 1)
        if op == "flip":
            data[at] ^= byte or 1
        elif op == "insert":
            data.insert(at, byte)
        elif op == "delete":
            del data[at]
        else:
            data[at] = byte
    return bytes(data)


@FUZZ
@given(edits=st.lists(BYTE_EDIT, min_size=1, max_size=6), block=BLOCK_SIZES)
def test_random_byte_edits(workdir: Path, edits: list[tuple[str, int, int]], block: int | None) -> None:
    assert_loads_or_fails_cleanly(write(workdir, apply_edits(RAW, edits)), block)


GZ = (TRACES_DIR / "sync_every_step.json.gz").read_bytes()


@settings(FUZZ, max_examples=40)
@given(edits=st.lists(BYTE_EDIT, min_size=1, max_size=3), cut=st.integers(min_value=1, max_value=len(GZ)))
def test_damaged_gzip(workdir: Path, edits: list[tuple[str, int, int]], cut: int) -> None:
    data = apply_edits(GZ, [(op, at % len(GZ), b) for op, at, b in edits])[:cut]
    assert_loads_or_fails_cleanly(write(workdir, data, "fuzzed.json.gz"))


# ---- (b) structure level ------------------------------------------------------------------------------
EVENT_EDIT = st.tuples(
    st.integers(min_value=0, max_value=N_EVENTS - 1),
    st.sampled_from(EVENT_KEYS + [f"args.{k}" for k in ARG_KEYS]),
    st.just(DROP) | JSON_VALUES,
)


def edit_event(events: list[Any], index: int, key: str, value: Any) -> None:
    event = events[index]
    if not isinstance(event, dict):
        return
    if key.startswith("args."):
        key = key[len("args.") :]
        event = event.get("args")
        if not isinstance(event, dict):
            return
    if value is DROP:
        event.pop(key, None)
    else:
        event[key] = value


@FUZZ
@given(
    edits=st.lists(EVENT_EDIT, min_size=1, max_size=40),
    replaced=st.lists(st.tuples(st.integers(min_value=0, max_value=N_EVENTS - 1), JSON_VALUES), max_size=3),
    top=st.lists(st.tuples(st.sampled_from(TOP_KEYS), st.just(DROP) | JSON_VALUES), max_size=2),
    shuffle=st.none() | st.randoms(use_true_random=False),
    bare=st.booleans(),
    block=BLOCK_SIZES,
)
def test_damaged_events(
    workdir: Path,
    edits: list[tuple[int, str, Any]],
    replaced: list[tuple[int, Any]],
    top: list[tuple[str, Any]],
    shuffle: random.Random | None,
    bare: bool,
    block: int | None,
) -> None:
    # GIVEN the trace with keys dropped or given random values, whole events replaced, events shuffled
    doc = json.loads(RAW)
    events = doc["traceEvents"]
    for index, key, value in edits:
        edit_event(events, index, key, value)
    for index, value in replaced:
        events[index] = value
    for key, value in top:
        if value is DROP:
            doc.pop(key, None)
        else:
            doc[key] = value
    if shuffle is not None:
        shuffle.shuffle(events)
    data = json.dumps(events if bare else doc).encode()
    # THEN it loads, or fails cleanly
    trace = assert_loads_or_fails_cleanly(write(workdir, data), block)
    if not bare and not replaced:
        assert trace is not None, "damaged events are skipped or repaired, never fatal"


@FUZZ
@given(
    names=st.lists(
        st.text(alphabet=st.sampled_from('{}[],:"\\ abc\n\t\u00e9\u6f22'), max_size=12), min_size=1
    ),
    block=st.sampled_from([1, 13, 256, 4096]),
)
def test_names_made_of_json_punctuation(workdir: Path, names: list[str], block: int) -> None:
    # Names built from JSON's own punctuation must come back exactly, at any chunk size
    events = [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": float(i), "dur": 0.5}
        for i, n in enumerate(names)
    ]
    path = write(workdir, json.dumps({"traceEvents": events, "traceName": names[0]}).encode())
    trace = assert_loads_or_fails_cleanly(path, block)
    assert trace is not None
    assert [trace.names[i] for i in trace.name.tolist()] == names
    assert trace.meta.trace_name == names[0]


DEVICE_KEYS = [
    "id",
    "name",
    "numSms",
    "totalGlobalMem",
    "computeMajor",
    "computeMinor",
    "warpSize",
    "l2CacheSize",
]
TOP_VALUES = {
    "deviceProperties": JSON_VALUES
    | st.lists(JSON_VALUES | st.dictionaries(st.sampled_from(DEVICE_KEYS), JSON_VALUES), max_size=3),
    "distributedInfo": JSON_VALUES
    | st.dictionaries(st.sampled_from(["rank", "world_size", "backend", "pg_count"]), JSON_VALUES),
    "baseTimeNanoseconds": JSON_VALUES,
    "schemaVersion": JSON_VALUES,
    "traceName": JSON_VALUES,
    "with_stack": JSON_VALUES,
    "profile_memory": JSON_VALUES,
}


@FUZZ
@given(
    top=st.lists(
        st.sampled_from(sorted(TOP_VALUES)).flatmap(
            lambda k: st.tuples(st.just(k), st.just(DROP) | TOP_VALUES[k])
        ),
        min_size=1,
        max_size=4,
    ),
    events_first=st.booleans(),
)
def test_damaged_top_level_keys(workdir: Path, top: list[tuple[str, Any]], events_first: bool) -> None:
    # GIVEN the trace's metadata keys dropped or given random values, before or after the events
    doc = json.loads(RAW)
    events = doc.pop("traceEvents")[:400]
    for key, value in top:
        if value is DROP:
            doc.pop(key, None)
        else:
            doc[key] = value
    doc = {"traceEvents": events, **doc} if events_first else {**doc, "traceEvents": events}
    # THEN the events load all the same: metadata never makes a trace unreadable
    trace = assert_loads_or_fails_cleanly(write(workdir, json.dumps(doc).encode()), 1000)
    assert trace is not None and len(trace) > 0
    assert isinstance(trace.meta.rank, int)
