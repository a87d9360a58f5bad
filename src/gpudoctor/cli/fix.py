"""`gpudoctor fix [options] train.py [args...]` / `gpudoctor fix --from RUN_DIR`: diagnose, apply each
candidate fix to the unmodified script — switched in blocks of one process where it can be, else in fresh
processes — keep it only if it is faster beyond noise with the same results, combine the kept ones, and
print the table and the diff; then apply the diff to a copy of the user's files and time it against the
script as plain processes (the proof, the headline; `--no-proof` skips it). Writes the fix directory as it
goes (fix.json after every fix; fix.md, fix.html, fix.diff — where recommended —, calibration.json at the end); Ctrl-C keeps
the results so far and exits 130 (SIGTERM and SIGHUP likewise, exiting 128 + the signal); a script that
does not compile is a usage error (exit 2); one that does not run as written exits 1, its output kept."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpudoctor.cli.common import DebugOption, own_options_after_script, set_debug, stdout_console
from gpudoctor.runner.launch import check_runnable
from gpudoctor.runner.ranks import RankEnv
from gpudoctor.runner.rundir import prepare_fix_dir
from gpudoctor.util.errors import UsageError
from gpudoctor.util.signals import signals_interrupt

if TYPE_CHECKING:
    from rich.console import Console

    from gpudoctor.fixes.api import FixTarget
    from gpudoctor.fixes.diagnose import RunInputs
    from gpudoctor.fixes.options import FixOptions
    from gpudoctor.fixes.result import FixReport

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")  # fixes.patches.compile's, not imported

FIXES_DIR = Path("gpudoctor-fixes")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "10m", "1.5h"."""
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"not a duration: {text!r} (e.g. 90s, 10m, 1h)")
    scale = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    seconds = float(m.group(1)) * scale
    if seconds <= 0:
        raise UsageError(
            f"--budget {text}: give a time to spend, e.g. 5m (the diagnosis alone takes seconds)"
        )
    return seconds


def _ids(text: str | None) -> tuple[str, ...]:
    from gpudoctor.fixes.catalog import asked

    return tuple(asked(f.strip()) for f in (text or "").split(",") if f.strip())


def _skipped(text: str | None) -> tuple[str, ...]:
    """--skip: fix ids or kinds (`workers` skips every worker count); an unknown one is a usage error,
    not a silent no-op."""
    from gpudoctor.fixes.catalog import spec_of

    items = tuple(s.strip() for s in (text or "").split(",") if s.strip())
    for item in items:
        spec_of(item)  # a UsageError naming it where it is no fix
    return items


ONE_NODE = (
    "gpudoctor fix runs its groups of ranks on this node alone (each round a torchrun of its own, "
    "--standalone): give the GPUs of one node (--nproc N, or torchrun --nnodes 1)"
)


