"""Load Kineto / Chrome traces (`.json`, `.json.gz`, a directory of rank files) into columnar `Trace`s.

Events arrive chunk by chunk from `jsonstream`; each chunk becomes numpy columns at once and its dicts
are dropped, so memory stays near the size of the columns. Malformed events are counted in
`Trace.skipped`, never fatal; a file that is not a trace at all raises `TraceFormatError`.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import stat
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import compress, pairwise, repeat
from operator import attrgetter, eq, is_, not_
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from gpudoctor.device import DeviceInfo
from gpudoctor.trace.jsonstream import decode_untyped, read_trace_json
from gpudoctor.trace.model import (
    CATEGORY_KINDS,
    RUN_STEP_KEY,
    SHAPED_OPS,
    CommCalls,
    DistributedInfo,
    Kind,
    MemoryEvents,
    OpInputs,
    Trace,
    TraceMeta,
    is_torch_annotation,
)
from gpudoctor.trace.schema import NO_ARGS, Args, Event, Repairs, decoder
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
            builder = _Builder()
            repairs = Repairs()
            gen = read_trace_json(stream, decoder(repairs))
            try:
                while True:
                    builder.add_chunk(next(gen))
                    if max_bytes is not None and builder.column_bytes > max_bytes // 2:
                        raise _too_large(max_bytes, "its events would take more than half of it in memory")
            except StopIteration as stop:
                top: dict[str, Any] = stop.value
            for reason, count in repairs.counts.items():
                builder.skip(reason, count)
        return builder.build(str(p), top)
    except TraceFormatError as err:
        raise type(err)(f"{p}: {err}") from None
    except RecursionError:  # nesting beyond what even `jsonstream.shallow` was given to read
        raise TraceFormatError(f"{p}: JSON nested too deeply to be a trace") from None
    except OSError as err:
        raise TraceFormatError(f"{p}: cannot read: {err.strerror or err}") from None


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


class _Interner:
    """Strings to dense ids, in first-seen order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.strings: list[str] = []
        self.bytes = 0  # the characters of the strings (memory, about)

    def many(self, values: Sequence[Any]) -> np.ndarray:
        get = self.ids.get
        try:
            out = list(map(get, values))
            if None in out:  # new names: add each once, then look all up again
                for v in dict.fromkeys(compress(values, map(is_, out, repeat(None)))):  # C loops
                    self.one(v)
                out = list(map(get, values))
        except TypeError:  # an unhashable name (a list, say) in a damaged trace
            out = [self.one(v) for v in values]
        return np.array(out, dtype=np.int32)

    def one(self, value: Any) -> int:
        key = value if isinstance(value, str) else ("" if value is None else str(value)[:200])
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.strings)
            self.strings.append(key)
            self.bytes += len(key) + 50
        if key is not value:  # None, a number: look it up directly next time
            with contextlib.suppress(TypeError):
                self.ids[value] = got
        return got


_RAW_INPUTS = tuple(map(attrgetter, ("input_dims", "input_types", "concrete_inputs")))
_NO_INPUTS = (b"", b"", b"")


class _RawInputs:
    """The record_shapes args of cpu ops, interned as raw JSON: ops repeat a few hundred distinct
    argument lists every step, so each distinct one is parsed once, at the end."""

    def __init__(self) -> None:
        self.ids: dict[tuple[bytes, bytes, bytes], int] = {_NO_INPUTS: -1}
        self.keys: list[tuple[bytes, bytes, bytes]] = []

    def many(self, args: Sequence[Args]) -> np.ndarray:
        # bytes() copies each Raw out of the chunk's buffer, which can then be freed
        keys = list(zip(*(map(bytes, map(get, args)) for get in _RAW_INPUTS), strict=True))
        get = self.ids.get
        out = list(map(get, keys))
        if None in out:
            for key in dict.fromkeys(compress(keys, map(is_, out, repeat(None)))):
                self.ids[key] = len(self.keys)
                self.keys.append(key)
            out = list(map(get, keys))
        return np.array(out, dtype=np.int32)

    def parsed(self) -> tuple[OpInputs, ...]:
        return tuple(
            OpInputs(
                _json_tuple(dims), tuple(map(str, _json_tuple(types))), tuple(map(str, _json_tuple(conc)))
            )
            for dims, types, conc in self.keys
        )


