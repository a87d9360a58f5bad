"""One round of `gpudoctor fix`, in a fresh process:

    python -m gpudoctor.fixes.child --fixes tf32,compile --out round.json [options] -- train.py args

Seeds every generator, applies the fixes' patches, runs the script as `gpudoctor run --light` does (skip
`--warmup` steps, time `--steps` without the profiler, then stop it), records the first `--record` losses
or root outputs, and writes a `RoundResult` — also when the script or a patch fails. Everything it
changed is undone before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpudoctor.fixes.catalog import build_patch
from gpudoctor.fixes.observe import Observer
from gpudoctor.fixes.patches.base import PatchContext
from gpudoctor.fixes.round import RoundResult
from gpudoctor.runner.capture import LiveCapture, LiveOptions
from gpudoctor.runner.compile_time import CompileTime
from gpudoctor.runner.hooks import RootFinder, patched, seed_everything
from gpudoctor.runner.launch import ScriptEnd, run_script
from gpudoctor.runner.outputs import OutputRecorder


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpudoctor.fixes.child", description=__doc__)
    parser.add_argument("--fixes", default="", help="comma-separated fix ids (none: the baseline)")
    parser.add_argument("--out", required=True, help="where to write the round's JSON")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--record", type=int, default=5, help="steps whose loss or output is recorded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-m", dest="module", action="store_true", help="the target is a module")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--exact-random", action="store_true", help="Inductor draws random numbers as eager")
    parser.add_argument("--count-cpu-items", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the script (or module) and its arguments after --")
    return args


class CompileClock:
    """Wall time spent compiling (`runner.compile_time`), as a patch; what of it fell in the timed steps
    is counted apart (a recompilation there inflates them)."""

    name = "compile_clock"

    def __init__(self, timing: Callable[[], bool]) -> None:
        self.timing = timing
        self.timed_s = 0.0
        self._time = CompileTime(self._on_spent)

    @property
    def total_s(self) -> float:
        return self._time.total_s

    def apply(self) -> None:
        self._time.install()

    def undo(self) -> None:
        self._time.uninstall()

    def _on_spent(self, spent: float) -> None:
        if self.timing():
            self.timed_s += spent


def run_round(args: argparse.Namespace) -> RoundResult:
    target, script_args = args.command[0], args.command[1:]
    fixes = tuple(f for f in args.fixes.split(",") if f)
    started = time.perf_counter()
    seed_everything(args.seed)
    finder = RootFinder()
    ctx = PatchContext(finder, None if args.module else str(Path(target).resolve()))
    patches = sorted(
        (
            build_patch(f, ctx, compile_backend=args.compile_backend, exact_random=args.exact_random)
            for f in fixes
        ),
        key=lambda p: p.order,
    )
    observer = Observer(finder, all_devices=args.count_cpu_items)
    recorder = OutputRecorder(finder, args.record)
    options = LiveOptions(
        warmup=args.warmup,
        warmup_seconds=0.0,
        light_steps=args.steps,
        light_seconds=0.0,
        light_only=True,
        nvml=False,
    )
    capture = LiveCapture(Path(args.out).parent, options)
    compiling = any(f.startswith("compile") for f in fixes)
    clock = CompileClock(lambda: capture.phase == "light") if compiling else None
    end: ScriptEnd | None = None
    failed: str | None = None
    kind, values, observations = "none", [], None
    finder.install()
    try:
        with patched([*patches, observer, recorder, *([clock] if clock else [])]):
            capture.install()
            try:
                end = run_script(target, script_args, module=args.module)
            finally:
                capture.uninstall()
            kind, values = recorder.values()
            observations = observer.observations()
    except Exception as err:  # a patch that could not be applied or undone
        failed = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    finally:
        finder.uninstall()
    result = _result(fixes, end, failed, capture, clock)
    return replace(
        result,
        outputs_kind=kind,
        outputs=tuple(tuple(v) for v in values),
        patches={p.name: p.outcome() for p in patches},
        observations=observations,
        exact_random=args.exact_random,
        wall_s=time.perf_counter() - started,
    )


def _result(
    fixes: tuple[str, ...],
    end: ScriptEnd | None,
    failed: str | None,
    capture: LiveCapture,
    clock: CompileClock | None,
) -> RoundResult:
    """How the script ended and what the light phase timed."""
    light = capture.light
    error = failed or (
        None if end is None or end.error is None else f"{type(end.error).__name__}: {end.error}"
    )
    return RoundResult(
        fixes=fixes,
        outcome="patch_failed" if failed else (end.outcome if end else "crashed"),
        exit_code=end.exit_code if end else 1,
        clock=light.clock if light else None,
        step_times_us=tuple(light.times_us) if light else (),
        steps_seen=capture.steps_seen,
        compile_s=clock.total_s if clock else 0.0,
        compile_timed_s=clock.timed_s if clock else 0.0,
        error=" ".join(error.split())[:500] if error else None,
        oom=_is_oom(end.error if end else None),
        device=_device(capture),
        torch=_torch_version(),
    )


def _device(capture: LiveCapture) -> str:
    env = capture.environment
    if env is None:
        return "unknown"
    return env.gpu_name or env.device


def _torch_version() -> str | None:
    import torch

    return str(torch.__version__)


def _is_oom(err: BaseException | None) -> bool:
    if err is None:
        return False
    return type(err).__name__ == "OutOfMemoryError" or "out of memory" in str(err).lower()


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    result = run_round(args)
    if result.error and result.outcome == "exception":
        print(f"gpudoctor fix: the script raised {result.error}", file=sys.stderr)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result.to_json(), allow_nan=False))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