def fix_command(
    ctx: typer.Context,
    command: Annotated[list[str] | None, typer.Argument(help="script.py [args...] (or, with -m, module [args...])")] = None,
    module: Annotated[bool, typer.Option("-m", help="Run a module, as python -m does.")] = False,
    from_run: Annotated[Path | None, typer.Option("--from", help="A gpudoctor run directory: its script and findings.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Fix directory (default gpudoctor-fixes/<name>-<time>).")] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Pairs of fresh processes per fix that cannot switch in a running process.")] = 4,
    blocks: Annotated[int, typer.Option("--blocks", min=0, help="Block pairs of the A/B inside one process, for fixes that switch in a running process (0: fresh processes for every fix).")] = 8,
    block_s: Annotated[float, typer.Option("--block-s", min=0.0, help="Seconds a block lasts at least.")] = 0.5,
    extend_blocks: Annotated[int, typer.Option("--extend-blocks", min=0, help="Block pairs added, once, to an A/B in one process whose planned pairs lean to a saving undecided, where the time budget has room (then judged at α 3%; 0: never).")] = 16,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Steps skipped in each process (compilation too).")] = 5,
    warmup_s: Annotated[float, typer.Option("--warmup-s", min=0.0, help="And seconds, at least (GPU clocks ramp up).")] = 1.0,
    steps: Annotated[int, typer.Option("--steps", min=2, help="Steps timed in each fresh process.")] = 20,
    steps_s: Annotated[float, typer.Option("--steps-s", min=0.0, help="And seconds, at least (periodic stalls inside).")] = 2.0,
    record: Annotated[int, typer.Option("--loss-steps", min=0, help="First steps whose losses are compared.")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of torch, random and numpy in every process.")] = 0,
    budget: Annotated[str | None, typer.Option("--budget", help="Time limit, e.g. 10m: fixes not reached are reported.")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Try just these fixes, e.g. tf32,compile,workers:8.")] = None,
    skip: Annotated[str | None, typer.Option("--skip", help="Never try these fixes (kinds or ids).")] = None,
    allow_batch: Annotated[bool, typer.Option("--allow-batch", help="Also try twice the batch (timed per sample).")] = False,
    compile_mode: Annotated[str | None, typer.Option("--compile-mode", help=f"torch.compile mode: {', '.join(MODES)}.")] = None,
    diagnose: Annotated[bool, typer.Option("--diagnose/--no-diagnose", help="Profile the script first (gpudoctor run).")] = True,
    child_timeout: Annotated[int, typer.Option("--child-timeout", min=10, help="Seconds one process may run.")] = 600,
    shared_baseline: Annotated[bool, typer.Option("--shared-baseline", help="One baseline process per round for all fixes (A B C, A C B, …), not one per fix: fewer processes.")] = False,
    stack: Annotated[bool, typer.Option("--stack/--no-stack", help="Try each fix after a kept one on top of what is kept (one bottleneck at a time), and those not faster alone on top of the recommendation; --no-stack: every fix against the script alone.")] = True,
    fork: Annotated[bool, typer.Option("--fork/--no-fork", help="Fork each round from a server that imported torch and the script's libraries once (faster), or start a fresh interpreter each.")] = True,
    proof: Annotated[bool, typer.Option("--proof/--no-proof", help="Apply the recommended diff to a copy of your files and time it against the script as plain processes (python script.py), the report's headline; --no-proof: the harness's figure alone.")] = True,
    proof_half_width: Annotated[float, typer.Option("--proof-half-width", min=0.1, max=50.0, help="The proof times pairs of plain processes until the speedup's 95% interval is within ± this % of it (3 pairs at least, 10 at most, fewer where --budget ends first).")] = 5.0,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Ranks on this node: each round, and each process of the proof, a torchrun group of this many, every rank with the same fixes (as torchrun --nproc-per-node).")] = 1,
    numa_binding: Annotated[str | None, typer.Option("--numa-binding", help="With --nproc: every group's ranks bound to the CPUs near their GPUs, as torchrun --numa-binding binds them (node, socket, exclusive, core-complex); under torchrun, taken from its own command line.")] = None,
    aa: Annotated[bool, typer.Option("--aa", help="A/A: time the script against itself and a patch that changes nothing (in processes and in blocks), beside plain processes: the noise floor, and the test's false-positive rate here.")] = False,
    debug: DebugOption = False,
) -> None:  # fmt: skip
    """Apply each fix the diagnosis points to, prove it by a timed A/B in fresh processes, keep or revert.

    Every fix is applied at runtime, the script is never edited: the permanent change is printed as a
    diff. Options after the script name are the script's.
    """
    set_debug(ctx, debug)
    warning = own_options_after_script(ctx, command or [])
    if warning:
        typer.echo(f"gpudoctor fix: {warning}", err=True)
    if compile_mode is not None and compile_mode not in MODES:
        raise UsageError(f"--compile-mode must be one of {', '.join(MODES)}")
    if blocks == 1:
        raise UsageError("--blocks must be 0 (fresh processes only) or at least 2 pairs")
    check_numa_binding(numa_binding, nproc)
    from gpudoctor.fixes.options import FixOptions

    options = FixOptions(
        rounds=rounds, warmup=warmup, warmup_s=warmup_s, steps=steps, steps_s=steps_s, record=record, seed=seed,
        budget_s=parse_duration(budget) if budget else None, child_timeout_s=float(child_timeout),
        allow_batch=allow_batch, compile_mode=compile_mode, only=_ids(only),
        skip=_skipped(skip), fork=fork,
        shared_baseline=shared_baseline, stack=stack, blocks=blocks, block_s=block_s, extend_blocks=extend_blocks,
        proof=proof, proof_half_width=proof_half_width / 100, nproc=nproc, numa_binding=numa_binding,
    )  # fmt: skip
    request = FixRequest(tuple(command or ()), module, from_run, out, options, diagnose, aa)
    code = run_fix_request(request)
    if code:
        raise typer.Exit(code)


@dataclass(frozen=True)
class FixRequest:
    """What `gpudoctor fix` was asked: the script and its arguments (or a run directory to take them and
    the findings from), where to write, how to try the fixes (`FixOptions`), whether to diagnose first,
    and whether to measure the noise floor (the A/A) instead."""

    command: tuple[str, ...]  # script.py args… (or, with module, a module and its args)
    module: bool
    from_run: Path | None
    out: Path | None
    options: FixOptions
    diagnose: bool = True
    aa: bool = False


def run_fix_request(request: FixRequest) -> int:
    """Run it, write the fix directory, print the report; the exit status (130, or 128 + the signal,
    when interrupted; 1 when the script as written did not run)."""
    from gpudoctor.fixes.api import FixTarget, load_from_run
    from gpudoctor.report.fix_view import render_fix_terminal
    from gpudoctor.runner.rundir import ROUNDS_DIR, round_files

    request = _as_group(request)
    if request is None:  # a rank of torchrun's but the first: rank 0 runs the session's groups
        return 0
    command, inputs = request.command, None
    if request.from_run is not None:
        script, inputs = load_from_run(request.from_run)
        if command:
            script = FixTarget(command[0], tuple(command[1:]), request.module)
    elif command:
        script = FixTarget(command[0], tuple(command[1:]), request.module)
    else:
        raise UsageError("give a script (gpudoctor fix train.py ...) or a run directory (--from RUN_DIR)")
    if not script.module:
        check_runnable(script.target)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = request.out or FIXES_DIR / f"{_name(script.target)}-{stamp}"
    prepare_fix_dir(out)
    console = stdout_console()
    if request.aa:
        _run_aa(script, out, request.options, console)
        return 0
    # a scheduler's SIGTERM (or a closed terminal's SIGHUP) stops it as Ctrl-C does: the rounds ended,
    # the results so far written
    with signals_interrupt() as received:
        report = _run(script, out, request.options, inputs, request.diagnose, console)
    _write_all(out, report)
    render_fix_terminal(report, console)
    console.print(f"\nfix directory: {out}")
    if report.interrupted:
        return 128 + received[0] if received else 130
    if not report.baseline_rounds:  # the script as written did not run: nothing to compare fixes with
        why = next((n for n in report.notes if n.startswith("the baseline did not run")), "no baseline")
        log = round_files(out / ROUNDS_DIR, "baseline-0")[1]
        print(f"gpudoctor fix: {why}" + (f"; its output: {log}" if log.exists() else ""), file=sys.stderr)
        return 1
    return 0


def check_numa_binding(mode: str | None, nproc: int) -> None:
    """A `--numa-binding` that torchrun here can apply to a group, or a one-line error."""
    if mode is None:
        return
    from gpudoctor.fixes.ranks import NUMA_BINDINGS

    if mode not in NUMA_BINDINGS:
        raise UsageError(f"--numa-binding must be one of {', '.join(NUMA_BINDINGS)}")
    if nproc == 1 and RankEnv.from_environ() is None:
        raise UsageError("--numa-binding binds the ranks of a group: give --nproc N")
    import importlib.util

    if importlib.util.find_spec("torch.numa") is None:
        raise UsageError("--numa-binding: this torch's torchrun has no --numa-binding (no torch.numa)")
    import torch

    if not torch.cuda.device_count():
        raise UsageError("--numa-binding binds each rank to the CPUs near its GPU: no CUDA GPU is visible")


def _agent_numa_binding() -> str | None:
    """The `--numa-binding` of the torchrun that started this rank (its agent is this process's parent)."""
    from gpudoctor.fixes.ranks import launcher_numa_binding

    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return launcher_numa_binding([a.decode(errors="replace") for a in argv if a])


def _as_group(request: FixRequest) -> FixRequest | None:
    """Under torchrun (`torchrun --nproc-per-node N -m gpudoctor fix script.py`): rank 0 runs the
    session, each round a group of N ranks of its own; the other ranks end here (None)."""
    env = RankEnv.from_environ()
    if env is None:
        return request
    if int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)) != env.world_size:
        raise UsageError(ONE_NODE)
    if request.options.nproc not in (1, env.world_size):
        raise UsageError(f"--nproc {request.options.nproc} under torchrun's {env.world_size} ranks: give one")
    if env.rank != 0:
        print(f"gpudoctor fix: rank {env.rank}: rank 0 runs the session (each round {env.world_size} ranks "
              "of its own)", file=sys.stderr)  # fmt: skip
        return None
    binding = request.options.numa_binding or _agent_numa_binding()
    return replace(request, options=replace(request.options, nproc=env.world_size, numa_binding=binding))


