"""SIGTERM and SIGHUP as a Ctrl-C: a scheduler's `kill`, a closed terminal or `timeout` stop a long
command (`gpudoctor fix`) the way Ctrl-C does — its children ended, the results so far written — rather
than killing it with nothing written. Main thread only; elsewhere nothing is installed."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP: caught wherever Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def interruption(err: KeyboardInterrupt) -> str:
    """What stopped it, in words: "Ctrl-C" or the signal's name."""
    return signal.Signals(err.signum).name if isinstance(err, Stopped) else "Ctrl-C"


@contextlib.contextmanager
def signals_interrupt() -> Iterator[list[int]]:
    """While inside, SIGTERM and SIGHUP raise `Stopped` in the main thread (the previous handlers come
    back after); yields the list of the signals received (for the exit status: 128 + the first)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
