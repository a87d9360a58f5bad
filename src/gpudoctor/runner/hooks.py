"""The hook points where `gpudoctor fix` changes the user's process (in a child process of its own):
patches applied in order before the script runs and undone in reverse order after it, also when it
raises or is interrupted; `Restorer`, which puts back exactly what a patch found; the top-level modules
(the outermost `nn.Module`s with parameters the script calls), each found at its first call; the user's
frame of a call; seeding. Nothing here runs at import or imports torch at import.
"""

from __future__ import annotations

import contextlib
import functools
import random
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

_MISSING = object()


class Patch(Protocol):
    """A reversible change: `apply()` makes it, `undo()` restores exactly what `apply()` found."""

    name: str

    def apply(self) -> None: ...

    def undo(self) -> None: ...


@contextlib.contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[list[Patch]]:
    """Apply `patches` in order; on leaving, undo those applied in reverse order, whatever happened.
    A patch whose `apply()` raises must leave nothing behind itself (`Restorer` does that)."""
    applied: list[Patch] = []
    try:
        for patch in patches:
            patch.apply()
            applied.append(patch)
        yield applied
    finally:
        failure: BaseException | None = None
        for patch in reversed(applied):
            try:
                patch.undo()
            except Exception as err:  # undo the others anyway; report the first failure
                failure = failure or err
        if failure is not None and sys.exc_info()[1] is None:
            raise failure


class Restorer:
    """Records each change as it is made and reverts them all, newest first."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def replace(self, obj: Any, name: str, value: Any) -> Any:
        """Set an attribute held in `obj.__dict__` (a class's method, an instance's attribute); on
        restore it is put back, or deleted if `obj` did not hold it itself. Returns the value seen."""
        held = vars(obj).get(name, _MISSING)
        seen = getattr(obj, name, None)
        setattr(obj, name, value)

        def undo() -> None:
            if held is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, held)

        self._undo.append(undo)
        return seen

    def set_flag(self, obj: Any, name: str, value: Any) -> Any:
        """Set a property-like setting (torch.backends flags) through getattr/setattr."""
        old = getattr(obj, name)
        setattr(obj, name, value)
        self._undo.append(lambda: setattr(obj, name, old))
        return old

    def on_restore(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def restore(self) -> None:
        failure: Exception | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as err:
                failure = failure or err
        if failure is not None:
            raise failure


# -- the user's frames ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallSite:
    """A line of the user's code: where a DataLoader was built, a module called, ..."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class StepFunction:
    """A plain function of the user's files that calls a top-level module (`def act(obs): ... actor(obs)
    ... critic(obs)`): bound to its name at the top level of its module, so that the name can be bound to
    its compiled form (`act = torch.compile(act)`). `line`: its `def`."""

    file: str
    name: str
    line: int


TRAINS = frozenset({"backward", "grad", "zero_grad"})  # names a training step's own function uses


def step_function(frame: FrameType) -> StepFunction | None:
    """The function `frame` runs, where it is a plain function bound to its own name at the top level of
    its module, and not a training step of its own (it takes gradients — `.backward()`,
    `torch.autograd.grad` — or zeroes them: torch.compile breaks its graph there and would trace the
    optimizer's step, whose hooks count the steps); else None."""
    code = frame.f_code
    if code.co_name.startswith("<") or "." in getattr(code, "co_qualname", code.co_name):
        return None  # the module's top level, a lambda or comprehension; a method or a nested function
    if getattr(frame.f_globals.get(code.co_name), "__code__", None) is not code or TRAINS & set(
        code.co_names
    ):
        return None
    return StepFunction(code.co_filename, code.co_name, code.co_firstlineno)


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(str(Path(d).resolve()) + "/" for d in dirs))


_OURS = str(Path(__file__).resolve().parent.parent) + "/"
_WORKLOADS = _OURS + "workloads/"
_LIBRARY = re.compile(r"/(site-packages|dist-packages)/")


