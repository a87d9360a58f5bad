"""`gpudoctor demo`: profile a built-in workload — on the GPU if there is one, else on the CPU — keep
its trace and analysis in a run directory, and print the summary. The README's first command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.analysis.summary import analyze
from gpudoctor.cli.common import DebugOption, set_debug, stdout_console
from gpudoctor.cli.report import write_html
from gpudoctor.report.json_out import report_json
from gpudoctor.report.terminal import render_analysis
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace
from gpudoctor.trace.capture import ProfileOptions, profile_steps

DEFAULT_WORKLOAD = "sync_every_step"  # an MLP trained with the usual host syncs planted in its loop
WARMUP_STEPS = 3


def demo_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="The run directory to write.")] = Path(
        "gpudoctor-demo"
    ),
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="A built-in workload (see --list).")
    ] = DEFAULT_WORKLOAD,
    steps: Annotated[int, typer.Option("--steps", min=1, max=50, help="Profiled steps.")] = 3,
    cpu: Annotated[bool, typer.Option("--cpu", help="Run on the CPU even if there is a GPU.")] = False,
    list_workloads: Annotated[bool, typer.Option("--list", help="List the built-in workloads.")] = False,
    debug: DebugOption = False,
) -> None:
    """Profile a built-in workload and diagnose it.

    Runs the workload a few steps, records them with torch.profiler (stacks and memory on), writes the
    trace and analysis.json under --out, and prints the summary.
    """
    set_debug(ctx, debug)
    from gpudoctor import workloads  # imports torch: only when the demo runs

    if list_workloads:
        for name in workloads.names():
            typer.echo(f"{name:20} {workloads.get(name).description}")
        return
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    console = stdout_console()
    console.print(
        f"[bold]gpudoctor demo[/]: {workload} on {device} ({'full size' if device.type == 'cuda' else 'CPU size'})"
    )
    step = workloads.get(workload).build(device, small=device.type != "cuda")
    try:
        for _ in range(WARMUP_STEPS):
            step.run()
        options = ProfileOptions(active=steps, with_stack=True, profile_memory=True)
        trace_path = profile_steps(step.run, out / f"{workload}.json.gz", options)
    finally:
        step.close()
    trace = load_trace(trace_path)
    analysis = analyze(trace)
    diagnosis = diagnose(analysis)
    write_html(out / "report.html", analysis, diagnosis, trace)
    analysis_path = out / "analysis.json"
    analysis_path.write_text(json.dumps(report_json([(analysis, diagnosis)]), indent=1, allow_nan=False))
    render_analysis(analysis, console, diagnosis=diagnosis)
    console.print(
        f"\ntrace: {trace_path}   analysis: {analysis_path}   report: {out / 'report.html'}   (gpudoctor analyze {trace_path})"
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)
