"""`run_fix`: the whole of `gpudoctor fix` below the command line — the diagnosis (the doctor run on the
script in a fresh process, a run directory, or none), then the A/B session in child processes, then the
proof of its recommendation in plain processes — returning the `FixReport`.
Writes only under `out` (the diagnosis run, the rounds' results and logs, copies of the user's files); what
the script itself writes is watched and the user's files it changed are put back (`runner.userfiles`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from gpudoctor.fixes.aa import BLOCK_PAIRS_FACTOR, AAReport, run_aa
from gpudoctor.fixes.diagnose import RunInputs, diagnose_ranks, diagnose_script, load_run
from gpudoctor.fixes.forkserver import ForkLauncher, start_launcher
from gpudoctor.fixes.launch import SubprocessLauncher, TorchrunLauncher
from gpudoctor.fixes.options import Launcher
from gpudoctor.fixes.prove import PlainProver, Target
from gpudoctor.fixes.result import FixReport
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions, FixSession, Progress
from gpudoctor.runner import rundir
from gpudoctor.runner.userfiles import UserFiles, WrittenFiles

DIAGNOSE_STEPS = (3, 10, 3)  # warm-up, light and traced steps of the diagnosis run


@dataclass(frozen=True)
class FixTarget:
    target: str
    args: tuple[str, ...]
    module: bool = False


def run_fix(
    script: FixTarget,
    out: Path,
    options: FixOptions,
    *,
    inputs: RunInputs | None = None,
    diagnose: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    on_update: Callable[[FixReport], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
    child_extra: tuple[str, ...] = (),
    protect: bool = True,
    on_warning: Callable[[str], None] | None = None,
) -> FixReport:
    """Diagnose (unless `inputs` are given or `diagnose` is off), then verify the fixes. With `protect`,
    the user's files are copied before the first process and the ones the script changed put back after
    the last, also when it is interrupted or fails (`runner.userfiles`); `on_warning` hears, before the
    first process, of files past what is copied."""
    files = _protect(script, out, protect, on_stage, on_warning)
    written: WrittenFiles | None = None
    try:
        report = _run_fix(script, out, options, inputs=inputs, diagnose=diagnose, on_progress=on_progress,
                          on_update=on_update, on_stage=on_stage, child_extra=child_extra)  # fmt: skip
    finally:
        if files is not None:
            written = files.finish()  # every process of the script has ended: rounds, server, diagnosis
    return replace(report, user_files=written) if written is not None else report


def _protect(
    script: FixTarget,
    out: Path,
    protect: bool,
    on_stage: Callable[[str], None] | None,
    on_warning: Callable[[str], None] | None,
) -> UserFiles | None:
    if not protect:
        return None
    if on_stage:
        on_stage("copying the files here that the script may write")
    files = UserFiles.protect(None if script.module else script.target, out)
    warning = files.warning()
    if warning and on_warning:
        on_warning(warning)
    return files


def _run_fix(
    script: FixTarget,
    out: Path,
    options: FixOptions,
    *,
    inputs: RunInputs | None,
    diagnose: bool,
    on_progress: Callable[[Progress], None] | None,
    on_update: Callable[[FixReport], None] | None,
    on_stage: Callable[[str], None] | None,
    child_extra: tuple[str, ...],
) -> FixReport:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    notes: list[str] = []
    if options.nproc > 1:  # every round a torchrun group: no fork server
        options = replace(options, fork=False)
    if inputs is None and diagnose:
        if on_stage:
            on_stage("diagnosing: the script under the doctor, with stacks")
        inputs = _diagnose(script, out / rundir.DIAGNOSIS_RUN, options)
    if inputs is not None and inputs.script_error is not None and inputs.diagnosis is None:
        # the script fails by itself: every round would fail alike, each running it once more
        return _failed_under_doctor(script, options, inputs, started, notes)
    if inputs is not None and inputs.note:
        notes.append(f"no diagnosis: {inputs.note}; fixes chosen from what the script does")
    if on_stage:
        on_stage("starting the rounds' processes")
    t0 = time.monotonic()
    launcher: Launcher
    if options.nproc > 1:
        launcher = TorchrunLauncher(script.target, list(script.args), module=script.module, options=options,
                                    rounds_dir=out / rundir.ROUNDS_DIR, extra=child_extra, nproc=options.nproc)  # fmt: skip
    else:
        launcher, how = start_launcher(script.target, list(script.args), module=script.module, options=options,
                                       rounds_dir=out / rundir.ROUNDS_DIR, extra=child_extra, fork=options.fork)  # fmt: skip
    if options.fork and not isinstance(launcher, ForkLauncher):
        notes.append(f"rounds: {how}")  # slower than asked (the options say fork)
    # a plain process imports what the server imported once before its rounds: the budget counts it
    start_s = time.monotonic() - t0 if isinstance(launcher, ForkLauncher) else 0.0
    prover = PlainProver(Target(script.target, script.args, script.module), options, out, start_s=start_s,
                         on_stage=on_stage)  # fmt: skip
    try:
        session = FixSession(launcher, options, inputs.diagnosis if inputs else None,
                             argv=(script.target, *script.args), started_at=started,
                             on_progress=on_progress, on_update=on_update, prover=prover)  # fmt: skip
        session.notes.extend(notes)
        if isinstance(launcher, ForkLauncher):
            launcher.on_gone = session.notes.append
        return session.run()
    finally:
        if isinstance(launcher, ForkLauncher):
            launcher.close()


def _diagnose(script: FixTarget, out: Path, options: FixOptions) -> RunInputs:
    """The doctor's run on the script: one process, or a group of `options.nproc` ranks."""
    w, light, traced = DIAGNOSE_STEPS
    if options.nproc > 1:
        return diagnose_ranks(script.target, list(script.args), nproc=options.nproc, module=script.module, out=out,
                              warmup=w, light_steps=light, steps=traced, timeout_s=options.child_timeout_s,
                              numa_binding=options.numa_binding)  # fmt: skip
    return diagnose_script(script.target, list(script.args), module=script.module, out=out, warmup=w,
                           light_steps=light, steps=traced, timeout_s=options.child_timeout_s)  # fmt: skip


