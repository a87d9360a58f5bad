"""`gpudoctor run [options] script.py [args...]` / `gpudoctor run -m module [args...]`: run an unmodified
script in this process, time its steps without the profiler (light phase), trace a few (traced phase),
and write the run directory: trace, record.json, analysis.json (the profiler's distortion taken out by
the light phase's step time); print the summary. Exits with the script's own status."""

from __future__ import annotations

import gc
from dataclasses import replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpudoctor.cli.common import DebugOption, set_debug, stdout_console, trace_ceilings
from gpudoctor.runner.capture import LiveCapture, LiveOptions
from gpudoctor.runner.launch import ScriptEnd, check_runnable, print_script_traceback, run_script
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.errors import GpudoctorError
from gpudoctor.util.units import fmt_bytes, fmt_us

if TYPE_CHECKING:
    from rich.console import Console

    from gpudoctor.analysis.memory_run import MemoryAnalysis
    from gpudoctor.runner.ranks import RankRun

RUNS_DIR = Path("gpudoctor-runs")
RECORD_FILE = "record.json"
CPU_NOTE = (
    "on the CPU: step times are the host's wall time, and the profiler's cost here says nothing about "
    "a GPU run; the trace shows which ops and Python each step runs, not GPU busy or idle time, kernels, "
    "copies or synchronizations (run it on a GPU for those)"
)


class MemoryHistory(str, Enum):
    outside_light = "outside-light"  # on from the first CUDA call, paused while steps are timed
    always = "always"
    off = "off"


def run_command(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="script.py [args...] (or, with -m, module [args...])")],
    module: Annotated[bool, typer.Option("-m", help="Run a module, as python -m does.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Run directory (default gpudoctor-runs/<name>-<time>).")
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Steps skipped before timing.")] = 3,
    warmup_seconds: Annotated[
        float, typer.Option("--warmup-seconds", min=0, help="...and for at least this long.")
    ] = 1.0,
    light_steps: Annotated[
        int, typer.Option("--light-steps", min=1, help="Steps timed with no profiler.")
    ] = 20,
    light_seconds: Annotated[
        float, typer.Option("--light-seconds", min=0, help="...and for at least this long.")
    ] = 2.0,
    steps: Annotated[
        int, typer.Option("--steps", min=1, max=100, help="Steps recorded by the profiler.")
    ] = 5,
    light: Annotated[bool, typer.Option("--light", help="Light phase only: no profiler at all.")] = False,
    run_to_end: Annotated[
        bool, typer.Option("--run-to-end", help="Let the script finish after the capture (default: stop it).")
    ] = False,
    with_stack: Annotated[bool, typer.Option("--with-stack", help="Record Python stacks.")] = False,
    record_shapes: Annotated[bool, typer.Option("--record-shapes", help="Record op input shapes.")] = False,
    profile_memory: Annotated[bool, typer.Option("--profile-memory", help="Record allocations.")] = False,
    nvml: Annotated[bool, typer.Option("--nvml/--no-nvml", help="Sample the GPU through NVML.")] = True,
    nvml_interval: Annotated[
        int, typer.Option("--nvml-interval", min=10, help="NVML sampling interval, ms (light phase).")
    ] = 100,
    module_depth: Annotated[
        int, typer.Option("--module-depth", min=-1, max=6, help="Module view depth in the trace (-1: none).")
    ] = 3,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            min=1,
            help="Run N ranks under torchrun (one run directory, rank-K/ each).",
            show_default=False,
        ),
    ] = None,
    memory_history: Annotated[
        MemoryHistory,
        typer.Option("--memory-history", help="When the allocator keeps Python stacks (docs/memory.md)."),
    ] = MemoryHistory.outside_light,
    debug: DebugOption = False,
) -> None:
    """Profile an unmodified script: `gpudoctor run train.py --lr 3e-4`.

    The step is found without help: an optimizer step, one call of the model, one generate() call, one
    DataLoader batch, one iteration of the script's loop (gpudoctor.step() overrides). After --warmup
    steps, --light-steps are timed with no profiler, then --steps are traced; then the script is stopped
    (or runs on with --run-to-end). Options after the script name are the script's.
    """
    set_debug(ctx, debug)
    target, args = command[0], command[1:]
    out = out or RUNS_DIR / f"{_run_name(target)}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    options = LiveOptions(
        warmup=warmup,
        warmup_seconds=warmup_seconds,
        light_steps=light_steps,
        light_seconds=light_seconds,
        steps=steps,
        light_only=light,
        run_to_end=run_to_end,
        with_stack=with_stack,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        nvml=nvml,
        nvml_interval_s=nvml_interval / 1000,
        module_depth=module_depth,
        memory_history=memory_history.value,
    )
    if nproc:  # several ranks: torchrun runs this command in each (cli.rank_run)
        from gpudoctor.cli.rank_run import launch

        raise typer.Exit(launch(nproc, out, options, module, command, stdout_console()))
    code = run_and_report(target, args, module=module, out=out, options=options, console=stdout_console())
    if code:
        raise typer.Exit(code)


