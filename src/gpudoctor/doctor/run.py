"""`run_and_diagnose`: an unmodified script run in this process under capture (`runner.capture`: its
steps timed without the profiler, a few traced), its run directory written as it goes
(`runner.livedir`), then its trace analyzed with the profiler's distortion taken out (the light phase's
step time), its memory analyzed, and the results saved (analysis.json, observer.json, memory.json) — a
`RunReport`. A script that ends before anything was traced runs a second time, traced to fit what it
did, unless told not to; as one rank of several, the rank that finishes last combines every rank's."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.doctor.memory import findings_of, memory_document, memory_of_run
from gpudoctor.doctor.observer import observer_effect, unprofiled_step_us
from gpudoctor.doctor.pipeline import AnalyzeOptions, diagnose_loaded
from gpudoctor.doctor.report import RunReport
from gpudoctor.runner import rundir
from gpudoctor.runner.capture import LiveCapture
from gpudoctor.runner.compile_time import CompileTime
from gpudoctor.runner.launch import ScriptEnd, check_runnable, print_script_traceback, run_script
from gpudoctor.runner.phases import LiveOptions, fitted_options
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.errors import GpudoctorError

if TYPE_CHECKING:
    from gpudoctor.runner.ranks import RankRun

RUNS_DIR = Path("gpudoctor-runs")
Note = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    """How a script is run: as a module (`-m`), into which run directory (default
    gpudoctor-runs/<name>-<UTC time>), with which phases, and whether a script that ends before its trace
    runs a second time, traced to fit."""

    live: LiveOptions = field(default_factory=LiveOptions)
    module: bool = False
    out: Path | None = None
    rerun: bool = True


def default_out(target: str, kind: str = "") -> Path:
    name = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    return RUNS_DIR / f"{name}{kind}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def run_and_diagnose(
    script: str, argv: Sequence[str] = (), options: RunOptions | None = None, *, on_note: Note | None = None
) -> RunReport:
    """Run `script argv…` as `python script argv…` would, under capture; its report. `on_note` hears what
    happens as it happens (a second run, before it starts). The script's own traceback, if it raised, is
    printed as Python prints it; its exit status is the record's."""
    options = options or RunOptions()
    note = on_note or (lambda _: None)
    args = list(argv)
    check_runnable(script, module=options.module)  # a missing script: one line, before anything is made
    out = options.out or default_out(script)
    from gpudoctor.runner.ranks import RankRun

    started = now_utc()
    rank = RankRun.start(out, [script, *args], started, dict(vars(options.live)))  # one of several ranks?
    if rank is not None:
        return _as_rank(rank, script, args, options, note)
    record, error, signum = capture_script(script, args, module=options.module, out=out, options=options.live)
    again = (
        None
        if error is not None or options.live.light_only or signum
        else fitted_options(record, options.live)
    )
    if again is not None and not options.rerun:
        note(
            f"the script ended after {record.steps_seen} steps, before anything was traced (--no-rerun: not run again)"
        )
    elif again is not None:
        note(rerun_note(record, again))
        record, error, signum = _second_run(record, script, args, out, options.module, again)
    if error is not None:
        print_script_traceback(error)
    if signum is not None:  # asked to stop: keep what was measured, analyze it later
        return RunReport(record=record, run_dir=str(out))
    return diagnose_run(out, record)


def rerun_note(record: RunRecord, again: LiveOptions) -> str:
    how = (
        "traced from start to end"
        if again.trace_all
        else f"with its phases fitted to {record.steps_seen} steps"
    )
    return (
        f"the script ended after {record.steps_seen} steps, before anything was traced: running it once "
        f"more, {how} — its output and side effects happen again (--no-rerun: not)"
    )


def _second_run(
    first: RunRecord, script: str, args: list[str], out: Path, module: bool, again: LiveOptions
) -> tuple[RunRecord, BaseException | None, int | None]:
    # The first run's objects (its model, its tensors on the GPU) live on in reference cycles (the
    # script's functions hold its globals): collect them, or the second run's memory counts them.
    gc.collect()
    record, error, signum = capture_script(script, args, module=module, out=out, options=again)
    record = replace(
        record, notes=(*record.notes, f"second run: the first ended after {first.steps_seen} steps")
    )
    if record.light is None and first.light is not None:
        record = replace(record, light=first.light)
    rundir.write_record(out, record)
    return record, error, signum


