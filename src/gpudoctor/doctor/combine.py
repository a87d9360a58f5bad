"""`gpudoctor run` with several ranks, the command-line side: `--nproc N` starts torchrun with N ranks
of this same command; under torchrun, each rank ends by saying it is done (`runner.ranks`), and the
one elected combines the ranks: `analysis.json` (gpudoctor.ranks/1, with every rank's summary and the
findings about the ranks together, and whether their traces cover the same steps), `report.html`,
and the ranks side by side on its terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from gpudoctor.runner.capture import LiveOptions
from gpudoctor.runner.ranks import RANK_INFO, RECORD, RankRun
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.errors import GpudoctorError

ANALYSIS = "analysis.json"
REPORT = "report.html"
NVML_OFF_ENV = {"NCCL_NVLS_ENABLE": "0"}  # never NVLink multicast from a tool's own launch


def torchrun_argv(nproc: int, out: Path, options: LiveOptions, module: bool, command: list[str]) -> list[str]:
    """The torchrun command line that runs `gpudoctor run` with these options as `nproc` ranks."""
    o = options
    flags = [
        "--out", str(out), "--warmup", str(o.warmup), "--light-steps", str(o.light_steps),
        "--light-seconds", str(o.light_seconds), "--warmup-seconds", str(o.warmup_seconds), "--steps", str(o.steps),
        "--nvml-interval", str(round(o.nvml_interval_s * 1000)), "--module-depth", str(o.module_depth),
    ]  # fmt: skip
    for name, on in (
        ("--light", o.light_only),
        ("--run-to-end", o.run_to_end),
        ("--with-stack", o.with_stack),
        ("--record-shapes", o.record_shapes),
        ("--profile-memory", o.profile_memory),
    ):
        flags += [name] if on else []
    flags.append("--nvml" if o.nvml else "--no-nvml")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [*launcher, "-m", "gpudoctor", "run", *flags, *(["-m"] if module else []), *command]


def launch(
    nproc: int, out: Path, options: LiveOptions, module: bool, command: list[str], console: Console
) -> int:
    """Run the ranks under torchrun and wait; combine them here if no rank did (one was killed)."""
    argv = torchrun_argv(nproc, out, options, module, command)
    env = {**os.environ, **{k: v for k, v in NVML_OFF_ENV.items() if k not in os.environ}}
    code = subprocess.call(argv, env=env)
    if not (out / ANALYSIS).is_file() and any(out.glob("rank-*/trace*.json*")):
        console.print("no rank combined the ranks (one ended early): combining them now", style="dim")
        combine(out, console)
    return code


def finish_rank(rank: RankRun, console: Console) -> None:
    """This rank is done: the elected one combines every rank's results."""
    try:
        elected = rank.finish()
        if elected:
            combine(rank.out, console)
        else:
            console.print(f"rank {rank.env.rank}: {rank.dir}", style="dim")
    finally:
        rank.close()


def combine(out: Path, console: Console) -> dict[str, Any] | None:
    """The ranks of the run directory analyzed together: analysis.json, report.html, the terminal."""
    from gpudoctor.cli.multirank import FULL_REPORTS_MAX, analyze_directory, combined_doc
    from gpudoctor.cli.report import write_html
    from gpudoctor.report.terminal import render_analysis, render_rank_overview
    from gpudoctor.trace import load_trace

    if not any(out.glob("rank-*/trace*.json*")):
        console.print(untraced_ranks(out))
        return None
    try:
        run = analyze_directory(out, all_reports=len(list(out.glob("rank-*"))) <= FULL_REPORTS_MAX)
    except GpudoctorError as err:
        console.print(f"the ranks could not be analyzed together: {err}", style="dim")
        return None
    doc = combined_doc(run)
    doc["run"] = alignment(out)
    (out / ANALYSIS).write_text(json.dumps(doc, indent=1, allow_nan=False))
    first = run.ranks[0]
    a, d = run.reports[first]
    view = run.view(first) if len(run.summaries) > 1 else None
    try:
        write_html(out / REPORT, a, d, load_trace(run.trace_paths[first]), ranks=view)
    except Exception as err:  # the report is a by-product: the results are written
        console.print(f"{REPORT} not written: {type(err).__name__}: {err}", style="dim")
    if view is not None:
        render_rank_overview(view, console)
        console.print()
    render_analysis(a, console, diagnosis=d)
    _alignment_line(doc["run"], console)
    console.print(f"\nrun directory: {out}")
    return doc


