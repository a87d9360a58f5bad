"""The doctor's diagnosis for `gpudoctor fix`: `doctor.run_and_diagnose` (stacks on, no NVML) on the
script in a fresh process through the runner's child protocol (`runner.child` running
`gpudoctor.doctor.diagnosis_process`: its own process group, a time limit, what it leaves running ended), so that
nothing it loads stays in this one; or a run directory already made, read back as the doctor's
`RunReport`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gpudoctor.doctor.diagnosis_process import EXITED, ChildDiagnosis, child_argv
from gpudoctor.doctor.report import RunReport
from gpudoctor.fixes.ranks import group_env, root_cause, torchrun
from gpudoctor.fixes.round import said
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner import rundir
from gpudoctor.runner.child import child_env, log_tail, run_child, run_plain
from gpudoctor.runner.phases import LiveOptions
from gpudoctor.runner.torchrun import torchrun_argv
from gpudoctor.util.errors import UsageError


@dataclass(frozen=True)
class RunInputs:
    diagnosis: Diagnosis | None
    argv: tuple[str, ...]  # the script's command line, as the run recorded it
    note: str | None = None  # why there is no diagnosis
    # the script failed under the doctor (its exception, after how many steps): every round would too
    script_error: str | None = None
    log: Path | None = None  # the diagnosis run's output


def diagnose_script(
    target: str,
    args: list[str],
    *,
    module: bool,
    out: Path,
    warmup: int,
    light_steps: int,
    steps: int,
    timeout_s: float,
) -> RunInputs:
    """The doctor run on the script into `out` (its output in `out`.log), in a child process."""
    result, log = rundir.diagnosis_files(out)
    command = [target, *args]
    argv = child_argv(
        out, result, module=module, warmup=warmup, light_steps=light_steps, steps=steps, command=command
    )
    run = run_child("gpudoctor.doctor.diagnosis_process", argv, result=result, log=log, timeout_s=timeout_s)
    if run.timed_out:
        return RunInputs(None, tuple(command), f"the diagnosis run ran past {timeout_s:.0f} s")
    if run.result is None:
        tail = run.log_tail.strip().splitlines()[-1:]
        why = f"the diagnosis run wrote no result ({run.error})"
        return RunInputs(None, tuple(command), why + (f" ({tail[0][:200]})" if tail else ""))
    child = ChildDiagnosis.from_json(run.result)
    if child.script_error is not None and child.script_error.startswith(EXITED):
        child = replace(child, script_error=child.script_error + said(run.log_tail))  # what it said last
    if child.diagnosis is None:
        tail = run.log_tail.strip().splitlines()[-1:]
        note = child.note or "no diagnosis"
        return RunInputs(None, tuple(command), note + (f" ({tail[0][:200]})" if tail else ""),
                         child.script_error, log)  # fmt: skip
    return RunInputs(child.diagnosis, tuple(command), script_error=child.script_error, log=log)


def load_run(run_dir: Path) -> RunInputs:
    """The diagnosis and command line of a `gpudoctor run` directory (of one process, or of ranks:
    `rank-K/` beside the ranks' combined analysis)."""
    first_rank = rundir.rank_dir(run_dir, 0)
    if (
        run_dir.is_dir()
        and rundir.read_record(run_dir) is None
        and rundir.read_record(first_rank) is not None
    ):
        record = rundir.read_record(first_rank)
        argv = tuple(record.argv) if record is not None else ()
        if not (run_dir / rundir.ANALYSIS_FILE).exists():
            return RunInputs(None, argv, f"{run_dir} has no analysis.json (no rank traced its steps)")
        return _ranks_inputs(RunReport.load(run_dir), argv, None)
    if not run_dir.is_dir() or rundir.read_record(run_dir) is None:
        raise UsageError(f"{run_dir} is not a gpudoctor run directory (no record.json)")
    report = RunReport.load(run_dir)
    argv = report.record.argv if report.record else ()
    if report.diagnosis is None:
        return RunInputs(None, argv, f"{run_dir} has no analysis.json (the run traced no steps)")
    return RunInputs(report.diagnosis, argv)


def diagnose_ranks(
    target: str,
    args: list[str],
    *,
    nproc: int,
    module: bool,
    out: Path,
    warmup: int,
    light_steps: int,
    steps: int,
    timeout_s: float,
    numa_binding: str | None = None,
) -> RunInputs:
    """The doctor run on the script as `nproc` ranks (`torchrun … -m gpudoctor run`, stacks on, no NVML)
    into `out`; the diagnosis of the rank that paces the others, with what is found of the ranks
    together (a straggler, uneven work, exposed communication)."""
    command = [target, *args]
    options = LiveOptions(warmup=warmup, warmup_seconds=0.5, light_steps=light_steps, light_seconds=1.0,
                          steps=steps, with_stack=True, nvml=False)  # fmt: skip
    log = out.with_name(out.name + ".log")
    argv = [*torchrun(nproc, numa_binding), *torchrun_argv(nproc, out, options, module, command)[6:]]
    run = run_plain(argv, env=group_env(child_env()), cwd=str(Path.cwd()), result=out / rundir.ANALYSIS_FILE,
                    log=log, timeout_s=timeout_s)  # fmt: skip
    if run.timed_out:
        return RunInputs(None, tuple(command), f"the diagnosis run ran past {timeout_s:.0f} s", log=log)
    if run.exit_code:
        failed = f"the script failed under the doctor: {_rank_failure(out, nproc, log)}"
        return RunInputs(None, tuple(command), failed, failed, log)
    if not (out / rundir.ANALYSIS_FILE).exists():
        return RunInputs(None, tuple(command), f"the ranks' diagnosis run wrote no analysis{said(run.log_tail)}",
                         log=log)  # fmt: skip
    return _ranks_inputs(RunReport.load(out), tuple(command), log)


def _ranks_inputs(report: RunReport, argv: tuple[str, ...], log: Path | None) -> RunInputs:
    """The diagnosis of the rank that paces the others, with what is found of the ranks together."""
    if report.ranks is None:
        return RunInputs(report.diagnosis, argv, log=log)
    slowest = report.ranks.across.overview.slowest
    own = report.ranks.reports.get(slowest.rank) if slowest else None
    paced = own[1] if own is not None else report.diagnosis
    together = report.ranks.diagnosis.findings
    if paced is None:
        return RunInputs(report.ranks.diagnosis, argv, log=log)
    return RunInputs(replace(paced, findings=(*paced.findings, *together)), argv, log=log)


def _rank_failure(out: Path, nproc: int, log: Path) -> str:
    """Which rank failed first and how (torchrun's summary), with its script's exception where it
    raised one, in one line."""
    cause = root_cause(log_tail(log, 16_000))
    for r in range(nproc):
        record = rundir.read_record(rundir.rank_dir(out, r))
        if record is not None and record.error and (cause is None or cause.rank == r):
            return f"{cause or f'rank {r}'}: {record.error}"
    return str(cause) if cause else f"a rank failed{said(log_tail(log))}"
