"""`PlainProver`: the proof of `gpudoctor fix`'s recommendation. `fix.diff` is applied by a strict applier
(`fixes.patchtext`) to a copy of the user's files (`fixes.shadow`), and the patched copy is timed against
the untouched script as plain processes — `python script.py args` with the user's folder, arguments and
environment, on the cores the rounds ran on, no gpudoctor code and no fork server in them; only the
stopwatch (`fixes.stopwatch`, as `sitecustomize.py` first on PYTHONPATH) counts the step the harness's
baseline counted — in pairs, A B, B A, …, until the paired test's 95% interval is within ±5% (3 pairs at
least; at most 10, or what the time budget leaves). Every process runs through the runner's protocol
(`runner.child.run_plain`: its process group ended with it, a time limit)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpudoctor.fixes import stopwatch
from gpudoctor.fixes.options import FixOptions
from gpudoctor.fixes.patchtext import PatchError, patched_files
from gpudoctor.fixes.proof import (
    COUNTABLE,
    MAX_PAIRS,
    MIN_PAIRS,
    TARGET_HALF_WIDTH,
    PlainProcess,
    ProcessClocks,
    Proof,
    ProofPair,
    ProofRequest,
    clocks_note,
    compare,
    enough,
    half_width,
    timed_reason,
)
from gpudoctor.fixes.ranks import group_env, rank_path, root_cause, torchrun
from gpudoctor.fixes.shadow import ShadowError, build_shadow
from gpudoctor.runner.child import ChildRun, log_tail, read_result, run_plain
from gpudoctor.runner.record import StepFound
from gpudoctor.runner.rundir import proof_files, proof_folders, write_stopwatch
from gpudoctor.runner.samplers import ChildClocks, child_clocks
from gpudoctor.timing.paired import PairedComparison

TIMEOUT_FACTOR = 3.0  # a side's processes after its first: this many times its longest so far, and at least
MIN_TIMEOUT_S = 60.0
SIDES = ("script", "patched")
WINDOWS = 4  # the timed span is cut in this many windows (each one set aside where it compiled)


@dataclass(frozen=True)
class Target:
    script: str
    args: tuple[str, ...]
    module: bool


class PlainProver:
    def __init__(
        self,
        target: Target,
        options: FixOptions,
        out: Path,
        *,
        start_s: float = 0.0,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        on_stage: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`start_s`: what a fresh interpreter spends before the script's first line that a round did
        not (the fork server's imports), for the budget's reserve."""
        self.target, self.options, self.out, self.start_s = target, options, out, start_s
        self.cwd = cwd or Path.cwd()
        self.env = dict(os.environ if env is None else env)
        self.say = on_stage or (lambda s: None)
        self.clock = clock
        self._no_clocks = False  # NVML could not read the GPU once: not asked again

    def reserve_s(self, round_s: float) -> float:
        """MIN_PAIRS pairs of plain processes, each a baseline round and an interpreter's start."""
        return 2 * MIN_PAIRS * (round_s + self.start_s) if self.options.proof else 0.0

    def __call__(self, request: ProofRequest) -> Proof:
        t0 = self.clock()
        script = Path(self.target.script)
        a_cmd = self._script_command()
        stated = Stated(a_cmd, str(self.cwd), t0, self.clock, request.step)
        why = self._cannot(request)
        if why is not None:
            return stated.proof("not made", None, why)
        try:
            patched = patched_files(request.diff, self.cwd)
        except PatchError as err:
            return stated.proof("does not apply", False, f"fix.diff does not apply to your files: {err}")
        copy_dir, _ = proof_folders(self.out)
        try:
            copy = build_shadow(self.cwd / script, patched, copy_dir)
        except (ShadowError, OSError) as err:
            return stated.proof("not made", None, f"the patched copy could not be made: {err}")
        b_cmd = (*self._python(), str(copy.script), *self.target.args)
        return self._pairs(request, stated, a_cmd, b_cmd, str(copy.root))

    def _script_command(self) -> tuple[str, ...]:
        """The script as the user runs it: its interpreter (or torchrun), path and arguments."""
        return (*self._python(), self.target.script, *self.target.args)

    def _python(self) -> tuple[str, ...]:
        """How the user starts the script: python, or torchrun for a group of ranks."""
        o = self.options
        return tuple(torchrun(o.nproc, o.numa_binding)) if o.nproc > 1 else (sys.executable,)

    def script_alone(self, request: ProofRequest, count: int) -> tuple[PlainProcess, ...]:
        """The script as written, `count` plain processes (the first failure ends them), for the
        harness's level where no proof timed it; none where a plain process cannot count the step."""
        if self.target.module or self._uncountable(request.step):
            return ()
        a_cmd = self._script_command()
        settings, added = self._stopwatch(request)
        processes: list[PlainProcess] = []
        for k in range(1, count + 1):
            self.say(f"the harness's level: the script as written, plain process {k} of {count}")
            p = self._run("script", k, a_cmd, dict(settings), added, processes)
            processes.append(p)
            if p.failure is not None or p.mean_step_us is None:
                break
        return tuple(processes)

    def _cannot(self, request: ProofRequest) -> str | None:
        """Why no proof can be made of this recommendation, or None."""
        if self.target.module:
            return "the script runs as a module (-m): the proof runs scripts by their path"
        if not request.diff:
            return "the kept change has no call site in your files (a snippet to add), so no diff to run"
        return self._uncountable(request.step)

    @staticmethod
    def _uncountable(step: StepFound | None) -> str | None:
        """Why a plain process cannot count this step, or None."""
        if step is None or step.source not in COUNTABLE:
            what = "no step was found" if step is None else f"the step is {step.description}"
            return f"{what}: a plain process counts optimizer steps, top-level module calls or DataLoader batches"
        return None

    def _stopwatch(self, request: ProofRequest) -> tuple[dict[str, object], dict[str, str]]:
        """The stopwatch's settings (the step the harness's baseline counted, the warm-up and timed span
        the options ask), and what it adds to the user's environment."""
        step = request.step
        assert step is not None
        o = self.options
        settings = {"source": step.source, "module": step.module, "warmup": o.warmup, "warmup_s": o.warmup_s,
                    "steps": o.steps, "steps_s": o.steps_s, "window_s": max(o.steps_s / WINDOWS, 0.05)}  # fmt: skip
        if o.nproc > 1:
            settings.update(lockstep_steps(o, request.step_us))
        boot = write_stopwatch(self.out, Path(stopwatch.__file__).read_text(encoding="utf-8")).resolve()
        path = os.pathsep.join(p for p in (str(boot), self.env.get("PYTHONPATH", "")) if p)
        return settings, {"PYTHONPATH": path, stopwatch.ENV: json.dumps(settings)}

    def _pairs(
        self,
        request: ProofRequest,
        known: Stated,
        a_cmd: tuple[str, ...],
        b_cmd: tuple[str, ...],
        copy: str,
    ) -> Proof:
        settings, added = self._stopwatch(request)
        stated = replace(known, patched_command=b_cmd, env=tuple(added.items()), copy=copy)
        processes: list[PlainProcess] = []
        pairs: list[ProofPair] = []
        deadline = None if request.seconds_left is None else self.clock() + request.seconds_left
        target = self.options.proof_half_width
        for k in range(1, MAX_PAIRS + 1):
            if pairs and (enough(pairs, target) or not self._fits(processes, pairs, deadline)):
                break
            order = ("script", "patched") if k % 2 else ("patched", "script")  # A B, B A, …
            means: dict[str, float] = {}
            for side in order:
                self.say(
                    f"proof: pair {k} — {'the patched copy' if side == 'patched' else 'the script as written'}"
                )
                cmd = b_cmd if side == "patched" else a_cmd
                p = self._run(side, k, cmd, dict(settings), added, processes)
                processes.append(p)
                if p.failure is not None or p.mean_step_us is None:
                    return self._failed(stated, p, processes, pairs)
                means[side] = p.mean_step_us
            pairs.append(ProofPair(means["script"], means["patched"], patched_first=order[0] == "patched"))
        if len(pairs) < MIN_PAIRS:
            why = (
                f"the time budget ran out after {len(pairs)} of the {MIN_PAIRS} pairs a proof needs at least"
            )
            return stated.proof("not made", None, why, processes, pairs)
        c = compare(pairs)
        recommended, reason = timed_reason(c)
        return stated.proof(c.verdict, recommended, reason, processes, pairs, c, target)

    def _fits(self, processes: list[PlainProcess], pairs: list[ProofPair], deadline: float | None) -> bool:
        """Another pair fits the budget (the first MIN_PAIRS are run in any case: the reserve kept them)."""
        if len(pairs) < MIN_PAIRS or deadline is None:
            return True
        return self.clock() + 2 * max(p.wall_s for p in processes) <= deadline

    def _run(
        self,
        side: str,
        k: int,
        cmd: tuple[str, ...],
        settings: dict[str, object],
        added: dict[str, str],
        before: list[PlainProcess],
    ) -> PlainProcess:
        result, log = proof_files(self.out, f"{side}-{k}")
        settings["out"] = str(result.resolve())  # the script may change its folder
        env = {**self.env, **added, stopwatch.ENV: json.dumps(settings)}
        # each side's first process gets the rounds' limit (the patched copy may compile), the next ones
        # a few times the longest of their side
        limit = self.options.child_timeout_s
        own = [p.wall_s for p in before if p.side == side]
        if own:
            limit = min(limit, max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * max(own)))
        if self.options.nproc > 1:
            env = group_env(env)
            run = run_plain(
                cmd, env=env, cwd=str(self.cwd), result=rank_path(result, 0), log=log, timeout_s=limit
            )
            run = slowest_rank(run, result, self.options.nproc, log)
            return plain_process(side, run, str(log), self.options)
        clocks = None if self._no_clocks else child_clocks(env)
        self._no_clocks = clocks is None
        with clocks or contextlib.nullcontext():
            run = run_plain(cmd, env=env, cwd=str(self.cwd), result=result, log=log, timeout_s=limit)
            ended = time.monotonic()
        return plain_process(side, run, str(log), self.options, timed_clocks(clocks, run.result, ended))

    def _failed(
        self, stated: Stated, p: PlainProcess, processes: list[PlainProcess], pairs: list[ProofPair]
    ) -> Proof:
        if p.side == "patched":
            why = f"the patched script did not run as you run it: {p.failure} (its output: {p.log})"
            return stated.proof("does not run", False, why, processes, pairs)
        why = f"the script as written did not run as a plain process: {p.failure} (its output: {p.log})"
        return stated.proof("not made", None, why, processes, pairs)


