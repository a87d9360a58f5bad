"""`gc_paused()`: hold off Python's cyclic garbage collector during a bulk build that allocates many
objects and creates no cycles (loading a trace). Collections triggered by allocation counts would scan
every live container again and again for nothing; the previous state is restored on exit."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
