"""Several ranks side by side: each rank's figures, the slowest rank and what the others wait on it
(`analysis.ranks`), and how `gpudoctor report` and `analyze` show them — HTML, Markdown, a saved
gpudoctor.ranks/1 document, `--rank`. On recorded traces given ranks, and on a real 2-GPU DDP run."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from conftest import write_json
from gpudoctor.analysis.ranks import HOST_IDLE_GAP, RankFigures, RankOverview, rank_overview, rank_overview_of
from gpudoctor.analysis.summary import analyze
from gpudoctor.cli.main import app
from gpudoctor.doctor.document import RANKS_SCHEMA
from gpudoctor.trace import load_traces

DDP = Path(__file__).parent / "fixtures" / "ddp"


def run(*args: str | Path) -> Result:
    return CliRunner(env={"COLUMNS": None}).invoke(app, [str(a) for a in args])


def write_ranks(folder: Path, trace_doc: Any, names: tuple[str, ...]) -> Path:
    """A directory of rank traces: fixture `names[r]` as rank r, its distributedInfo saying so."""
    for rank, name in enumerate(names):
        doc = trace_doc(name)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": len(names)}
        write_json(folder / f"worker{rank}.json", doc)
    return folder


@pytest.fixture
def twins(tmp_path: Path, trace_doc: Any) -> Path:
    """Two ranks that did the same work: one recording, given ranks 0 and 1."""
    return write_ranks(tmp_path / "twins", trace_doc, ("sync_every_step", "sync_every_step"))


@pytest.fixture
def straggling(tmp_path: Path, trace_doc: Any) -> Path:
    """Rank 1 waits on its data loader: its step takes ~5x rank 0's."""
    return write_ranks(tmp_path / "straggling", trace_doc, ("sync_every_step", "dataloader_bound"))


def overview_of(folder: Path) -> RankOverview:
    return rank_overview([analyze(t) for t in load_traces(folder)])


def ranks_section(page: str) -> str:
    m = re.search(r'<section id="ranks">.*?</section>', page, re.S)
    assert m, "no ranks section"
    return m.group(0)


# --- the figures --------------------------------------------------------------------------------


def test_each_rank_has_its_step_time_busy_shares_and_idle_by_cause(twins: Path) -> None:
    overview = overview_of(twins)
    assert [r.rank for r in overview.ranks] == [0, 1]
    r = overview.ranks[0]
    assert r.steps == 3 and r.step_p50_us == pytest.approx(16504, rel=1e-3)
    assert r.busy_fraction == pytest.approx(0.945, abs=1e-3)
    # Busy kinds are exclusive and sum to busy; busy and idle by cause fill the window.
    assert r.compute_share + r.communication_share + r.copy_share == pytest.approx(r.busy_fraction)
    assert r.busy_fraction + sum(r.idle_share_by_cause.values()) == pytest.approx(1.0)
    assert r.communication_share == 0 and r.work_us == r.step_p50_us  # no communication: all work
    assert overview.ranks[1] == dataclasses.replace(r, rank=1, path=overview.ranks[1].path)


def test_ranks_that_did_the_same_work_are_balanced(twins: Path) -> None:
    slowest = overview_of(twins).slowest
    assert slowest is not None
    assert (slowest.rank, slowest.spread, slowest.straggler) == (0, 0.0, False)  # the first of equals
    assert slowest.comm_wait_us is None  # nothing communicates


def test_the_rank_furthest_behind_is_the_straggler_with_its_spread(straggling: Path) -> None:
    overview = overview_of(straggling)
    slowest = overview.slowest
    assert slowest is not None and slowest.rank == 1 and slowest.straggler
    fast, slow = overview.ranks
    assert slowest.spread == pytest.approx(slow.step_p50_us / fast.step_p50_us - 1)
    assert slowest.spread > 3  # 81.5 ms against 16.5 ms
    assert slow.idle_share_by_cause["host_wait"] > 0.9


def test_one_rank_has_no_slowest() -> None:
    trace = load_traces(Path(__file__).parent / "fixtures" / "traces" / "sync_every_step.json.gz")[0]
    assert rank_overview([analyze(trace)]).slowest is None


