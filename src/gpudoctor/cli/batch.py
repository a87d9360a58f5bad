"""`gpudoctor batch [options] train.py [args...]`: sweep the script's batch size (its --batch-size-like
option, else its DataLoaders' batch_size), each size in a fresh process; print and write what fits,
where throughput stops growing and, with --latency-ms, the largest batch meeting a latency target
(`batch.json`, schema gpudoctor.batch/1, and `batch.html` in --out)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.cli.common import DebugOption, set_debug, stdout_console
from gpudoctor.util.errors import UsageError


def batch_command(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(help="script.py [args...] (or, with -m, module [args...])")],
    module: Annotated[bool, typer.Option("-m", help="Run a module, as python -m does.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Where batch.json and batch.html go.")
    ] = None,
    start: Annotated[int, typer.Option("--start", min=1, help="The first batch size.")] = 1,
    max_batch: Annotated[
        int | None, typer.Option("--max", min=1, help="The largest batch size to try.")
    ] = None,
    max_runs: Annotated[int, typer.Option("--max-runs", min=1, help="Processes to run at most.")] = 14,
    latency_ms: Annotated[
        float | None,
        typer.Option("--latency-ms", min=0.001, help="Inference: the largest batch within this latency."),
    ] = None,
    batch_arg: Annotated[
        str | None,
        typer.Option("--batch-arg", help="The script's batch-size option, if its name is unusual."),
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Steps skipped before timing.")] = 2,
    light_steps: Annotated[int, typer.Option("--light-steps", min=1, help="Steps timed per size.")] = 10,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds one size may take.")] = 600.0,
    debug: DebugOption = False,
) -> None:
    """Which batch size to run: `gpudoctor batch train.py --lr 3e-4`.

    Sizes double from --start while throughput grows; then the largest size the memory model predicts
    is tried with the next size up. Options after the script name are the script's.
    """
    from gpudoctor.analysis.batch_plan import SweepPlan, sweep
    from gpudoctor.doctor.run import default_out
    from gpudoctor.report.batch_view import render_html, render_sweep
    from gpudoctor.report.fix_view import user_files_lines
    from gpudoctor.runner.launch import check_runnable
    from gpudoctor.runner.rundir import write_batch
    from gpudoctor.runner.sweep import measure_in_process
    from gpudoctor.runner.userfiles import UserFiles

    set_debug(ctx, debug)
    if max_batch is not None and start > max_batch:
        raise UsageError(f"--start {start} is above --max {max_batch}: no batch size to measure")
    target, args = command[0], command[1:]
    check_runnable(target, module=module)  # a missing or broken script: one line, before any batch
    out = out or default_out(target, "-batch")
    child = ["--warmup", str(warmup), "--light-steps", str(light_steps)]
    child += ["--batch-arg", batch_arg] if batch_arg else []
    plan = SweepPlan(
        start=start,
        max_batch=max_batch,
        max_runs=max_runs,
        latency_target_us=latency_ms * 1000 if latency_ms else None,
    )
    console = stdout_console()
    measure = measure_in_process(target, args, module=module, timeout_s=timeout, child_args=child)

    def measured(batch: int) -> dict:
        console.print(f"batch {batch}…", end=" ", style="dim")
        raw = measure(batch)
        console.print(f"{raw.get('status')}", style="dim")
        return raw

    # each size runs the script once more: the files it writes are put back after the sweep
    files = UserFiles.protect(None if module else target, out)
    warning = files.warning()
    if warning:
        console.print(f"gpudoctor batch: {warning}", style="yellow", markup=False, highlight=False)
    try:
        result = sweep(measured, plan, [target, *args])
    finally:
        user_files = files.finish()
    written = write_batch(out, result.to_json(), render_html(result))
    render_sweep(result, console)
    for line in user_files_lines(user_files):
        console.print(line, style="dim", markup=False, highlight=False)
    console.print(f"\nwrote {written[0]} and {written[1]}")


def register(app: typer.Typer) -> None:
    app.command(
        "batch",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )(batch_command)
