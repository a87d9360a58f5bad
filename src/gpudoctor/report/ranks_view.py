"""The ranks table that the terminal, HTML and Markdown reports all show, as text: its columns, each
rank's cells (with the value a sortable table sorts by), the slowest rank's mark, and the sentence on
it. Formatting only: every figure comes from `analysis.ranks.RankOverview` as it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.analysis.ranks import STRAGGLER_SPREAD, RankFigures, RankOverview
from gpudoctor.analysis.timeline import IDLE_CAUSES
from gpudoctor.report.style import IDLE_LABELS
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.util.units import fmt_pct, fmt_us

WORK_NOTE = (
    "Outside comm.: the median step less its exposed communication (communication no compute "
    "overlaps), so computing, copying or idle. The rank that takes longest there arrives last at each "
    "collective; the others wait for it."
)


@dataclass(frozen=True)
class RanksView:
    """What a report shows of the ranks: the overview, each rank's diagnosis (in the order of
    `overview.ranks`), and the rank the rest of the report details."""

    overview: RankOverview
    diagnoses: tuple[Diagnosis, ...]
    detailed: int


@dataclass(frozen=True)
class Cell:
    text: str
    sort: float | None = None  # what a sortable table sorts by; None: a text column
    hint: str = ""  # the longer text behind a short cell (the finding's title)


@dataclass(frozen=True)
class RankRow:
    rank: int
    mark: str  # "straggler", "slowest" or ""
    cells: tuple[Cell, ...]  # one per column; the last: the top finding's id and what it may save
    top_finding: str  # its id alone ("none" without findings), where space is short


def rank_table(view: RanksView) -> tuple[tuple[str, ...], list[RankRow]]:
    """The header and one row per rank. Idle causes no rank has are left out."""
    overview = view.overview
    causes = [c for c in IDLE_CAUSES if any(r.idle_share_by_cause.get(c) for r in overview.ranks)]
    columns: list[tuple[str, Callable[[RankFigures], Cell]]] = [
        ("rank", lambda r: Cell(str(r.rank), r.rank)),
        ("trace", lambda r: Cell(Path(r.path).name)),
        ("steps", lambda r: Cell(f"{r.steps:,}", r.steps)),
        ("step p50", lambda r: Cell(fmt_us(r.step_p50_us), r.step_p50_us)),
        ("GPU busy", lambda r: _share(r.busy_fraction)),
        ("compute", lambda r: _share(r.compute_share)),
        ("comm.", lambda r: _share(r.communication_share)),
        ("copies", lambda r: _share(r.copy_share)),
        *(
            (f"idle {IDLE_LABELS.get(c, c)}", lambda r, c=c: _share(r.idle_share_by_cause.get(c)))
            for c in causes
        ),
        ("outside comm.", lambda r: Cell(fmt_us(r.work_us), r.work_us)),
    ]
    slowest = overview.slowest
    rows = []
    for figures, diagnosis in zip(overview.ranks, view.diagnoses, strict=True):
        mark = ""
        if slowest is not None and slowest.rank == figures.rank:
            mark = "straggler" if slowest.straggler else "slowest"
        cells = (*(f(figures) for _, f in columns), _top_finding(diagnosis))
        top = diagnosis.findings[0].id if diagnosis.findings else "none"
        rows.append(RankRow(figures.rank, mark, cells, top))
    return (*(h for h, _ in columns), "top finding"), rows


def slowest_sentence(overview: RankOverview) -> str | None:
    """What the table says about the slowest rank, in one or two sentences; None with one rank."""
    s = overview.slowest
    if s is None:
        return None
    spread = f"{s.spread * 100:+.1f}%"
    if s.straggler:
        head = f"Rank {s.rank} is the straggler"
    else:
        head = f"The ranks are balanced (within {STRAGGLER_SPREAD:.0%}); the slowest is rank {s.rank}"
    text = (
        f"{head}: {fmt_us(s.work_us)} per step outside communication, {spread} against the other "
        f"ranks' median ({fmt_us(s.others_work_us)})."
    )
    if s.comm_wait_us is None:
        return text + " No rank has communication kernels in its trace."
    if s.straggler:
        return text + (
            f" The other ranks spend {fmt_us(s.comm_wait_us)} more per step in exposed communication "
            "than it does: waiting for it in the collectives."
        )
    return text + f" The others' exposed communication beyond its own: {fmt_us(s.comm_wait_us)} per step."


def _share(share: float | None) -> Cell:
    return Cell(fmt_pct(share), share)


def _top_finding(d: Diagnosis) -> Cell:
    if not d.findings:
        return Cell("none")
    f = d.findings[0]
    saving = f" (up to {f.est_saving_pct:g}%)" if f.est_saving_pct > 0 else ""
    return Cell(f.id + saving, hint=f.title)
