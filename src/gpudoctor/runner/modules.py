"""The script's `nn.Module` calls. `RootWatcher` (while the step is being found) sees every outermost module
call through torch's global forward hooks, with the function between the user's code and the call;
`on_calls(module, hook)` then follows one module instance alone. `ModuleLabels` (traced phase only) wraps
the forward of the root's submodules, to a depth, in profiler ranges named `gpudoctor.module: <path>`,
which the analysis reads as the module view.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from gpudoctor.runner.discovery import RootCall
from gpudoctor.runner.hooks import eager_only, on_compiled_calls
from gpudoctor.runner.loops import UserCode

MODULE_LABEL = "gpudoctor.module: "
# Frames that only carry a call along (decorators, context managers, module call machinery).
_PLUMBING = (
    "utils/_contextlib.py",
    "nn/modules/module.py",
    "_dynamo/",
    "functools.py",
    "contextlib.py",
    "gpudoctor/runner/hooks.py",  # eager_only's wrapper around the hooks themselves
)


def compiled_by_script(module: Any) -> bool:
    """The script compiled the module itself: `torch.compile(model)` (an OptimizedModule) or
    `model.compile()` (its hooks run inside the compiled call: hooks put on it or on its submodules
    would be traced into the graph, or recompile it)."""
    return (
        getattr(module, "_orig_mod", None) is not None
        or getattr(module, "_compiled_call_impl", None) is not None
    )


def module_name(module: Any) -> str:
    """The class name; for a compiled module, its original class's and a mark."""
    original = getattr(module, "_orig_mod", None)
    if original is not None:
        return f"{type(original).__name__} (torch.compile)"
    return type(module).__name__


class RootWatcher:
    """Reports each outermost module call to `on_root(call, module)`."""

    def __init__(self, on_root: Callable[[RootCall, Any], None], user_code: UserCode) -> None:
        self.on_root = on_root
        self.user_code = user_code
        self._depth = threading.local()
        self._handles: list[Any] = []
        self._compiled_off: Callable[[], None] | None = None

    def start(self) -> RootWatcher:
        from torch.nn.modules import module

        # eager only: traced, `_via` stopped Dynamo at each module and read a cache other threads write
        self._handles = [
            module.register_module_forward_pre_hook(eager_only(self._pre)),
            module.register_module_forward_hook(eager_only(self._post), always_call=True),
        ]
        self._compiled_off = on_compiled_calls(self._pre, self._post)  # a module of `model.compile()`
        return self

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._compiled_off is not None:
            self._compiled_off()
            self._compiled_off = None

    def _pre(self, module: Any, args: Any) -> None:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth == 0:
            call = RootCall(time.perf_counter(), id(module), module_name(module), self._via(sys._getframe(1)))
            self.on_root(call, module)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self._depth.n = max(getattr(self._depth, "n", 1) - 1, 0)

    def _via(self, frame: FrameType | None) -> str | None:
        """The outermost function between the user's code and the module call that is not plumbing;
        None when the user's code called the module itself (or no user code is on the stack)."""
        via: FrameType | None = None
        while frame is not None and not self.user_code(frame.f_code.co_filename):
            path = frame.f_code.co_filename.replace("\\", "/")
            if not any(p in path for p in _PLUMBING):
                via = frame
            frame = frame.f_back
        if frame is None or via is None:
            return None
        return _function_name(via)


def _function_name(frame: FrameType) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    owner = frame.f_locals.get("self") if code.co_varnames[:1] == ("self",) else None
    if owner is not None:
        return f"{module_name(owner)}.{code.co_name}"
    return name


class CallHook:
    """A forward pre-hook on one module instance: `on_call()` at each of its eager calls (and at each
    call of it compiled with `model.compile()`, whose hooks run inside the compiled call)."""

    def __init__(self, module: Any, on_call: Callable[[], None]) -> None:
        inside = [0]  # compiled calls of it under way: one that Dynamo runs eagerly is counted once

        def eager(_m: Any, _a: Any) -> None:
            if not inside[0]:
                on_call()

        def before(called: Any, _args: Any) -> None:
            if called is module:
                on_call()
                inside[0] += 1

        def after(called: Any, _args: Any, _out: Any) -> None:
            if called is module:
                inside[0] -= 1

        self.handle = module.register_forward_pre_hook(eager_only(eager))
        self._compiled_off = on_compiled_calls(before, after)

    def remove(self) -> None:
        self.handle.remove()
        self._compiled_off()


class ModuleLabels:
    """Profiler ranges around the forward of `root` and its submodules to `depth` (root = depth 0),
    named `gpudoctor.module: <dotted path>` (the root by its class name). Not for compiled modules:
    hooks inside compiled code would be traced into it."""

    def __init__(self, root: Any, depth: int) -> None:
        self.root, self.depth = root, depth
        self._handles: list[Any] = []
        self._open: list[Any] = []

    def install(self) -> ModuleLabels:
        for path, module in self.root.named_modules():
            level = 0 if not path else path.count(".") + 1
            if level > self.depth:
                continue
            name = MODULE_LABEL + (path or module_name(self.root))
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            self._handles.append(module.register_forward_hook(self._exit, always_call=True))
        return self

    def _enter(self, name: str) -> Callable[..., None]:
        import torch

        def pre(_module: Any, _args: Any) -> None:
            self._open.append(torch.ops.profiler._record_function_enter_new(name, None))

        return pre

    def _exit(self, _module: Any, _args: Any, _output: Any) -> None:
        import torch

        if self._open:
            torch.ops.profiler._record_function_exit._RecordFunction(self._open.pop())

    def remove(self) -> None:
        import torch

        for handle in self._handles:
            handle.remove()
        self._handles = []
        while self._open:  # a forward that raised: close its ranges
            torch.ops.profiler._record_function_exit._RecordFunction(self._open.pop())