@pytest.mark.skipif(not (DDP / "rank1.json.gz").exists(), reason="the DDP recording is not present")
def test_ddp_ranks_communicate_and_the_planted_straggler_is_found() -> None:
    # GIVEN two DDP ranks (NCCL all-reduce) where rank 1 does extra host work in every step
    manifest = json.loads((DDP / "manifest.json").read_text())
    planted = max(manifest["ranks"].values(), key=lambda r: r["straggler_ms"])["rank"]
    overview = overview_of(DDP)
    # THEN both ranks communicate, their step times agree (the all-reduce syncs them) ...
    assert all(r.communication_share and r.communication_share > 0 for r in overview.ranks)
    slow = next(r for r in overview.ranks if r.rank == planted)
    fast = next(r for r in overview.ranks if r.rank != planted)
    assert math.isclose(fast.step_p50_us, slow.step_p50_us, rel_tol=0.1)
    # ... and yet the straggler is the planted rank: the other waits on it in the all-reduce
    slowest = overview.slowest
    assert slowest is not None and slowest.rank == planted and slowest.straggler
    assert fast.communication_share > slow.communication_share
    assert slowest.comm_wait_us == pytest.approx(fast.communication_us - slow.communication_us)
    assert slowest.comm_wait_us > 0.25 * fast.step_p50_us


# --- the reports --------------------------------------------------------------------------------


