"""Load Kineto / Chrome traces (`.json`, `.json.gz`, a directory of rank files) into columnar `Trace`s.

Events arrive chunk by chunk from `jsonstream`; each chunk becomes numpy columns at once and its dicts
are dropped, so memory stays near the size of the columns. Malformed events are counted in
`Trace.skipped`, never fatal; a file that is not a trace at all raises `TraceFormatError`.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from gpudoctor.device import DeviceInfo
from gpudoctor.trace.columns import ColumnBuilder, concat_blocks, sorted_columns
from gpudoctor.trace.jsonstream import decode_untyped, read_trace_json
from gpudoctor.trace.model import (
    RUN_STEP_KEY,
    CommCalls,
    DistributedInfo,
    MemoryEvents,
    Trace,
    TraceMeta,
)
from gpudoctor.trace.schema import Repairs, decoder
from gpudoctor.util.errors import NotATraceError, TraceFormatError
from gpudoctor.util.gcpause import gc_paused
from gpudoctor.util.units import fmt_bytes

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NO_DIM = [0, 0, 0]
COMM_OP = "record_param_comms"  # the CPU op torch.distributed records each collective call as
_MAX_TIME_US = 1e18  # ~31,700 years; epoch µs are ~1.8e15 (even epoch ns, 1.8e18, would not fit in µs)
# The most a trace may take: its JSON once decompressed (a 2 MB gzip can inflate to many GB), and half
# of it for the columns built from it (each a fraction of the JSON in real traces: 0.3 for ten ResNet-50
# steps; more in a crafted one), so that the loader's memory stays within it. 0 on the command line: none.
DEFAULT_MAX_TRACE_BYTES = 4 << 30
# Top-level keys only Kineto writes: a trace with them is PyTorch's even with no event of a known kind.
_KINETO_KEYS = (
    "schemaVersion", "deviceProperties", "computeProperties", "traceName", "baseTimeNanoseconds",
    "distributedInfo",
)  # fmt: skip


_BROWSER_CATEGORIES = frozenset(
    {"devtools.timeline", "blink", "blink.user_timing", "v8", "v8.execute", "toplevel", "cc", "viz",
     "renderer.scheduler", "loading", "navigation", "input", "latencyinfo", "benchmark", "netlog"}
)  # fmt: skip


class TraceTooLargeError(TraceFormatError):
    """The trace's JSON is larger than the limit it was loaded with."""


class ForeignTraceError(NotATraceError):
    """A Chrome trace-format file that is not PyTorch's (JAX, a browser): nothing here to analyze."""


def load_trace(path: str | os.PathLike[str], max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES) -> Trace:
    """Load one trace file. Raises `TraceFormatError` when the file is not a usable trace, and
    `TraceTooLargeError` when its JSON (decompressed) is over `max_bytes` (None: no limit)."""
    p = Path(path)
    if not os.fspath(path):
        raise TraceFormatError("no trace given (an empty path)")
    if not p.exists():
        raise TraceFormatError(f"no such file: {p}")
    if p.is_dir():
        raise TraceFormatError(f"{p} is a directory: use load_traces() for a directory of rank files")
    try:
        with gc_paused(), _open(p, max_bytes) as stream:
            parsed = parse_events(stream, max_bytes)
        for reason, count in parsed.repairs.items():
            parsed.builder.skip(reason, count)
        return build_trace(parsed.builder, str(p), parsed.top)
    except TraceFormatError as err:
        raise type(err)(f"{p}: {err}") from None
    except RecursionError:  # nesting beyond what even `jsonstream.shallow` was given to read
        raise TraceFormatError(f"{p}: JSON nested too deeply to be a trace") from None
    except OSError as err:
        raise TraceFormatError(f"{p}: cannot read: {err.strerror or err}") from None


@dataclass
class Parsed:
    """One pass of the stream reader over a trace's JSON, or a part of it (`split`): the builder of its
    columns, the top-level keys, what was repaired (by reason), and after each chunk how many reasons
    for skipping events and how many labels the builder had met (`split` checks them before a join)."""

    builder: ColumnBuilder
    top: dict[str, Any]
    repairs: dict[str, int]
    marks: list[tuple[int, int]] = field(default_factory=list)


