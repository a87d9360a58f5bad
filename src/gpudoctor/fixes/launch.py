"""`SubprocessLauncher`: each round of `gpudoctor fix` as `python -m gpudoctor.fixes.child` in a fresh
process through the runner's child protocol (`runner.child`), in the current folder, its output in
`<rounds>/<label>.log`, its result read back from `<rounds>/<label>.json`. A child that runs past the
time limit, dies, or writes nothing is a `RoundResult` saying so, never an exception."""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpudoctor.fixes.ranks import (
    FAILED,
    failure_line,
    group_env,
    merge_rounds,
    rank_path,
    root_cause,
    torchrun,
)
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions
from gpudoctor.runner.child import child_env, log_tail, run_child, run_plain
from gpudoctor.runner.rundir import round_files, write_child_result
from gpudoctor.util.errors import GpudoctorError


class SubprocessLauncher:
    def __init__(
        self,
        target: str,
        args: list[str],
        *,
        module: bool,
        options: FixOptions,
        rounds_dir: Path,
        extra: tuple[str, ...] = (),  # more child options (tests: --compile-backend eager)
    ) -> None:
        self.target, self.args, self.module = target, args, module
        self.options, self.rounds_dir, self.extra = options, rounds_dir, extra

    def command(
        self,
        out: Path,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> list[str]:
        o = self.options
        blocks = ["--switch", ",".join(switch), "--pairs", str(o.blocks), "--block-s", str(o.block_s),
                  *(["--extend-pairs", str(extend)] if extend else [])]  # fmt: skip
        return [
            sys.executable, "-m", "gpudoctor.fixes.child", "--fixes", ",".join(fixes), "--out", str(out),
            "--warmup", str(o.warmup), "--steps", str(o.steps), "--record", str(o.record), "--seed", str(o.seed),
            "--warmup-s", str(o.warmup_s), "--steps-s", str(o.steps_s),
            *(["-m"] if self.module else []), *(["--exact-random"] if exact_random else []),
            *(blocks if switch else []), *self.extra, "--", self.target, *self.args,
        ]  # fmt: skip

    def __call__(
        self,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult:
        out, log = round_files(self.rounds_dir, label)
        argv = self.command(out, fixes, exact_random, switch, extend)[
            3:
        ]  # after `python -m gpudoctor.fixes.child`
        run = run_child(
            "gpudoctor.fixes.child", argv, result=out, log=log, timeout_s=self.options.child_timeout_s
        )
        if run.timed_out:
            return self._timed_out(fixes, run.log_tail, exact_random)
        result = read_round(out, log, run.exit_code or 0, fixes, exact_random)
        return replace(result, leftover_processes=run.leftover) if run.leftover else result

    def _timed_out(self, fixes: tuple[str, ...], tail: str, exact_random: bool) -> RoundResult:
        return RoundResult(fixes, "timeout", 124, error=f"ran past {self.options.child_timeout_s:.0f} s",
                           log_tail=tail, exact_random=exact_random)  # fmt: skip


def read_round(out: Path, log: Path, code: int, fixes: tuple[str, ...], exact_random: bool) -> RoundResult:
    """The result a round's process wrote (or why there is none), with the end of its output."""
    tail = log_tail(log)
    if not out.exists():
        return RoundResult(fixes, "crashed", code, error=f"exit status {code}, no result written",
                           log_tail=tail, exact_random=exact_random)  # fmt: skip
    try:
        result = RoundResult.from_json(json.loads(out.read_text()))
    except (ValueError, TypeError, KeyError, GpudoctorError) as err:
        return RoundResult(fixes, "crashed", code, error=f"unreadable result: {err}", log_tail=tail)
    return _with_tail(result, tail)


def _with_tail(result: RoundResult, tail: str) -> RoundResult:
    return replace(result, log_tail=tail)


class TorchrunLauncher(SubprocessLauncher):
    """Each round as a torchrun group of `nproc` ranks on this node, every rank with the same fixes
    (`fixes.ranks`); the group's result written where a single round's would be. An A/B in blocks runs
    on every rank in one order (one seed for the group), the steps of a block as rank 0 calibrated them
    (`timing.blocks`, agreed through torchrun's store): every rank switches at the same step."""

    def __init__(self, target: str, args: list[str], *, nproc: int, **kw: Any) -> None:
        super().__init__(target, args, **kw)
        self.nproc = nproc

    def __call__(
        self,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult:
        out, log = round_files(self.rounds_dir, label)
        for r in range(self.nproc):
            rank_path(out, r).unlink(missing_ok=True)
        child = self.command(out, fixes, exact_random, switch)[1:]  # `-m gpudoctor.fixes.child …`
        if switch:  # the blocks' orders, one for every rank (no pairs added: ranks could not agree on it)
            at = child.index("--")
            child[at:at] = ["--order-seed", str(secrets.randbits(31))]
        run = run_plain([*torchrun(self.nproc, self.options.numa_binding), *child], env=group_env(child_env()), cwd=os.getcwd(),
                        result=rank_path(out, 0), log=log, timeout_s=self.options.child_timeout_s)  # fmt: skip
        if run.timed_out:
            return self._timed_out(fixes, run.log_tail, exact_random)
        ranks = [
            read_round(rank_path(out, r), log, run.exit_code or 0, fixes, exact_random)
            if rank_path(out, r).exists()
            else None
            for r in range(self.nproc)
        ]
        result = merge_rounds(ranks, fixes)
        result = replace(result, leftover_processes=result.leftover_processes + run.leftover)
        cause = root_cause(log_tail(log, 16_000)) if run.exit_code else None
        if cause is not None:  # a rank failed: torchrun ended the group
            outcome = result.outcome if result.outcome in FAILED else "crashed"
            error = failure_line(cause, ranks)
            result = replace(
                result, outcome=outcome, exit_code=run.exit_code or 1, error=error, step_times_us=()
            )
        write_child_result(out, result.to_json())
        return result
