"""The ranks table that the terminal, HTML and Markdown reports all show, as text: its columns, each
rank's cells (with the value a sortable table sorts by), the slowest rank's mark, and the sentence on
it; the rows outliers first (with many ranks, only the furthest from the median and the detailed
rank), the collectives across ranks, and the findings about the run as a whole. Formatting only:
every figure comes from `analysis.ranks` / `analysis.across_ranks` as it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.analysis.across_ranks import AcrossRanks
from gpudoctor.analysis.rank_summary import TopFinding
from gpudoctor.analysis.ranks import HOST_IDLE_GAP, STRAGGLER_SPREAD, RankFigures, RankOverview
from gpudoctor.analysis.timeline import IDLE_CAUSES
from gpudoctor.report.style import IDLE_LABELS
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.util.units import fmt_bytes, fmt_pct, fmt_rate, fmt_us

if TYPE_CHECKING:
    from gpudoctor.doctor.ranks import RanksRun

MAX_ROWS = 16  # ranks shown in a table: the furthest from the median first, and the detailed one

WORK_NOTE = (
    "Outside comm.: the median step less its exposed communication (communication no compute "
    "overlaps), so computing, copying or idle. The rank that takes longest there arrives last at each "
    "collective; the others wait for it."
)


@dataclass(frozen=True)
class RanksView:
    """What a report shows of the ranks: the overview, each rank's top findings (in the order of
    `overview.ranks`), the rank the rest of the report details; with the ranks compared (`across`),
    the outliers first, the collectives' transfer rates and the findings about the run as a whole."""

    overview: RankOverview
    top_findings: tuple[TopFinding | None, ...]
    detailed: int
    across: AcrossRanks | None = None
    diagnosis: Diagnosis | None = None  # findings about the ranks together (rules.across)
    max_rows: int = MAX_ROWS

    def shown(self) -> list[int]:
        """Indices into `overview.ranks` of the rows to show, outliers first: all of them up to
        `max_rows`, else the furthest from the median, the slowest and the detailed rank."""
        ranks = self.overview.ranks
        order = list(range(len(ranks)))
        if self.across is not None:
            index = {r.rank: i for i, r in enumerate(ranks)}
            order = [index[r] for r in self.across.outliers if r in index]
        if len(order) <= self.max_rows:
            return order
        slowest = self.overview.slowest.rank if self.overview.slowest else None
        musts = [i for i in order if ranks[i].rank in (self.detailed, slowest)]
        rest = [i for i in order if i not in musts]
        keep = set(musts) | set(rest[: self.max_rows - len(musts)])
        return [i for i in order if i in keep]


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
        ("trace", lambda r: Cell(trace_name(r.path))),
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
    if view.across is not None and any(w is not None for w in view.across.wait_us):
        waits = dict(zip((r.rank for r in overview.ranks), view.across.wait_us, strict=True))
        columns.append(("comm. wait", lambda r: Cell(fmt_us(waits.get(r.rank)), waits.get(r.rank))))
    slowest = overview.slowest
    rows = []
    for i in view.shown():
        figures, top = overview.ranks[i], view.top_findings[i]
        mark = ""
        if slowest is not None and slowest.rank == figures.rank:
            mark = "straggler" if slowest.straggler else "slowest"
        cells = (*(f(figures) for _, f in columns), _top_finding(top))
        rows.append(RankRow(figures.rank, mark, cells, top.id if top is not None else "none"))
    return (*(h for h, _ in columns), "top finding"), rows


def trace_name(path: str) -> str:
    """A rank's trace as the table names it: its file name, with its rank-K/ folder in a run of several."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name.startswith("rank-") else p.name


def hidden_note(view: RanksView) -> str | None:
    """What the trimmed table leaves out, in one sentence; None when every rank is shown."""
    n, shown = len(view.overview.ranks), len(view.shown())
    if shown >= n:
        return None
    return (
        f"{n - shown} more ranks not shown: they are the closest to the median time outside communication "
        "(the distribution shows them all; `--json` lists every rank)."
    )


@dataclass(frozen=True)
class CollectiveRow:
    collective: str
    size: str
    calls: str
    transfer: str
    busbw: str
    link_share: str
    waited: str


COLLECTIVE_HEAD = (
    "collective",
    "message",
    "calls",
    "transfer",
    "bus bandwidth",
    "of the link",
    "longest wait",
)


def collective_rows(view: RanksView, limit: int = 8) -> list[CollectiveRow]:
    """The collectives matched across ranks: each call's transfer time is its shortest kernel over the
    ranks (the rank that waited for no one), its wait the longest kernel beyond that (medians)."""
    if view.across is None:
        return []
    return [
        CollectiveRow(
            f"{c.collective.replace('_', '-')} ×{c.group_size}",
            _size(c.bytes),
            f"{c.calls:,}",
            fmt_us(c.transfer_us),
            fmt_rate(c.busbw),
            fmt_pct(c.link_share),
            fmt_us(c.waited_us),
        )
        for c in view.across.collectives[:limit]
    ]


def _size(n: int) -> str:
    """Four significant figures: DDP's buckets differ by a few KB (32.03 MiB, 32.05 MiB), each its own row."""
    return f"{n / 2**20:.4g} MiB" if n >= 2**20 else fmt_bytes(n)