def _run(
    script: FixTarget,
    out: Path,
    options: FixOptions,
    inputs: RunInputs | None,
    diagnose: bool,
    console: Console,
) -> FixReport:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gpudoctor.fixes.api import run_fix
    from gpudoctor.fixes.session import Progress as Step
    from gpudoctor.report.fix_view import saving_cell, status_cell
    from gpudoctor.runner.rundir import write_fix_progress

    bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=console, transient=True)  # fmt: skip
    task = bars.add_task("starting", total=None)

    # piped to a log (a batch job, CI) the bar is not drawn: a line per stage and per fix verdict instead,
    # so that ten minutes of rounds are not ten minutes of nothing
    lines = not console.is_terminal
    shown, started = [0], [""]

    def progress(p: Step) -> None:
        if p.together:  # every fix in each round, beside one baseline
            what = f"round {p.round}/{p.rounds} — " + (
                "baseline" if p.fix is None else f"fix {p.index}/{p.count} — {_titles(p.fix)}"
            )
            bars.update(task, description=what, total=p.rounds, completed=p.round - 1)
            return
        what = "baseline" if p.stage == "baseline" else f"{p.stage} {p.index}/{p.count} — {_titles(p.fix)}"
        if lines and what != started[0]:
            console.print(f"  {what}…", markup=False, highlight=False, style="dim")
            started[0] = what
        rounds = "" if p.stage == "baseline" else f" — round {p.round}/{p.rounds} ({p.side})"
        done = 0 if p.stage == "baseline" else 2 * (p.round - 1) + (p.side == "candidate")
        bars.update(
            task,
            description=what + rounds,
            total=None if p.stage == "baseline" else 2 * p.rounds,
            completed=done,
        )

    def updated(report: FixReport) -> None:
        write_fix_progress(out, report.to_json())
        if lines:
            for v in report.verdicts[shown[0] :]:
                console.print(
                    f"  {v.title}: {saving_cell(v)}, {status_cell(v)}", markup=False, highlight=False
                )
            shown[0] = len(report.verdicts)

    def stage(what: str) -> None:
        bars.update(task, description=what)
        if lines:
            console.print(f"  {what}…", markup=False, highlight=False, style="dim")

    def warn(what: str) -> None:  # before the first process: files past what is copied
        console.print(f"gpudoctor fix: {what}", style="yellow", markup=False, highlight=False)

    with bars:
        return run_fix(script, out, options, inputs=inputs, diagnose=diagnose, on_progress=progress,
                       on_update=updated, on_stage=stage, on_warning=warn)  # fmt: skip


