"""The annotated trace: the original Kineto trace document plus gpudoctor's view on a process of its own
— idle spans by cause, the findings as global instant events, and counter tracks (GPU busy % per step,
launch-queue depth) — for Perfetto UI and chrome://tracing. Renders only: the spans come from
`analysis.timeline_view.idle_spans`; the caller reads and writes the files."""

from __future__ import annotations

from typing import Any

from gpudoctor.analysis.summary import Analysis
from gpudoctor.analysis.timeline_view import IdleSpans
from gpudoctor.rules.finding import Diagnosis

PID = 9_999_999  # above any Linux pid (at most 2**22), so it cannot clash with a profiled process
CATEGORY = "gpudoctor"
TID_IDLE, TID_FINDINGS = 1, 2
IDLE_NAMES = {
    "host_wait": "GPU idle: host wait",
    "sync": "GPU idle: sync",
    "launch_gap": "GPU idle: launch gap",
    "other": "GPU idle: other",
}


def annotate(
    original: dict[str, Any], spans: IdleSpans, analysis: Analysis, diagnosis: Diagnosis
) -> dict[str, Any]:
    """A new trace document: `original` with gpudoctor's events appended (the original is not changed)."""
    events = list(original.get("traceEvents") or [])
    events.extend(gpudoctor_events(spans, analysis, diagnosis))
    return {**original, "traceEvents": events}


def gpudoctor_events(spans: IdleSpans, analysis: Analysis, diagnosis: Diagnosis) -> list[dict[str, Any]]:
    o = spans.origin_us
    out: list[dict[str, Any]] = [
        _meta("process_name", {"name": "gpudoctor"}),
        _meta("process_sort_index", {"sort_index": -1}),
        _meta("thread_name", {"name": "GPU idle by cause"}, TID_IDLE),
        _meta("thread_name", {"name": "findings"}, TID_FINDINGS),
    ]
    for cause, (starts, ends) in spans.by_cause.items():
        name = IDLE_NAMES.get(cause, f"GPU idle: {cause}")
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            out.append(
                {
                    "ph": "X",
                    "cat": CATEGORY,
                    "name": name,
                    "pid": PID,
                    "tid": TID_IDLE,
                    "ts": s + o,
                    "dur": e - s,
                }
            )
    at = (spans.step_windows[0][1] if spans.step_windows else 0.0) + o
    for f in diagnosis.findings:
        args = {
            "id": f.id,
            "severity": f.severity.value,
            "est_saving_pct": f.est_saving_pct,
            "evidence": list(f.evidence),
            "fix": f.fix.summary,
        }
        out.append(
            {
                "ph": "i",
                "s": "g",
                "cat": CATEGORY,
                "name": f"{f.severity.value}: {f.title}",
                "pid": PID,
                "tid": TID_FINDINGS,
                "ts": at,
                "args": args,
            }
        )
    for step in analysis.steps:
        if step.gpu is not None:
            busy = round(100 * step.gpu.busy_fraction, 2) if step.gpu.window_us > 0 else 0.0
            out.append(_counter("GPU busy %", step.gpu.start_us + o, {"busy %": busy}))
    if analysis.steps and analysis.steps[-1].gpu is not None:
        out.append(_counter("GPU busy %", analysis.steps[-1].gpu.end_us + o, {"busy %": 0}))
    for t, depth in zip(spans.queue_ts_us.tolist(), spans.queue_depth.tolist(), strict=True):
        out.append(_counter("launch queue depth", t + o, {"queued": depth}))
    return out


def _meta(name: str, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": PID, "tid": tid, "args": args}


def _counter(name: str, ts: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "C", "cat": CATEGORY, "name": name, "pid": PID, "tid": 0, "ts": ts, "args": args}
