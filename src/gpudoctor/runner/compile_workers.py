"""Inductor's compile workers, a start-up transient kept out of timed steps: the first torch.compile
starts a pool of worker processes, one per core, that import torch and Triton while the loop runs. After
a compile served from Inductor's cache (seconds), they may still be starting when timing begins, beside a
loop that its host bounds. Where such a pool exists, it is shut down (a later compile starts another), as
Inductor itself does once it has been idle a minute.

Measured on the H100 with torch 2.11 (docs/fix.md): the shutdown holds the loop 5 to 10 s, the sidecar
with no worker yet started (benchmarks/compile_workers_stop.py), and the stop bought no measurable step
time on GPT-2 (benchmarks/compile_workers_probe.py). Not waiting, or not stopping, is to be measured."""

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
