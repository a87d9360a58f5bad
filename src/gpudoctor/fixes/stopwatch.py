"""The proof's stopwatch: times a plain `python script.py args` process — the user's script or its patched
copy — without any of gpudoctor's code in it. This one file imports nothing from gpudoctor (the standard
library, and torch once the script has imported it); the proof copies it as `sitecustomize.py` into a
private folder put first on PYTHONPATH, so the command line stays the user's. At start-up it takes its
settings from GPUDOCTOR_PROOF_STOPWATCH (JSON), gives the script back its own PYTHONPATH and the rest of
its path, and chain-loads the sitecustomize it hid. Torch is hooked only after the script imports it
(a post-import hook on the meta path: a script may set environment variables before `import torch`).

A step is what the harness's baseline counted (`runner.steps`): `optimizer` (the first optimizer to step
leads), `module` (a call of the top-level module, named by class), or `dataloader` (a batch). It warms
up `warmup` steps and `warmup_s` seconds and the batches a DataLoader's workers hold in flight (workers ×
prefetch_factor), then times windows of `window_s` with one CUDA synchronization at each window's ends
(never per step) until `steps` steps and `steps_s` seconds are timed; a window in which torch.compile
compiled is set aside and another timed in its place. The result goes, whole or not at all, to `out`,
and the process ends at once (its parent ends its process group: a DataLoader's workers). A script
that ends first leaves a result saying how far it got."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

ENV = "GPUDOCTOR_PROOF_STOPWATCH"
SCHEMA = "gpudoctor.proof-stopwatch/1"
SOURCES = ("optimizer", "module", "dataloader")
MAX_SET_ASIDE = 8  # windows set aside for compiling, at most (then they are timed as they come)


class Stopwatch:
    """Counts steps, warms up, times windows; `finish` writes the result and ends the process."""

    def __init__(self, config: dict[str, Any], clock: Any = time.perf_counter) -> None:
        self.out = str(config["out"])
        self.source = str(config["source"])
        self.module = config.get("module")  # the top-level module's class name (source `module`)
        self.warmup = int(config.get("warmup", 5))
        self.warmup_s = float(config.get("warmup_s", 1.0))
        self.steps = int(config.get("steps", 20))
        self.steps_s = float(config.get("steps_s", 2.0))
        self.window_s = float(config.get("window_s", 0.5))
        # one rank of a group: every rank warms up and times the same number of steps and ends at the
        # same step (a rank that stopped early would leave the others waiting in a collective)
        self.lockstep = bool(config.get("ranks"))
        self.clock = clock
        self.sync = lambda: None  # CUDA synchronization, once torch is there
        self.compiled_s = lambda: 0.0  # seconds torch.compile has spent compiling so far
        self.steps_seen = 0
        self.in_flight = 0  # batches a DataLoader's workers hold ahead of the loop
        self.first_step: float | None = None
        self.warmup_steps = 0
        self.window: tuple[float, int, float] | None = None  # start, steps in it, compiled at its start
        self.windows: list[tuple[float, int]] = []  # seconds, steps
        self.set_aside: list[tuple[float, int, float]] = []  # seconds, steps, seconds compiling
        self.finished = False
        self.error: str | None = None  # the stopwatch could not hook what it counts: the script ran on

    def on_step(self) -> None:
        now = self.clock()
        self.steps_seen += 1
        if self.window is None:
            if self.first_step is None:
                self.first_step = now
            warm = self.steps_seen >= self.warmup + self.in_flight and (
                self.lockstep or now - self.first_step >= self.warmup_s
            )
            if warm:
                self.warmup_steps = self.steps_seen
                self.sync()
                self.window = (self.clock(), 0, self.compiled_s())
            return
        start, n, compiled = self.window
        n += 1
        last = self.lockstep and self.steps_seen >= self.warmup_steps + max(self.steps, 2 * self.in_flight, 1)
        if now - start < self.window_s and not last:
            self.window = (start, n, compiled)
            return
        self.sync()
        end = self.clock()
        spent = self.compiled_s() - compiled
        if spent > 0 and len(self.set_aside) < MAX_SET_ASIDE:
            self.set_aside.append((end - start, n, spent))
        else:
            self.windows.append((end - start, n))
        self.window = (end, 0, self.compiled_s())
        timed_s = sum(w[0] for w in self.windows)
        timed = sum(w[1] for w in self.windows)
        if last or (
            not self.lockstep and timed_s >= self.steps_s and timed >= max(self.steps, 2 * self.in_flight, 1)
        ):
            self.finish("timed")

    def result(self, outcome: str) -> dict[str, Any]:
        seconds, steps = sum(w[0] for w in self.windows), sum(w[1] for w in self.windows)
        return {
            "schema": SCHEMA,
            "outcome": outcome,  # timed, or ended (the script ended before it was timed)
            "source": self.source,
            "steps_seen": self.steps_seen,
            "warmup_steps": self.warmup_steps,
            "in_flight": self.in_flight,
            "windows": self.windows,
            "set_aside": self.set_aside,
            "mean_step_us": 1e6 * seconds / steps if outcome == "timed" and steps else None,
            "error": self.error,
            "pid": os.getpid(),
            "monotonic": time.monotonic(),  # system-wide on Linux: the prover reads the GPU's clocks to it
        }

    def write(self, outcome: str) -> None:
        partial = f"{self.out}.partial"
        with open(partial, "w") as f:
            json.dump(self.result(outcome), f)
        os.replace(partial, self.out)

    def finish(self, outcome: str) -> None:
        """Written, then the process ends here: nothing after the measurement is the proof's."""
        self.finished = True
        self.write(outcome)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing to keep
                stream.flush()
        os._exit(0)

    def at_exit(self) -> None:
        """The script ended before its steps were timed: how far it got."""
        if not self.finished:
            self.finished = True
            self.write("ended")