def _failed_under_doctor(
    script: FixTarget, options: FixOptions, inputs: RunInputs, started: str, notes: list[str]
) -> FixReport:
    """The report of a session that starts no round: the script failed by itself in the diagnosis run."""

    def no_round(*_: object) -> RoundResult:
        raise AssertionError("no round is started for a script that fails by itself")

    session = FixSession(no_round, options, None, argv=(script.target, *script.args), started_at=started)
    where = f" (its output: {inputs.log})" if inputs.log else ""
    session.notes.extend(notes)
    session.notes.append(
        f"the baseline did not run: the script failed by itself under the doctor — {inputs.script_error}"
        f"{where}; every round would fail alike, so none was started: fix the script first"
    )
    session.complete = True
    return session.report()


def run_aa_fix(
    script: FixTarget,
    out: Path,
    options: FixOptions,
    *,
    on_stage: Callable[[str], None] | None = None,
    child_extra: tuple[str, ...] = (),
    protect: bool = True,
    on_warning: Callable[[str], None] | None = None,
    on_files: Callable[[WrittenFiles], None] | None = None,
) -> AAReport:
    """`gpudoctor fix --aa`: the script against itself (`fixes.aa`), its rounds under `out/rounds`; the
    user's files as in `run_fix` (`on_files` hears what the script wrote)."""
    files = _protect(script, out, protect, on_stage, on_warning)
    try:
        return _run_aa_fix(script, out, options, on_stage=on_stage, child_extra=child_extra)
    finally:
        if files is not None:
            written = files.finish()
            if on_files:
                on_files(written)


def _run_aa_fix(
    script: FixTarget,
    out: Path,
    options: FixOptions,
    *,
    on_stage: Callable[[str], None] | None,
    child_extra: tuple[str, ...],
) -> AAReport:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    recorded = replace(options, blocks=options.blocks * BLOCK_PAIRS_FACTOR)  # resampled in the session's size
    rounds = out / rundir.ROUNDS_DIR
    launcher: Launcher
    plain: Launcher | None
    if options.nproc > 1:
        # every round a fresh torchrun group already, as a fix's: no fork server, no other processes to
        # set beside them (plain groups of the script are the proof's, after a fix is kept)
        launcher = TorchrunLauncher(script.target, list(script.args), module=script.module, options=recorded,
                                    rounds_dir=rounds, extra=child_extra, nproc=options.nproc)  # fmt: skip
        how, plain = f"torchrun groups of {options.nproc} ranks, each its slowest rank's", None
    else:
        launcher, how = start_launcher(script.target, list(script.args), module=script.module, options=recorded,
                                       rounds_dir=rounds, extra=child_extra, fork=options.fork)  # fmt: skip
        plain = SubprocessLauncher(script.target, list(script.args), module=script.module, options=recorded,
                                   rounds_dir=rounds, extra=child_extra)  # fmt: skip
    try:
        report = run_aa(launcher, plain, options, argv=(script.target, *script.args), started_at=started,
                        how=how, clock=time.monotonic, on_stage=on_stage)  # fmt: skip
    finally:
        if isinstance(launcher, ForkLauncher):
            launcher.close()
    if plain is None:
        why = "each round is a fresh torchrun group; a kept fix's proof times plain groups of the script"
        report = replace(report, notes=(*report.notes, f"plain processes: not timed here ({why})"))
    return report


def load_from_run(run_dir: Path) -> tuple[FixTarget, RunInputs]:
    """The script and diagnosis of a `gpudoctor run` directory (`gpudoctor fix --from RUN_DIR`)."""
    from gpudoctor.util.errors import UsageError

    inputs = load_run(run_dir)
    if not inputs.argv:
        raise UsageError(f"{run_dir}/{rundir.RECORD_FILE} names no script")
    target, *args = inputs.argv
    module = not target.endswith(".py") and not Path(target).is_file()
    if not module and not Path(target).is_file():
        raise UsageError(
            f"the run's script {target} is not here: run gpudoctor fix from the folder the run was made in"
        )
    return FixTarget(target, tuple(args), module), inputs