def _json_tuple(raw: bytes) -> tuple[Any, ...]:
    """A JSON array as nested tuples; () for anything else (absent, null, malformed)."""
    try:
        value = msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        return ()
    return _tuples(value) if isinstance(value, list) else ()


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _num(values: Sequence[Any], dtype: type, default: float) -> np.ndarray:
    """numpy array of numbers; anything that is not a number (None included) becomes `default`."""
    try:
        arr = np.array(values, dtype=dtype)
        if arr.ndim == 1:
            if default == default and arr.dtype.kind == "f":  # None became NaN; want the default
                arr[np.isnan(arr)] = default
            return arr
    except (TypeError, ValueError, OverflowError):
        pass
    try:  # usually only nulls (e.g. a top-level Python frame's "Python parent id": null)
        arr = np.array([default if v is None else v for v in values], dtype=dtype)
        if arr.ndim == 1:
            return arr
    except (TypeError, ValueError, OverflowError):
        pass
    clean = [
        v if isinstance(v, (int, float)) and not isinstance(v, bool) and _fits(v, dtype) else default
        for v in values
    ]
    return np.array(clean, dtype=dtype)


def _fits(v: float, dtype: type) -> bool:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return v == v and info.min <= v <= info.max  # NaN fails
    return True


def _dims(values: list[Any]) -> np.ndarray:
    clean = [v if type(v) is list and len(v) == 3 else _NO_DIM for v in values]
    try:
        return np.array(clean, dtype=np.int32).reshape(-1, 3)
    except (TypeError, ValueError, OverflowError):
        fixed = [v if all(isinstance(x, int) and 0 <= x < 2**31 for x in v) else _NO_DIM for v in clean]
        return np.array(fixed, dtype=np.int32).reshape(-1, 3)


