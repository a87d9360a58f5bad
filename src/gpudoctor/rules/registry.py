"""Every rule, and `diagnose(analysis) -> Diagnosis`: run them all, rank the findings by what their
fix can save, and say what bounds the step."""

from __future__ import annotations

from gpudoctor.analysis.profiler_cost import UNCERTAINTY
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.allocator import allocator_thrash
from gpudoctor.rules.attention import attention_materialized
from gpudoctor.rules.base import MIN_SAVING_PCT, Rule, pct, us
from gpudoctor.rules.batch import small_batch
from gpudoctor.rules.collectives import comm_link_bound
from gpudoctor.rules.communication import communication_exposed
from gpudoctor.rules.copy_overlap import copy_overlap
from gpudoctor.rules.data_parallel import data_parallel
from gpudoctor.rules.facts import Facts, facts_of
from gpudoctor.rules.finding import SCHEMA, Diagnosis, Finding, Severity
from gpudoctor.rules.fsdp import fsdp_exposed
from gpudoctor.rules.fusion import unfused_elementwise
from gpudoctor.rules.host_python import host_python
from gpudoctor.rules.host_sync import host_sync
from gpudoctor.rules.input_pipeline import input_pipeline
from gpudoctor.rules.launch_overhead import launch_overhead
from gpudoctor.rules.layout import conv_layout
from gpudoctor.rules.memory import memory_pressure
from gpudoctor.rules.memory_registry import memory_findings
from gpudoctor.rules.optimizer import optimizer_unfused
from gpudoctor.rules.pageable_copy import pageable_copy
from gpudoctor.rules.pipeline import pipeline_bubble
from gpudoctor.rules.profiler import HOST_SIDE, profiler_distortion, without_profiler
from gpudoctor.rules.tensor_cores import tensor_cores_unused, tf32_not_bf16

RULES: tuple[Rule, ...] = (
    input_pipeline,
    host_sync,
    launch_overhead,
    host_python,
    pageable_copy,
    copy_overlap,
    tensor_cores_unused,
    tf32_not_bf16,
    attention_materialized,
    unfused_elementwise,
    conv_layout,
    allocator_thrash,
    optimizer_unfused,
    small_batch,
    memory_pressure,
    profiler_distortion,
    data_parallel,
    communication_exposed,
    comm_link_bound,
    fsdp_exposed,
    pipeline_bubble,
)
# Findings that carry no time saving by nature: kept even at 0%.
ALWAYS_KEPT = {"memory_pressure", "profiler_distortion"}
_SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.MAJOR: 1, Severity.MINOR: 2, Severity.INFO: 3}


# Without steps the traced time is one whole: with this little work in it, its shares say nothing about
# a training or inference loop; nor do the shares of steps inferred in so little work (a loop's own
# marked steps are judged whatever their size).
MIN_KERNELS_WITHOUT_STEPS = 20


def diagnose(analysis: Analysis) -> Diagnosis:
    """Time findings ranked by what they save, then the memory findings of a `gpudoctor run` (its own
    order: `rules.memory_registry`)."""
    memory = memory_findings(analysis.memory_run)
    facts = facts_of(analysis)
    if facts is None:
        reason = analysis.trace.no_gpu_reason
        said = "No GPU activity in this trace: nothing to diagnose on the GPU."
        if reason and not reason.startswith("no GPU activity"):
            said = f"No GPU activity to diagnose: {reason}."
        return Diagnosis(SCHEMA, memory, said, {}, judged=False)
    too_little = _too_little(analysis)
    if too_little is not None:
        return Diagnosis(SCHEMA, memory, too_little, _summary(facts), _saving_of(facts), judged=False)
    # A trace alone: each host-side finding's severity is judged again on the step without what the
    # profiler may have added (the high end of its estimated cost); its saving stays the trace's bound.
    bare = None
    if facts.est_unprofiled_us is not None and analysis.profiler_cost is not None:
        high = analysis.profiler_cost.est_unprofiled_us(facts.traced_step_us, facts.busy_us, UNCERTAINTY)
        bare = facts_of(analysis, high)
    found: list[Finding] = []
    for rule in RULES:
        f = rule(analysis, facts)
        if f is not None and bare is not None and f.id in HOST_SIDE:
            f = without_profiler(f, rule(analysis, bare), facts)
        if f is not None and (f.est_saving_pct >= MIN_SAVING_PCT or f.id in ALWAYS_KEPT):
            found.append(f)
    found.sort(key=lambda f: (-f.est_saving_pct, _SEVERITY_ORDER[f.severity], f.id))
    return Diagnosis(SCHEMA, (*found, *memory), bound(analysis, facts), _summary(facts), _saving_of(facts))


