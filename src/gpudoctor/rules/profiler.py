"""`profiler_distortion` (info): the profiler's own overhead changes the picture — it slows the host,
so a GPU-bound step looks host-bound in the trace. Judged against the step time measured without the
profiler, where that is known."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix, Severity

MIN_OVERHEAD = 0.15

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
