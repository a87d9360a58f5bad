"""Several ranks, for `analyze` and `report` on a directory and for `gpudoctor run` under torchrun: the
per-rank stage (`doctor.rank_pool`), the reduce over the ranks' summaries (`analysis.across_ranks`), the
ranks that wait for a straggler diagnosed again at their own pace, the findings about the run as a whole
(`rules.across`), and the combined document (`gpudoctor.ranks/1`: every rank's summary, and whole reports
up to `FULL_REPORTS_MAX` ranks, else the first's and the slowest's)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpudoctor.analysis.across_ranks import AcrossRanks, across_ranks, own_pace_us
from gpudoctor.analysis.rank_summary import RankSummary, TopFinding, summarize_rank
from gpudoctor.doctor.document import RANKS_SCHEMA, Report, report_json
from gpudoctor.doctor.pipeline import diagnose_again
from gpudoctor.doctor.rank_pool import SERIAL_BELOW, RankJob, default_workers, jobs_for, run_jobs
from gpudoctor.rules.across import diagnose_ranks
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.rundir import rank_files
from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES, same_rank_advice
from gpudoctor.util.errors import TraceFormatError, UsageError

FULL_REPORTS_MAX = 64


@dataclass(frozen=True)
class RanksRun:
    """The ranks of one directory, analyzed: every rank's summary (by rank), the whole report of some
    (by rank), the ranks compared and what is found about them together."""

    summaries: tuple[RankSummary, ...]
    reports: dict[int, Report]
    across: AcrossRanks
    diagnosis: Diagnosis
    trace_paths: dict[int, str]

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.summaries]


def analyze_directory(
    path: Path,
    *,
    unprofiled_us: float | None = None,
    detailed: int | None = None,
    all_reports: bool = False,
    workers: int | None = None,
    engine: str = "auto",
    top: int = 15,
    max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES,
) -> RanksRun:
    """Analyze every rank of a directory. The whole report comes back for every rank with
    `all_reports`, else for the rank to detail (`detailed`, default the first) and the slowest."""
    files = rank_files(path)
    if not files:
        raise TraceFormatError(f"{path}: no trace files (*.json, *.json.gz) in this directory")
    jobs = jobs_for(files, unprofiled_us, True if all_reports else {0}, top, max_bytes)
    results = run_jobs(jobs, workers, engine)
    if not results:
        others = ", ".join(f.trace.name for f in files)
        raise TraceFormatError(
            f"{path}: no trace files (*.json, *.json.gz) in this directory ({others}: JSON of another kind)"
        )
    results.sort(key=lambda r: r.summary.rank)
    for a, b in itertools.pairwise(results):
        if a.summary.rank == b.summary.rank:
            names = f"{Path(a.summary.path).name} and {Path(b.summary.path).name}"
            raise TraceFormatError(
                f"{path}: {names} both claim rank {a.summary.rank}: "
                + same_rank_advice(a.summary.world_size is None and b.summary.world_size is None)
            )
    summaries = tuple(r.summary for r in results)
    reports = {r.summary.rank: r.report for r in results if r.report is not None}
    across = across_ranks(summaries)
    slowest = across.overview.slowest
    wanted = {summaries[0].rank if detailed is None else detailed, *([slowest.rank] if slowest else [])}
    by_path = {j.trace: j for j in jobs}
    missing = [by_path[s.path] for s in summaries if s.rank in wanted and s.rank not in reports]
    # a load more for each, where the others ran: a parent that reads no trace stays small
    many = len(results) >= SERIAL_BELOW and (workers or default_workers(len(results))) > 1
    again = engine if engine != "auto" else ("processes" if many else "serial")
    for r in run_jobs([_full(j, True) for j in missing], max(len(missing), 1), again):
        reports[r.summary.rank] = r.report  # type: ignore[assignment]
    paths = {s.rank: s.path for s in summaries}
    summaries = at_own_pace(summaries, reports, across)
    return RanksRun(summaries, reports, across, diagnose_ranks(across, summaries), paths)


def at_own_pace(
    summaries: tuple[RankSummary, ...], reports: dict[int, Report], across: AcrossRanks
) -> tuple[RankSummary, ...]:
    """The reports of ranks that wait for a straggler diagnosed again against their own pace (the
    unprofiled step less that wait: `own_pace_us`), in place, and their summaries' top findings with
    them; the summaries, updated."""
    out = []
    for summary in summaries:
        own = own_pace_us(across, summary)
        if own is not None and summary.rank in reports:
            a, d = diagnose_again(reports[summary.rank][0], unprofiled_us=own)
            reports[summary.rank] = (a, d)
            tops = tuple(TopFinding(f.id, f.est_saving_pct, f.title) for f in d.findings[:3])
            summary = replace(summary, top_findings=tops)
        out.append(summary)
    return tuple(out)


def ranks_from_reports(reports: Sequence[Report], saved: dict[str, Any] | None = None) -> RanksRun:
    """The same from whole reports (a saved gpudoctor.ranks/1 document): its summaries where it has
    them, else made from the reports."""
    summaries: tuple[RankSummary, ...]
    if saved and isinstance(saved.get("summaries"), list):
        summaries = tuple(RankSummary.from_json(s) for s in saved["summaries"])
    else:
        summaries = tuple(
            summarize_rank(a, (top,) if (top := top_finding(d)) is not None else ()) for a, d in reports
        )
    across = across_ranks(summaries)
    by_rank = {a.trace.rank: (a, d) for a, d in reports}
    return RanksRun(
        summaries, by_rank, across, diagnose_ranks(across, summaries), {s.rank: s.path for s in summaries}
    )


def combined_doc(run: RanksRun) -> dict[str, Any]:
    """The gpudoctor.ranks/1 document: the whole reports kept, every summary, the findings about the
    ranks together."""
    keep = sorted(run.reports) if len(run.summaries) <= FULL_REPORTS_MAX else _first_and_slowest(run)
    reports = [run.reports[r] for r in keep if r in run.reports]
    doc = report_json(reports) if reports else {"schema": RANKS_SCHEMA, "ranks": []}
    if doc.get("schema") != RANKS_SCHEMA:  # one report: still a document of several ranks
        doc = {"schema": RANKS_SCHEMA, "ranks": [doc]}
    doc["summaries"] = [s.to_json() for s in run.summaries]
    doc["across"] = run.diagnosis.to_json()
    return doc


def check_rank(run: RanksRun, rank: int | None) -> int:
    """The rank to detail: `rank` if it is there (else a user error naming those there are), else the first."""
    if rank is None:
        return run.ranks[0]
    if rank not in run.ranks:
        raise UsageError(f"no rank {rank} among the traces (ranks: {', '.join(map(str, run.ranks))})")
    return rank


def top_finding(d: Diagnosis) -> TopFinding | None:
    """A rank's first finding as its summary keeps it."""
    first = d.findings[0] if d.findings else None
    return TopFinding(first.id, first.est_saving_pct, first.title) if first is not None else None


def _first_and_slowest(run: RanksRun) -> list[int]:
    slowest = run.across.overview.slowest
    return sorted({run.ranks[0], *([slowest.rank] if slowest else [])})


def _full(job: RankJob, full: bool) -> RankJob:
    return replace(job, full=full)