def _as_rank(rank: RankRun, script: str, args: list[str], options: RunOptions, note: Note) -> RunReport:
    """One rank of several: its capture into rank-K/; the rank elected combines them all."""
    from gpudoctor.doctor.combine import combine_ranks

    record, error, _ = capture_script(
        script, args, module=options.module, out=rank.dir, options=options.live, rank=rank
    )
    rundir.write_record(rank.dir, record)
    if error is not None:
        print_script_traceback(error)
    try:
        elected = rank.finish()
        combined = combine_ranks(rank.out, note) if elected else None
        if not elected:
            note(f"rank {rank.env.rank}: {rank.dir}")
    finally:
        rank.close()
    if combined is not None:
        return replace(combined, record=record, rank=rank.env.rank)
    return RunReport(record=record, run_dir=str(rank.dir), rank=rank.env.rank)


def capture_script(
    target: str,
    args: list[str],
    *,
    module: bool,
    out: Path,
    options: LiveOptions,
    rank: RankRun | None = None,
) -> tuple[RunRecord, BaseException | None, int | None]:
    """One run of the script under capture; its record (written as the run goes, by `RunDir`), the
    exception it ended with, and the signal that stopped it, if one did."""
    from gpudoctor.runner.livedir import RunDir

    started = now_utc()
    argv = [target, *args]
    live = None if rank is not None else RunDir(out, argv, started, dict(vars(options))).open()
    on_phase = rank.on_phase if rank is not None else None
    # one process: a recompilation inside the light phase (a compiled model meeting an epoch's last,
    # smaller batch) starts the phase again; under ranks the phases go by agreed step counts
    compiling = CompileTime().install() if rank is None else None
    disturbed = compiling.seconds if compiling is not None and compiling.available else None
    files = script_files(target, module)
    capture = LiveCapture(out, options, files, on_phase=on_phase, disturbed=disturbed).install()
    if live is not None:
        live.watch(capture.result)
        capture.on_change = live.update
    try:
        end = run_script(target, args, module=module)
    finally:
        if rank is not None:  # torchrun's SIGTERM from here on must not cut the writing of results short
            rank.script_ended = True
        capture.uninstall()  # also on Ctrl-C in our own code: no hook or profiler stays behind
        if compiling is not None:
            compiling.uninstall()
    if end.outcome == "stopped":  # stopped at a step boundary: end its process group as its end would
        from gpudoctor.runner.ranks import end_process_group

        group_note = end_process_group()
        if group_note is not None:
            capture.notes.append(group_note)
    record = record_of(capture, end, argv, started, options)
    if live is not None:
        record = live.finish(record)
        return record, end.error, live.signum
    return record, end.error, None


def diagnose_run(out: Path, record: RunRecord) -> RunReport:
    """A finished run's trace and memory analyzed, saved beside its record; its report."""
    notes: list[str] = []
    memory, why = memory_of_run(out, record)
    if why:
        notes.append(why)
    memory_findings = findings_of(memory) if memory is not None else ()
    if memory is not None:
        rundir.write_memory(out, memory_document(memory, memory_findings))
    report = RunReport(record=record, memory=memory, memory_findings=memory_findings, run_dir=str(out))
    if not record.trace_files:
        return replace(report, notes=tuple(notes))
    from gpudoctor.analysis.timeline_view import step_timeline
    from gpudoctor.trace import load_trace

    trace_path = out / record.trace_files[0]
    try:
        trace = load_trace(trace_path)
        # the module view as deep as the run labelled the modules (its --module-depth)
        depth = (record.options or {}).get("module_depth")
        deep = {"module_depth": depth} if isinstance(depth, int) and depth >= 1 else {}
        analysis, diagnosis = diagnose_loaded(
            trace, AnalyzeOptions(unprofiled_us=unprofiled_step_us(record), **deep), memory=memory
        )
    except GpudoctorError as err:
        return replace(report, notes=(*notes, f"the trace could not be analyzed: {err}"))
    report = replace(
        report,
        analysis=analysis,
        diagnosis=diagnosis,
        observer=observer_effect(analysis, record),
        timeline=step_timeline(trace, analysis.selected_step),
        trace_path=str(trace_path),
        notes=tuple(notes),
    )
    report.save(out)
    return report


def script_files(target: str, module: bool) -> tuple[str, ...]:
    """The files that are the user's script, whatever folder they are in (for the loop watcher)."""
    if not module:
        return (str(Path(target).resolve()),)
    import importlib.util

    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return ()
    return (spec.origin,) if spec is not None and spec.origin else ()


def record_of(
    capture: LiveCapture, end: ScriptEnd, argv: list[str], started: str, options: LiveOptions
) -> RunRecord:
    error = None if end.error is None else f"{type(end.error).__name__}: {end.error}"
    return RunRecord(
        argv=tuple(argv),
        started_at=started,
        options=dict(vars(options)),
        outcome=end.outcome,
        exit_code=end.exit_code,
        error=error,
        **capture.result(),
    )


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
