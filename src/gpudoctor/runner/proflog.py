"""The profiler's own chatter goes to the run directory, not the user's terminal. Kineto and c10 write
their log lines from C++ straight to file descriptors 1 and 2 (`USDT: … profiler_start`, `STAGE: …`,
`[W… CPUAllocator.cpp:245] Memory block of unknown size …`), while the profiler starts, stops, exports
and during the traced steps. While `ProfilerLog` is on, both descriptors feed a pipe read by a thread:
the profiler's lines go to `profiler.log`, everything else on to where it was going, as it comes (a
partial line that cannot be the profiler's is passed on at once). Off again, the descriptors are put
back; the thread reads on until the pipe's last writer is gone (a DataLoader worker forked meanwhile
holds it), so no one writing to the terminal ever blocks on a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from pathlib import Path
from typing import IO

# Whole lines that are the profiler's: Kineto's and c10's log formats and anything naming them.
_PROFILER_LINE = re.compile(
    rb"^(?:USDT:|STAGE:|\[[WIEF]\d{4} [^\]]*\]|\[[WIEF] [^\]]*\.(?:cpp|cc|h):\d+\])"
    rb"|kineto|cupti|ActivityProfiler|CuptiActivity|torch/(?:autograd/)?profiler",
    re.IGNORECASE,
)
_STARTS = (b"USDT:", b"STAGE:")
_GLOG_START = re.compile(rb"^\[[WIEF]?(?:\d{0,4}|\d{4} [^\]]*)$")  # a prefix of "[W1124 22:17:23.14 …]"
_HOLD_AT_MOST = 4096  # a partial line held to see whether it is the profiler's


class ProfilerLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> ProfilerLog:
        if self._saved:
            return self
        try:
            self._log = open(self.path, "ab")  # noqa: SIM115 -- closed in stop
        except OSError:
            return self  # no log, no filtering: the lines reach the terminal as before
        _flush_python_streams()
        for fd in (1, 2):
            try:
                saved = os.dup(fd)
            except OSError:
                continue  # closed: nothing to filter
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            self._saved[fd] = saved
            thread = threading.Thread(
                target=self._pump, args=(read, saved), name=f"gpudoctor-fd{fd}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Put the descriptors back; wait a moment for the pipes to drain."""
        if not self._saved:
            return
        _flush_python_streams()
        for fd, saved in self._saved.items():
            with contextlib.suppress(OSError):
                os.dup2(saved, fd)  # closes this end of the pipe: the reader sees its end of file
        self._saved.clear()
        for thread in self._threads:
            thread.join(timeout=2.0)
        self._threads = [t for t in self._threads if t.is_alive()]
        if not self._threads and self._log is not None:
            with self._lock:
                self._log.close()
                self._log = None

    def __enter__(self) -> ProfilerLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pump(self, read: int, target: int) -> None:
        pending = b""
        try:
            while data := os.read(read, 65536):
                pending = self._route(pending + data, target)
            if pending:  # the last line had no newline: it goes where it belongs as it is
                if _PROFILER_LINE.search(pending):
                    self._to_log(pending + b"\n")
                else:
                    _write_all(target, pending)
        except OSError:
            pass
        finally:
            os.close(read)
            with contextlib.suppress(OSError):
                os.close(target)

    def _route(self, data: bytes, target: int) -> bytes:
        """Send complete lines on; return the partial line still held."""
        *lines, partial = data.split(b"\n")
        out, log = bytearray(), bytearray()
        for line in lines:
            (log if _PROFILER_LINE.search(line) else out).extend(line + b"\n")
        if partial and not _may_start_profiler_line(partial):
            out += partial
            partial = b""
        if out:
            _write_all(target, bytes(out))
        if log:
            self._to_log(bytes(log))
        return partial

    def _to_log(self, data: bytes) -> None:
        with self._lock:
            if self._log is not None:
                self._log.write(data)
                self._log.flush()


def _may_start_profiler_line(partial: bytes) -> bool:
    if len(partial) > _HOLD_AT_MOST:
        return False
    if any(partial.startswith(s) or s.startswith(partial) for s in _STARTS):
        return True
    return _GLOG_START.match(partial) is not None or _PROFILER_LINE.match(partial) is not None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