@functools.lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """The user's own code: not Python's library, an installed package, or gpudoctor (its workloads
    excepted, which stand for a user's script). Remembered per path: a frame's file is asked for at
    every counted call (each `.item()` of the loop), and the library's folders cost 130 µs to list."""
    if not path or path.startswith("<"):
        return False
    if path.startswith(_WORKLOADS):
        return True
    if path.startswith(_OURS) or _LIBRARY.search(path):
        return False
    return not path.startswith(_library_dirs())


def user_frame(frame: FrameType | None = None) -> FrameType | None:
    """The innermost frame of the user's code at or above `frame` (default: the caller's)."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None and not is_user_file(f.f_code.co_filename):
        f = f.f_back
    return f


def call_site(frame: FrameType | None = None) -> CallSite | None:
    f = user_frame(frame if frame is not None else sys._getframe(1))
    return None if f is None else CallSite(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


# -- calls of modules compiled with `Module.compile()` ----------------------------------------------------
# (module, args) -> new args or None; (module, args, output, None where the call raised) -> new output or None
CompiledPre = Callable[[Any, tuple[Any, ...]], "tuple[Any, ...] | None"]
CompiledPost = Callable[[Any, tuple[Any, ...], Any], Any]
_COMPILED_LISTENERS: list[tuple[CompiledPre, CompiledPost]] = []
_TORCH_MODULE_COMPILE: list[Any] = []  # torch's Module.compile, while gpudoctor's stands in


def on_compiled_calls(pre: CompiledPre, post: CompiledPost) -> Callable[[], None]:
    """`pre` and `post` around every call of a module the script compiles with `model.compile()` from now
    on, eagerly, as torch's global forward hooks run around an eager call: torch runs such a module's
    hooks (global ones too) inside its compiled call, where they are traced and never run. While any
    listener is in, `Module.compile` wraps the compiled call it makes; the wrapper passes calls straight
    through once none is. Returns what takes the listener out (and puts torch's `Module.compile` back
    after the last)."""
    from torch.nn.modules import module

    listener = (pre, post)
    if not _TORCH_MODULE_COMPILE and getattr(module.Module, "compile", None) is not None:
        torch_compile = module.Module.compile
        _TORCH_MODULE_COMPILE.append(torch_compile)

        def compile_watched(mod: Any, *args: Any, **kwargs: Any) -> Any:
            out = torch_compile(mod, *args, **kwargs)
            call = getattr(mod, "_compiled_call_impl", None)
            if call is not None:
                mod._compiled_call_impl = _watched_call(mod, call)
            return out

        module.Module.compile = compile_watched
    _COMPILED_LISTENERS.append(listener)

    def remove() -> None:
        if listener in _COMPILED_LISTENERS:
            _COMPILED_LISTENERS.remove(listener)
        if not _COMPILED_LISTENERS and _TORCH_MODULE_COMPILE:
            module.Module.compile = _TORCH_MODULE_COMPILE.pop()

    return remove


def drop_compiled_listeners() -> int:
    """Every listener to compiled calls taken out, and torch's `Module.compile` put back (a forked child's
    copy of them: `runner.forked`); how many listeners there were."""
    count = len(_COMPILED_LISTENERS)
    _COMPILED_LISTENERS.clear()
    if _TORCH_MODULE_COMPILE:
        from torch.nn.modules import module

        module.Module.compile = _TORCH_MODULE_COMPILE.pop()
    return count


def _watched_call(mod: Any, call: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    compiling = torch.compiler.is_compiling

    def run(*args: Any, **kwargs: Any) -> Any:
        listeners = tuple(_COMPILED_LISTENERS)
        if not listeners or compiling():  # traced into code compiled around it: as eager_only's hooks
            return call(*args, **kwargs)
        given = args
        for pre, _ in listeners:
            new_args = pre(mod, args)
            if new_args is not None:
                args = new_args
        try:
            out = call(*args, **kwargs)
        except BaseException:
            for _, post in reversed(listeners):
                post(mod, given, None)
            raise
        for _, post in reversed(listeners):
            result = post(mod, given, out)
            if result is not None:
                out = result
        return out

    return run


# -- the root module --------------------------------------------------------------------------------------
RootCallback = Callable[[Any, tuple[Any, ...]], "tuple[Any, ...] | None"]


def eager_only(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` (for one of torch's hook points) where it runs eagerly; traced into code the user compiled
    (a model called from a compiled function, `model.compile()`, a compiled optimizer step) it does
    nothing and returns None: `torch.compiler.is_compiling()` is a constant there, so the branch folds
    away — the hook neither breaks the user's graph (Dynamo stops at `sys._getframe`, timers, weak sets)
    nor recompiles it at each call (it guards on the lists and counters a hook changes)."""
    import torch

    compiling = torch.compiler.is_compiling

    @functools.wraps(hook)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return None
        return hook(*args, **kwargs)

    return wrapper