def lockstep_steps(o: FixOptions, step_us: float | None) -> dict[str, object]:
    """The stopwatch's settings for ranks: a number of steps, the same on every rank, for the warm-up
    and the timed span the options ask in seconds (at the harness's baseline pace)."""
    per_s = 1e6 / step_us if step_us else 0.0
    return {
        "ranks": True,
        "warmup": o.warmup + math.ceil(o.warmup_s * per_s),
        "steps": max(o.steps, math.ceil(o.steps_s * per_s)),
    }


def slowest_rank(run: ChildRun, result: Path, nproc: int, log: Path) -> ChildRun:
    """A group's plain process as its slowest rank's (the step every rank pays); where a rank failed
    or wrote nothing, the group's failure in one line."""
    docs = [read_result(rank_path(result, r))[0] for r in range(nproc)]
    if run.exit_code and not run.timed_out:
        cause = root_cause(log_tail(log, 16_000))
        return replace(
            run, result=None, error=str(cause) if cause else f"torchrun exit status {run.exit_code}"
        )
    if any(d is None for d in docs):
        missing = next(r for r, d in enumerate(docs) if d is None)
        return replace(run, result=None, error=run.error or f"rank {missing} wrote no result")
    timed = [d for d in docs if d and isinstance(d.get("mean_step_us"), (int, float))]
    if len(timed) < nproc:
        return replace(run, result=next(d for d in docs if d not in timed))
    return replace(run, result=max(timed, key=lambda d: float(d["mean_step_us"])))


