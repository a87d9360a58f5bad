"""Wall time the process spends compiling, from torch.compile's own compile start/end callbacks: Dynamo
tracing a frame, a backward compiled lazily at its first call, CUDA graph recording. Step discovery
leaves it out of its clock (a first step that compiles for a minute is not "nothing repeats"); a fix
round reports it apart from the step times. Where this torch has no such callbacks, nothing is counted
and nothing fails."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any


class CompileTime:
    def __init__(self, on_spent: Callable[[float], None] = lambda s: None) -> None:
        self.on_spent = on_spent  # each compilation's seconds, when it ends
        self.total_s = 0.0  # compilations that ended
        self.available = False
        self._started: float | None = None
        self._handler: Any = None

    def install(self) -> CompileTime:
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return self
        callback_handler.register_start_callback(self._on_start)
        callback_handler.register_end_callback(self._on_end)
        self._handler, self.available = callback_handler, True
        return self

    def uninstall(self) -> None:
        """Safe to call twice."""
        if self._handler is not None:
            for remove, callback in (
                (self._handler.remove_start_callback, self._on_start),
                (self._handler.remove_end_callback, self._on_end),
            ):
                with contextlib.suppress(ValueError):  # gone: torch._dynamo.reset() clears them
                    remove(callback)
            self._handler = None

    def seconds(self) -> float:
        """Spent compiling so far, the compilation under way included."""
        ongoing = time.perf_counter() - self._started if self._started is not None else 0.0
        return self.total_s + ongoing

    def _on_start(self, *args: Any) -> None:
        self._started = time.perf_counter()

    def _on_end(self, *args: Any) -> None:
        if self._started is not None:
            spent = time.perf_counter() - self._started
            self._started = None
            self.total_s += spent
            self.on_spent(spent)
