"""The loops of the user's own code, seen as they iterate: each arrival at a loop's header is an event
`(loop, time)`, for code outside the standard library, site-packages, torch and gpudoctor only. Python
3.12+ uses `sys.monitoring` JUMP events (every other location disabled at its first event, so the cost
elsewhere is nil), older Pythons a line tracer on the user's frames. `follow(loop)` narrows the events to
one loop once the step is known; `stop()` takes everything out."""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

MONITORING = sys.version_info >= (3, 12)


@dataclass(frozen=True)
class LoopKey:
    file: str
    function: str
    line: int  # the loop's header: where each iteration begins

    def describe(self) -> str:
        where = "the script's top level" if self.function == "<module>" else f"{self.function}()"
        return f"{Path(self.file).name}:{self.line} in {where}"


OnIteration = Callable[[LoopKey, float], None]


class UserCode:
    """Which code objects are the user's: not the standard library, site-packages, torch or gpudoctor —
    except the script itself (`extra`), which is the user's wherever it is installed."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        paths = sysconfig.get_paths()
        roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        roots.add(str(Path(__file__).resolve().parent.parent))  # gpudoctor itself
        self._not_user = tuple(os.path.realpath(r) + os.sep for r in roots if r)
        self._user = tuple(os.path.realpath(p) for p in extra)
        self._cache: dict[str, bool] = {}

    def __call__(self, filename: str) -> bool:
        known = self._cache.get(filename)
        if known is None:
            known = self._cache[filename] = self._judge(filename)
        return known

    def _judge(self, filename: str) -> bool:
        if filename.startswith("<"):
            return False
        real = os.path.realpath(filename)
        if any(real == p or real.startswith(p + os.sep) for p in self._user):
            return True
        return not real.startswith(self._not_user) and "site-packages" not in real


class LoopWatcher:
    """Reports each iteration of the user's loops to `on_iteration` until `stop()`."""

    def __init__(self, on_iteration: OnIteration, user_code: UserCode) -> None:
        self.on_iteration = on_iteration
        self.user_code = user_code
        self.only: LoopKey | None = None  # set by follow(): other loops are ignored
        self.active = False
        self.unavailable: str | None = None
        self._impl: _Monitoring | _Tracing | None = None

    def start(self) -> LoopWatcher:
        impl: _Monitoring | _Tracing = _Monitoring(self) if MONITORING else _Tracing(self)
        self.unavailable = impl.start()
        if self.unavailable is None:
            self._impl, self.active = impl, True
        return self

    def follow(self, loop: LoopKey) -> None:
        self.only = loop

    def stop(self) -> None:
        if self._impl is not None:
            self._impl.stop()
            self._impl = None
        self.active = False

    def _report(self, loop: LoopKey) -> None:
        if self.only is None or loop is self.only:
            self.on_iteration(loop, time.perf_counter())


def _qualname(code: CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname from Python 3.11


def _header_line(code: CodeType, offset: int) -> int | None:
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


class _Monitoring:
    """Python 3.12+: JUMP events; a jump to an earlier offset of the user's code is a loop's back edge."""

    TOOL_IDS = (4, 3)  # unassigned by CPython (0 debugger, 1 coverage, 2 profiler, 5 optimizer)

    def __init__(self, watcher: LoopWatcher) -> None:
        self.watcher = watcher
        self.tool: int | None = None
        self.keys: dict[tuple[CodeType, int], LoopKey | None] = {}

    def start(self) -> str | None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        for tool in self.TOOL_IDS:
            if mon.get_tool(tool) is None:
                mon.use_tool_id(tool, "gpudoctor")
                self.tool = tool
                break
        else:
            return "sys.monitoring has no free tool id"
        mon.register_callback(self.tool, mon.events.JUMP, self._on_jump)
        mon.set_events(self.tool, mon.events.JUMP)
        return None

    def _on_jump(self, code: CodeType, source: int, destination: int) -> Any:
        if destination >= source:
            return sys.monitoring.DISABLE  # type: ignore[attr-defined]
        key = self.keys.get((code, destination), False)
        if key is False:
            key = None
            if self.watcher.user_code(code.co_filename):
                line = _header_line(code, destination)
                key = LoopKey(code.co_filename, _qualname(code), line) if line is not None else None
            self.keys[(code, destination)] = key
        only = self.watcher.only
        if key is None or (only is not None and key is not only):  # keys are made once: `is` will do
            return sys.monitoring.DISABLE  # type: ignore[attr-defined]
        self.watcher._report(key)
        return None

    def stop(self) -> None:
        if self.tool is None:
            return
        mon = sys.monitoring  # type: ignore[attr-defined]
        mon.set_events(self.tool, 0)
        mon.register_callback(self.tool, mon.events.JUMP, None)
        mon.free_tool_id(self.tool)
        mon.restart_events()  # what DISABLE turned off, for other tools
        self.tool = None


class _Tracing:
    """Older Pythons: sys.settrace; the user's frames get a line tracer, every other frame none."""

    def __init__(self, watcher: LoopWatcher) -> None:
        self.watcher = watcher
        self.last_line: dict[int, int] = {}  # id(frame) -> its last line
        self.keys: dict[tuple[CodeType, int], LoopKey] = {}
        self.installed = False
        self.running: list[FrameType] = []  # the user's frames that were running at the start, traced

    def start(self) -> str | None:
        if sys.gettrace() is not None:
            return "another tracer (a debugger or coverage) is installed"
        sys.settrace(self._on_call)
        self.installed = True
        # sys.settrace reaches the frames called from now on; the user's frames already running (the one
        # whose `with gpudoctor.profile():` block holds the loop) get the line tracer themselves
        frame = sys._getframe(1)
        while frame is not None:
            if self.watcher.user_code(frame.f_code.co_filename):
                self.last_line[id(frame)] = frame.f_lineno
                frame.f_trace = self._on_line
                self.running.append(frame)
            frame = frame.f_back
        return None

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or not self.watcher.user_code(frame.f_code.co_filename):
            return None
        self.last_line[id(frame)] = frame.f_lineno
        return self._on_line

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            previous = self.last_line.get(id(frame), 0)
            self.last_line[id(frame)] = frame.f_lineno
            if frame.f_lineno < previous:
                code = frame.f_code
                key = self.keys.get((code, frame.f_lineno))
                if key is None:
                    key = self.keys[(code, frame.f_lineno)] = LoopKey(
                        code.co_filename, _qualname(code), frame.f_lineno
                    )
                self.watcher._report(key)
        elif event == "return":
            self.last_line.pop(id(frame), None)
        return self._on_line

    def stop(self) -> None:
        if self.installed and sys.gettrace() == self._on_call:
            sys.settrace(None)
        for frame in self.running:
            if frame.f_trace == self._on_line:
                frame.f_trace = None
        self.running.clear()
        self.installed = False