def _run_aa(script: FixTarget, out: Path, options: FixOptions, console: Console) -> None:
    from gpudoctor.fixes.api import run_aa_fix
    from gpudoctor.report.aa_view import aa_lines
    from gpudoctor.report.fix_view import user_files_lines
    from gpudoctor.runner.rundir import write_aa

    files: list[str] = []
    with console.status("A/A") as status:
        report = run_aa_fix(script, out, options, on_stage=lambda s: status.update(s),
                            on_warning=lambda w: console.print(f"gpudoctor fix: {w}", style="yellow",
                                                               markup=False, highlight=False),
                            on_files=lambda w: files.extend(user_files_lines(w)))  # fmt: skip
    written = write_aa(out, report.to_json())
    for line in [*aa_lines(report), *files]:
        console.print(line, markup=False, highlight=False)
    console.print(f"\nA/A results: {written}")


def _titles(fix: str | None) -> str:
    from gpudoctor.fixes.catalog import title_of

    return " + ".join(title_of(f) for f in (fix or "").split("+") if f)


def _write_all(out: Path, report: FixReport) -> None:
    from gpudoctor.report.fix_view import render_fix_html, render_fix_markdown
    from gpudoctor.runner.rundir import write_fix

    # fix.diff is the recommended change: none where the proof refuted it (fix.json keeps the diff and why)
    write_fix(out, report.to_json(), markdown=render_fix_markdown(report), html=render_fix_html(report),
              calibration=report.calibration_json(), diff=report.diff if report.recommended else None)  # fmt: skip


def _name(target: str) -> str:
    return Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]


def register(app: typer.Typer) -> None:
    app.command(
        "fix",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )(fix_command)