def parse_events(stream: BinaryIO, max_bytes: int | None) -> Parsed:
    """Read every event of `stream` into a new builder; `TraceTooLargeError` as soon as its columns
    would take more than half of `max_bytes`."""
    builder = ColumnBuilder()
    repairs = Repairs()
    parsed = Parsed(builder, {}, repairs.counts)
    gen = read_trace_json(stream, decoder(repairs))
    try:
        while True:
            builder.add_chunk(next(gen))
            parsed.marks.append((len(builder.skipped), len(builder.labels.strings)))
            if max_bytes is not None and builder.column_bytes > max_bytes // 2:
                raise _too_large(max_bytes, "its events would take more than half of it in memory")
    except StopIteration as stop:
        parsed.top = stop.value
    return parsed


def load_traces(path: str | os.PathLike[str], max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES) -> list[Trace]:
    """Load a trace file, or every trace file of a directory (one per rank), sorted by rank. (A
    `gpudoctor run` directory's `rank-K/` folders are `runner.rundir`'s to find: `load_trace_files`.)"""
    p = Path(path)
    if not os.fspath(path) or not p.is_dir():
        return [load_trace(path, max_bytes)]
    files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    return load_trace_files(files, p, max_bytes)


def load_trace_files(
    files: Sequence[Path], directory: Path, max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES
) -> list[Trace]:
    """The traces among `files` (of `directory`), sorted by rank. JSON of another kind (a run's
    record.json, a manifest) is passed over; a damaged trace is not, nor are two files that claim the
    same rank."""
    p = directory
    traces, others = [], []
    for f in files:
        try:
            traces.append(load_trace(f, max_bytes))
        except NotATraceError:
            others.append(f.name)
    if not traces:
        also = f" ({', '.join(others)}: JSON of another kind)" if others else ""
        raise TraceFormatError(f"{p}: no trace files (*.json, *.json.gz) in this directory{also}")
    traces.sort(key=lambda t: t.meta.rank)
    for a, b in pairwise(traces):
        if a.meta.rank == b.meta.rank:
            raise TraceFormatError(
                f"{p}: {Path(a.meta.path).name} and {Path(b.meta.path).name} both claim rank "
                f"{a.meta.rank}: "
                + same_rank_advice(a.meta.distributed is None and b.meta.distributed is None)
            )
    return traces


def same_rank_advice(single_process: bool) -> str:
    """What to do about two traces of a directory that claim the same rank. Traces recorded outside
    torch.distributed are one process's: most often the cycles of a profiler schedule with repeat,
    which tensorboard_trace_handler writes side by side."""
    if single_process:
        return (
            "neither was recorded under torch.distributed, so they are not ranks of one run (a profiler "
            "schedule with repeat writes one trace per cycle): analyze one file"
        )
    # Under torch.distributed, schedule(repeat=N) with tensorboard_trace_handler writes N traces per rank
    # side by side: one run's traces, but N cycles of each rank.
    return (
        "keep one run's rank traces in a directory, one profiler cycle's (a schedule with repeat writes "
        "a trace per rank and cycle): one directory per cycle"
    )


def load_document(
    path: str | os.PathLike[str], max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES
) -> dict[str, Any]:
    """A trace's whole JSON document as Python values (for a tool that rewrites it), read the way
    `load_trace` reads it: regular files only, gzip or not, a byte-order mark allowed, `max_bytes`
    enforced, values nested deeper than `jsonstream.MAX_DEPTH` read as null. The bare array form
    comes back as `{"traceEvents": [...]}`."""
    p = Path(path)
    try:
        with _open(p, max_bytes) as stream:
            chunks = []
            while block := stream.read(8 << 20):
                chunks.append(block)
        data = b"".join(chunks).removeprefix(b"\xef\xbb\xbf")
        del chunks
        try:
            doc = decode_untyped(data)
        except (msgspec.DecodeError, UnicodeDecodeError) as err:
            raise TraceFormatError(f"not readable JSON: {' '.join(str(err).split())[:120]}") from None
    except TraceFormatError as err:
        raise type(err)(f"{p}: {err}") from None
    except OSError as err:
        raise TraceFormatError(f"{p}: cannot read: {err.strerror or err}") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotATraceError(f"{p}: JSON is not a trace: it has no 'traceEvents' array")
    return doc


