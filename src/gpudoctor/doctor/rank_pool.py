"""The per-rank stage of the doctor on a directory of rank traces, in parallel: each task loads one rank's
trace, analyzes and diagnoses it, and sends back its `RankSummary` (a few KB), and for the ranks asked
for its whole report, so the parent holds summaries, not traces. Engines: `serial`, `processes` (a worker
holds one trace at a time), `ray` and `dask` (an existing cluster, where the files live); results come
back as plain JSON whichever ran them."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.analysis.rank_summary import Clocks, RankSummary, TopFinding, summarize_rank
from gpudoctor.device.links import Link
from gpudoctor.doctor.document import Report, reports_from_json
from gpudoctor.doctor.engines import check_engine
from gpudoctor.runner.rundir import RankFile, rank_info_beside, record_fields
from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES
from gpudoctor.util.errors import GpudoctorError, NotATraceError, UsageError

SERIAL_BELOW = 4  # fewer ranks than this: starting workers costs more than it saves


@dataclass(frozen=True)
class RankJob:
    """One rank to analyze. `full`: also send back the whole report (analysis and diagnosis)."""

    trace: str
    record: str | None
    unprofiled_us: float | None  # given by the user for every rank; else the record's light median
    full: bool
    top: int = 15
    max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES  # the largest trace JSON to read (--max-trace-size)


@dataclass(frozen=True)
class RankResult:
    summary: RankSummary
    report: Report | None


def analyze_rank(job: RankJob) -> dict[str, Any] | None:
    """The per-rank stage (runs in a worker): None for a file that is not a trace."""
    from gpudoctor.doctor.document import report_json
    from gpudoctor.doctor.pipeline import AnalyzeOptions, diagnose_loaded
    from gpudoctor.trace import load_trace

    t0 = time.perf_counter()
    try:
        trace = load_trace(job.trace, job.max_bytes)
    except NotATraceError:
        return None
    record = record_fields(Path(job.record) if job.record else None)
    unprofiled = job.unprofiled_us or record.get("light_median_us")
    options = AnalyzeOptions(top=job.top, unprofiled_us=unprofiled)
    a, d = diagnose_loaded(trace, options, link=_link(job.record))
    del trace
    tops = tuple(TopFinding(f.id, f.est_saving_pct, f.title) for f in d.findings[:3])
    summary = summarize_rank(a, tops, Clocks.from_nvml_summary(record.get("nvml_summary")))
    doc = summary.to_json()
    doc["seconds"] = time.perf_counter() - t0
    doc["peak_rss_bytes"] = peak_rss_bytes()
    return {"summary": doc, "report": report_json([(a, d)]) if job.full else None}


def run_jobs(jobs: Sequence[RankJob], workers: int | None = None, engine: str = "auto") -> list[RankResult]:
    """Every job's result, in the jobs' order, files that are not traces left out."""
    check_engine(engine)
    n = workers or default_workers(len(jobs))
    if engine == "auto":
        engine = "serial" if n <= 1 or len(jobs) < SERIAL_BELOW else "processes"
    runner: Callable[[Sequence[RankJob], int], list[dict[str, Any] | None]] = {
        "serial": _serial,
        "processes": _processes,
        "ray": _ray,
        "dask": _dask,
    }[engine]
    out = []
    for raw in runner(jobs, n):
        if raw is None:
            continue
        report = reports_from_json(raw["report"])[0] if raw.get("report") else None
        out.append(RankResult(RankSummary.from_json(raw["summary"]), report))
    return out


def default_workers(n_jobs: int) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, n_jobs))


def jobs_for(
    files: Sequence[RankFile],
    unprofiled_us: float | None,
    full: set[int] | bool,
    top: int,
    max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES,
) -> list[RankJob]:
    """A job per file; `full`: True for every rank's whole report, or the indices of those wanted."""
    return [
        RankJob(
            str(f.trace),
            str(f.record) if f.record else None,
            unprofiled_us,
            full is True or (full is not False and i in full),
            top,
            max_bytes,
        )
        for i, f in enumerate(files)
    ]


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _serial(jobs: Sequence[RankJob], _: int) -> list[dict[str, Any] | None]:
    return [analyze_rank(j) for j in jobs]


def _processes(jobs: Sequence[RankJob], workers: int) -> list[dict[str, Any] | None]:
    from concurrent.futures import ProcessPoolExecutor  # here: one trace is read without a pool
    from multiprocessing import get_context

    # spawn: the parent may hold CUDA or threads (a rank of `gpudoctor run`), which fork would copy
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(analyze_rank, jobs, chunksize=1))


def _ray(jobs: Sequence[RankJob], _: int) -> list[dict[str, Any] | None]:
    try:
        import ray  # type: ignore[import-not-found]
    except ImportError:
        raise UsageError("the ray engine needs Ray: pip install 'gpudoctor[cluster]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(analyze_rank)
    return list(ray.get([task.remote(j) for j in jobs]))


def _dask(jobs: Sequence[RankJob], workers: int) -> list[dict[str, Any] | None]:
    try:
        from dask.distributed import Client  # type: ignore[import-not-found]
    except ImportError:
        raise UsageError("the dask engine needs dask.distributed: pip install 'gpudoctor[cluster]'") from None
    address = os.environ.get("DASK_SCHEDULER_ADDRESS")
    client = Client(address) if address else Client(n_workers=workers, threads_per_worker=1, processes=True)
    try:
        return list(client.gather(client.map(analyze_rank, list(jobs), pure=False)))
    finally:
        client.close()


def _link(record: str | None) -> Link | None:
    """The link NVML saw for this rank's GPU (rank.json beside its record), if it was recorded."""
    link = rank_info_beside(Path(record) if record else None).get("link")
    if not isinstance(link, dict):
        return None
    try:
        return Link.from_json(link)
    except (TypeError, GpudoctorError):
        return None