def link_note(view: RanksView) -> str | None:
    link = view.across.link if view.across is not None else None
    if link is None:
        return None
    return (
        f"Bus bandwidth as NCCL-tests defines it (all-reduce 2(n−1)/n × bytes / time, all-gather and "
        f"reduce-scatter (n−1)/n ×), against the link's {fmt_rate(link.bytes_per_s)} per direction: {link.source}."
    )


def slowest_sentence(overview: RankOverview) -> str | None:
    """What the table says about the slowest rank, in one or two sentences; None with one rank."""
    s = overview.slowest
    if s is None:
        return None
    spread = f"{s.spread * 100:+.1f}%"
    what = "of GPU work (compute and copies)" if s.paced_by == "gpu" else "outside communication"
    if s.gpu_idle is not None and s.others_gpu_idle is not None:  # judged by the unprofiled utilization
        idle = (
            f"unprofiled its GPU idled {s.gpu_idle:.0%} of the step waiting for its host, the other ranks' "
            f"{s.others_gpu_idle:.0%} (NVML, the light phase)"
        )
        if s.straggler:
            text = f"Rank {s.rank} is the straggler: {idle}."
        else:
            text = f"The ranks are balanced: in the trace the slowest is rank {s.rank}; {idle}" + (
                ", its host pacing the run by no more own host work than the others'."
                if s.gpu_idle - s.others_gpu_idle >= HOST_IDLE_GAP
                else "."
            )
        text += f" In the trace: {fmt_us(s.work_us)} per step {what}, {spread} against the others' median"
        text += f" ({fmt_us(s.others_work_us)})" + (
            f"; rank {s.traced_rank} looked the slowest there, the profiler's doing."
            if s.traced_rank is not None
            else "."
        )
    else:
        if s.straggler:
            head = f"Rank {s.rank} is the straggler"
        else:
            head = f"The ranks are balanced (within {STRAGGLER_SPREAD:.0%}); the slowest is rank {s.rank}"
        text = (
            f"{head}: {fmt_us(s.work_us)} per step {what}, {spread} against the other "
            f"ranks' median ({fmt_us(s.others_work_us)})."
        )
    if s.paced_by == "gpu":
        return text + (
            f" Unprofiled, the GPUs pace the {fmt_us(s.unprofiled_step_us)} step: the profiler's cost on the "
            "hosts changes which rank waits in the trace, not which one the others wait for."
        )
    if s.catch_up_us is not None:
        text += (
            f" Unprofiled, at most {fmt_us(s.catch_up_us)} of the {fmt_us(s.unprofiled_step_us)} step would go "
            "if it caught up (the step less the heaviest GPU's work and the transfer"
            + (
                ", its GPU's idle beyond the others', and its own host time beyond theirs"
                if s.gpu_idle is not None
                else ""
            )
            + ")."
        )
    if s.traced_rank is not None:  # the trace's waits are of the rank the profiler slowed
        return text
    if s.comm_wait_us is None:
        # a CPU run's collectives (gloo's all-reduce ops) hold their waits inside the step, with no
        # kernel of their own to tell waiting from working
        return text + (
            " No rank has GPU communication kernels in its trace (gloo's collectives on the CPU are inside"
            " each rank's step): a rank's wait for the others cannot be told from its work."
        )
    if s.straggler:
        return text + (
            f" The other ranks spend {fmt_us(s.comm_wait_us)} more per step in exposed communication "
            "than it does: waiting for it in the collectives."
        )
    return text + f" The others' exposed communication beyond its own: {fmt_us(s.comm_wait_us)} per step."


def _share(share: float | None) -> Cell:
    return Cell(fmt_pct(share), share)


def _top_finding(f: TopFinding | None) -> Cell:
    if f is None:
        return Cell("none")
    saving = f" (up to {f.est_saving_pct:g}%)" if f.est_saving_pct > 0 else ""
    return Cell(f.id + saving, hint=f.title)


def view_of(run: RanksRun, detailed: int) -> RanksView:
    """What the reports show of a run's ranks, `detailed` the rank they detail."""
    return RanksView(
        run.across.overview,
        tuple(s.top_findings[0] if s.top_findings else None for s in run.summaries),
        detailed,
        run.across,
        run.diagnosis,
    )
