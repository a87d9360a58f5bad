"""A directory of many rank traces: the per-rank stage runs in a pool of processes and gives what it
gives in this process; the reports show the ranks outliers first, the table trimmed, every rank in
the distribution plot; the engines that need a cluster say so when it is not installed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import TRACES_DIR, write_json
from gpudoctor.cli.main import app
from gpudoctor.doctor.rank_pool import jobs_for, run_jobs
from gpudoctor.report.ranks_view import MAX_ROWS
from gpudoctor.runner.rundir import rank_files
from gpudoctor.util.errors import UsageError

DDP = Path(__file__).parent / "fixtures" / "ddp"
WORKER_COST = ("seconds", "peak_rss_bytes")


def comparable(summary: Any) -> dict[str, Any]:
    return {k: v for k, v in summary.to_json().items() if k not in WORKER_COST}


def test_a_pool_of_processes_gives_what_this_process_gives() -> None:
    jobs = jobs_for(rank_files(DDP), None, True, 15)
    serial = run_jobs(jobs, 1, "serial")
    pooled = run_jobs(jobs, 2, "processes")
    assert [comparable(r.summary) for r in pooled] == [comparable(r.summary) for r in serial]
    assert [r.report[1].to_json() for r in pooled] == [r.report[1].to_json() for r in serial]  # type: ignore[index]
    # each worker says what it cost: its time and its peak memory
    assert all(r.summary.seconds and r.summary.peak_rss_bytes for r in pooled)


def test_engines_that_need_a_cluster_say_how_to_get_one() -> None:
    pytest.importorskip("torch")  # any environment: ray and dask are extras, not installed for the tests
    for engine in ("ray", "dask"):
        try:
            __import__("ray" if engine == "ray" else "dask.distributed")
        except ImportError:
            with pytest.raises(UsageError, match=r"gpudoctor\[cluster\]"):
                run_jobs(jobs_for(rank_files(DDP), None, False, 15), 1, engine)
    with pytest.raises(UsageError, match="unknown engine"):
        run_jobs([], 1, "spark")


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twenty ranks: nineteen copies of one recording, and rank 13 waiting on its data loader."""
    import gzip

    folder = tmp_path_factory.mktemp("many")
    docs = {}
    for name in ("sync_every_step", "dataloader_bound"):
        with gzip.open(TRACES_DIR / f"{name}.json.gz") as f:
            docs[name] = json.loads(f.read())
    for rank in range(20):
        doc = docs["dataloader_bound" if rank == 13 else "sync_every_step"]
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 20}
        write_json(folder / f"rank{rank:02d}.json", doc, compact=True)
    return folder


def test_the_ranks_table_shows_outliers_first_and_is_trimmed(many: Path, tmp_path: Path) -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["report", str(many), "-f", "md", "-o", str(tmp_path / "r.md")]
    )
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r.md").read_text()
    rows = [line for line in md[md.index("### Ranks") :].splitlines() if re.match(r"\| \d", line)]
    # the straggler first, then the table stops at MAX_ROWS with rank 0 (the detailed one) among them
    assert rows[0].startswith("| 13 **straggler** |")
    assert len(rows) == MAX_ROWS and any(r.startswith("| 0 |") for r in rows)
    assert f"{20 - MAX_ROWS} more ranks not shown" in md


def test_the_html_plots_every_rank_and_marks_the_straggler(many: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(many), "-o", str(tmp_path / "r.html"), "--rank", "13"])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    section = re.search(r'<section id="ranks">.*?</section>', page, re.S).group(0)
    plot = section[section.index("Time outside communication, every rank") :]
    assert plot.count("<circle") == 20
    assert plot.count('fill="#d62728"') == 1 and "<title>rank 13:" in plot
    assert "Rank 13 is the straggler" in section


def test_a_directory_of_run_folders_is_read_like_one_of_files(tmp_path: Path) -> None:
    # GIVEN the rank-K/ layout of gpudoctor run under torchrun (trace.json.gz beside rank.json)
    for rank in (0, 1):
        folder = tmp_path / f"rank-{rank}"
        folder.mkdir()
        shutil.copy(DDP / f"rank{rank}.json.gz", folder / "trace.json.gz")
        (folder / "rank.json").write_text("{}")
    files = rank_files(tmp_path)
    assert [(f.rank, f.trace.name) for f in files] == [(0, "trace.json.gz"), (1, "trace.json.gz")]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["analyze", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "rank-1/trace.json.gz" in result.output and "Rank 1 is a straggler: host work" in result.output
