"""What a process forked from one gpudoctor measures (a DataLoader's worker, started at the loop's first
batch) must not inherit: gpudoctor's instrumentation. A fork copies the process as it is — torch's
global module and optimizer hooks that step discovery and the fix observer installed, and the loop
watcher's tracer (`sys.settrace` on Python 3.11, a `sys.monitoring` tool on 3.12+), and the listeners
to calls of modules compiled with `model.compile()` (`runner.hooks.on_compiled_calls`) — so every module a
worker calls (torchvision's transforms are `nn.Module`s) ran gpudoctor's hooks, and every line of the
user's Dataset code its line tracer, for as long as the worker lived: the batches came slower inside a
round than in the script run plainly, and every saving was measured against that slower baseline.
`leave_forked_children()` registers, once per process, an at-fork handler that takes them out in the
child; the parent keeps them. Only gpudoctor's own hooks go (told by the module of the function, or of
the function it wraps); the script's stay."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

OURS = "gpudoctor."
TOOL_NAME = "gpudoctor"  # the loop watcher's sys.monitoring tool (`runner.loops`)
_registered = False

# torch's global hook registries (module and optimizer), by module and attribute name
HOOK_DICTS = (
    ("torch.nn.modules.module", "_global_forward_pre_hooks"),
    ("torch.nn.modules.module", "_global_forward_hooks"),
    ("torch.nn.modules.module", "_global_backward_pre_hooks"),
    ("torch.nn.modules.module", "_global_backward_hooks"),
    ("torch.optim.optimizer", "_global_optimizer_pre_hooks"),
    ("torch.optim.optimizer", "_global_optimizer_post_hooks"),
)


def is_ours(fn: Any) -> bool:
    """A hook of gpudoctor's: its function (a bound method's, or the one an `eager_only` wrapper wraps)
    is defined in a gpudoctor module."""
    seen = 0
    while fn is not None and seen < 8:
        if str(getattr(fn, "__module__", "") or "").startswith(OURS):
            return True
        fn = getattr(fn, "__wrapped__", None) or getattr(fn, "__func__", None)
        seen += 1
    return False


def strip_instrumentation() -> int:
    """In a forked child: gpudoctor's tracer, monitoring tool and torch hooks taken out; how many."""
    removed = 0
    trace = sys.gettrace()
    if trace is not None and is_ours(trace):
        sys.settrace(None)
        removed += 1
    if is_ours(getattr(threading, "_trace_hook", None)):
        threading.settrace(None)
    mon = getattr(sys, "monitoring", None)
    if mon is not None:
        for tool in range(6):
            if mon.get_tool(tool) == TOOL_NAME:
                mon.set_events(tool, 0)
                mon.free_tool_id(tool)
                removed += 1
    for module_name, attr in HOOK_DICTS:
        hooks = getattr(sys.modules.get(module_name), attr, None)
        if not isinstance(hooks, dict):
            continue
        for key, fn in list(hooks.items()):
            if is_ours(fn):
                del hooks[key]
                removed += 1
    ours = sys.modules.get("gpudoctor.runner.hooks")  # the listeners to `model.compile()`'s calls
    if ours is not None:
        removed += ours.drop_compiled_listeners()
    return removed


def leave_forked_children() -> None:
    """Take gpudoctor's instrumentation out of every process forked from this one, from now on."""
    global _registered
    if not _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_in_child)
        _registered = True


def _in_child() -> None:
    with contextlib.suppress(Exception):  # never the child's failure: it runs on with what it inherited
        strip_instrumentation()