def untraced_ranks(out: Path) -> str:
    """Why no rank left a trace, and what to do: a script that ended before its traced phase is not
    run again under torchrun (every rank would have to start the script's process group anew): the
    phases that fit the steps it ran, as the options to pass."""
    from gpudoctor.cli.run import fitted_options

    records = []
    for path in sorted(out.glob(f"rank-*/{RECORD}")):
        try:
            records.append(RunRecord.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not records:
        return f"no rank left a record or a trace in {out}: the ranks ended before gpudoctor could write"
    first = min(records, key=lambda r: r.steps_seen)
    head = f"no rank was traced: the script ended after {first.steps_seen} steps"
    if first.outcome not in ("completed", "exit") or first.exit_code != 0:
        return f"{head} ({first.outcome}, exit status {first.exit_code}), before its traced phase"
    fit = fitted_options(first, LiveOptions(**_known(first.options)))
    if fit is None or fit.trace_all or first.step is None:
        return (
            f"{head}, too few to time and trace apart; under torchrun gpudoctor does not run it again "
            "(every rank would have to start its process group anew): let it run more steps"
        )
    flags = (
        f"--warmup {fit.warmup} --warmup-seconds 0 --light-steps {fit.light_steps} --light-seconds 0 "
        f"--steps {fit.steps}"
    )
    return (
        f"{head}, before its traced phase; under torchrun gpudoctor does not run it again (every rank "
        f"would have to start its process group anew): run it with {flags} (phases that fit "
        f"{first.steps_seen} steps), or let it run more steps"
    )


def _known(options: dict[str, Any]) -> dict[str, Any]:
    """The run's options as recorded, those LiveOptions has (a record from another version may differ)."""
    fields = vars(LiveOptions())
    return {k: v for k, v in options.items() if k in fields}


def alignment(out: Path) -> dict[str, Any]:
    """Whether every rank entered each phase at the same step (so their traces cover the same steps),
    which ranks left no trace, and each rank's notes."""
    infos = {}
    for path in sorted(out.glob(f"rank-*/{RANK_INFO}")):
        try:
            info = json.loads(path.read_text())
            infos[int(info["rank"])] = info
        except (OSError, ValueError, KeyError):
            continue
    world = max((i.get("world_size", 0) for i in infos.values()), default=0)
    phases = {r: i.get("phases", {}) for r, i in infos.items()}
    steps = {p for ph in phases.values() for p in ph}
    agreed = {p: sorted({ph.get(p) for ph in phases.values()} - {None}) for p in steps}
    traced = sorted(r for r in infos if any((out / f"rank-{r}").glob("trace*.json*")))
    return {
        "world_size": world,
        "ranks_seen": sorted(infos),
        "ranks_traced": traced,
        "phase_steps": {p: v[0] if len(v) == 1 else v for p, v in sorted(agreed.items())},
        "aligned": bool(phases) and all(len(v) == 1 for v in agreed.values()),
        "notes": {r: i.get("notes", []) for r, i in infos.items() if i.get("notes")},
    }


def _alignment_line(info: dict[str, Any], console: Console) -> None:
    steps = info.get("phase_steps", {})
    traced = info.get("ranks_traced", [])
    if info.get("aligned") and "traced" in steps and "done" in steps:
        console.print(
            f"\n{len(traced)} of {info['world_size']} ranks traced the same steps: {steps['traced'] + 2}–"
            f"{steps['done']} recorded, after one profiler warm-up step"
        )
    elif steps:
        console.print(f"\nthe ranks did not enter their phases at the same steps: {steps}", style="bold red")
    missing = sorted(set(range(info.get("world_size", 0))) - set(traced))
    if missing:
        console.print(f"ranks without a trace: {missing}", style="yellow")