# -- torch's hooks, once the script imported it -------------------------------------------------------
def hook_torch(watch: Stopwatch, torch: Any) -> Callable[[], None]:
    """The step's source, the DataLoader's batches in flight, and CUDA synchronization; returns what
    takes them out again. A process forked from this one (a DataLoader's worker) takes them out at
    once: they are the training process's, and would only slow the worker."""
    from torch.utils.data import dataloader

    compiling = torch.compiler.is_compiling
    iterate = dataloader.DataLoader.__iter__
    undo: list[Callable[[], None]] = []

    def counted_iter(loader: Any) -> Any:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        if workers:
            ahead = workers * int(getattr(loader, "prefetch_factor", None) or 2)
            watch.in_flight = max(watch.in_flight, ahead)
        return iterate(loader)

    dataloader.DataLoader.__iter__ = counted_iter
    undo.append(lambda: setattr(dataloader.DataLoader, "__iter__", iterate))

    def sync() -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    watch.sync = sync
    if watch.source == "optimizer":
        from torch.optim.optimizer import register_optimizer_step_post_hook

        lead: list[int] = []

        def stepped(optimizer: Any, *args: Any) -> None:
            if compiling():  # traced into a compiled optimizer step, it does nothing (as the harness's)
                return
            if not lead:
                lead.append(id(optimizer))
            if id(optimizer) == lead[0]:
                watch.on_step()

        undo.append(register_optimizer_step_post_hook(stepped).remove)
    elif watch.source == "dataloader":
        take = dataloader._BaseDataLoaderIter.__next__

        def batch(iterator: Any) -> Any:
            out = take(iterator)
            watch.on_step()
            return out

        dataloader._BaseDataLoaderIter.__next__ = batch
        undo.append(lambda: setattr(dataloader._BaseDataLoaderIter, "__next__", take))
    else:
        undo.append(RootCalls(watch, torch).install().uninstall)

    def take_out() -> None:
        while undo:
            undo.pop()()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=take_out)
    return take_out


class RootCalls:
    """Steps as calls of the top-level module: the first module with parameters called while no other
    module's forward runs (of the class the harness named); global hooks find it, then leave for a
    hook on that module alone (global ones slow every module call). A module the script compiles with
    `module.compile()` runs its hooks inside the compiled code, where they are traced and never run:
    its compiled call is wrapped (`Module.compile`, while installed) and counted outside it."""

    def __init__(self, watch: Stopwatch, torch: Any) -> None:
        self.watch, self.torch = watch, torch
        self.depth = 0
        self.handles: list[Any] = []
        self.root: Any = None
        self.module_compile: Any = None  # Module.compile as torch has it, while ours stands in

    def install(self) -> RootCalls:
        from torch.nn.modules import module as nn_module

        compiling = self.torch.compiler.is_compiling

        def before(mod: Any, args: Any) -> None:
            if not compiling():
                self.depth += 1

        def after(mod: Any, args: Any, out: Any) -> None:
            if compiling():
                return
            self.depth -= 1
            self.found(mod)

        self.handles = [
            nn_module.register_module_forward_pre_hook(before),
            nn_module.register_module_forward_hook(after, always_call=True),
        ]
        module_compile = getattr(nn_module.Module, "compile", None)
        if module_compile is not None:
            self.module_compile = module_compile

            def compile_counted(mod: Any, *args: Any, **kwargs: Any) -> Any:
                out = module_compile(mod, *args, **kwargs)
                call = getattr(mod, "_compiled_call_impl", None)
                if call is not None:
                    mod._compiled_call_impl = self.counted(mod, call)
                return out

            nn_module.Module.compile = compile_counted
        return self

    def counted(self, mod: Any, call: Callable[..., Any]) -> Callable[..., Any]:
        """`mod`'s compiled call, counted as its hooks would count it in eager code."""

        def run(*args: Any, **kwargs: Any) -> Any:
            if self.root is not None:
                out = call(*args, **kwargs)
                if mod is self.root:
                    self.watch.on_step()
                return out
            self.depth += 1
            try:
                return call(*args, **kwargs)
            finally:
                self.depth -= 1
                self.found(mod)

        return run

    def found(self, mod: Any) -> None:
        """A module's call ended: the root, if it is the first top-level one of its class (then counted)."""
        if self.depth != 0 or self.root is not None or not self.is_root(mod):
            return
        self.root = mod
        self.remove()
        compiling = self.torch.compiler.is_compiling
        if getattr(mod, "_compiled_call_impl", None) is None:  # a compiled one is counted by `counted`
            self.handles = [
                mod.register_forward_hook(lambda *a: None if compiling() else self.watch.on_step())
            ]
        self.watch.on_step()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def uninstall(self) -> None:
        self.remove()
        if self.module_compile is not None:
            from torch.nn.modules import module as nn_module

            nn_module.Module.compile = self.module_compile
            self.module_compile = None

    def is_root(self, mod: Any) -> bool:
        inner = getattr(mod, "_orig_mod", mod)  # a module the script compiled
        named = self.watch.module is None or type(inner).__name__ == self.watch.module
        return named and any(True for _ in inner.parameters())