def _open(p: Path, max_bytes: int | None) -> BinaryIO:
    """The file's bytes, decompressed when it is gzip, counted against `max_bytes`. Only a regular
    file is opened: reading a FIFO would wait for a writer, a device may never end."""
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceFormatError("not a regular file (a FIFO, device or socket): give a trace file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return _Limited(_GzipReader(f), max_bytes)  # type: ignore[return-value]
    if max_bytes is not None and st.st_size > max_bytes:
        f.close()
        raise _too_large(max_bytes, f"its JSON is {fmt_bytes(st.st_size)}")
    return _Limited(f, max_bytes)  # type: ignore[return-value]


def _too_large(limit: int, what: str) -> TraceTooLargeError:
    return TraceTooLargeError(
        f"the trace is over the {fmt_bytes(limit)} limit ({what}); if it is a real trace, raise the "
        f"limit with --max-trace-size (0: none)"
    )


class _Limited:
    """Counts the bytes read and stops at the limit (a gzip bomb inflates to far more than its size)."""

    def __init__(self, f: Any, max_bytes: int | None) -> None:
        self._f = f
        self._left = max_bytes
        self._limit = max_bytes

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        if self._left is not None:
            self._left -= len(data)
            if self._left < 0:
                assert self._limit is not None
                raise _too_large(self._limit, "that much JSON read, once decompressed, and more to come")
        return data

    def __enter__(self) -> _Limited:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


class _GzipReader:
    """Reads a (possibly multi-member) gzip file, turning zlib/EOF errors into TraceFormatError."""

    def __init__(self, f: BinaryIO) -> None:
        self._raw = f
        self._f = gzip.GzipFile(fileobj=f, mode="rb")

    def read(self, n: int) -> bytes:
        try:
            return self._f.read(n)
        except (zlib.error, gzip.BadGzipFile, EOFError) as err:
            raise TraceFormatError(f"corrupt or truncated gzip: {err}") from None

    def close(self) -> None:
        self._f.close()
        self._raw.close()


def build_trace(b: ColumnBuilder, path: str, top: dict[str, Any]) -> Trace:
    """The trace of a builder that has read every event, its top-level keys `top`."""
    if b.n_events == 0 and not top:
        raise TraceFormatError("no events: the trace is empty")
    ts, dur = concat_blocks(b.blocks["ts"], "ts"), concat_blocks(b.blocks["dur"], "dur")
    kind = concat_blocks(b.blocks["kind"], "kind")
    mem = {c: concat_blocks(blocks, "m" + c) for c, blocks in b.mem_blocks.items()}
    # Events, but none of PyTorch's: durations of other names (or only begin/end pairs, counters,
    # instants, which no Kineto trace is made of) and no Kineto key at the top.
    events = b.n_events - b.n_metadata - len(mem["ts"])
    if events and not kind.any() and not any(k in top for k in _KINETO_KEYS):
        raise ForeignTraceError(
            f"this is {_foreign_kind(b)}, not a PyTorch profiler (Kineto) trace: none of its "
            f"{events:,} events is a PyTorch op, GPU kernel or CUDA runtime call. gpudoctor needs the "
            f"trace torch.profiler writes: prof.export_chrome_trace(...) or tensorboard_trace_handler"
        )
    # NaN (no ts) fails these too. One event at ts=-1e308 would otherwise become the origin and
    # push every other row to ~1e308, where float64 has no resolution left.
    valid = (np.abs(ts) < _MAX_TIME_US) & (dur < _MAX_TIME_US)
    kept = None if valid.all() else np.flatnonzero(valid)
    if kept is not None:
        absurd = int((~valid & ~np.isnan(ts)).sum())
        if absurd:
            b.skip(f"duration event with ts or dur beyond {_MAX_TIME_US:.0e} µs", absurd)
    kept_ts = ts if kept is None else ts[kept]
    mem_valid = np.abs(mem["ts"]) < _MAX_TIME_US
    if not mem_valid.all():
        mem = {c: v[mem_valid] for c, v in mem.items()}
    starts = [kept_ts.min()] if len(kept_ts) else []
    if len(mem["ts"]):
        starts.append(mem["ts"].min())
    origin = float(np.floor(min(starts))) if starts else 0.0
    order = np.argsort(kept_ts, kind="stable")
    cols = sorted_columns(
        b.blocks, order if kept is None else kept[order], {"ts": ts, "dur": dur, "kind": kind}
    )
    cols["ts"] -= origin
    mem_order = np.argsort(mem["ts"], kind="stable")
    mem = {c: v[mem_order] for c, v in mem.items()}
    mem["ts"] -= origin
    for cat, count in b.unknown_categories.items():
        b.skip(f"unknown category {cat[:40]!r} (kept as OTHER)", count)
    comm_calls = _comm_calls(b.comm_calls, origin)
    return Trace(
        meta=_meta(path, top, origin, dict(b.unknown_categories)),
        names=tuple(b.names.strings),
        memory=MemoryEvents(**mem),
        labels=tuple(b.labels.strings),
        op_inputs=b.inputs.parsed(),
        thread_names=b.thread_names,
        skipped=dict(b.skipped),
        comm_calls=comm_calls,
        **cols,
    )


def _foreign_kind(b: ColumnBuilder) -> str:
    """What a trace with no PyTorch event is, from its process, thread and category names."""
    names = " ".join([*b.process_names, *b.thread_names.values()]).lower()
    if any(mark in names for mark in ("/device:", "/host:", "xla", "tpu:", "jax")):
        return "a JAX (XLA profiler) trace"
    cats = set(b.unknown_categories)
    if (
        cats & _BROWSER_CATEGORIES
        or any(c.startswith("disabled-by-default-") for c in cats)
        or any(mark in names for mark in ("crbrowsermain", "crrenderermain", "crgpumain"))
    ):
        return "a Chrome browser (DevTools) trace"
    return "a trace in Chrome's trace-event format from another tool"


def _comm_calls(rows: list[tuple[Any, ...]], origin: float) -> CommCalls:
    """The collected record_param_comms rows as columns, in time order, ts relative to `origin`."""
    ok = [r for r in rows if isinstance(r[1], (int, float)) and abs(r[1]) < _MAX_TIME_US]
    if not ok:
        return CommCalls.empty()
    ok.sort(key=lambda r: r[1])
    ext, ts, dur, tid, n_in, n_out, size, coll, dtype, group = zip(*ok, strict=True)
    as_int = [t if isinstance(t, int) and not isinstance(t, bool) else -1 for t in tid]
    durations = [d if isinstance(d, (int, float)) and 0 <= d < _MAX_TIME_US else 0.0 for d in dur]
    return CommCalls(
        external_id=np.array(ext, dtype=np.int64),
        ts=np.array(ts, dtype=np.float64) - origin,
        dur=np.array(durations, dtype=np.float64),
        tid=np.array(as_int, dtype=np.int64),
        in_nelems=np.array(n_in, dtype=np.int64),
        out_nelems=np.array(n_out, dtype=np.int64),
        group_size=np.array(size, dtype=np.int64),
        collective=coll,
        dtype=dtype,
        group=group,
    )


def _meta(path: str, top: dict[str, Any], origin: float, other: dict[str, int]) -> TraceMeta:
    props = top.get("deviceProperties", top.get("computeProperties"))  # the latter: older traces
    if not isinstance(props, list):  # a damaged trace: a number, say, where the list should be
        props = []
    devices = tuple(DeviceInfo.from_kineto(d) for d in props if isinstance(d, dict))
    dist = top.get("distributedInfo")
    distributed = None
    if isinstance(dist, dict):
        rank = dist.get("rank")
        world = dist.get("world_size")
        distributed = DistributedInfo(
            rank=rank if isinstance(rank, int) else _rank_from_name(path),
            world_size=world if isinstance(world, int) else None,
            backend=str(dist["backend"]) if dist.get("backend") is not None else None,
        )
    elif _RANK_IN_NAME.search(Path(path).name):
        distributed = DistributedInfo(rank=_rank_from_name(path), world_size=None, backend=None)
    base = top.get("baseTimeNanoseconds")
    schema = top.get("schemaVersion")
    config = {k: top[k] for k in ("with_stack", "profile_memory", "record_shapes", "with_flops") if k in top}
    return TraceMeta(
        path=path,
        schema_version=schema if isinstance(schema, int) else None,
        base_time_ns=base if isinstance(base, int) else None,
        origin_us=origin,
        devices=devices,
        distributed=distributed,
        trace_name=str(top["traceName"]) if "traceName" in top else None,
        profiler_config=config,
        run_step=top[RUN_STEP_KEY] if isinstance(top.get(RUN_STEP_KEY), str) else None,
        other_categories=other,
    )


def _rank_from_name(path: str) -> int:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else 0