def run_and_report(
    target: str, args: list[str], *, module: bool, out: Path, options: LiveOptions, console: Console
) -> int:
    """Run the script under capture, write the run directory, print the summary; the script's exit status.
    A script that ends before anything was traced runs a second time, traced to fit what it does (not
    as one rank of several: the ranks combine what they have)."""
    from gpudoctor.runner.ranks import RankRun

    check_runnable(target, module=module)  # a missing script or module: one line, before anything is made
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rank = RankRun.start(out, [target, *args], started, dict(vars(options)))  # one of several ranks?
    if rank is not None:
        from gpudoctor.cli.rank_run import finish_rank

        record, error, _ = _capture(target, args, module=module, out=rank.dir, options=options, rank=rank)
        _write_record(rank.dir, record)
        if error is not None:
            print_script_traceback(error)
        finish_rank(rank, console)  # the last rank to finish combines them all
        return record.exit_code
    record, error, signum = _capture(target, args, module=module, out=out, options=options)
    again = None if error is not None or options.light_only or signum else fitted_options(record, options)
    if again is not None:
        console.print(
            f"the script ended after {record.steps_seen} steps, before tracing: running it again, "
            f"{_describe_fit(again)}",
            style="dim",
        )
        first = record
        # The first run's objects (its model, its tensors on the GPU) live on in reference cycles (the
        # script's functions hold its globals): collect them, or the second run's memory counts them.
        gc.collect()
        record, error, signum = _capture(target, args, module=module, out=out, options=again)
        record = replace(
            record, notes=(*record.notes, f"second run: the first ended after {first.steps_seen} steps")
        )
        if record.light is None and first.light is not None:
            record = replace(record, light=first.light)
        _write_record(out, record)
    if error is not None:
        print_script_traceback(error)
    if signum is not None:  # asked to stop: keep what was measured, analyze it later
        console.print(
            f"gpudoctor run: {record.outcome}; what was measured is in {out} (gpudoctor report {out})"
        )
        return record.exit_code
    _report(record, out, console)
    return record.exit_code


def _capture(
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
    from gpudoctor.runner.rundir import RunDir

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    argv = [target, *args]
    rundir = None if rank is not None else RunDir(out, argv, started, dict(vars(options))).open()
    on_phase = rank.on_phase if rank is not None else None
    capture = LiveCapture(out, options, script_files(target, module), on_phase=on_phase).install()
    if rundir is not None:
        rundir.watch(capture.result)
        capture.on_change = rundir.update
    try:
        end = run_script(target, args, module=module)
    finally:
        if rank is not None:  # torchrun's SIGTERM from here on must not cut the writing of results short
            rank.script_ended = True
        capture.uninstall()  # also on Ctrl-C in our own code: no hook or profiler stays behind
    if end.outcome == "stopped":  # stopped at a step boundary: end its process group as its end would
        from gpudoctor.runner.ranks import end_process_group

        note = end_process_group()
        if note is not None:
            capture.notes.append(note)
    record = _record(capture, end, argv, started, options)
    if rundir is not None:
        record = rundir.finish(record)
        return record, end.error, rundir.signum
    return record, end.error, None


def _write_record(out: Path, record: RunRecord) -> None:
    from gpudoctor.util.outfile import write_json

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / RECORD_FILE, record.to_json())


