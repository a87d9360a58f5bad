"""A large trace file read by two processes at once. `start_load` forks a helper that parses the events
after a point between two events about a third into the file, and returns at once: the caller imports
what it needs next while the helper works. `result()` then parses the events before that point here,
and joins the two parts' columns into the trace one pass over the file would have built.

Any doubt and the file is read in one pass, as `load_trace` reads it, which also gives its errors: a
gzip file or a small one, threads running (a fork copies none of them), one CPU, a point that turns out
not to lie between two events, a part that needed repairs, or a part whose order of labels or of reasons
for skipping events could differ from a single pass's."""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import re
import signal
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gpudoctor.trace import jsonstream
from gpudoctor.trace.columns import ColumnBuilder
from gpudoctor.trace.jsonstream import EventsAt, events_at
from gpudoctor.trace.load import Parsed, build_trace, load_trace, parse_events
from gpudoctor.trace.model import Trace
from gpudoctor.util.gcpause import gc_paused

SPLIT_MIN_BYTES = 16 << 20  # below this the fork and the join cost more than half the parse saves
# The share of the file parsed here: less than half, as this process also imports while the helper parses
# (shares from 0.2 to 0.4 measured within noise of one another on a 2-core machine, docs/results.md).
HEAD_SHARE = 0.3
_WINDOW = 1 << 20  # how far before the target point a split between two events is looked for
_SPLIT = re.compile(rb"\}\s*,\s*\{")
_TOLD = struct.Struct("<QQ")  # what the helper sends through the pipe: where its pickle starts and ends


@dataclass(frozen=True)
class _Plan:
    """Where the file is cut: the head is [0, cut) closed by `close`, the tail `[` + [resume, end)."""

    path: Path
    events: EventsAt
    cut: int  # just after the `}` of the last event of the head
    resume: int  # at the `{` of the first event of the tail

    @property
    def close(self) -> bytes:
        return b"]" if self.events.bare else b"]}"

    @property
    def reopen(self) -> bytes:
        return b"[" if self.events.bare else b'{"traceEvents":['


def start_load(path: str | os.PathLike[str], max_bytes: int | None) -> StartedLoad:
    """Start loading the trace at `path`, in two processes where that is sure to pay (see the module);
    never raises: what is wrong with the file is raised by `result()`, as `load_trace` raises it."""
    plan = _plan(Path(path), max_bytes)
    return StartedLoad(path, max_bytes, _Helper.fork(plan, max_bytes) if plan else None)


class StartedLoad:
    """A load begun by `start_load`: `result()` once; leaving a `with` block stops a helper still at work."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None, helper: _Helper | None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._helper = helper

    @property
    def split(self) -> bool:
        """Whether a helper was started (the file is read in two parts, unless a part fails a check)."""
        return self._helper is not None

    def result(self) -> Trace:
        helper, self._helper = self._helper, None
        if helper is None:
            return load_trace(self.path, self.max_bytes)
        try:
            trace = _joined(helper, self.max_bytes)
        except Exception:  # whatever it was, the one pass below says it properly
            trace = None
        finally:
            helper.stop()
        return trace if trace is not None else load_trace(self.path, self.max_bytes)

    def close(self) -> None:
        if self._helper is not None:
            self._helper.stop()
            self._helper = None

    def __enter__(self) -> StartedLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plan(path: Path, max_bytes: int | None) -> _Plan | None:
    if not hasattr(os, "fork") or threading.active_count() != 1 or _cpus() < 2:
        return None
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size < SPLIT_MIN_BYTES:
            return None
        if max_bytes is not None and st.st_size > max_bytes:
            return None
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                return None
            f.seek(0)
            events = events_at(f)
            target = int(st.st_size * HEAD_SHARE)
            if events is None or target - _WINDOW < events.start + 2 * jsonstream.BLOCK_BYTES:
                return None
            f.seek(target - _WINDOW)
            window = f.read(_WINDOW)
    except (OSError, ValueError):
        return None
    last = None
    for last in _SPLIT.finditer(window):  # noqa: B007  (the last one is wanted)
        pass
    if last is None:
        return None
    base = target - _WINDOW
    return _Plan(path, events, cut=base + last.start() + 1, resume=base + last.end() - 1)


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _joined(helper: _Helper, max_bytes: int | None) -> Trace | None:
    """The head parsed here, the tail from the helper, joined; None where a check fails."""
    plan = helper.plan
    with gc_paused(), open(plan.path, "rb") as f:
        head = parse_events(_Head(f, plan.cut, plan.close), max_bytes)
    tail = helper.receive()
    if tail is None or not _joinable(plan, head, tail):
        return None
    head.builder.join(tail.builder)
    if max_bytes is not None and head.builder.column_bytes > max_bytes // 2:
        return None
    return build_trace(head.builder, str(plan.path), {**head.top, **tail.top})


def _joinable(plan: _Plan, head: Parsed, tail: Parsed) -> bool:
    """Whether the join is what one pass would build. The head ended at the cut, inside the events (its
    top-level keys are those before them, nothing after), and neither part was repaired. The order of
    labels and of reasons for skipping events depends on how a pass cuts the events into chunks: the
    tail reads the file in the blocks one pass reads, so its chunks after its first are one pass's; the
    head's last two chunks and the tail's first, where they differ, must bring no new one."""
    if (
        head.top != plan.events.header
        or head.repairs
        or tail.repairs
        or len(head.marks) < 3
        or not tail.marks
    ):
        return False
    b, t = head.builder, tail.builder
    reasons, labels = head.marks[-3]
    tail_reasons, tail_labels = tail.marks[0]
    return (
        (len(b.skipped), len(b.labels.strings)) == (reasons, labels)
        and set(list(t.skipped)[:tail_reasons]) <= set(b.skipped)
        and set(t.labels.strings[:tail_labels]) <= set(b.labels.strings)
    )


class _Helper:
    """The forked process that parses the tail, writes its columns into memory shared with this process
    and pickles the rest of its `Parsed` after them, then says through a pipe where that is, and exits."""

    def __init__(self, plan: _Plan, pid: int, fd: int, region: mmap.mmap) -> None:
        self.plan = plan
        self.pid: int | None = pid
        self.fd: int | None = fd
        self.region: mmap.mmap | None = region

    @classmethod
    def fork(cls, plan: _Plan, max_bytes: int | None) -> _Helper | None:
        try:
            region = mmap.mmap(-1, _region_bytes(plan))
            read_fd, write_fd = os.pipe()
            pid = os.fork()
        except (OSError, ValueError):
            return None
        if pid == 0:  # the helper: never returns
            os.close(read_fd)
            _serve(plan, max_bytes, write_fd, region)
        os.close(write_fd)
        return cls(plan, pid, read_fd, region)

    def receive(self) -> Parsed | None:
        """The tail's parse, once the helper is done; None if it failed."""
        assert self.fd is not None and self.pid is not None and self.region is not None
        with os.fdopen(self.fd, "rb") as f:
            self.fd = None
            told = f.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if status != 0 or len(told) != _TOLD.size:
            return None
        start, end = _TOLD.unpack(told)
        with memoryview(self.region) as whole, whole[start:end] as data:
            parsed, layout = pickle.loads(data)
        if not isinstance(parsed, Parsed):
            return None
        _columns_in(parsed.builder, self.region, layout)
        return parsed

    def stop(self) -> None:
        """Kill the helper if it still runs, reap it, and let go of the pipe and the shared memory."""
        if self.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(self.pid, 0)
            self.pid = None
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        if self.region is not None:
            with contextlib.suppress(BufferError):  # columns still view it: unmapped when they go
                self.region.close()
            self.region = None


