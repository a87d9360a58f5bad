"""The filter process of `runner.proflog`, run as `python -c <this file> FD`: stdin is the pipe that
file descriptor 2 of the profiled process writes to, stdout the terminal's stderr, FD the log the parent
opened (profiler.log, through the one writer). The profiler's lines go to FD; everything else goes on at
once (a partial line that cannot be the profiler's is not held).
Only the standard library: it runs from its source, before anything else is importable."""

import os
import re
import sys
from typing import BinaryIO

PROFILER_LINE = re.compile(
    rb"^(?:USDT:|STAGE:|\[[WIEF]\d{4} [^\]]*\]|\[[WIEF] [^\]]*\.(?:cpp|cc|h):\d+\])"
    rb"|kineto|cupti|ActivityProfiler|CuptiActivity|torch/(?:autograd/)?profiler",
    re.IGNORECASE,
)
STARTS = (b"USDT:", b"STAGE:")
GLOG_START = re.compile(rb"^\[[WIEF]?(?:\d{0,4}|\d{4} [^\]]*)$")  # a prefix of "[W1124 22:17:23.14 …]"
HOLD_AT_MOST = 4096


def may_start_profiler_line(partial: bytes) -> bool:
    if len(partial) > HOLD_AT_MOST:
        return False
    if any(partial.startswith(s) or s.startswith(partial) for s in STARTS):
        return True
    return GLOG_START.match(partial) is not None or PROFILER_LINE.match(partial) is not None


def route(data: bytes, out: BinaryIO, log: BinaryIO) -> bytes:
    *lines, partial = data.split(b"\n")
    for line in lines:
        (log if PROFILER_LINE.search(line) else out).write(line + b"\n")
    if partial and not may_start_profiler_line(partial):
        out.write(partial)
        partial = b""
    out.flush()
    log.flush()
    return partial


def main(log_fd: str) -> None:
    out = sys.stdout.buffer
    with os.fdopen(int(log_fd), "ab") as log:
        pending = b""
        while True:
            try:
                data = os.read(0, 65536)
            except InterruptedError:
                continue
            if not data:
                break
            pending = route(pending + data, out, log)
        if pending:
            (log if PROFILER_LINE.search(pending) else out).write(pending)
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