def fitted_options(record: RunRecord, options: LiveOptions) -> LiveOptions | None:
    """For a script that ended (by itself) before its trace: phases that fit the steps it ran, or the
    whole script traced when it ran too few; None when it was traced or must not run again."""
    if record.trace_files or record.exit_code != 0 or record.outcome not in ("completed", "exit"):
        return None
    if options.trace_all:
        return None
    n = record.steps_seen
    if n < 5 or record.step is None:
        return replace(options, trace_all=True)
    steps = max(1, min(options.steps, (n - 2) // 3))
    light = max(n - 2 - steps - 1, 1)
    return replace(options, warmup=1, warmup_seconds=0.0, light_steps=light, light_seconds=0.0, steps=steps)


def _describe_fit(options: LiveOptions) -> str:
    if options.trace_all:
        return "traced from start to end"
    return f"with {options.warmup} warm-up, {options.light_steps} timed and {options.steps} traced steps"


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


def _run_name(target: str) -> str:
    return Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]


def _record(
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


def _report(record: RunRecord, out: Path, console: Console) -> None:
    """The observer-effect lines, then the trace's analysis with the profiler's distortion taken out."""
    from rich.text import Text

    from gpudoctor.cli.run_memory import memory_of_run, render_without_trace

    console.print(
        Text.assemble(
            "\n",
            ("gpudoctor run", "bold"),
            f": {' '.join(record.argv)} — {record.outcome}, {record.steps_seen} steps",
        )
    )
    for note in record.notes:
        console.print(f"note: {note}", style="dim")
    console.print(f"step = {_step_line(record)}")
    light, traced = record.light, record.traced
    if light is None or not light.times_us:
        console.print(f"no light-phase steps: the script ended after {record.steps_seen} steps", style="dim")
    else:
        times = sorted(light.times_us)
        p10, p90 = times[len(times) // 10], times[(len(times) * 9) // 10 - (len(times) >= 10)]
        console.print(
            f"light phase (no profiler): {len(times)} steps, {fmt_us(light.mean_us or 0)} per step "
            f"(median {fmt_us(light.median_us or 0)}, p10 {fmt_us(p10)}, p90 {fmt_us(p90)}) by {light.clock}"
        )
        per_call = record.step.calls_per_step if record.step else None
        if per_call and per_call > 1.5 and light.mean_us:
            console.print(
                f"  {per_call:.1f} calls of {record.step.module}.forward per step: "  # type: ignore[union-attr]
                f"{fmt_us(light.mean_us / per_call)} per call"
            )
    if light is not None and light.clock == "perf_counter" and record.environment is not None:
        console.print(CPU_NOTE, style="dim")  # the profiler's cost on the CPU says nothing about a GPU run
    elif traced is not None and traced.median_us and light is not None and light.median_us:
        overhead = record.profiler_overhead or 0.0
        console.print(
            f"traced phase: {len(traced.times_us)} steps, median {fmt_us(traced.median_us)}: "
            f"the profiler slows each step by {100 * overhead:.0f}% — figures below use the unprofiled step"
        )
    if record.memory and not record.memory_run:  # else the memory section below says it per step
        console.print(
            f"GPU memory: peak allocated {fmt_bytes(record.memory.get('allocated_bytes.all.peak', 0))}, "
            f"peak reserved {fmt_bytes(record.memory.get('reserved_bytes.all.peak', 0))}, "
            f"allocator retries {record.memory.get('num_alloc_retries', 0)}"
        )
    if record.nvml_missing is None:
        console.print(f"NVML: {len(record.nvml_samples)} samples")
    else:
        console.print(f"NVML: not recorded ({record.nvml_missing})", style="dim")
    memory = memory_of_run(out, record, console)
    if record.trace_files:
        _analyze(out, record, console, memory)
    elif memory is not None:
        render_without_trace(memory, console)
    console.print(f"\nrun directory: {out}")


def _analyze(out: Path, record: RunRecord, console: Console, memory: MemoryAnalysis | None = None) -> None:
    from gpudoctor.analysis.summary import analyze
    from gpudoctor.report.json_out import report_json
    from gpudoctor.report.terminal import render_analysis
    from gpudoctor.rules import diagnose
    from gpudoctor.trace import load_trace
    from gpudoctor.util.outfile import write_json

    unprofiled = unprofiled_step_us(record)
    try:
        trace = load_trace(out / record.trace_files[0])
        analysis = analyze(trace, unprofiled_step_us=unprofiled, ceilings=trace_ceilings(trace))
        analysis = replace(analysis, memory_run=memory)
        diagnosis = diagnose(analysis)
    except GpudoctorError as err:
        console.print(f"the trace could not be analyzed: {err}", style="dim")
        return
    write_json(out / "analysis.json", report_json([(analysis, diagnosis)]))
    observer = observer_effect(analysis, record)
    write_json(out / "observer.json", observer)
    _write_html(out, analysis, diagnosis, trace, console)
    render_analysis(analysis, console, diagnosis=diagnosis)
    if observer["busy_pct_unprofiled"] is not None:
        console.print(
            f"\nGPU busy {observer['busy_pct_unprofiled']:.0f}% of each unprofiled step "
            f"(the trace read alone says {observer['busy_pct_traced']:.0f}%: the profiler's overhead taken out)"
        )


def _step_line(record: RunRecord) -> str:
    if record.step is None:
        return (
            "not found (nothing in the script repeated)" if not record.trace_files else "the whole traced run"
        )
    return record.step.description


def unprofiled_step_us(record: RunRecord) -> float | None:
    """The step time without the profiler: the light phase's time over its steps (None for timed windows,
    which are no step of the script)."""
    if record.light is None or (record.step is not None and record.step.source == "window"):
        return None
    return record.light.mean_us


def observer_effect(analysis: object, record: RunRecord) -> dict[str, float | None]:
    """The profiler's distortion in numbers: step times with and without it, and the GPU's busy share
    of the step as the trace shows it and as it is without the profiler (kernels are not slowed by the
    profiler, the host is: busy time per step over the unprofiled step time)."""
    from gpudoctor.rules.facts import facts_of

    facts = facts_of(analysis)  # type: ignore[arg-type]
    light = unprofiled_step_us(record)
    result: dict[str, float | None] = {
        "light_median_us": light,
        "traced_median_us": record.traced.median_us if record.traced else None,
        "profiler_overhead": record.profiler_overhead,
        "trace_step_median_us": None,
        "gpu_busy_us_per_step": None,
        "busy_pct_traced": None,
        "busy_pct_unprofiled": None,
    }
    if facts is not None:
        result["trace_step_median_us"] = facts.traced_step_us
        result["gpu_busy_us_per_step"] = facts.busy_us
        result["busy_pct_traced"] = 100 * min(facts.busy_us / facts.traced_step_us, 1.0)
        result["busy_pct_unprofiled"] = 100 * facts.busy_fraction if light else None
    return result


def _write_html(out: Path, analysis: Any, diagnosis: Any, trace: Any, console: Console) -> None:
    """report.html through `gpudoctor report`'s writer, with the run's NVML series."""
    from gpudoctor.cli.report_source import nvml_samples, write_html

    try:
        write_html(out / "report.html", analysis, diagnosis, trace, nvml=nvml_samples(out / RECORD_FILE))
    except Exception as err:  # the report is a by-product: the run's results are already written
        console.print(f"report.html not written: {type(err).__name__}: {err}", style="dim")


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )(run_command)