def _region_bytes(plan: _Plan) -> int:
    """Room for the tail's columns, a fraction of its JSON in any real trace (a crafted one that needs
    more is read in one pass); only the pages written are ever backed by memory."""
    return max(plan.path.stat().st_size, 1 << 20)


# (group, column, dtype, shape, offset): where the helper put each column of its builder
Layout = list[tuple[str, str, str, tuple[int, ...], int]]


def _columns_out(builder: ColumnBuilder, region: mmap.mmap) -> tuple[Layout, int]:
    """Each column's blocks written into `region` as one array, one column after the other, and taken
    out of the builder (which is then pickled without them); where each went, and where they end."""
    layout: Layout = []
    offset = 0
    for group, columns in (("blocks", builder.blocks), ("mem_blocks", builder.mem_blocks)):
        for name, blocks in columns.items():
            if not blocks:
                continue
            dtype = np.result_type(*blocks)
            shape = (sum(len(b) for b in blocks), *blocks[0].shape[1:])
            offset = -(-offset // 64) * 64
            out = np.ndarray(shape, dtype, buffer=region, offset=offset)  # past its end: TypeError
            np.concatenate(blocks, out=out)
            layout.append((group, name, dtype.str, shape, offset))
            offset += out.nbytes
            blocks.clear()
    return layout, offset


def _columns_in(builder: ColumnBuilder, region: mmap.mmap, layout: Layout) -> None:
    """The helper's columns back into its builder, as views of `region` (joining copies them)."""
    for group, name, dtype, shape, offset in layout:
        getattr(builder, group)[name][:] = [np.ndarray(shape, np.dtype(dtype), buffer=region, offset=offset)]


def _serve(plan: _Plan, max_bytes: int | None, fd: int, region: mmap.mmap) -> None:
    """In the helper: parse the tail, put it into `region`, write where to `fd`, and exit at once (no
    atexit handler, no flush of buffers copied from the parent); any failure is exit status 1 and nothing
    written."""
    code = 1
    try:
        with gc_paused(), open(plan.path, "rb") as f:
            f.seek(plan.resume)
            parsed = parse_events(_Tail(plan.reopen, f, jsonstream.BLOCK_BYTES), max_bytes)
        layout, end = _columns_out(parsed.builder, region)
        region.seek(end)
        pickle.dump((parsed, layout), region, protocol=pickle.HIGHEST_PROTOCOL)  # past its end: ValueError
        os.write(fd, _TOLD.pack(end, region.tell()))
        code = 0
    except BaseException:  # Ctrl-C included: the parent decides, by the exit status
        pass
    finally:
        os._exit(code)


class _Head:
    """The file's bytes up to `end`, then `close`: the head part as a document of its own."""

    def __init__(self, f: BinaryIO, end: int, close: bytes) -> None:
        self._f = f
        self._left = end
        self._close = close

    def read(self, n: int) -> bytes:
        if self._left > 0:
            data = self._f.read(min(n, self._left))
            self._left -= len(data)
            if data:
                return data
            self._left = 0
        data, self._close = self._close, b""
        return data


class _Tail:
    """`reopen`, then the file's bytes from where it stands, the first read ending where a block of one
    pass ends (so that the reader cuts chunks where one pass cuts them): the tail as a document."""

    def __init__(self, reopen: bytes, f: BinaryIO, block: int) -> None:
        self._first: bytes | None = reopen
        self._f = f
        self._short = block - f.tell() % block

    def read(self, n: int) -> bytes:
        if self._first is not None:
            data, self._first = self._first, None
            return data
        if self._short:
            n, self._short = self._short, 0
        return self._f.read(n)
