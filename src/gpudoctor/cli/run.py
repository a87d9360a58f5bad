"""`gpudoctor run [options] script.py [args...]` / `gpudoctor run -m module [args...]`: the doctor runs an
unmodified script in this process (`doctor.run_and_diagnose`: its steps timed without the profiler,
a few traced, the run directory written) and the report is printed and written as report.html. With
--nproc, torchrun runs this command as each rank. Exits with the script's own status."""

from __future__ import annotations

import contextlib
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.cli.common import DebugOption, mute, set_debug, shown, stdout_console

if TYPE_CHECKING:
    from rich.console import Console

    from gpudoctor.doctor.report import RunReport
    from gpudoctor.doctor.run import RunOptions


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
    rerun: Annotated[
        bool,
        typer.Option(
            "--rerun/--no-rerun",
            help="A script that ends before anything is traced runs once more, traced to fit (its output and "
            "side effects happen again); --no-rerun: it runs once.",
        ),
    ] = True,
    debug: DebugOption = False,
) -> None:
    """Profile an unmodified script: `gpudoctor run train.py --lr 3e-4`.

    The step is found without help: an optimizer step, one call of the model, one generate() call, one
    DataLoader batch, one iteration of the script's loop (gpudoctor.step() overrides). After --warmup
    steps, --light-steps are timed with no profiler, then --steps are traced; then the script is stopped
    (or runs on with --run-to-end). Options after the script name are the script's.
    """
    set_debug(ctx, debug)
    from gpudoctor.doctor.run import RunOptions, default_out
    from gpudoctor.runner.phases import LiveOptions

    target, args = command[0], command[1:]
    live = LiveOptions(
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
    options = RunOptions(live, module, out or default_out(target), rerun)
    console = stdout_console()
    if nproc:  # several ranks: torchrun runs this command in each
        raise typer.Exit(launch(nproc, options, command, console))
    code = run_and_report(target, args, options, console)
    if code:
        raise typer.Exit(code)


def run_and_report(target: str, args: list[str], options: RunOptions, console: Console) -> int:
    """The doctor runs the script (`doctor.run_and_diagnose`); its report printed and report.html
    written; the script's exit status. `options.out` is the run directory."""
    from gpudoctor.doctor.run import run_and_diagnose

    assert options.out is not None
    out = options.out

    def note(text: str) -> None:
        shown(console, text, style="dim")

    report = run_and_diagnose(target, args, options, on_note=note)
    record = report.record
    assert record is not None
    if record.outcome == "terminated" and report.analysis is None:  # asked to stop: analyze it later
        console.print(
            f"gpudoctor run: {record.outcome}; what was measured is in {out} (gpudoctor report {out})"
        )
        return record.exit_code
    if report.rank is not None and report.alignment is None:  # one rank of several, not the one combining
        return record.exit_code
    # under torchrun, the rank that combined after another failed is told to stop (SIGTERM) while it
    # prints: held off until its report is out (torchrun kills it outright after its grace time)
    from gpudoctor.runner.ranks import sigterm_held

    with sigterm_held() if report.rank is not None else contextlib.nullcontext():
        # report.html first: a reader that stops reading (`| head`) must not cost the run its report
        if report.run_dir is not None and report.analysis is not None:
            _write_html(Path(report.run_dir), report, console)
        try:
            render_report(report, console)
            console.file.flush()
        except BrokenPipeError:
            mute(console)
    return record.exit_code


def launch(nproc: int, options: RunOptions, command: list[str], console: Console) -> int:
    """`--nproc N`: the ranks under torchrun; combined here if no rank did."""
    from gpudoctor.doctor.combine import launch_ranks

    assert options.out is not None
    out = options.out
    code, report = launch_ranks(
        nproc, out, options.live, options.module, command, lambda text: console.print(text, style="dim")
    )
    if report is not None:
        _write_html(out, report, console)
        render_report(report, console)
    return code


def _write_html(out: Path, report: RunReport, console: Console) -> None:
    """report.html: a by-product, so a failure to write it is a line, not an error."""
    from gpudoctor.report.run_view import report_html
    from gpudoctor.runner.rundir import write_report

    try:
        write_report(out, report_html(report))
    except Exception as err:  # the run's results are already written
        console.print(f"report.html not written: {type(err).__name__}: {err}", style="dim")


def render_report(report: RunReport, console: Console) -> None:
    from gpudoctor.report.run_view import render_report as render

    render(report, console)


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )(run_command)