class _Builder:
    """Accumulates column blocks chunk by chunk."""

    _COLUMNS = (
        "kind", "name", "pid", "tid", "ts", "dur", "correlation", "external_id", "device", "stream",
        "bytes", "grid", "block", "registers", "shared_memory", "occupancy", "blocks_per_sm",
        "warps_per_sm", "python_id", "python_parent_id", "flops", "inputs", "sequence", "fwd_thread",
    )  # fmt: skip
    _MEMORY = ("ts", "bytes", "total_allocated", "total_reserved", "device_type", "device_id")

    def __init__(self) -> None:
        self.names = _Interner()
        self.labels = _Interner()
        self.inputs = _RawInputs()
        self.shaped_names = np.zeros(0, dtype=bool)  # per name id: one of SHAPED_OPS
        self.annotation_names = np.zeros(0, dtype=bool)  # per name id: one of torch's own annotations
        self.blocks: dict[str, list[np.ndarray]] = {c: [] for c in self._COLUMNS}
        self.mem_blocks: dict[str, list[np.ndarray]] = {c: [] for c in self._MEMORY}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.comm_calls: list[tuple[Any, ...]] = []  # record_param_comms rows, see _add_comm_calls
        self.process_names: list[str] = []
        self.skipped: dict[str, int] = {}
        self.unknown_categories: dict[str, int] = {}
        self.n_events = 0
        self.n_metadata = 0  # "M" events: process and thread names, which any tool writes

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    # ---- one chunk -------------------------------------------------------------------------
    def add_chunk(self, events: list[Event]) -> None:
        phases = list(map(_PH, events))
        self.n_events += len(phases) - phases.count(None)  # a JSON object without "ph" is no event
        self.n_metadata += phases.count("M")
        # C loops: no bytecode per event. eq, not "X".__eq__: that gives NotImplemented (truthy) for None
        is_x = list(map(eq, repeat("X"), phases))
        xs = list(compress(events, is_x))
        if len(xs) < len(events):
            self._add_others(list(compress(events, map(not_, is_x))))
        if xs:
            self._add_durations(xs)

    @property
    def column_bytes(self) -> int:
        """What the columns built so far hold (the strings interned included, about)."""
        arrays = sum(
            a.nbytes for blocks in (*self.blocks.values(), *self.mem_blocks.values()) for a in blocks
        )
        return arrays + self.names.bytes + self.labels.bytes

    def _add_durations(self, xs: list[Event]) -> None:
        n = len(xs)
        kinds = self._kinds(list(map(_CAT, xs)))
        ts = _column(xs, "ts", np.float64, np.nan)
        dur = _column(xs, "dur", np.float64, 0.0)
        bad_ts = np.isnan(ts)
        if bad_ts.any():
            self.skip("duration event without a numeric ts", int(bad_ts.sum()))
        negative = dur < 0
        if negative.any():  # seen in the wild (HTA issue tracker); keep the event, as an instant
            self.skip("negative duration clamped to 0", int(negative.sum()))
            dur[negative] = 0.0
        args = list(map(_ARGS, xs))
        if None in args:
            args = [a or NO_ARGS for a in args]
        b = self.blocks
        name_ids = self.names.many(list(map(_NAME, xs)))
        _as_annotations(kinds, self._by_name(name_ids, "annotation_names", is_torch_annotation))
        b["kind"].append(kinds)
        b["name"].append(name_ids)
        b["pid"].append(self._ids(list(map(_PID, xs))))
        b["tid"].append(self._ids(list(map(_TID, xs))))
        b["ts"].append(ts)
        b["dur"].append(dur)
        b["correlation"].append(_column(args, "correlation", np.int64, -1))
        b["external_id"].append(_external_ids(kinds, args))
        gpu = _Subset(n, np.flatnonzero((kinds >= Kind.KERNEL) & (kinds <= Kind.GPU_SYNC)), args)
        b["device"].append(gpu.column("device", np.int16, -1))
        b["stream"].append(gpu.column("stream", np.int64, -1))
        b["bytes"].append(gpu.column("bytes", np.int64, -1))
        kernel = _Subset(n, np.flatnonzero(kinds == Kind.KERNEL), args)
        b["registers"].append(kernel.column("registers", np.int32, -1))
        b["shared_memory"].append(kernel.column("shared_memory", np.int64, -1))
        b["occupancy"].append(kernel.column("occupancy", np.float32, np.nan))
        b["blocks_per_sm"].append(kernel.column("blocks_per_sm", np.float32, np.nan))
        b["warps_per_sm"].append(kernel.column("warps_per_sm", np.float32, np.nan))
        b["grid"].append(kernel.dims("grid"))
        b["block"].append(kernel.dims("block"))
        python = _Subset(n, np.flatnonzero(kinds == Kind.PYTHON), args)
        b["python_id"].append(python.column("python_id", np.int64, -1))
        b["python_parent_id"].append(python.column("python_parent_id", np.int64, -1))
        cpu_op = _Subset(n, np.flatnonzero(kinds == Kind.CPU_OP), args)
        b["flops"].append(cpu_op.column("flops", np.float64, np.nan))
        b["sequence"].append(cpu_op.column("sequence", np.int64, -1))
        b["fwd_thread"].append(cpu_op.column("fwd_thread", np.int64, -1))
        shaped = cpu_op.rows[self._by_name(name_ids[cpu_op.rows], "shaped_names", SHAPED_OPS.__contains__)]
        b["inputs"].append(_Subset(n, shaped, args).inputs(self.inputs))
        comm_id = self.names.ids.get(COMM_OP)
        if comm_id is not None:
            calls = cpu_op.rows[name_ids[cpu_op.rows] == comm_id]
            self._add_comm_calls([xs[i] for i in calls.tolist()])

    def _add_comm_calls(self, ops: list[Event]) -> None:
        """torch.distributed's records of collective calls: what each moved (a few per step)."""
        for e in ops:
            a = e.args
            if a is None or a.collective is None:
                continue
            self.comm_calls.append(
                (_int(a.external_id), e.ts, e.dur, e.tid, _int(a.in_nelems), _int(a.out_nelems),
                 _int(a.group_size), _text(a.collective), _text(a.dtype), _text(a.group))
            )  # fmt: skip

    def _by_name(self, name_ids: np.ndarray, memo: str, predicate: Callable[[str], Any]) -> np.ndarray:
        """Which of these names `predicate` holds for (a mask over them), memoized per name id in the
        array attribute `memo`."""
        mask: np.ndarray = getattr(self, memo)
        known = len(mask)
        if known < len(self.names.strings):
            more = [bool(predicate(s)) for s in self.names.strings[known:]]
            mask = np.concatenate((mask, np.array(more, dtype=bool)))
            setattr(self, memo, mask)
        return mask[name_ids]

    def _kinds(self, cats: Sequence[Any]) -> np.ndarray:
        known = CATEGORY_KINDS
        try:
            out = list(map(known.get, cats))
        except TypeError:  # an unhashable category in a damaged trace
            out = [None] * len(cats)
        if None in out:
            for i, c in enumerate(cats):
                if out[i] is None:
                    out[i] = self._kind_of_unknown(c)
        return np.array(out, dtype=np.int8)

    def _kind_of_unknown(self, cat: Any) -> Kind:
        text = str(cat).lower() if cat is not None else ""
        kind = CATEGORY_KINDS.get(text)
        if kind is None:
            if text.endswith("_runtime"):
                kind = Kind.RUNTIME
            elif text.endswith("_driver"):
                kind = Kind.DRIVER
            else:
                kind = Kind.OTHER
                self.unknown_categories[text] = self.unknown_categories.get(text, 0) + 1
        return kind

    def _ids(self, values: Sequence[Any]) -> np.ndarray:
        # No dtype= here: numpy would parse numeric strings ("5" -> 5) and keep negative ints, which
        # collide with the label ids; `_id` turns both into labels, whatever the chunk holds.
        arr = np.array(values)
        if arr.dtype.kind == "i" and arr.ndim == 1 and (not len(arr) or arr.min() >= 0):
            return arr.astype(np.int64, copy=False)
        return np.array([self._id(v) for v in values], dtype=np.int64)

    def _id(self, v: Any) -> int:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63:
            return v
        return -self.labels.one(v) - 2

    def _add_others(self, others: list[Event]) -> None:
        memory = [e for e in others if e.name == "[memory]" and e.ph in ("i", "I")]
        if memory:
            self._add_memory(memory)
        for ph, count in Counter(e.ph for e in others).items():
            if ph == "M":
                for e in others:
                    if e.ph == "M":
                        self._add_metadata(e)
            elif ph in ("s", "f", "t"):
                self.skip("flow events (links come from correlation ids)", count)
            elif ph in ("i", "I"):
                count -= sum(1 for e in memory if e.ph == ph)
                if count:
                    self.skip("instant events", count)
            else:
                self.skip(f"events of phase {str(ph)[:8]!r}", count)

    def _add_metadata(self, e: Event) -> None:
        if e.args is None or e.args.name is None:
            return
        if e.name == "thread_name":
            self.thread_names[(self._id(e.pid), self._id(e.tid))] = e.args.name
        elif e.name == "process_name" and len(self.process_names) < 1000:
            self.process_names.append(e.args.name)

    def _add_memory(self, evs: list[Event]) -> None:
        args = [e.args or NO_ARGS for e in evs]
        m = self.mem_blocks
        m["ts"].append(_num([e.ts for e in evs], np.float64, np.nan))
        m["bytes"].append(_num([a.alloc_bytes for a in args], np.int64, 0))
        m["total_allocated"].append(_num([a.total_allocated for a in args], np.int64, -1))
        m["total_reserved"].append(_num([a.total_reserved for a in args], np.int64, -1))
        m["device_type"].append(_num([a.device_type for a in args], np.int8, -1))
        m["device_id"].append(_num([a.device_id for a in args], np.int16, -1))

    def _foreign_kind(self) -> str:
        """What a trace with no PyTorch event is, from its process, thread and category names."""
        names = " ".join([*self.process_names, *self.thread_names.values()]).lower()
        if any(mark in names for mark in ("/device:", "/host:", "xla", "tpu:", "jax")):
            return "a JAX (XLA profiler) trace"
        cats = set(self.unknown_categories)
        if (
            cats & _BROWSER_CATEGORIES
            or any(c.startswith("disabled-by-default-") for c in cats)
            or any(mark in names for mark in ("crbrowsermain", "crrenderermain", "crgpumain"))
        ):
            return "a Chrome browser (DevTools) trace"
        return "a trace in Chrome's trace-event format from another tool"

    # ---- the whole trace -------------------------------------------------------------------
    def build(self, path: str, top: dict[str, Any]) -> Trace:
        if self.n_events == 0 and not top:
            raise TraceFormatError("no events: the trace is empty")
        cols = {c: _concat(blocks, c) for c, blocks in self.blocks.items()}
        mem = {c: _concat(blocks, "m" + c) for c, blocks in self.mem_blocks.items()}
        # Events, but none of PyTorch's: durations of other names (or only begin/end pairs, counters,
        # instants, which no Kineto trace is made of) and no Kineto key at the top.
        events = self.n_events - self.n_metadata - len(mem["ts"])
        if events and not cols["kind"].any() and not any(k in top for k in _KINETO_KEYS):
            raise ForeignTraceError(
                f"this is {self._foreign_kind()}, not a PyTorch profiler (Kineto) trace: none of its "
                f"{events:,} events is a PyTorch op, GPU kernel or CUDA runtime call. gpudoctor needs the "
                f"trace torch.profiler writes: prof.export_chrome_trace(...) or tensorboard_trace_handler"
            )
        # NaN (no ts) fails these too. One event at ts=-1e308 would otherwise become the origin and
        # push every other row to ~1e308, where float64 has no resolution left.
        valid = (np.abs(cols["ts"]) < _MAX_TIME_US) & (cols["dur"] < _MAX_TIME_US)
        if not valid.all():
            absurd = int((~valid & ~np.isnan(cols["ts"])).sum())
            if absurd:
                self.skip(f"duration event with ts or dur beyond {_MAX_TIME_US:.0e} µs", absurd)
            cols = {c: v[valid] for c, v in cols.items()}
        mem_valid = np.abs(mem["ts"]) < _MAX_TIME_US
        if not mem_valid.all():
            mem = {c: v[mem_valid] for c, v in mem.items()}
        starts = [cols["ts"].min()] if len(cols["ts"]) else []
        if len(mem["ts"]):
            starts.append(mem["ts"].min())
        origin = float(np.floor(min(starts))) if starts else 0.0
        order = np.argsort(cols["ts"], kind="stable")
        cols = {c: v[order] for c, v in cols.items()}
        cols["ts"] -= origin
        mem_order = np.argsort(mem["ts"], kind="stable")
        mem = {c: v[mem_order] for c, v in mem.items()}
        mem["ts"] -= origin
        for cat, count in self.unknown_categories.items():
            self.skip(f"unknown category {cat[:40]!r} (kept as OTHER)", count)
        comm_calls = _comm_calls(self.comm_calls, origin)
        return Trace(
            meta=_meta(path, top, origin, dict(self.unknown_categories)),
            names=tuple(self.names.strings),
            memory=MemoryEvents(**mem),
            labels=tuple(self.labels.strings),
            op_inputs=self.inputs.parsed(),
            thread_names=self.thread_names,
            skipped=dict(self.skipped),
            comm_calls=comm_calls,
            **cols,
        )


