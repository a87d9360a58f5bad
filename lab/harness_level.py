"""Probe: which part of a fix round's instrumentation makes the harness's baseline slower than the script
run plainly. Each configuration runs the script in a fresh process with some of the round's parts
installed — the capture (step discovery and the light phase: `capture`), the finder of the step's modules
with the observer (`observer`), the recorder of the first losses (`recorder`) — and times it with the
same small timer in all of them: an optimizer step post-hook counting steps, a window of `--window-s`
after `--warmup` steps, one CUDA synchronization at each of its ends. Configurations alternate, so drift
cancels across rounds.

    PYTHONPATH=src python3 lab/harness_level.py --rounds 3 --configs plain,capture,observer,all -- \\
        benchmarks/fix_workloads/lm_three_modules.py --small

`forked` runs the plain script in a child forked from a process that imported what the fix rounds' fork
server imports ahead (torch, torch._dynamo, numpy, gpudoctor's round, and transformers where present) and
froze its objects (`gc.freeze`), as each round is; `forked_all` adds every part. A loop without an
optimizer (inference) counts its steps as calls of the top-level module of class `--module` instead.

    PYTHONPATH=src python3 lab/harness_level.py --rounds 3 --configs plain,forked,all,forked_all \\
        --module GPT2LMHeadModel -- benchmarks/fix_workloads/transformer_infer_b1.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PARTS = {"plain": (), "capture": ("capture",), "finder": ("finder",), "observer": ("observer",),
         "recorder": ("recorder",), "all": ("capture", "observer", "recorder"), "forked": ("fork",),
         "forked_all": ("fork", "capture", "observer", "recorder")}  # fmt: skip
PRELOAD = ("torch", "torch._dynamo", "numpy", "gpudoctor.fixes.child", "transformers")  # as the fork server


def forked(run: Callable[[], None]) -> None:
    """`run()` in a child forked from this process once it has imported what the fork server imports
    ahead and frozen its objects; this process waits and ends with the child's status."""
    import gc
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        try:
            run()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status))


def child(
    parts: tuple[str, ...], out: str, warmup: int, window_s: float, command: list[str], module: str | None
) -> None:
    if "fork" in parts:
        rest = tuple(p for p in parts if p != "fork")
        forked(lambda: child(rest, out, warmup, window_s, command, module))
        return
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    state = {"steps": 0, "t0": 0.0, "n": 0}

    def sync() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    class Done(Exception):
        pass

    lead: list[int] = []

    def stepped(opt: object, *args: object) -> None:
        if torch.compiler.is_compiling():
            return
        if not lead:
            lead.append(id(opt))
        if id(opt) != lead[0]:
            return
        state["steps"] += 1
        if state["steps"] == warmup:
            sync()
            state["t0"] = time.perf_counter()
            return
        if state["steps"] > warmup:
            state["n"] += 1
            if time.perf_counter() - state["t0"] >= window_s:
                sync()
                elapsed = time.perf_counter() - state["t0"]
                Path(out).write_text(json.dumps({"step_us": 1e6 * elapsed / state["n"], "steps": state["n"]}))
                os._exit(0)

    if module:  # calls of the top-level module of that class, counted as the proof's stopwatch counts them
        from gpudoctor.fixes.stopwatch import RootCalls

        class Counting:
            def __init__(self) -> None:
                self.module = module
                self.on_step = lambda: stepped(self)

        RootCalls(Counting(), torch).install()
    else:
        register_optimizer_step_post_hook(stepped)
    from gpudoctor.runner.hooks import RootFinder, patched, seed_everything
    from gpudoctor.runner.launch import run_script

    seed_everything(0)
    installed: list[object] = []
    if "capture" in parts:
        from gpudoctor.runner.capture import LiveCapture, LiveOptions

        capture = LiveCapture(Path(out).parent, LiveOptions(warmup=5, light_steps=10_000, light_seconds=1e6,
                                                            light_only=True, nvml=False, settle=False))  # fmt: skip
        capture.install()
        installed.append(capture)
    steps_seen = (lambda: installed[0].steps_seen) if installed else (lambda: state["steps"])
    finder = RootFinder(until=lambda: steps_seen() >= 3)
    patches: list[object] = []
    if "observer" in parts:
        from gpudoctor.fixes.observe import Observer

        patches.append(Observer(finder))
    if "recorder" in parts:
        from gpudoctor.runner.outputs import OutputRecorder

        patches.append(OutputRecorder(finder, 5))
    if patches or "finder" in parts:
        finder.install()
    with patched(patches):  # type: ignore[arg-type]
        run_script(command[0], command[1:])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="plain,capture,observer,recorder,all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument(
        "--module", default="", help="count calls of this top-level module's class, not optimizer steps"
    )
    parser.add_argument("--child", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if a.child or a.out:
        parts = tuple(p for p in a.child.split(",") if p)
        child(parts, a.out, a.warmup, a.window_s, command, a.module or None)
        return 1  # the script ended before its window
    configs = a.configs.split(",")
    results: dict[str, list[float]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.rounds):
            for c in configs if k % 2 == 0 else configs[::-1]:
                out = str(Path(tmp) / f"{c}-{k}.json")
                cmd = [sys.executable, __file__, "--child", ",".join(PARTS[c]) or "none", "--out", out,
                       "--warmup", str(a.warmup), "--window-s", str(a.window_s),
                       *(["--module", a.module] if a.module else []), "--", *command]  # fmt: skip
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
                if Path(out).exists():
                    results[c].append(json.loads(Path(out).read_text())["step_us"])
    base = statistics.median(results["plain"]) if results.get("plain") else None
    for c, values in results.items():
        med = statistics.median(values) if values else None
        ratio = f"{med / base:.3f}" if med and base else "-"
        print(f"{c:10s} {' '.join(f'{v / 1e3:.2f}' for v in values)} ms   median/plain {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
