"""A trace's events, chunk by chunk, as numpy column blocks: names and labels interned to dense ids,
the arguments of each kind of event read only for its rows, what is not kept counted by reason.
`load` turns a builder's blocks into a `Trace`; `split` joins two builders, each of one part of a
file, into the one a single pass over the whole file would have built."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import attrgetter, eq, is_, not_
from typing import Any

import msgspec
import numpy as np

from gpudoctor.trace.model import CATEGORY_KINDS, SHAPED_OPS, Kind, OpInputs, is_torch_annotation
from gpudoctor.trace.schema import NO_ARGS, Args, Event

_NO_DIM = [0, 0, 0]
COMM_OP = "record_param_comms"  # the CPU op torch.distributed records each collective call as
_MAX_PROCESS_NAMES = 1000  # kept to tell what wrote a foreign trace


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
                self.one(key)
            out = list(map(get, keys))
        return np.array(out, dtype=np.int32)

    def one(self, key: tuple[bytes, bytes, bytes]) -> int:
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.keys)
            self.keys.append(key)
        return got

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


class ColumnBuilder:
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
        self._array_bytes = 0  # the blocks' bytes, as far as `column_bytes` has counted them
        self._tallied: dict[str, int] = {}  # per list of blocks: how many are counted

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    # ---- one chunk -------------------------------------------------------------------------
    def add_chunk(self, events: list[Event]) -> None:
        phases = list(map(_PH, events))
        # C loops: no bytecode per event. eq, not "X".__eq__: that gives NotImplemented (truthy) for None
        is_x = list(map(eq, repeat("X"), phases))
        xs = list(compress(events, is_x))
        self.n_events += len(xs)
        if len(xs) < len(events):
            others = list(compress(events, map(not_, is_x)))
            other_phases = list(compress(phases, map(not_, is_x)))
            self.n_events += len(others) - other_phases.count(None)  # a JSON object without "ph" is no event
            self.n_metadata += other_phases.count("M")
            self._add_others(others, other_phases)
        if xs:
            self._add_durations(xs)

    @property
    def column_bytes(self) -> int:
        """What the columns built so far hold (the strings interned included, about); each block is
        counted once, the first time it is seen here (this is asked after every chunk)."""
        for key, blocks in (*self.blocks.items(), *(("m" + k, v) for k, v in self.mem_blocks.items())):
            seen = self._tallied.get(key, 0)
            if seen < len(blocks):
                self._array_bytes += sum(a.nbytes for a in blocks[seen:])
                self._tallied[key] = len(blocks)
        return self._array_bytes + self.names.bytes + self.labels.bytes

    def join(self, later: ColumnBuilder) -> None:
        """Append what `later` read from the events after this builder's (the next part of the same
        trace): its names, labels and argument lists interned after these, as a single pass would have
        met them, and the ids in its blocks renumbered to match."""
        names = np.array([self.names.one(s) for s in later.names.strings], dtype=np.int32)
        labels = np.array([self.labels.one(s) for s in later.labels.strings], dtype=np.int64)
        inputs = np.array([self.inputs.one(k) for k in later.inputs.keys], dtype=np.int32)
        renumber = {
            "name": lambda ids: names[ids],
            "pid": lambda ids: _relabel(ids, labels),
            "tid": lambda ids: _relabel(ids, labels),
            "inputs": lambda ids: np.where(ids >= 0, inputs[np.maximum(ids, 0)], ids) if len(inputs) else ids,
        }
        for column, blocks in later.blocks.items():
            how = renumber.get(column)
            self.blocks[column] += [how(b) for b in blocks] if how else blocks
        for column, blocks in later.mem_blocks.items():
            self.mem_blocks[column] += blocks
        for (pid, tid), name in later.thread_names.items():
            key = tuple(_relabel(np.array([pid, tid], dtype=np.int64), labels).tolist())
            self.thread_names[key] = name  # type: ignore[index]
        self.comm_calls += later.comm_calls
        self.process_names += later.process_names[: max(0, _MAX_PROCESS_NAMES - len(self.process_names))]
        for reason, n in later.skipped.items():
            self.skip(reason, n)
        for category, n in later.unknown_categories.items():
            self.unknown_categories[category] = self.unknown_categories.get(category, 0) + n
        self.n_events += later.n_events
        self.n_metadata += later.n_metadata

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

    def _add_others(self, others: list[Event], phases: list[Any]) -> None:
        named = compress(others, map(eq, repeat("[memory]"), map(_NAME, others)))
        memory = [e for e in named if e.ph in ("i", "I")]
        if memory:
            self._add_memory(memory)
        for ph, count in Counter(phases).items():
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
        elif e.name == "process_name" and len(self.process_names) < _MAX_PROCESS_NAMES:
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


def _relabel(ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """pid or tid ids of a later part with its labels (-label - 2) renumbered by `labels`."""
    out = ids.copy()
    neg = out < 0
    if neg.any():
        out[neg] = -labels[-out[neg] - 2] - 2
    return out


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


def concat_blocks(blocks: list[np.ndarray], column: str) -> np.ndarray:
    if blocks:
        return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    if column in ("grid", "block"):
        return np.zeros((0, 3), dtype=np.int32)
    dtype = {
        "mts": np.float64, "ts": np.float64, "dur": np.float64, "flops": np.float64, "inputs": np.int32
    }.get(column, np.int64)  # fmt: skip
    return np.empty(0, dtype=dtype)


def sorted_columns(
    blocks: dict[str, list[np.ndarray]], order: np.ndarray, joined: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each column's blocks joined (or taken from `joined`) and its rows taken in `order`. Columns of
    several blocks are joined into one scratch buffer, reused column after column: a fresh array per
    column, twice over, would cost the page faults of all of them."""
    out: dict[str, np.ndarray] = {}
    scratch = np.empty(0, dtype=np.uint8)
    for column, parts in blocks.items():
        if column in joined or len(parts) < 2:
            whole = joined[column] if column in joined else concat_blocks(parts, column)
            out[column] = np.take(whole, order, axis=0)
            continue
        dtype = np.result_type(*parts)
        shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
        size = int(np.prod(shape)) * dtype.itemsize
        if scratch.nbytes < size:
            scratch = np.empty(size, dtype=np.uint8)
        whole = np.ndarray(shape, dtype, buffer=scratch)
        np.concatenate(parts, out=whole)
        out[column] = np.take(whole, order, axis=0)
    return out