def _as_annotations(kinds: np.ndarray, torch_annotation: np.ndarray) -> None:
    """Torch's own ranges (`ProfilerStep#N`, the optimizer's and DataLoader's) recorded as ops, as
    PyTorch <= 1.9 wrote every range ("Operator"), become the user annotations later versions write."""
    recast = torch_annotation & (kinds == Kind.CPU_OP)
    if recast.any():
        kinds[recast] = Kind.USER_ANNOTATION


def _external_ids(kinds: np.ndarray, args: Sequence[Args]) -> np.ndarray:
    """Each row's `External id`; on runtime calls and GPU activity without one, the `external id` older
    Kineto (PyTorch <= 1.9) wrote there instead, which names the CPU op as `External id` does now."""
    ids = _column(args, "external_id", np.int64, -1)
    missing = np.flatnonzero((ids < 0) & (kinds >= Kind.RUNTIME))
    if len(missing):
        ids[missing] = _Subset(len(ids), missing, args).column("external_id_older", np.int64, -1)[missing]
    return ids


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


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else -1


def _text(v: Any) -> str:
    return v[:100] if isinstance(v, str) else ""


_PH, _CAT, _NAME, _PID, _TID, _ARGS = (attrgetter(f) for f in ("ph", "cat", "name", "pid", "tid", "args"))


