"""A hard time limit on a measurement: `watchdog(seconds)` raises `TimeLimit` in the thread that entered it
once `seconds` have passed, even inside a call that sleeps or loops for ever — SIGALRM in the main thread
(a signal breaks a blocking wait), an asynchronous exception elsewhere. A call stuck in C cannot be
stopped from inside the process. On leaving, the timer is cancelled and the SIGALRM handler put back."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Iterator


class TimeLimit(BaseException):
    """The watchdog's limit passed. A BaseException: the timed function's own `except Exception`
    must not swallow it."""


class Watchdog:
    """`fired`: whether the limit passed while the block ran."""

    def __init__(self) -> None:
        self.fired = False
        self.live = True
        self.lock = threading.Lock()


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[Watchdog]:
    dog = Watchdog()
    target = threading.get_ident()
    use_signal = _can_signal()
    previous = None
    if use_signal:

        def on_alarm(signum: int, frame: object) -> None:
            if dog.live and dog.fired:
                raise TimeLimit

        previous = signal.signal(signal.SIGALRM, on_alarm)

    def fire() -> None:
        with dog.lock:
            if not dog.live:
                return
            dog.fired = True
            if use_signal:
                signal.pthread_kill(target, signal.SIGALRM)
            else:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(target), ctypes.py_object(TimeLimit)
                )

    timer = threading.Timer(max(seconds, 0.0), fire)
    timer.daemon = True
    timer.start()
    try:
        yield dog
    finally:
        while True:  # the limit may pass just as the block ends: its exception must not cut this short
            try:
                _disarm(dog, timer, use_signal, previous)
                break
            except TimeLimit:
                continue


def _disarm(dog: Watchdog, timer: threading.Timer, use_signal: bool, previous: object) -> None:
    """Stop the watchdog. An asynchronous exception already set is raised by one of the calls here
    (every call checks for one) and the caller's loop comes back. It is never cleared by setting
    NULL: CPython 3.11 then raises the interpreter's "pending" flag with nothing to take it down,
    and every thread runs slowly through that check at every call from then on."""
    dog.live = False  # from here the signal handler raises nothing
    with dog.lock:
        dog.live = False
    timer.cancel()
    if use_signal:
        _restore(previous)


def _can_signal() -> bool:
    return (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "pthread_kill")
        and hasattr(signal, "pthread_sigmask")
        and hasattr(signal, "sigtimedwait")
    )


def _restore(previous: object) -> None:
    """Put the old SIGALRM handler back with the signal blocked, taking any alarm still pending first:
    delivered after the old handler (by default: terminate) is back, it would end the process."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        while signal.SIGALRM in signal.sigpending():
            signal.sigtimedwait({signal.SIGALRM}, 0)
        signal.signal(signal.SIGALRM, previous)  # type: ignore[arg-type]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
