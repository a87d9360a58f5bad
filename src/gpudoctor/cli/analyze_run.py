"""What `gpudoctor analyze` does once its arguments are parsed, with no typer in it: the option values
turned into one `AnalyzeRequest`, the doctor run on its path, the output printed. The typer command
(`cli.analyze`) and the fast path (`cli.fast`) both end here, so they cannot differ in what they do."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.cli.basics import (
    engine_name,
    input_path,
    one_blas_thread,
    parse_size,
    stdout_console,
    step_time_us,
)

if TYPE_CHECKING:
    from gpudoctor.doctor.pipeline import AnalyzeOptions
    from gpudoctor.doctor.report import RunReport


@dataclass(frozen=True)
class AnalyzeRequest:
    """What `gpudoctor analyze` was asked: the trace or directory of rank traces, how it is analyzed
    (`options()`), the rank to detail, where the ranks of a directory are analyzed, and the outputs:
    the summary (its tables `top` rows long) or the JSON on stdout, and an HTML report."""

    path: Path
    engine: str = "auto"
    rank: int | None = None
    workers: int | None = None
    as_json: bool = False
    html: Path | None = None
    top: int = 10
    step: int | None = None
    unprofiled_us: float | None = None
    module_depth: int = 2
    max_bytes: int | None = None

    def options(self) -> AnalyzeOptions:
        """The doctor's options (imported here: the doctor's modules load while a trace does)."""
        from gpudoctor.doctor.pipeline import AnalyzeOptions

        return AnalyzeOptions(
            step=self.step,
            top=max(self.top, 15),
            unprofiled_us=self.unprofiled_us,
            module_depth=self.module_depth,
            max_bytes=self.max_bytes,
        )


def analyze_request(
    path: str,
    *,
    as_json: bool = False,
    step: int | None = None,
    rank: int | None = None,
    top: int = 10,
    step_time_ms: float | None = None,
    html: Path | None = None,
    module_depth: int = 2,
    max_trace_size: str = "4G",
    workers: int | None = None,
    engine: str = "auto",
) -> AnalyzeRequest:
    """The command's option values (as parsed, ranges already checked) as a request; a value that is
    wrong whatever the trace (an empty PATH, a bad size, an unknown engine) raises `UsageError`."""
    one_blas_thread()
    return AnalyzeRequest(
        engine=engine_name(engine),
        path=input_path(path),
        unprofiled_us=step_time_us(step_time_ms),
        max_bytes=parse_size(max_trace_size),
        step=step,
        module_depth=module_depth,
        rank=rank,
        workers=workers,
        as_json=as_json,
        html=html,
        top=top,
    )


def run_analyze(request: AnalyzeRequest) -> None:
    """The doctor on the path (`doctor.diagnose_trace`, or `diagnose_ranks` for a directory of rank
    traces), then its output. A trace file starts loading first (`trace.split.start_load`: a large
    one in two processes), so that the doctor's and the renderer's modules import while it does."""
    import json

    from gpudoctor.trace.split import start_load

    r = request
    if r.path.is_dir() and r.step is None:  # many rank files: each rank by a worker, summaries kept
        from gpudoctor.doctor.diagnose import diagnose_ranks

        report = diagnose_ranks(
            r.path, r.options(), rank=r.rank, engine=r.engine, workers=r.workers,
            all_reports=r.as_json and r.rank is None, timeline=r.html is not None,
        )  # fmt: skip
    else:
        with start_load(r.path, r.max_bytes) if r.path.is_file() else contextlib.nullcontext() as started:
            from gpudoctor.doctor.diagnose import diagnose_trace

            if not r.as_json:
                import gpudoctor.report.run_view  # noqa: F401  (to import beside the load, not after it)
            report = diagnose_trace(
                r.path, r.options(), rank=r.rank, timeline=r.html is not None, started=started
            )
    if r.html is not None:
        from gpudoctor.cli.report_files import write_html

        inputs = (
            r.path,
            *((report.ranks.trace_paths.values()) if report.ranks else (report.trace_path or r.path,)),
        )
        write_html(r.html, report, inputs=inputs)
    if r.as_json:
        sys.stdout.write(json.dumps(_json_doc(report, r.rank), indent=1, allow_nan=False) + "\n")
        sys.stdout.flush()
        return
    from gpudoctor.report.run_view import render_report

    render_report(report, stdout_console(), top=r.top)


def _json_doc(report: RunReport, rank: int | None) -> dict[str, Any]:
    """The findings with the analysis: of the rank asked for alone, else of every rank (gpudoctor.ranks/1)."""
    several = report.ranks is not None and len(report.ranks.summaries) > 1
    if rank is not None or not several:
        return {**report.diagnosis.to_json(), "analysis": report.analysis.to_json()}  # type: ignore[union-attr]
    return report.analysis_document() or {}
