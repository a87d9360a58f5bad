"""Inductor's compile workers, a start-up transient kept out of timed steps: the first torch.compile starts
a pool of worker processes, one per core, that may still be starting after a compile served from the
cache, beside a loop its host bounds. Where such a pool exists it is shut down at the warm-up's end (a
later compile starts another), as Inductor itself does once idle. What stopping them costs and buys:
docs/results.md (lab)."""

from __future__ import annotations

import sys


def stop_compile_workers() -> bool:
    """Shut down this process's Inductor compile-worker pools; whether there were any. Never raises:
    a torch without these internals has nothing to stop."""
    module = sys.modules.get("torch._inductor.async_compile")
    if module is None or not getattr(module, "_pool_set", None):
        return False
    shutdown = getattr(module, "shutdown_compile_workers", None)
    if shutdown is None:
        return False
    try:
        shutdown()
    except Exception:  # theirs to fail: the timing goes on beside the workers
        return False
    return True
