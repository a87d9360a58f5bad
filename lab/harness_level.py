"""Probe: which part of a fix round's instrumentation makes the harness's baseline slower than the script
run plainly. Each configuration runs the script in a fresh process with some of the round's parts
installed — the capture (step discovery and the light phase: `capture`), the finder of the step's modules
with the observer (`observer`), the recorder of the first losses (`recorder`) — and times it with the
same small timer in all of them: an optimizer step post-hook counting steps, a window of `--window-s`
after `--warmup` steps, one CUDA synchronization at each of its ends. Configurations alternate, so drift
cancels across rounds.

    PYTHONPATH=src python3 lab/harness_level.py --rounds 3 --configs plain,capture,observer,all -- \\
        benchmarks/fix_workloads/lm_three_modules.py --small
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = {"plain": (), "capture": ("capture",), "finder": ("finder",), "observer": ("observer",),
         "recorder": ("recorder",), "all": ("capture", "observer", "recorder")}  # fmt: skip


def child(parts: tuple[str, ...], out: str, warmup: int, window_s: float, command: list[str]) -> None:
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
    parser.add_argument("--child", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if a.child or a.out:
        parts = tuple(p for p in a.child.split(",") if p)
        child(parts, a.out, a.warmup, a.window_s, command)
        return 1  # the script ended before its window
    configs = a.configs.split(",")
    results: dict[str, list[float]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.rounds):
            for c in configs if k % 2 == 0 else configs[::-1]:
                out = str(Path(tmp) / f"{c}-{k}.json")
                cmd = [sys.executable, __file__, "--child", ",".join(PARTS[c]) or "none", "--out", out,
                       "--warmup", str(a.warmup), "--window-s", str(a.window_s), "--", *command]  # fmt: skip
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
