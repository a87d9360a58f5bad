"""A `gpudoctor run` of several ranks, the doctor's side: the ranks run under torchrun (`--nproc N`,
`runner.torchrun`), and the ranks of one run directory combined — every rank analyzed (`doctor.ranks`),
`analysis.json` written (gpudoctor.ranks/1, with every rank's summary, the findings about the ranks
together, and whether their traces cover the same steps) — as a `RunReport`; or, where no rank left a
trace, why, and the options that would fit the steps the script ran."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpudoctor.doctor.diagnose import ranks_report
from gpudoctor.doctor.ranks import FULL_REPORTS_MAX, analyze_directory
from gpudoctor.doctor.report import RunReport
from gpudoctor.runner import rundir
from gpudoctor.runner.phases import LiveOptions, fitted_options
from gpudoctor.runner.torchrun import run_ranks
from gpudoctor.util.errors import GpudoctorError


def launch_ranks(
    nproc: int,
    out: Path,
    options: LiveOptions,
    module: bool,
    command: list[str],
    on_note: Callable[[str], None] = lambda _: None,
) -> tuple[int, RunReport | None]:
    """Run the ranks under torchrun and wait; combine them here if no rank did (one was killed). The
    exit status, and the combined report when it was made here."""
    code = run_ranks(nproc, out, options, module, command)
    if (out / rundir.ANALYSIS_FILE).is_file() or not rundir.has_rank_traces(out):
        return code, None
    on_note("no rank combined the ranks (one ended early): combining them now")
    return code, combine_ranks(out, on_note)


def combine_ranks(out: Path, on_note: Callable[[str], None] = lambda _: None) -> RunReport | None:
    """The ranks of the run directory analyzed together, analysis.json written; None (and a note) when
    no rank left a trace or they could not be analyzed."""
    if not rundir.has_rank_traces(out):
        on_note(untraced_ranks(out))
        return None
    try:
        run = analyze_directory(out, all_reports=rundir.rank_count(out) <= FULL_REPORTS_MAX)
    except GpudoctorError as err:
        on_note(f"the ranks could not be analyzed together: {err}")
        return None
    report = replace(ranks_report(run, run.ranks[0]), alignment=alignment(out), run_dir=str(out))
    rundir.write_analysis(out, report.analysis_document() or {})
    return report


def untraced_ranks(out: Path) -> str:
    """Why no rank left a trace, and what to do: a script that ended before its traced phase is not
    run again under torchrun (every rank would have to start the script's process group anew): the
    phases that fit the steps it ran, as the options to pass."""
    records = rundir.rank_records(out)
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
    infos = rundir.rank_infos(out)
    world = max((i.get("world_size", 0) for i in infos.values()), default=0)
    phases = {r: i.get("phases", {}) for r, i in infos.items()}
    steps = {p for ph in phases.values() for p in ph}
    agreed = {p: sorted({ph.get(p) for ph in phases.values()} - {None}) for p in steps}
    return {
        "world_size": world,
        "ranks_seen": sorted(infos),
        "ranks_traced": rundir.traced_ranks(out, sorted(infos)),
        "phase_steps": {p: v[0] if len(v) == 1 else v for p, v in sorted(agreed.items())},
        "aligned": bool(phases) and all(len(v) == 1 for v in agreed.values()),
        "notes": {r: notes for r in sorted(infos) if (notes := _rank_notes(out, r, infos[r]))},
    }


def _rank_notes(out: Path, rank: int, info: dict[str, Any]) -> list[str]:
    """A rank's notes: its meetings' (rank.json) and its run's (record.json: a light phase that did not
    settle, a step that changed), each once."""
    record = rundir.read_record(rundir.rank_dir(out, rank))
    notes = [*info.get("notes", []), *(record.notes if record is not None else ())]
    return list(dict.fromkeys(notes))
