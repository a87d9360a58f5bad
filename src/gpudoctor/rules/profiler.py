"""`profiler_distortion` (info): the profiler's own overhead changes the picture — it slows the host,
so a GPU-bound step looks host-bound in the trace. Judged against the step time measured without the
profiler where that is known; on a trace alone, against the profiler's cost estimated from what it
recorded (`analysis.profiler_cost`). `without_profiler` re-judges a host-side finding on a trace alone
with that cost taken out: no critical or major verdict rests on host time the profiler may have added."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.analysis.profiler_cost import UNCERTAINTY, ProfilerCost
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix, Severity

MIN_OVERHEAD = 0.15
# Findings whose saving is host time or the GPU's wait for the host: what the profiler inflates.
HOST_SIDE = frozenset({
    "input_pipeline", "host_sync", "launch_overhead", "host_python", "allocator_thrash",
    "optimizer_unfused", "small_batch",
})  # fmt: skip
MEASURE_INSTEAD = (
    "for the real figures run the script under `gpudoctor run` (it times the steps without the profiler), "
    "or pass the step time measured without it: `gpudoctor analyze TRACE --step-time-ms MS`"
)

FIX = Fix(
    summary="Trust the step time measured without the profiler; record fewer options (with_stack, "
    "record_shapes and profile_memory cost the most) when the host side matters.",
    snippet="""\
from torch.profiler import ProfilerActivity, profile, schedule

with profile(activities=[ProfilerActivity.CUDA],          # GPU activity only: least host overhead
             schedule=schedule(wait=1, warmup=2, active=3),
             on_trace_ready=lambda p: p.export_chrome_trace("trace.json")) as prof:
    for inputs, targets in loader:
        train_step(inputs, targets)
        prof.step()""",
)


def profiler_distortion(a: Analysis, f: Facts) -> Finding | None:
    if f.profiler_est_us is not None:
        return _estimated(a, f)
    overhead = f.profiler_overhead
    if overhead is None or overhead < MIN_OVERHEAD or f.traced_step_us <= 0:
        return None
    options = [k for k, v in a.trace.profiler_config.items() if v]
    evidence = [
        f"Profiled steps take {us(f.traced_step_us)}, {pct(100 * overhead)} longer than the {us(f.step_us)} "
        f"measured without the profiler" + (f" (recorded with {', '.join(options)})." if options else "."),
        f"The trace shows the GPU idle {pct(100 * f.traced_idle_us / f.traced_step_us)} of the time; without "
        f"the profiler it is idle {pct(f.pct(f.idle_us))}. Host-side findings are scaled to the real step.",
    ]
    return finding(
        "profiler_distortion",
        "The profiler's overhead distorts the trace",
        0.0,
        evidence,
        FIX,
        {"profiler_overhead": overhead, "traced_idle_share": f.traced_idle_us / f.traced_step_us},
        severity=Severity.INFO,
    )


def _estimated(a: Analysis, f: Facts) -> Finding | None:
    cost = a.profiler_cost
    est, unprofiled = f.profiler_est_us, f.est_unprofiled_us
    if cost is None or est is None or unprofiled is None or f.traced_step_us <= 0:
        return None
    added = f.traced_step_us - unprofiled
    if est < MIN_OVERHEAD * f.traced_step_us:
        return None
    evidence = [
        f"The profiler recorded {profiler_records(cost.counts, cost.options)} {f.per}; at its estimated "
        f"cost per record that is {us(est)} of host time, {pct(100 * est / f.traced_step_us)} of each traced "
        f"{us(f.traced_step_us)} step ({cost.costs_status}).",
        f"Without it the step would take about {us(unprofiled)} (the GPU's own work, {us(f.busy_us)}, bounds "
        f"it from below): up to {us(added)} of each traced step, and of the GPU's wait for the host, may be "
        "the profiler's" + _high_end(cost, f) + ". Host-side findings are judged with that taken out.",
        MEASURE_INSTEAD[0].upper() + MEASURE_INSTEAD[1:] + ".",
    ]
    return finding(
        "profiler_distortion",
        "The profiler's own overhead may account for much of the host time in this trace",
        0.0,
        evidence,
        FIX,
        {
            "est_profiler_us": est,
            "est_unprofiled_step_us": unprofiled,
            "est_profiler_share": est / f.traced_step_us,
        },
        severity=Severity.INFO,
    )


def _high_end(cost: ProfilerCost, f: Facts) -> str:
    """Where part of the estimate rests on costs not yet confirmed: how far it may reach."""
    if not cost.unconfirmed_us:
        return ""
    shortest = cost.high_unprofiled_us(f.traced_step_us, f.busy_us)
    return (
        f" ({us(cost.unconfirmed_us)} of the estimate rests on per-record costs not yet confirmed: at their "
        f"high end the profiler's share is {us(f.traced_step_us - shortest)}, and the step without it "
        f"{us(shortest)})"
    )


def profiler_records(counts: dict[str, float], options: tuple[str, ...]) -> str:
    parts = [f"{counts.get('event', 0):,.0f} ops and runtime calls"]
    if counts.get("compiled_launch"):
        parts.append(f"{counts['compiled_launch']:,.0f} of them launches of compiled (Triton) kernels")
    if counts.get("python_frame"):
        parts.append(f"{counts['python_frame']:,.0f} Python frames (with_stack)")
    if counts.get("shaped_op"):
        parts.append(f"the arguments of {counts['shaped_op']:,.0f} ops (record_shapes)")
    if counts.get("memory_event"):
        parts.append(f"{counts['memory_event']:,.0f} allocations (profile_memory)")
    return ", ".join(parts)


def without_profiler(
    found: Finding, at_fit: Finding | None, at_high: Finding | None, f: Facts, cost: ProfilerCost
) -> Finding:
    """`found` (a host-side finding on a trace alone) with its severity judged again on the step with the
    profiler's cost taken out: `at_fit`, the same rule with that cost 30% above its estimate, `at_high`
    with it at the high end of every price (None: the rule does not fire there). Where only the prices
    not yet confirmed make the difference, the trace alone cannot tell, and the finding says so. The saving
    shown stays the trace's bound."""
    if f.profiler_est_us is None or f.est_unprofiled_us is None or found.id not in HOST_SIDE:
        return found
    fit = at_fit.est_saving_pct if at_fit is not None else 0.0
    low = at_high.est_saving_pct if at_high is not None else 0.0
    # the milder of the two, and minor at least: the cause is in the trace, its size is not known
    severity = max(found.severity, Severity.of_saving(low), key=_RANK.__getitem__)
    severity = min(severity, Severity.MINOR, key=_RANK.__getitem__)
    if severity == found.severity and low >= found.est_saving_pct * 0.8:
        return found
    cannot_tell = _RANK[Severity.of_saving(fit)] < _RANK[severity] and cost.unconfirmed_us > 0
    said = _cannot_tell(f, cost, fit, low, severity) if cannot_tell else _milder(f, low, severity)
    values = {**found.values, "saving_without_profiler_pct": round(low, 1)}
    if cannot_tell:
        values["saving_at_fitted_profiler_cost_pct"] = round(fit, 1)
    return replace(found, severity=severity, evidence=(*found.evidence, said), values=values)