def _column(objs: Sequence[Any], field: str, dtype: type, default: float) -> np.ndarray:
    """One numeric field of every struct as an array; None or garbage becomes `default`."""
    get = attrgetter(field)
    try:  # the fast path: a C loop with no intermediate list
        arr = np.fromiter(map(get, objs), dtype=dtype, count=len(objs))
    except (TypeError, ValueError, OverflowError):
        return _num(list(map(get, objs)), dtype, default)
    if default == default and arr.dtype.kind == "f":  # fromiter turns None into NaN; want the default
        arr[np.isnan(arr)] = default
    return arr


class _Subset:
    """Reads `Args` fields for a subset of a chunk's rows into full-length columns."""

    def __init__(self, n: int, rows: np.ndarray, args: Sequence[Args]) -> None:
        self.n = n
        self.rows = rows
        self.args = list(map(args.__getitem__, rows.tolist())) if len(rows) < n else args

    def column(self, field: str, dtype: type, default: float) -> np.ndarray:
        if len(self.rows) == self.n:
            return _column(self.args, field, dtype, default)
        out = np.full(self.n, default, dtype=dtype)
        if len(self.rows):
            out[self.rows] = _column(self.args, field, dtype, default)
        return out

    def inputs(self, interned: _RawInputs) -> np.ndarray:
        out = np.full(self.n, -1, dtype=np.int32)
        if len(self.rows):
            out[self.rows] = interned.many(self.args)
        return out

    def dims(self, field: str) -> np.ndarray:
        out = np.zeros((self.n, 3), dtype=np.int32)
        if len(self.rows):
            out[self.rows] = _dims(list(map(attrgetter(field), self.args)))
        return out


def _concat(blocks: list[np.ndarray], column: str) -> np.ndarray:
    if blocks:
        return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    if column in ("grid", "block"):
        return np.zeros((0, 3), dtype=np.int32)
    dtype = {
        "mts": np.float64, "ts": np.float64, "dur": np.float64, "flops": np.float64, "inputs": np.int32
    }.get(column, np.int64)  # fmt: skip
    return np.empty(0, dtype=dtype)


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