def timed_clocks(
    clocks: ChildClocks | None, result: dict[str, Any] | None, ended: float
) -> ProcessClocks | None:
    """The GPU's clocks and the host over a plain process's timed windows (`result`: what its timer
    wrote, windows of seconds and steps): the seconds they took, up to the timer's last reading
    (`monotonic`: system-wide; else `ended`, when the process was seen to end)."""
    if clocks is None or not result:
        return None
    timed_s = sum(float(w[0]) for w in result.get("windows") or [])
    timed_s += sum(float(w[0]) for w in result.get("set_aside") or [])
    if timed_s <= 0:
        return None
    end = float(result.get("monotonic") or ended)
    r = clocks.between(end - timed_s, end)
    h = clocks.host_between(end - timed_s, end)
    if r is None and h is None:
        return None
    return ProcessClocks(
        samples=r.samples if r else 0,
        sm_mean_mhz=r.sm_mean_mhz if r else None,
        sm_min_mhz=r.sm_min_mhz if r else None,
        sm_max_mhz=r.sm_max_mhz if r else None,
        slowdowns=tuple(sorted(r.slowdown_shares.items())) if r else (),
        temp_max_c=r.temp_max_c if r else None,
        power_mean_w=r.power_mean_w if r else None,
        host_samples=h.samples if h else 0,
        others_cores=h.others_cores if h else None,
        steal_cores=h.steal_cores if h else None,
        probe_us=h.probe_us if h else None,
    )