def hook_dynamo(watch: Stopwatch) -> None:
    """Compile time from torch.compile's own start/end callbacks (nothing where this torch lacks them)."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    state = {"total": 0.0, "start": None}

    def started(*args: Any) -> None:
        state["start"] = watch.clock()

    def ended(*args: Any) -> None:
        if state["start"] is not None:
            state["total"] += watch.clock() - state["start"]
            state["start"] = None

    callback_handler.register_start_callback(started)
    callback_handler.register_end_callback(ended)
    watch.compiled_s = lambda: (
        state["total"] + (watch.clock() - state["start"] if state["start"] is not None else 0.0)
    )


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then[name](module)` once the module `name` has been imported (executed), whoever imports
    it: the loader found by the rest of the meta path is left in place, its exec_module wrapped once."""

    def __init__(self, then: dict[str, Any]) -> None:
        self.then = dict(then)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.then:
            return None
        callback = self.then.pop(fullname)
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            with contextlib.suppress(AttributeError):
                del loader.exec_module  # the loader as it was
            callback(module)

        loader.exec_module = exec_module
        return spec


def install(config: dict[str, Any]) -> Stopwatch:
    watch = Stopwatch(config)
    atexit.register(watch.at_exit)

    def guarded(hook: Any) -> Any:
        def call(module: Any) -> None:
            try:
                hook(module)
            except Exception as err:  # the script's run is not ours to break: the result says why
                watch.error = watch.error or f"{type(err).__name__}: {err}"

        return call

    then = {
        "torch": guarded(lambda m: hook_torch(watch, m)),
        "torch._dynamo": guarded(lambda m: hook_dynamo(watch)),
    }
    for name in list(then):
        if name in sys.modules:  # imported already (by a sitecustomize before it): hook it now
            then.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(then))
    return watch


# -- start-up, as sitecustomize ------------------------------------------------------------------------
def _hide(here: str) -> None:
    """The script's own path and PYTHONPATH: this folder off both (its children start without it)."""

    def ours(p: str) -> bool:
        try:
            return os.path.realpath(p or ".") == here
        except (OSError, ValueError):
            return False

    sys.path[:] = [p for p in sys.path if not ours(p)]
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not ours(p)]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        os.environ.pop("PYTHONPATH", None)


def _chain_load() -> None:
    """The sitecustomize this one stands in front of, if there is one."""
    me = sys.modules.pop("sitecustomize", None)
    try:
        if importlib.util.find_spec("sitecustomize") is not None:
            importlib.import_module("sitecustomize")
    except Exception as err:  # as site does: a broken sitecustomize is reported, not fatal
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}",
              file=sys.stderr)  # fmt: skip
    if "sitecustomize" not in sys.modules and me is not None:
        sys.modules["sitecustomize"] = me


def rank_out(out: str, rank: int) -> str:
    """Where rank `rank` writes the result `out` names for its group (`a/b.json` → `a/b.rank1.json`)."""
    stem, dot, suffix = out.rpartition(".")
    return f"{stem}.rank{rank}.{suffix}" if dot and "/" not in suffix else f"{out}.rank{rank}"


def boot() -> None:
    raw = os.environ.get(ENV)
    if raw and json.loads(raw).get("ranks") and "RANK" not in os.environ:
        # the launcher of a group (torchrun's agent): its workers start with this folder and settings
        if __name__ == "sitecustomize":
            _chain_load()
        return
    os.environ.pop(ENV, None)
    if __name__ == "sitecustomize":
        _hide(os.path.realpath(os.path.dirname(os.path.abspath(__file__))))
        _chain_load()
    if raw:
        config = json.loads(raw)
        if config.get("ranks"):
            config["out"] = rank_out(str(config["out"]), int(os.environ["RANK"]))
        install(config)


if __name__ == "sitecustomize":
    boot()
