"""Time a workload plainly, for benchmarks/fix_vs_expert.py: run the script (optionally with gpudoctor's
fixes applied as `gpudoctor fix`'s child applies them), skip `--warmup` steps, then time `--windows`
windows of at least `--window-s` seconds each with CUDA-synchronized wall time — one synchronization at
each window's ends, none per step — and stop the script. Steps are found as `gpudoctor run` finds them.
A window in which torch.compile compiled (a recompilation on an epoch's last, smaller batch: 19.6 s in a
window of Lightning's compiled expert on the H200) is a one-off cost like the first compilation: it is
set aside (`recompiled`) and another window timed in its place, up to `--windows` more.

The warm-up also spends the batches a DataLoader with workers holds in flight (its workers ×
prefetch_factor, the largest of the loaders iterated): they pile up while the first steps compile, and a
loader-paced loop runs through them at the GPU's pace before it settles to its workers'. `--no-drain`
keeps the bare `--warmup`; the result records the warm-up it used (`warmup_steps`).

`--count-modules` counts, over the warm-up's steps (the first left out: it holds the script's set-up),
the top-level modules each step calls — modules with parameters called while no other module's forward
runs — with torch's global forward hooks, removed before the first window (they slow every module call).
The hooks see eager calls only: a module the script compiled itself is seen where it is a compiled
wrapper (`torch.compile(module)`), not after `module.compile()`; `modules.compiled_while_counting` says
when the count ran beside compilation.

    PYTHONPATH=src python3 benchmarks/fix_workloads/plain_timer.py --out t.json [--fixes tf32,compile] -- \\
        benchmarks/fix_workloads/gpt2_train.py [--expert]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fixes", default="")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-drain",
        action="store_true",
        help="no warm-up steps for the batches a DataLoader's workers hold in flight",
    )
    parser.add_argument(
        "--keep-compile-workers",
        action="store_true",
        help="leave Inductor's compile workers running (a probe)",
    )
    parser.add_argument(
        "--count-modules",
        action="store_true",
        help="count the top-level modules each warm-up step calls (`modules` in the result)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    stacks_after = os.environ.get("GPUDOCTOR_TIMER_STACKS_AFTER_S")
    if stacks_after:  # fix_vs_expert stops a timer with no result: what each thread was doing, first
        faulthandler.dump_traceback_later(float(stacks_after), exit=False)

    import torch
    from torch.utils.data import DataLoader

    from gpudoctor.fixes.catalog import build_patch
    from gpudoctor.fixes.patches.base import PatchContext
    from gpudoctor.runner.capture import StopRun
    from gpudoctor.runner.compile_time import CompileTime
    from gpudoctor.runner.compile_workers import stop_compile_workers
    from gpudoctor.runner.forked import leave_forked_children
    from gpudoctor.runner.hooks import RootFinder, eager_only, patched, seed_everything
    from gpudoctor.runner.launch import run_script
    from gpudoctor.runner.steps import StepDetector

    windows: list[tuple[float, int]] = []
    recompiled: list[tuple[float, int, float]] = []  # windows set aside: seconds, steps, compiling
    state = {"steps": 0, "t0": 0.0, "in_window": 0, "compiled": 0.0, "in_flight": 0, "warmup_steps": 0}
    compiling = CompileTime()
    iterate = DataLoader.__iter__
    modules = TopModules(eager_only) if args.count_modules else None

    def counted_iter(loader: DataLoader) -> object:  # type: ignore[type-arg]
        # read when iterated: the loader's final arguments, a fix's rewrite of them included
        workers = int(getattr(loader, "num_workers", 0) or 0)
        if workers and not args.no_drain:
            ahead = workers * int(getattr(loader, "prefetch_factor", None) or 2)
            state["in_flight"] = max(state["in_flight"], ahead)
        return iterate(loader)

    def warmup() -> int:
        return args.warmup + state["in_flight"]

    def sync() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def on_step() -> None:
        # Discovery's fallback when nothing repeats for 20 s — a first step still compiling, say — is a
        # 100 ms window: its ticks are not the script's steps (they once timed GPT-2's compilation)
        if detector.definition is None or detector.definition.source == "window":
            return
        state["steps"] += 1
        if not state["t0"]:  # warming up (the warm-up is fixed once timing starts)
            if modules is not None:
                modules.step_ended(compiling.seconds() > 0)
            if state["steps"] < warmup():
                return
            state["warmup_steps"] = state["steps"]
            if modules is not None:
                modules.uninstall()
            if not args.keep_compile_workers:
                stop_compile_workers()  # as gpudoctor's own timing does: their start-up is not the loop's
            sync()
            state["t0"], state["in_window"] = time.perf_counter(), 0
            state["compiled"] = compiling.seconds()
            return
        state["in_window"] += 1
        if time.perf_counter() - state["t0"] < args.window_s:
            return
        sync()
        now = time.perf_counter()
        compiled = compiling.seconds() - state["compiled"]
        if compiled > 0 and len(recompiled) < args.windows:
            recompiled.append((now - state["t0"], state["in_window"], compiled))
        else:
            windows.append((now - state["t0"], state["in_window"]))
        state["t0"], state["in_window"], state["compiled"] = now, 0, compiling.seconds()
        if len(windows) >= args.windows:
            raise StopRun

    # a DataLoader's workers, forked at the loop's first batch, leave the step detector's hooks behind:
    # they would run them at every transform (and a worker's copy once took one for the step and ended)
    leave_forked_children()
    seed_everything(args.seed)
    # every top-level module the step calls found over its first steps, as a fix round finds them
    finder = RootFinder(until=lambda: state["steps"] >= 3)
    ctx = PatchContext(finder, str(Path(command[0]).resolve()))
    patches = sorted((build_patch(f, ctx) for f in args.fixes.split(",") if f), key=lambda p: p.order)

    def on_definition(definition: object, restart: bool) -> None:
        if restart:  # another source took over (an optimizer after the window fallback): count anew
            windows.clear()
            recompiled.clear()
            state.update(steps=0, t0=0.0, in_window=0)
            if modules is not None:
                modules.restart()

    detector = StepDetector(on_step, on_definition)
    started = time.perf_counter()
    finder.install()
    compiling.install()
    if modules is not None:
        modules.install()
    DataLoader.__iter__ = counted_iter  # type: ignore[method-assign]
    try:
        with patched(patches):
            detector.install()
            try:
                end = run_script(command[0], command[1:])
            finally:
                detector.uninstall()
    finally:
        DataLoader.__iter__ = iterate  # type: ignore[method-assign]
        compiling.uninstall()
        finder.uninstall()
        if modules is not None:
            modules.uninstall()
    total_s = sum(w[0] for w in windows)
    total_steps = sum(w[1] for w in windows)
    result = {
        "command": command,
        "fixes": [f for f in args.fixes.split(",") if f],
        "outcome": end.outcome,
        "error": None if end.error is None else f"{type(end.error).__name__}: {end.error}",
        "windows": windows,
        "recompiled": recompiled,
        "step_s": total_s / total_steps if total_steps else None,
        "wall_s": time.perf_counter() - started,
        "warmup_steps": state["warmup_steps"],
        "modules": None if modules is None else modules.result(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "monotonic": time.monotonic(),  # system-wide: the benchmark reads the GPU's clocks up to it
    }
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")  # whole or not there: never an empty file read back
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(out)
    return 0 if result["step_s"] else 1


class TopModules:
    """The top-level modules each step calls: those with parameters called while no other module's
    forward runs (as many as the step calls, each counted once), seen by torch's global forward hooks
    wrapped by `eager_only` (inside code being compiled they do nothing). `step_ended()` at each step's
    end closes one step; the first, which holds what ran before the loop, is left out."""

    def __init__(self, eager_only: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._eager_only = eager_only
        self._handles: list[Any] = []
        self._depth = 0
        self._called: dict[int, str] = {}  # this step's top-level modules with parameters: id -> class
        self._without_parameters: dict[str, None] = {}
        self._names: dict[str, None] = {}
        self._steps_seen = 0
        self._compiled = False
        self.per_step: list[int] = []

    def install(self) -> None:
        from torch.nn.modules import module

        self._handles = [
            module.register_module_forward_pre_hook(self._eager_only(self._pre)),
            module.register_module_forward_hook(self._eager_only(self._post), always_call=True),
        ]

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre(self, module: Any, args: Any) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        original = getattr(module, "_orig_mod", module)  # torch.compile(module): the module it wraps
        name = type(original).__name__
        if next(module.parameters(), None) is None:
            self._without_parameters[name] = None
        else:
            self._called[id(original)] = name

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)

    def step_ended(self, compiled: bool) -> None:
        if not self._handles:
            return
        self._steps_seen += 1
        if self._steps_seen > 1:
            self.per_step.append(len(self._called))
            self._names.update(dict.fromkeys(self._called.values()))
            self._compiled = self._compiled or compiled
        self._called.clear()

    def restart(self) -> None:
        """Another source of steps took over (an optimizer after the calls of a model that a rollout
        makes first): count its steps anew, through a warm-up of its own."""
        self._steps_seen, self._compiled, self.per_step = 0, False, []
        self._names.clear()
        self._called.clear()
        self._depth = 0
        if not self._handles:
            self.install()

    def result(self) -> dict[str, Any]:
        counted = sorted(self.per_step)
        return {
            "modules_per_step": counted[len(counted) // 2] if counted else None,  # the median step's
            "per_step": self.per_step,
            "names": list(self._names),
            "without_parameters": list(self._without_parameters),
            "compiled_while_counting": self._compiled,
        }


if __name__ == "__main__":
    sys.exit(main())