def plain_process(
    side: str, run: ChildRun, log: str, o: FixOptions, clocks: ProcessClocks | None = None
) -> PlainProcess:
    """What one plain process measured, or why it measured nothing, in one line."""
    doc = run.result or {}
    mean = doc.get("mean_step_us")
    failure = None
    if doc.get("error"):
        failure = f"the stopwatch could not count its steps ({doc['error']})"
    elif run.timed_out:
        failure = f"{run.error} before its steps were timed ({doc.get('steps_seen', 'no')} steps)"
    elif doc.get("outcome") == "ended":
        failure = (
            f"the script ended (exit status {run.exit_code}) after {doc.get('steps_seen', 0)} steps, before "
            f"its steps were timed (a process warms up {o.warmup} steps and {o.warmup_s:g} s, then times "
            f"{o.steps} steps and {o.steps_s:g} s){_last_line(run.log_tail)}"
        )
    elif not isinstance(mean, (int, float)) or mean <= 0:
        failure = f"{run.error or 'no step timed'}{_last_line(run.log_tail)}"
    windows = doc.get("windows") or []
    return PlainProcess(
        side=side,
        mean_step_us=float(mean) if failure is None and isinstance(mean, (int, float)) else None,
        steps_timed=int(sum(w[1] for w in windows)),
        set_aside=len(doc.get("set_aside") or []),
        warmup_steps=int(doc.get("warmup_steps") or 0),
        wall_s=run.wall_s,
        exit_code=run.exit_code,
        failure=failure,
        log=log,
        clocks=clocks,
    )


def _last_line(tail: str) -> str:
    last = (tail.strip().splitlines() or [""])[-1].strip()
    return f": {' '.join(last.split())[:200]}" if last else ""


@dataclass(frozen=True)
class Stated:
    """What every proof states, timed or not: the commands, folder, environment, cores, and when it
    began."""

    script_command: tuple[str, ...]
    cwd: str
    t0: float
    clock: Callable[[], float]
    step: StepFound | None
    patched_command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    copy: str | None = None

    def proof(
        self,
        verdict: str,
        recommended: bool | None,
        reason: str,
        processes: Sequence[PlainProcess] = (),
        pairs: Sequence[ProofPair] = (),
        c: PairedComparison | None = None,
        target: float = TARGET_HALF_WIDTH,
    ) -> Proof:
        means = {s: [p.mean_step_us for p in processes if p.side == s and p.mean_step_us] for s in SIDES}
        return Proof(
            verdict=verdict,
            recommended=recommended,
            reason=reason,
            speedup=None if c is None else 1 / c.ratio,
            speedup_low=None if c is None else 1 / c.ci_high,
            speedup_high=None if c is None else 1 / c.ci_low,
            p_value=None if c is None else c.p_value,
            script_us=statistics.fmean(means["script"]) if means["script"] else None,
            patched_us=statistics.fmean(means["patched"]) if means["patched"] else None,
            pairs=tuple(pairs),
            processes=tuple(processes),
            test=None if c is None else c.test,
            half_width_pct=None if c is None else 100 * half_width(c),
            target_half_width_pct=100 * target,
            step=None if self.step is None else self.step.description,
            script_command=self.script_command,
            patched_command=self.patched_command,
            cwd=self.cwd,
            env=dict(self.env),
            copy=self.copy,
            cores=tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else (),
            elapsed_s=self.clock() - self.t0,
            clocks=clocks_note(processes),
        )
