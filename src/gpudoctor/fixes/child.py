"""One round of `gpudoctor fix`, in a fresh process:

    python -m gpudoctor.fixes.child --fixes tf32,compile --out round.json [options] -- train.py args

Seeds every generator, applies the fixes' patches, runs the script as `gpudoctor run --light` does (skip
`--warmup` steps, time `--steps` without the profiler, then stop it), records the first `--record` losses
or root outputs, and writes a `RoundResult` — also when the script or a patch fails. Everything it
changed is undone before it exits.

With `--switch f,g` (fixes among `--fixes`) the timed phase is an A/B inside this process: after the
warm-up (with every fix on, as the first losses were recorded) `f` and `g` are switched off and on at
step boundaries in `--pairs` pairs of blocks, each pair A B or B A at random (`timing.blocks`): after
`--warmup` untimed steps of the baseline, its steps are timed for the loop's pace and period (a
loader's cycle), and every block is then the same whole number of periods, at least `--block-steps`
steps and `--block-s` seconds at that pace, after `--settle` untimed steps. A switched fix not among
`--fixes` is the baseline's alone, replaced by those switched on (`--fixes autocast,compile --switch
compile,compile:reduce-overhead`: plain compile in CUDA graphs' place); it must wrap the root's forward.
Where wrappers of the root's forward switch, each side's forward is built from its own wrappers and
both are held at once (`ForwardVariants`: compile(forward) beside compile(autocast(forward))).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpudoctor.fixes.catalog import build_patch, wraps_forward
from gpudoctor.fixes.observe import Observer
from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.fixes.patches.forward import ForwardVariants, ForwardWrapper
from gpudoctor.fixes.patches.loader import PREFETCH, Workers
from gpudoctor.fixes.ranks import rank_path, this_rank
from gpudoctor.fixes.round import RoundResult
from gpudoctor.runner.capture import LiveCapture, LiveOptions
from gpudoctor.runner.child import end_within
from gpudoctor.runner.compile_time import CompileTime
from gpudoctor.runner.hooks import RootFinder, patched, seed_everything
from gpudoctor.runner.launch import ScriptEnd, run_script
from gpudoctor.runner.outputs import OutputRecorder
from gpudoctor.runner.ranks import RankRun, end_process_group
from gpudoctor.runner.record import StepFound
from gpudoctor.runner.rundir import write_child_result
from gpudoctor.timing.blocks import BlockPlan

WATCH_STEPS = 3  # steps over which the top-level modules the step calls are found and counted


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpudoctor.fixes.child", description=__doc__)
    parser.add_argument("--fixes", default="", help="comma-separated fix ids (none: the baseline)")
    parser.add_argument("--out", required=True, help="where to write the round's JSON")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-s", type=float, default=0.0, help="and warm up at least this long")
    parser.add_argument("--steps-s", type=float, default=0.0, help="and time at least this long")
    parser.add_argument("--record", type=int, default=5, help="steps whose loss or output is recorded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-m", dest="module", action="store_true", help="the target is a module")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--exact-random", action="store_true", help="Inductor draws random numbers as eager")
    parser.add_argument("--switch", default="", help="fixes turned off and on in blocks (an in-process A/B)")
    parser.add_argument("--pairs", type=int, default=8, help="block pairs of the in-process A/B")
    parser.add_argument("--block-s", type=float, default=0.5, help="seconds a block lasts at least")
    parser.add_argument("--extend-pairs", type=int, default=0,
                        help="block pairs added, once, where the planned ones lean to a saving undecided")  # fmt: skip
    parser.add_argument("--block-steps", type=int, default=2, help="steps a block lasts at least")
    parser.add_argument("--settle", type=int, default=1, help="untimed steps before every block")
    parser.add_argument("--order-seed", type=int, default=None,
                        help="seed of the pairs' random orders (default: drawn afresh; recorded)")  # fmt: skip
    parser.add_argument("--count-cpu-items", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the script (or module) and its arguments after --")
    fixes = [f for f in args.fixes.split(",") if f]
    if args.switch and this_rank() is not None and args.order_seed is None:
        parser.error(
            "--switch in a group of ranks needs --order-seed: every rank runs its blocks in one order"
        )
    stray = [f for f in args.switch.split(",") if f and f not in fixes and not wraps_forward(f)]
    if stray:
        parser.error(f"--switch names fixes not in --fixes that do not wrap the forward: {', '.join(stray)}")
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

    def seconds(self) -> float:
        """Spent compiling so far, the compilation under way included."""
        return self._time.seconds()

    def apply(self) -> None:
        self._time.install()

    def undo(self) -> None:
        self._time.uninstall()

    def _on_spent(self, spent: float) -> None:
        if self.timing():
            self.timed_s += spent


class Switched(Protocol):
    order: int

    def switch(self, on: bool) -> None: ...


@runtime_checkable
class Lagging(Protocol):
    def lag(self) -> int: ...


class Switcher:
    """Turns the switched fixes off (in reverse order) and on again (in order) at a block boundary; the
    first fix that cannot be switched is remembered (and stops the blocks)."""

    def __init__(self, switched: Sequence[Switched]) -> None:
        self.switched = sorted(switched, key=lambda s: s.order)
        self.error: str | None = None
        self.count = 0  # switches begun

    def __call__(self, on: bool) -> None:
        self.count += 1
        try:
            for s in self.switched if on else reversed(self.switched):
                s.switch(on)
        except Exception as err:
            self.error = self.error or f"{type(err).__name__}: {err}"
            raise

    def lag(self) -> int:
        """Steps a switch takes to reach the loop: the largest of the switched fixes' (a loader's
        batches made ahead), 0 where none says."""
        return max((s.lag() for s in self.switched if isinstance(s, Lagging)), default=0)


def forward_variants(
    finder: RootFinder, patches: Sequence[FixPatch], switch: tuple[str, ...], replaced: tuple[str, ...]
) -> ForwardVariants | None:
    """Where a wrapper of the root's forward switches, the forward of each side built from its own
    wrappers (those that stay, and those of its side alone)."""
    wrappers = [p for p in patches if isinstance(p, ForwardWrapper)]
    if not any(p.name in switch for p in wrappers):
        return None
    stay = [p for p in wrappers if p.name not in switch]
    join = [p for p in wrappers if p.name in switch and p.name not in replaced]
    leave = [p for p in wrappers if p.name in replaced]
    return ForwardVariants(finder, stay, join, leave)


def run_round(args: argparse.Namespace) -> RoundResult:
    target, script_args = args.command[0], args.command[1:]
    fixes = tuple(f for f in args.fixes.split(",") if f)
    switch = tuple(f for f in args.switch.split(",") if f)
    replaced = tuple(f for f in switch if f not in fixes)  # the baseline's alone
    started = time.perf_counter()
    seed_everything(args.seed)
    # every top-level module the step calls is found (and counted) over its first steps
    watching: list[LiveCapture] = []
    finder = RootFinder(until=lambda: bool(watching) and watching[0].steps_seen >= WATCH_STEPS)
    ctx = PatchContext(finder, None if args.module else str(Path(target).resolve()))
    patches = sorted(
        (
            build_patch(f, ctx, compile_backend=args.compile_backend, exact_random=args.exact_random)
            for f in (*fixes, *replaced)
        ),
        key=lambda p: p.order,
    )
    observer = Observer(finder, all_devices=args.count_cpu_items)
    recorder = OutputRecorder(finder, args.record)
    variants = forward_variants(finder, patches, switch, replaced)
    flags = [p for p in patches if p.name in switch and not isinstance(p, ForwardWrapper)]
    switcher = Switcher([*flags, *([variants] if variants else [])])
    plan = None
    if switch:
        plan = BlockPlan(pairs=args.pairs, min_steps=args.block_steps, min_seconds=args.block_s,
                         settle=args.settle, prewarm=max(args.warmup, 1), seed=args.order_seed,
                         extend_pairs=args.extend_pairs)  # fmt: skip
    # a loader's workers fill a queue ahead of the loop: warm up until it holds what it holds for good,
    # and time past it, so that batches made during the warm-up do not flatter the timed steps
    queued = sum(p.workers * PREFETCH for p in patches if isinstance(p, Workers))
    options = LiveOptions(
        warmup=max(args.warmup, queued),
        warmup_seconds=args.warmup_s,
        light_steps=max(args.steps, 2 * queued),
        light_seconds=args.steps_s,
        light_only=True,
        nvml=False,
        blocks=plan,
        settle=False,  # a round is its --steps and --steps-s: what A and B share cancels in their pairs
    )
    compiling = any(f.startswith("compile") for f in (*fixes, *replaced))
    # counted where steps are timed: a variant compiled in the blocks' prewarm is not a recompilation.
    # Installed in every round (a script that compiles its own model recompiles too: the light phase
    # starts again), reported where a fix compiles.
    clock = CompileClock(lambda: capture.timing)
    # one rank of several (a torchrun group): the ranks enter each phase at the same step, agreed through
    # the launcher's store, so that every rank stops at the step the others stop at
    ranks = _rank_run(args, target, script_args)
    capture = LiveCapture(
        Path(args.out).parent,
        options,
        on_phase=ranks.on_phase if ranks else None,
        on_switch=switcher,
        disturbed=None if ranks else clock.seconds,
        switch_lag=switcher.lag,
    )
    watching.append(capture)
    end: ScriptEnd | None = None
    failed: str | None = None
    kind, values, observations = "none", [], None
    ended_at = 0.0
    finder.install()
    try:
        # the variants after the wrappers: their forwards are built once the wrappers saw the root
        with patched([*patches, *([variants] if variants else []), observer, recorder, clock]):
            capture.install()
            try:
                end = run_script(target, script_args, module=args.module)
            finally:
                ended_at = time.time()
                if ranks is not None:  # torchrun's SIGTERM from here on must not cut the result short
                    ranks.script_ended = True
                capture.uninstall()
            kind, values = recorder.values()
            observations = observer.observations()
    except Exception as err:  # a patch that could not be applied or undone
        failed = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    finally:
        finder.uninstall()
        if ranks is not None:
            _end_rank(ranks, end)
    result = _result(fixes, end, failed, capture, clock if compiling else None)
    return replace(
        result,
        switch=switch,
        blocks=capture.blocks,
        redone=capture.redone,
        restarted_s=tuple(capture.restarted_s),
        block_layout=capture.block_layout,
        switch_error=switcher.error,
        switches=switcher.count,
        outputs_kind=kind,
        outputs=tuple(tuple(v) for v in values),
        patches={p.name: p.outcome() for p in patches},
        observations=observations,
        exact_random=args.exact_random,
        wall_s=time.perf_counter() - started,
        ended_at=ended_at,
    )


def _rank_run(args: argparse.Namespace, target: str, script_args: list[str]) -> RankRun | None:
    """This round's side of a group of ranks (its meeting files beside the round's result), or None."""
    if this_rank() is None:
        return None
    out = Path(args.out)
    return RankRun.start(out.with_name(f"{out.stem}.ranks"), [target, *script_args], "", {})


def _end_rank(ranks: RankRun, end: ScriptEnd | None) -> None:
    """The script's process group ended as its own end would have (every rank stopped at one step)."""
    if end is not None and end.outcome == "stopped":
        note = end_process_group()
        if note:
            print(f"gpudoctor fix: {note}", file=sys.stderr)
    ranks.close()


def _result(
    fixes: tuple[str, ...],
    end: ScriptEnd | None,
    failed: str | None,
    capture: LiveCapture,
    clock: CompileClock | None,
) -> RoundResult:
    """How the script ended and what the light phase timed."""
    light = capture.light
    # a recompilation in a block timed again, or before a light phase's restart, is not in the step times
    again = sum(r.disturbed_s for r in capture.redone) + sum(capture.restarted_s)
    recompiled = clock.timed_s - again if clock else 0.0
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
        compile_timed_s=max(0.0, recompiled),
        error=" ".join(error.split())[:500] if error else None,
        oom=_is_oom(end.error if end else None),
        device=_device(capture),
        torch=_torch_version(),
        step=None if capture.definition is None else StepFound.of(capture.definition, capture.calls_per_step),
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
    rank = this_rank()
    out = args.out if rank is None else str(rank_path(Path(args.out), rank))
    write_child_result(out, result.to_json())  # the one writer: whole or not at all
    end_within()  # the round is measured: its way out may not cost the session
    return 0


if __name__ == "__main__":
    sys.exit(main())
