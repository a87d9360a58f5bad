"""`gpudoctor demo`: a built-in workload run under `gpudoctor run` — on the GPU if there is one, else on
the CPU — its run directory written and its summary printed. The README's first command. On a machine
without a GPU it then shows, labelled as such, the full diagnosis of the same workload recorded on an
H100 (shipped with gpudoctor: `gpudoctor/workloads/recorded/`) first, labelled as such, so that a first
try shows what it does; then the live run on the CPU, whose GPU sections are left out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.cli.common import DebugOption, set_debug, stdout_console

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_WORKLOAD = "sync_every_step"  # an MLP trained with the usual host syncs planted in its loop
WARMUP_STEPS = 3
DRIVER = "gpudoctor.workloads.drive"  # runs a built-in workload as a plain script
# Workloads with a GPU run shipped in gpudoctor/workloads/recorded/, shown where there is no GPU.
RECORDED = {"sync_every_step": "sync_every_step_h100"}
RECORDED_DIR = "recorded-h100"


def demo_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="The run directory to write.")] = Path(
        "gpudoctor-demo"
    ),
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="A built-in workload (see --list).")
    ] = DEFAULT_WORKLOAD,
    steps: Annotated[int, typer.Option("--steps", min=1, max=50, help="Profiled steps.")] = 3,
    light_steps: Annotated[
        int, typer.Option("--light-steps", min=1, help="Steps timed without the profiler first.")
    ] = 10,
    cpu: Annotated[bool, typer.Option("--cpu", help="Run on the CPU even if there is a GPU.")] = False,
    list_workloads: Annotated[bool, typer.Option("--list", help="List the built-in workloads.")] = False,
    debug: DebugOption = False,
) -> None:
    """Profile a built-in workload and diagnose it.

    Runs the workload under `gpudoctor run`: a few warm-up steps, --light-steps timed without the profiler,
    then --steps recorded with torch.profiler (stacks, shapes and memory on); writes the run directory (trace,
    record.json, analysis.json, report.html) under --out and prints the summary.
    """
    set_debug(ctx, debug)
    from rich.rule import Rule
    from rich.text import Text

    from gpudoctor import workloads  # imports torch: only when the demo runs
    from gpudoctor.cli.run import run_and_report
    from gpudoctor.doctor.run import RunOptions
    from gpudoctor.runner.phases import LiveOptions

    if list_workloads:
        for name in workloads.names():
            typer.echo(f"{name:20} {workloads.get(name).description}")
        return
    import torch

    workloads.get(workload)  # an unknown name: one line and exit 2, before anything runs
    device = torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    console = stdout_console()
    size = "full size" if device.type == "cuda" else "CPU size"
    console.print(
        Text.assemble(("gpudoctor demo", "bold"), f": {workload} on {device} ({size})"),
        f"— as `gpudoctor run -m {DRIVER} {workload}`",
    )
    live = LiveOptions(
        warmup=WARMUP_STEPS,
        light_steps=light_steps,
        warmup_seconds=0.0,
        light_seconds=0.0,  # the workload runs a set number of steps
        steps=steps,
        with_stack=True,
        record_shapes=True,  # the report's roofline needs the ops' input shapes
        profile_memory=True,
    )
    # the run stops it once captured; room for warm-up steps beyond WARMUP_STEPS while step times fall
    total = WARMUP_STEPS + light_steps + steps + 2 + 20
    args = [workload, "--steps", str(total), *(["--cpu"] if cpu else [])]
    recorded = device.type == "cpu" and workload in RECORDED
    if recorded:  # the point of the demo first: a GPU run, labelled as the recorded run it is
        show_recorded(RECORDED[workload], out / RECORDED_DIR, console)
        console.print()
        console.print(Rule(Text(f"This machine: {workload} on the CPU, live", style="bold")))
    code = run_and_report(DRIVER, args, RunOptions(live, module=True, out=out), console)
    if recorded:
        console.print(
            f"\n(above this machine's run: the recorded {RECORDED[workload]} run; its report is "
            f"{out / RECORDED_DIR / 'report.html'})",
            style="dim",
        )
    if code:
        raise typer.Exit(code)


def show_recorded(name: str, dest: Path, console: Console) -> None:
    """The recorded GPU run `name`, copied to `dest` (its trace and record), diagnosed and shown in full
    as `gpudoctor run` shows a run, under a heading that says where it comes from."""
    from importlib import resources

    from rich.rule import Rule
    from rich.text import Text

    from gpudoctor.doctor.run import diagnose_run
    from gpudoctor.report.run_view import render_report, report_html
    from gpudoctor.runner import rundir

    source = resources.files("gpudoctor.workloads") / "recorded" / name
    rundir.copy_recorded_run(
        dest, {f: (source / f).read_bytes() for f in (rundir.RECORD_FILE, rundir.TRACE_FILE)}
    )
    record = rundir.read_record(dest)
    assert record is not None
    env = record.environment
    gpu = env.gpu_name if env and env.gpu_name else "a GPU"
    where = f"{gpu}, torch {env.torch if env else '?'}, {record.started_at[:10]}"
    console.print(
        Rule(Text(f"No GPU here. First, the same workload recorded on an {gpu}", style="bold yellow"))
    )
    console.print(
        f"What follows is not this machine: it is the run of `gpudoctor demo` on an {where}, shipped with "
        "gpudoctor, diagnosed now as it was there. This machine's own run comes after it.",
        style="yellow",
    )
    report = diagnose_run(dest, record)  # as `gpudoctor run` diagnoses its own run
    rundir.write_report(dest, report_html(report))
    render_report(report, console)
    console.print(
        f"(recorded on an {where}. On a machine with a GPU, `gpudoctor demo` runs it live.)", style="yellow"
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)
