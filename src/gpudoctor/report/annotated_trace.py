"""The annotated trace: the original Kineto trace document plus gpudoctor's view on a process of its own
— idle spans by cause, the findings as global instant events, and counter tracks (GPU busy % per step,
launch-queue depth) — for Perfetto UI and chrome://tracing. Renders only: the spans come from
`analysis.timeline_view.idle_spans`; the caller reads and writes the files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudoctor.analysis.summary import Analysis
from gpudoctor.analysis.timeline_view import IdleSpans
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.trace.model import ANNOTATION_CATEGORY
from gpudoctor.util.text import has_unsafe, printable

PID = 9_999_999  # above any Linux pid (at most 2**22), so it cannot clash with a profiled process
CATEGORY = ANNOTATION_CATEGORY  # a known category when the annotated trace is read back
TID_IDLE, TID_FINDINGS = 1, 2
IDLE_NAMES = {
    "host_wait": "GPU idle: host wait",
    "sync": "GPU idle: sync",
    "launch_gap": "GPU idle: launch gap",
    "other": "GPU idle: other",
}
# Perfetto names a counter track "<event name> <arg key>"; chrome://tracing shows the key as the legend.
BUSY_COUNTER, BUSY_SERIES = "GPU busy %", "(per step)"
QUEUE_COUNTER, QUEUE_SERIES = "launch queue depth", "(ops)"  # launched, not yet started on the GPU
# Trace times are ~1e12 µs, where a double holds a time to about 1 ns only, and viewers parse µs into
# ns by rounding or truncating: idle spans that touch may come out overlapping by a nanosecond, and
# Perfetto drops a span that overlaps its neighbour. So touching spans keep this gap between them.
GAP_NS = 2


def annotate(
    original: dict[str, Any], spans: IdleSpans, analysis: Analysis, diagnosis: Diagnosis
) -> dict[str, Any]:
    """A new trace document: `original` with gpudoctor's events appended (the original is not changed).
    The viewers show event names, categories and string args as they are: control characters in them
    (from a crafted trace) are written escaped."""
    events = [_viewable(e) for e in original.get("traceEvents") or []]
    events.extend(gpudoctor_events(spans, analysis, diagnosis))
    return {**original, "traceEvents": events}


def _viewable(event: Any) -> Any:
    """The event with control characters in its name, category and string args shown escaped; the
    same object when there are none (the common case costs a search per string)."""
    if not isinstance(event, dict):
        return event
    changed = {
        k: printable(v) for k in ("name", "cat") if isinstance(v := event.get(k), str) and has_unsafe(v)
    }
    args = event.get("args")
    if isinstance(args, dict):
        bad = {k: printable(v) for k, v in args.items() if isinstance(v, str) and has_unsafe(v)}
        if bad:
            changed["args"] = {**args, **bad}
    return {**event, **changed} if changed else event


def gpudoctor_events(spans: IdleSpans, analysis: Analysis, diagnosis: Diagnosis) -> list[dict[str, Any]]:
    origin_ns = round(spans.origin_us * 1000)  # added in whole ns: the absolute µs would round

    def ns(t_us: float) -> int:
        return origin_ns + round(t_us * 1000)

    return [
        _meta("process_name", {"name": "gpudoctor"}),
        _meta("process_sort_index", {"sort_index": -1}),
        _meta("thread_name", {"name": "GPU idle by cause"}, TID_IDLE),
        _meta("thread_name", {"name": "findings"}, TID_FINDINGS),
        *_idle_events(spans, ns),
        *_finding_events(diagnosis, ns(spans.step_windows[0][1] if spans.step_windows else 0.0)),
        *_counter_events(spans, analysis, ns),
    ]


def _idle_events(spans: IdleSpans, ns: Callable[[float], int]) -> list[dict[str, Any]]:
    """One complete event per idle span, in time order, on one thread: none overlaps the next."""
    rows = sorted(
        (ns(s), ns(e), IDLE_NAMES.get(cause, f"GPU idle: {cause}"))
        for cause, (starts, ends) in spans.by_cause.items()
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    )
    out = []
    for i, (start, end, name) in enumerate(rows):
        if i + 1 < len(rows):
            end = min(end, rows[i + 1][0] - GAP_NS)
        if end > start:
            out.append(
                {
                    "ph": "X",
                    "cat": CATEGORY,
                    "name": name,
                    "pid": PID,
                    "tid": TID_IDLE,
                    "ts": _us(start),
                    "dur": _us(end - start),
                }
            )
    return out


def _finding_events(diagnosis: Diagnosis, at_ns: int) -> list[dict[str, Any]]:
    out = []
    for f in diagnosis.findings:
        args = {
            "id": f.id,
            "severity": f.severity.value,
            "est_saving_pct": f.est_saving_pct,
            "evidence": [printable(e) for e in f.evidence],
            "fix": printable(f.fix.summary),
        }
        out.append(
            {
                "ph": "i",
                "s": "t",  # on the "findings" thread: both viewers draw them on that track
                "cat": CATEGORY,
                "name": printable(f"{f.severity.value}: {f.title}"),
                "pid": PID,
                "tid": TID_FINDINGS,
                "ts": _us(at_ns),
                "args": args,
            }
        )
    return out


def _counter_events(spans: IdleSpans, analysis: Analysis, ns: Callable[[float], int]) -> list[dict[str, Any]]:
    out = []
    for step in analysis.steps:
        if step.gpu is not None:
            busy = round(100 * step.gpu.busy_fraction, 2) if step.gpu.window_us > 0 else 0.0
            out.append(_counter(BUSY_COUNTER, ns(step.gpu.start_us), {BUSY_SERIES: busy}))
    if analysis.steps and analysis.steps[-1].gpu is not None:
        out.append(_counter(BUSY_COUNTER, ns(analysis.steps[-1].gpu.end_us), {BUSY_SERIES: 0}))
    for t, depth in zip(spans.queue_ts_us.tolist(), spans.queue_depth.tolist(), strict=True):
        out.append(_counter(QUEUE_COUNTER, ns(t), {QUEUE_SERIES: depth}))
    return out


def _us(t_ns: int) -> float:
    """Whole ns as µs: JSON writes it with at most 3 decimals."""
    return t_ns / 1000


def _meta(name: str, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": PID, "tid": tid, "args": args}


def _counter(name: str, ts_ns: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "C", "cat": CATEGORY, "name": name, "pid": PID, "tid": 0, "ts": _us(ts_ns), "args": args}