def test_html_report_shows_the_ranks_after_the_findings_and_details_the_first(
    straggling: Path, tmp_path: Path
) -> None:
    result = run("report", straggling, "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert "rank 0 of 2 ranks in detail; straggler: rank 1, see it with --rank 1" in result.stdout
    page = (tmp_path / "r.html").read_text()
    section = ranks_section(page)
    assert page.index('id="diagnosis"') < page.index('id="ranks"') < page.index('id="steps"')
    assert section.count("<tr") == 3  # the header and one row per rank
    assert '<tr class="straggler"><td data-v="1">1 <span class="badge critical">straggler</span>' in section
    assert '<tr aria-current="true"><td data-v="0">0</td>' in section  # rank 0 is detailed below
    assert "Rank 1 is the straggler" in section and "+394.0%" in section
    assert "input_pipeline (up to" in section and "tensor_cores_unused (up to" in section
    assert 'gpudoctor <span class="file">worker0.json</span>' in page
    data = json.loads(re.search(r'id="gpudoctor-data">(.*?)</script>', page).group(1))
    assert data["ranks"]["slowest"]["rank"] == 1 and data["ranks"]["detailed"] == 0


def test_rank_option_details_that_rank(straggling: Path, tmp_path: Path) -> None:
    result = run("report", straggling, "--rank", "1", "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    assert 'gpudoctor <span class="file">worker1.json</span>' in page
    assert '<tr class="straggler" aria-current="true">' in ranks_section(page)
    assert 'class="fid">input_pipeline<' in page  # rank 1's findings
    # The annotated trace is of one rank: the one asked for
    assert run("report", straggling, "--rank", "1", "-f", "trace", "-o", tmp_path / "a.json").exit_code == 0
    assert json.loads((tmp_path / "a.json").read_text())["distributedInfo"]["rank"] == 1


def test_unknown_rank_is_a_one_line_error(straggling: Path, tmp_path: Path) -> None:
    for fmt in ("html", "md", "trace"):
        result = run("report", straggling, "--rank", "7", "-f", fmt, "-o", tmp_path / "r.out")
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.strip() == "gpudoctor: error: no rank 7 among the traces (ranks: 0, 1)"
    assert not (tmp_path / "r.out").exists()


def test_a_saved_ranks_document_renders_the_same_ranks(straggling: Path, tmp_path: Path) -> None:
    # GIVEN `gpudoctor analyze DIR --json` saved
    saved = tmp_path / "ranks.json"
    saved.write_text(run("analyze", straggling, "--json").stdout)
    assert json.loads(saved.read_text())["schema"] == RANKS_SCHEMA
    # WHEN it is reported, and the directory too
    for source, name in ((saved, "saved.html"), (straggling, "dir.html")):
        assert run("report", source, "--rank", "1", "-o", tmp_path / name).exit_code == 0
    # THEN the same ranks section, and the detailed rank's timeline (its trace is where it was)
    saved_page, dir_page = ((tmp_path / n).read_text() for n in ("saved.html", "dir.html"))
    assert ranks_section(saved_page) == ranks_section(dir_page)
    assert 'aria-label="GPU timeline of one step"' in saved_page
    assert 'gpudoctor <span class="file">worker1.json</span>' in saved_page


def test_markdown_has_the_ranks_table(straggling: Path, tmp_path: Path) -> None:
    result = run("report", straggling, "-f", "md", "-o", tmp_path / "r.md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r.md").read_text()
    assert "rank 0 of 2 ranks" in md.splitlines()[2]
    ranks = md[md.index("### Ranks") : md.index("### Key figures")]
    assert "**Rank 1 is the straggler: 81.5 ms per step outside communication, +394.0%" in ranks
    rows = [line for line in ranks.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| rank | trace | steps | step p50 | GPU busy | compute | comm. | copies |")
    assert rows[1].startswith("| 0 | worker0.json | 3 | 16.5 ms | 94.5% |")
    assert rows[2].startswith("| 1 **straggler** | worker1.json | 3 | 81.5 ms |")
    assert rows[2].endswith("| input\\_pipeline (up to 90.1%) |")
    assert all(row.count("|") == rows[0].count("|") for row in rows)


def test_a_trace_file_name_is_escaped_in_the_ranks_table(tmp_path: Path, trace_doc: Any) -> None:
    folder = write_ranks(tmp_path / "crafted", trace_doc, ("sync_every_step", "sync_every_step"))
    (folder / "worker1.json").rename(folder / "<img src=x onerror=alert(1)>|*_rank1.json")
    assert run("report", folder, "-o", tmp_path / "r.html").exit_code == 0
    section = ranks_section((tmp_path / "r.html").read_text())
    assert "<img" not in section and "&lt;img src=x onerror=alert(1)&gt;|*_rank1.json" in section
    assert run("report", folder, "-f", "md", "-o", tmp_path / "r.md").exit_code == 0
    md = (tmp_path / "r.md").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;\\|\\*\\_rank1.json" in md and "<img" not in md


def test_analyze_prints_the_same_ranks_before_the_detail(straggling: Path, tmp_path: Path) -> None:
    result = run("analyze", straggling, "--html", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    overview, _, detail = result.stdout.partition("below: rank 0 in detail")
    assert "2 ranks" in overview and "1 ◀" in overview
    assert "Rank 1 is the straggler: 81.5 ms per step outside communication, +394.0%" in " ".join(
        overview.split()
    )
    assert "input_pipeline" in overview and "gpudoctor worker0.json" in detail
    assert "2 ranks" not in run("analyze", straggling / "worker0.json").stdout
    assert "Rank 1 is the straggler" in ranks_section((tmp_path / "r.html").read_text())  # --html too


def test_a_single_trace_has_no_ranks_section(tmp_path: Path) -> None:
    trace = Path(__file__).parent / "fixtures" / "traces" / "sync_every_step.json.gz"
    assert run("report", trace, "-o", tmp_path / "r.html").exit_code == 0
    assert 'id="ranks"' not in (tmp_path / "r.html").read_text()
    assert run("report", trace, "-f", "md", "-o", tmp_path / "r.md").exit_code == 0
    assert "### Ranks" not in (tmp_path / "r.md").read_text()


@pytest.mark.skipif(not (DDP / "rank1.json.gz").exists(), reason="the DDP recording is not present")
def test_ddp_report_marks_the_straggler_and_the_wait_on_it(tmp_path: Path) -> None:
    result = run("report", DDP, "-f", "md", "-o", tmp_path / "r.md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r.md").read_text()
    assert "**Rank 1 is the straggler:" in md
    assert "more per step in exposed communication than it does: waiting for it in the collectives." in md
    assert "| 1 **straggler** | rank1.json.gz |" in md


def _figures(rank: int, work_us: float, comm_us: float, gpu_work_us: float = 15_000.0) -> RankFigures:
    return RankFigures(
        rank=rank, path=f"rank-{rank}", steps=3, step_p50_us=work_us + comm_us, busy_fraction=0.5,
        compute_share=0.4, communication_share=0.1, copy_share=0.0, idle_share_by_cause={},
        work_us=work_us, communication_us=comm_us, gpu_work_us=gpu_work_us,
    )  # fmt: skip


# In the trace rank 0 is far longer outside communication (the profiler slowed its host); unprofiled the
# step (40 ms) is more than the GPU floor (15 ms of GPU work and the transfer): a host paces it.
TRACED = [_figures(0, 78_000.0, 500.0), _figures(1, 32_000.0, 46_000.0)]


def test_the_unprofiled_utilization_names_the_rank_whose_gpu_waits_for_its_host() -> None:
    # GIVEN rank 1's GPU idle 55% of the unprofiled step, rank 0's 4%
    s = rank_overview_of(TRACED, 40_000.0, [0.96, 0.45]).slowest
    # THEN rank 1 is the straggler, the trace's rank 0 kept as what the trace said, and the saving is at
    # most rank 1's idle beyond the other's (51% of the step), below the step less the GPU floor
    assert s is not None and s.rank == 1 and s.straggler and s.traced_rank == 0
    assert s.paced_by == "host"
    assert s.catch_up_us == pytest.approx(min(40_000.0 - 15_500.0, (0.55 - 0.04) * 40_000.0))


def test_a_traced_host_excess_far_below_the_unprofiled_idle_gap_bounds_the_saving_and_is_said() -> None:
    # GIVEN rank 1's GPU idle 55% unprofiled, rank 0's 4%, but rank 1's own host time as traced only
    # 4 ms beyond rank 0's (a busy machine stretched rank 0's host in the trace; seen on 2 GPUs of a
    # shared 4 × H200 host: 3.9 ms traced against 18.4 ms of idle, about 41% of the step measured)
    s = rank_overview_of(TRACED, 40_000.0, [0.96, 0.45], [20_000.0, 24_000.0]).slowest
    # THEN the estimate keeps the smaller figure, and the larger one the unprofiled run allows is kept
    assert s is not None and s.rank == 1 and s.straggler
    assert s.catch_up_us == pytest.approx(4_000.0)
    assert s.unprofiled_bound_us == pytest.approx((0.55 - 0.04) * 40_000.0)


def test_ranks_whose_gpus_idle_alike_unprofiled_are_balanced_whatever_the_trace_says() -> None:
    # GIVEN both GPUs 83% and 81% busy in the light phase, however far apart the trace puts the ranks
    s = rank_overview_of(TRACED, 40_000.0, [0.83, 0.81]).slowest
    # THEN no straggler; the trace's slowest is the one shown, with at most its idle beyond the other's
    assert s is not None and not s.straggler and s.rank == 0 and s.traced_rank is None
    assert s.gpu_idle - s.others_gpu_idle < HOST_IDLE_GAP
    assert s.catch_up_us <= max(s.gpu_idle - s.others_gpu_idle, 0.0) * 40_000.0 + 1e-6


def test_without_every_ranks_utilization_the_trace_decides() -> None:
    # GIVEN one rank with no NVML record
    s = rank_overview_of(TRACED, 40_000.0, [0.96, None]).slowest
    # THEN the trace's slowest, bounded by the step less the GPU floor and the others' traced wait
    assert s is not None and s.rank == 0 and s.straggler and s.gpu_idle is None
    assert s.catch_up_us == pytest.approx(min(40_000.0 - 15_500.0, s.comm_wait_us))


def test_a_rank_that_watched_every_gpu_gives_no_utilization_of_its_own() -> None:
    from gpudoctor.analysis.rank_summary import Clocks

    one = {"index": 1, "samples": 20, "gpu_util_mean_pct": 45.0, "sm_clock_busy_mean_mhz": 1980.0}
    # GIVEN the NVML summary of a rank that watched only its own GPU, and of one that watched all of them
    mine = Clocks.from_nvml_summary({"devices": [one]})
    every = Clocks.from_nvml_summary({"devices": [{**one, "index": 0, "gpu_util_mean_pct": 99.0}, one]})
    # THEN only the first says how busy the rank's GPU was; too few samples say nothing either
    assert mine is not None and mine.util_mean_pct == 45.0
    assert every is not None and every.util_mean_pct is None
    few = Clocks.from_nvml_summary({"devices": [{**one, "samples": 2}]})
    assert few is not None and few.util_mean_pct is None


def test_ranks_traced_without_a_gpu_name_no_straggler_from_their_step_times() -> None:
    # GIVEN two CPU ranks (gloo, no GPU window) of a balanced DDP loop: each step holds the wait for the
    # other, and the medians of 5 traced steps came out 4.38 and 5.15 ms
    cpu = [
        dataclasses.replace(_figures(r, us, 0.0), busy_fraction=None, communication_share=None, communication_us=None,
                gpu_work_us=None)
        for r, us in ((0, 4_380.0), (1, 5_150.0))
    ]  # fmt: skip
    s = rank_overview_of(cpu).slowest
    # THEN the slower median is shown, but no straggler is named on it
    assert s is not None and s.rank == 1 and s.spread == pytest.approx(5_150 / 4_380 - 1) and not s.straggler
    # AND the sentence says why the wait is not told apart, not that the ranks have no communication
    from gpudoctor.report.ranks_view import slowest_sentence

    said = slowest_sentence(rank_overview_of(cpu)) or ""
    assert "No rank has GPU communication kernels" in said and "gloo" in said
    # AND ranks whose time outside communication is known still name one
    assert rank_overview_of([_figures(0, 20_000.0, 9_000.0), _figures(1, 29_000.0, 200.0)]).slowest.straggler