def _milder(f: Facts, low: float, severity: Severity) -> str:
    return (
        f"The profiler's own cost is estimated at {us(f.profiler_est_us or 0.0)} of each traced "
        f"{us(f.traced_step_us)} step (profiler_distortion): with what it may have added taken out (up to "
        f"{pct(100 * (UNCERTAINTY - 1))} more than that estimate), this fix would save {pct(low)}, so this "
        f"is {severity.value}, not more; {MEASURE_INSTEAD}."
    )


def _cannot_tell(f: Facts, cost: ProfilerCost, fit: float, low: float, severity: Severity) -> str:
    return (
        f"The profiler's own cost is estimated at {us(cost.est_us)} of each traced {us(f.traced_step_us)} "
        f"step (profiler_distortion), {us(cost.unconfirmed_us)} of it at per-record costs not yet confirmed "
        f"(compiled-kernel launches; with_stack with record_shapes) that may be higher, up to "
        f"{us(cost.high_or_fitted_us)} in all: with {pct(100 * (UNCERTAINTY - 1))} more than the estimate "
        f"taken out this fix would save {pct(fit)}, with the high end taken out {pct(low)}. From the trace "
        f"alone gpudoctor cannot tell which, so this is {severity.value} until measured; {MEASURE_INSTEAD}."
    )


_RANK = {Severity.CRITICAL: 0, Severity.MAJOR: 1, Severity.MINOR: 2, Severity.INFO: 3}
