"""The profiler's own log lines go to the run directory, not the user's terminal. Kineto and c10 write them
from C++ straight to file descriptor 2; while `ProfilerLog` is on, descriptor 2 is a pipe into a small
filter process (`runner.stderr_filter`) that sends them to `profiler.log` and everything else on to the
terminal as it comes. A process, not a thread: C++ writes to stderr holding the GIL, so a thread of ours
emptying the pipe would deadlock once it is full. The filter ends when the pipe's last writer is gone."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.runner.rundir import open_log
from gpudoctor.util.errors import OutputError
from gpudoctor.util.outfile import close_live

_FILTER = Path(__file__).with_name("stderr_filter.py")


class ProfilerLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved: int | None = None
        self._filter: subprocess.Popen[bytes] | None = None

    def start(self) -> ProfilerLog:
        if self._saved is not None:
            return self
        try:
            source = _FILTER.read_text(encoding="utf-8")
            saved = os.dup(2)
        except OSError:
            return self  # no stderr, or no filter: the lines reach the terminal as before
        try:
            log = open_log(self.path, append=True)  # the filter writes to it: the one writer opened it
        except OutputError:
            os.close(saved)
            return self
        read, write = os.pipe()
        try:
            self._filter = subprocess.Popen(
                [sys.executable, "-c", source, str(log.fileno())],
                stdin=read,
                stdout=saved,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                pass_fds=(log.fileno(),),
            )
        except OSError:
            for fd in (read, write, saved):
                os.close(fd)
            return self
        finally:
            close_live(log)
        os.close(read)
        _flush_python_streams()
        os.dup2(write, 2)
        os.close(write)
        self._saved = saved
        return self

    def stop(self) -> None:
        """Put descriptor 2 back; give the filter a moment to pass on what is left."""
        if self._saved is None:
            return
        _flush_python_streams()
        with contextlib.suppress(OSError):
            os.dup2(self._saved, 2)  # closes this end of the pipe: the filter reads to its end
        os.close(self._saved)
        self._saved = None
        if self._filter is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._filter.wait(timeout=2.0)  # still running: a forked worker holds the pipe
            self._filter = None

    def __enter__(self) -> ProfilerLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