def eager_frame(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """`wrapper` (standing in for a torch method it calls through to, as DDP's forward) never traced by
    Dynamo, what it calls traced as before: in `torch.compile(ddp_model)` its counting would otherwise
    be traced, guarded on and retraced at every call."""
    import torch

    return torch.compiler.disable(wrapper, recursive=False)


@dataclass
class RootSeen:
    """One top-level module the script called: where it was first called from, the names the calling
    frame binds to it, where the user's code binds it to a name of its own (`model = Net()`, found
    where a framework calls it), its top-level calls while the finder watched, and the other lines of
    the user's files it was called from meanwhile (a GAN's discriminator: the real batch, the fake one)."""

    module: Any
    site: CallSite | None
    names: tuple[str, ...]
    binding: tuple[CallSite, str] | None
    calls: int = 1
    other_sites: list[CallSite] = field(default_factory=list)


FirstCallContext = Callable[[Any], "contextlib.AbstractContextManager[Any] | None"]
FirstCallOutput = Callable[[Any, Any], Any]  # (module, output) -> its output, the same or another
WATCH_CAP_S = 60.0  # the longest the finder keeps watching for more top-level modules
MAX_SITES = 16  # the other lines a top-level module is called from, kept per module


class RootFinder:
    """Finds the modules the script calls per step: every module with parameters called while no other
    module's forward runs (a top-level module: the model; or the encoder and the head a function calls
    in turn, a GAN's generator and discriminator). `root` is the first. Callbacks registered with
    `on_root` run at each top-level module's first call, before its forward runs, and may return new
    positional args for it; `around_first_call` wraps that first call in a context (its forward was
    fetched before the hooks ran, so a wrapper installed then takes effect from the second call), and
    `after_first_call` may replace what that call returns (as the wrapper would have).

    Global forward hooks watch until `until()` is true (fix rounds: a few steps, so that every module
    the step calls is seen and counted), at most WATCH_CAP_S after the first; without `until`, until
    the first module's first call ends (they slow every module call). Inside code that torch.compile
    traces the hooks do nothing: traced, they would break its graph."""

    def __init__(
        self, until: Callable[[], bool] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.until = until
        self._clock = clock
        self.seen: dict[int, RootSeen] = {}  # in the order of their first calls
        self._callbacks: list[RootCallback] = []
        self._contexts: list[FirstCallContext] = []
        self._outputs: list[FirstCallOutput] = []
        # the plain functions that called a top-level module while the finder watched, by (file, name)
        # (None: a function seen that is not one), and what is told of each at its first such call
        self.functions: dict[tuple[str, str], StepFunction | None] = {}
        self._on_function: list[Callable[[StepFunction, dict[str, Any]], None]] = []
        self._entered: list[contextlib.ExitStack] = []
        self._handles: list[Any] = []
        self._depth = 0
        self._since: float | None = None
        self._compiled_off: Callable[[], None] | None = None  # takes its listener to compiled calls out

    # -- the first module (what a single-model script calls) ---------------------------------------------
    @property
    def root(self) -> Any:
        first = self._first()
        return None if first is None else first.module

    @property
    def site(self) -> CallSite | None:
        first = self._first()
        return None if first is None else first.site

    @property
    def names(self) -> tuple[str, ...]:
        first = self._first()
        return () if first is None else first.names

    @property
    def binding(self) -> tuple[CallSite, str] | None:
        first = self._first()
        return None if first is None else first.binding

    def _first(self) -> RootSeen | None:
        return next(iter(self.seen.values()), None)

    # -- every top-level module -------------------------------------------------------------------------
    def roots(self) -> list[RootSeen]:
        return list(self.seen.values())

    def per_step(self) -> list[RootSeen]:
        """The top-level modules called more than once while the finder watched — those the loop calls,
        not one called once at set-up — or, where none was, the first."""
        again = [r for r in self.seen.values() if r.calls >= 2]
        first = self._first()
        return again or ([first] if first is not None else [])

    def seen_of(self, module: Any) -> RootSeen | None:
        return self.seen.get(id(module))

    @property
    def watching(self) -> bool:
        """Its global hooks are in (code compiled now would be guarded on them, and compiled again once
        they leave)."""
        return bool(self._handles)

    def on_root(self, callback: RootCallback) -> None:
        self._callbacks.append(callback)

    def on_function(self, callback: Callable[[StepFunction, dict[str, Any]], None]) -> None:
        """`callback(function, its module's globals)` at the first call of a top-level module from each
        plain function of the user's files (`step_function`), while the finder watches."""
        self._on_function.append(callback)

    def step_functions(self) -> list[StepFunction]:
        return [f for f in self.functions.values() if f is not None]

    def around_first_call(self, context: FirstCallContext) -> None:
        self._contexts.append(context)

    def after_first_call(self, transform: FirstCallOutput) -> None:
        self._outputs.append(transform)

    def install(self) -> RootFinder:
        from torch.nn.modules import module

        self._handles = [
            module.register_module_forward_pre_hook(eager_only(self._pre)),
            module.register_module_forward_hook(eager_only(self._post), always_call=True),
        ]
        self._compiled_off = on_compiled_calls(self._pre, self._post)  # `model.compile()`'s calls
        return self

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._compiled_off is not None:
            self._compiled_off()
            self._compiled_off = None

    def _pre(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self._depth += 1
        if self._depth != 1 or next(module.parameters(), None) is None:
            return None
        frame = user_frame(sys._getframe(1))
        if frame is not None:
            self._note_function(frame)
        known = self.seen.get(id(module))
        if known is not None:
            known.calls += 1
            if len(known.other_sites) < MAX_SITES:
                site = frame and CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
                if site and site != known.site and site not in known.other_sites:
                    known.other_sites.append(site)
            return None
        site = names = None
        if frame is not None:
            site = CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            names = tuple(k for k, v in frame.f_locals.items() if v is module)
        self.seen[id(module)] = RootSeen(module, site, names or (), _binding(frame, module))
        if self._since is None:
            self._since = self._clock()
        new_args = None
        for callback in self._callbacks:
            result = callback(module, args if new_args is None else new_args)
            if result is not None:
                new_args = result
        stack = contextlib.ExitStack()
        try:
            for make in self._contexts:
                ctx = make(module)
                if ctx is not None:
                    stack.enter_context(ctx)
        except BaseException:
            stack.close()
            raise
        self._entered.append(stack)
        return new_args

    def _note_function(self, frame: FrameType) -> None:
        key = (frame.f_code.co_filename, frame.f_code.co_name)
        if key in self.functions:
            return
        found = self.functions[key] = step_function(frame)
        if found is not None:
            for callback in self._on_function:
                callback(found, frame.f_globals)

    def _post(self, module: Any, args: Any, output: Any) -> Any:
        self._depth -= 1
        if self._depth != 0:
            return None
        first = bool(self._entered)  # the module's first call: `_pre` entered its contexts
        while self._entered:
            self._entered.pop().close()
        result = output
        if first:
            for transform in self._outputs:
                result = transform(module, result)
        if self.seen and self._done():
            self.uninstall()
        return None if result is output else result

    def _done(self) -> bool:
        if self.until is None:
            return True
        if self._since is not None and self._clock() - self._since > WATCH_CAP_S:
            return True
        return bool(self.until())


def _binding(frame: FrameType | None, obj: Any) -> tuple[CallSite, str] | None:
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            name = next((k for k, v in frame.f_locals.items() if v is obj and k != "self"), None)
            if name is not None:
                return CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name), name
        frame = frame.f_back
    return None


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's (if present) and torch's generators (every device), as the same seed in
    every process makes the same batches, weights and dropout masks."""
    import torch

    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