def _too_little(a: Analysis) -> str | None:
    """Why the trace holds too little GPU work for the time rules, where it does: fewer than
    MIN_KERNELS_WITHOUT_STEPS kernels and no step the profiler marked (none, or only inferred ones)."""
    marked = a.steps_source is None or not a.steps_source.inferred
    if a.kernels.count >= MIN_KERNELS_WITHOUT_STEPS or (a.steps and marked):
        return None
    steps = "no repeating step" if not a.steps else "no marked step"
    return (
        f"Too little GPU work to diagnose: {a.kernels.count} kernels and {steps} "
        f"(profile a few steps with torch.profiler's schedule and prof.step())."
    )


def _saving_of(f: Facts) -> str:
    return "traced time" if f.whole_trace else "step"


def bound(a: Analysis, f: Facts) -> str:
    """What limits the step, in one sentence."""
    busy = 100 * f.busy_fraction
    each = f"of the {us(f.step_us)} traced" if f.whole_trace else f"of each {us(f.step_us)} step"
    cats = a.kernels.time_by_category_us
    total = sum(cats.values()) or 1.0
    top_cat, top_us = max(cats.items(), key=lambda kv: kv[1]) if cats else ("kernels", 0.0)
    comm_us = a.window.busy_by_kind_us.get("communication", 0.0) if a.window else 0.0
    if busy >= 85 and a.window and comm_us >= 0.5 * a.window.busy_us:
        return (
            f"Communication-bound: the GPU is busy {pct(busy)} {each}, "
            f"{pct(100 * comm_us / a.window.busy_us)} of it in collectives with no compute beside them."
        )
    if busy >= 85:
        tc = a.kernels.tensor_core_share
        heavy = (cats.get("matmul", 0.0) + cats.get("convolution", 0.0) + cats.get("attention", 0.0)) / total
        detail = f"{pct(100 * heavy)} of GPU time in matmul, convolution and attention"
        if tc is not None:
            detail += f", {pct(100 * tc)} of matmul/convolution time on tensor cores"
        return f"GPU-bound: the GPU is busy {pct(busy)} {each}; {detail}."
    causes = {
        "waiting for the host": f.host_wait_us * f.host_scale,
        "synchronizations": f.sync_idle_us,
        "launch gaps between queued kernels": f.launch_gap_us,
        "before GPU work whose launch the trace does not record (cause unknown)": f.other_idle_us,
    }
    cause = max(causes, key=lambda c: causes[c])
    said = (
        f"The GPU idles {pct(100 - busy)} {each}, mostly {cause}; when busy, "
        f"{pct(100 * top_us / total)} of its time is {top_cat}."
    )
    if cause == "waiting for the host" and f.profiler_est_us and f.est_unprofiled_us:
        said += (
            f" The profiler itself may account for {us(f.traced_step_us - f.est_unprofiled_us)} of each "
            f"step (estimated from what it recorded; profiler_distortion)."
        )
    return said


def _summary(f: Facts) -> dict[str, float | None]:
    return {
        "step_us": f.step_us,
        "traced_step_us": f.traced_step_us,
        "gpu_busy_pct": 100 * f.busy_fraction,
        "gpu_idle_us": f.idle_us,
        "profiler_overhead_pct": 100 * f.profiler_overhead if f.profiler_overhead is not None else None,
    }
