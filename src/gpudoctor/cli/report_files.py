"""The files `gpudoctor report -o FILE` and `analyze --html FILE` write — the HTML report, Markdown, the
annotated trace — each rendered by `report` and written through `util.outfile` (whole or not at all,
never over one of the command's inputs). Imported only when such a command runs: it pulls in the
renderers."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from gpudoctor.analysis.timeline_view import idle_spans
from gpudoctor.doctor.report import RunReport
from gpudoctor.doctor.source import Source
from gpudoctor.report.annotated_trace import annotate
from gpudoctor.report.markdown import render_markdown
from gpudoctor.report.run_view import ranks_view, report_html
from gpudoctor.trace.load import DEFAULT_MAX_TRACE_BYTES, load_document
from gpudoctor.util.outfile import open_output, write_text


def write_html(target: Path, report: RunReport, inputs: Sequence[str | os.PathLike[str]] = ()) -> None:
    """The HTML report of the (detailed) trace: with its GPU timeline, the run's NVML series, and the
    ranks side by side where there are several."""
    write_text(target, report_html(report), inputs=inputs)


def write_markdown(target: Path, source: Source) -> None:
    report = source.report
    assert report.analysis is not None and report.diagnosis is not None
    text = render_markdown(report.analysis, report.diagnosis, ranks_view(report))
    write_text(target, text, inputs=source.inputs)


def write_annotated(target: Path, source: Source, max_bytes: int | None = DEFAULT_MAX_TRACE_BYTES) -> None:
    """The original trace (read by the trace loader's JSON path) with gpudoctor's tracks added."""
    report = source.report
    assert source.trace is not None and report.trace_path is not None
    assert report.analysis is not None and report.diagnosis is not None
    original = load_document(report.trace_path, max_bytes)
    doc = annotate(original, idle_spans(source.trace), report.analysis, report.diagnosis)
    # UTF-8 as is, not \u escapes: Perfetto shows an escaped µ in an arg as the six characters. A lone
    # surrogate (only an escape in the original can make one) is written back as its escape.
    with open_output(target, inputs=source.inputs) as f:
        f.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False))
