"""What every renderer says about a trace's steps: how they were found, and, where the trace has none,
its figures per traced second. Text only, from the analysis as it is."""

from __future__ import annotations

from gpudoctor.analysis.memory import MemoryReport
from gpudoctor.analysis.summary import Analysis
from gpudoctor.util.units import fmt_bytes, fmt_pct, fmt_us

# What a trace without GPU activity cannot fill: left out of every report, and said once.
GPU_SECTIONS = "GPU time, top kernels, roofline, launches, transfers, host synchronizations and GPU memory"


def counted(n: int, noun: str) -> str:
    """'1 step', '3 steps', '1,280 events'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def steps_count(a: Analysis) -> str:
    """The steps an analysis covers, for a header: '3 steps', '1 step', 'no steps', 'step 3 only',
    '4 steps (1 warm-up left out)'."""
    if a.selected_step is not None:
        return f"step {a.selected_step} only"
    if not a.steps:
        return "no steps"
    n = counted(len(a.steps) + len(a.warmup_steps), "step")
    return f"{n} ({len(a.warmup_steps)} warm-up left out)" if a.warmup_steps else n


def steps_sentence(a: Analysis) -> str | None:
    """'steps: ProfilerStep#N annotations', 'steps: inferred: …', and the warm-up steps left out; None
    in an analysis saved before gpudoctor recorded how steps were found."""
    source = a.steps_source
    if source is None:
        return None
    warmup = warmup_sentence(a)
    return f"steps: {source.description}" + (f"; {warmup}" if warmup else "")


def warmup_sentence(a: Analysis) -> str | None:
    """What was left out as warm-up, and why: 'step #1 (3.4 s, 20× the median of the others) is a
    warm-up at the trace's start: shown, left out of the medians and of every figure over the steps'."""
    warm = a.warmup_steps
    if not warm or a.step_time_us is None or a.step_time_us.p50 <= 0:
        return None
    times = max(s.duration_us for s in warm) / a.step_time_us.p50
    tail = "at the trace's start: shown, left out of the medians and of every figure over the steps"
    if len(warm) == 1:
        s = warm[0]
        return f"step #{s.number} ({fmt_us(s.duration_us)}, {times:.0f}× the median of the others) is a warm-up {tail}"
    which = ", ".join(f"#{s.number} ({fmt_us(s.duration_us)})" for s in warm)
    return f"steps {which} (up to {times:.0f}× the median of the others) are warm-up steps {tail}"


def per_call_sentence(a: Analysis) -> str | None:
    """Where each step is one outer call making several model calls (`generate`): the time per call."""
    source = a.steps_source
    if source is None or not source.calls_per_step or a.step_time_us is None:
        return None
    return (
        f"{source.calls_per_step:.3g} model calls per step: {fmt_us(a.step_time_us.p50 / source.calls_per_step)} "
        f"per call (median step over calls)"
    )


def per_second(a: Analysis) -> list[tuple[str, str]]:
    """(label, value) figures of the traced time as a whole, where the trace has no steps: busy share,
    and host figures per traced second. Empty where there are steps or no GPU activity."""
    w = a.whole_trace
    if a.steps or w is None or w.duration_us <= 0:
        return []
    seconds = w.duration_us / 1e6
    c = w.cpu
    rows = [("traced time (the GPU's span)", fmt_us(w.duration_us))]
    if w.gpu is not None:
        rows.append(("GPU busy", fmt_pct(w.gpu.busy_fraction)))
    rows += [
        ("kernel launches per second", f"{c.launch_count / seconds:,.0f}"),
        ("host in launch calls", fmt_pct(c.launch_us / w.duration_us)),
        ("host in synchronizing calls", fmt_pct(c.sync_us / w.duration_us)),
    ]
    if c.dataloader_us:
        rows.append(("host in DataLoader", fmt_pct(c.dataloader_us / w.duration_us)))
    if c.optimizer_us:
        rows.append(("host in Optimizer.step", fmt_pct(c.optimizer_us / w.duration_us)))
    if c.allocator_calls:
        rows.append(("cudaMalloc/cudaFree per second", f"{c.allocator_calls / seconds:,.0f}"))
    return rows


def memory_peaks(m: MemoryReport) -> list[str]:
    """The trace's memory peaks, as every renderer says them: the allocator's totals where the events
    carry them; else the rise of allocated memory from the trace's start (what was allocated before the
    trace began is not in it), and no reserved figure."""
    cap = m.capacity

    def of(b: int) -> str:
        return f" ({fmt_pct(b / cap)})" if cap else ""

    if m.is_rise:
        parts = [
            f"allocated memory rose by up to {fmt_bytes(m.peak_allocated)}{of(m.peak_allocated)} from the "
            "trace's start (its memory events carry no allocator totals: what was allocated before is unknown)"
        ]
    else:
        parts = [f"peak allocated {fmt_bytes(m.peak_allocated)}{of(m.peak_allocated)}"]
    if m.reserved_recorded:
        parts.append(f"peak reserved {fmt_bytes(m.peak_reserved)}{of(m.peak_reserved)}")
    else:
        parts.append("reserved not recorded")
    return parts


def memory_tile(m: MemoryReport) -> tuple[str, str]:
    """(label, value) of the memory figure a summary leads with."""
    return ("memory rise from trace start" if m.is_rise else "peak memory", fmt_bytes(m.peak_allocated))
