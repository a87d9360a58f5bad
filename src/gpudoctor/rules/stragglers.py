"""`straggler` (across ranks): the rank the others wait for in every collective, and why it is late. The
slowest rank (`analysis.ranks`) at 5% over the others' median is a straggler; what the others lose is
their wait in the collectives (`analysis.across_ranks`). Its cause is where its extra time goes: slower
GPU work with the same grids (a slower or throttled GPU), or its GPU waiting for its host (data loading,
synchronizations, Python between ops). Uneven shapes are `load_imbalance`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis.across_ranks import AcrossRanks
from gpudoctor.analysis.rank_summary import RankSummary
from gpudoctor.analysis.ranks import Slowest
from gpudoctor.rules.base import finding, pct, size, us
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.imbalance import FIX as FIX_UNEVEN
from gpudoctor.rules.imbalance import load_imbalance, uneven_kernels
from gpudoctor.util.units import fmt_rate

CLOCK_DROP = 0.05  # an SM clock this much under the others' while busy is a slower GPU
THROTTLE_SHARE = 0.1  # a slowdown reason active in this share of samples
# the unprofiled idle gap this many times the traced own-host excess: the evidence says both figures (a
# busy host can stretch a straggler past what its trace shows: docs/results.md, "Constants")
UNEVEN_TRACE_FACTOR = 2.0
REASON_WORDS = {
    "sw_thermal": "thermal (software slowdown)",
    "hw_thermal": "thermal (hardware slowdown)",
    "sw_power_cap": "its power cap",
    "hw_power_brake": "the hardware power brake",
    "hw_slowdown": "hardware slowdown",
}

FIXES = {
    "host work": Fix(
        summary="Take the straggler's per-step host work off the training thread (logging, metrics, "
        "checkpoint I/O, data preparation only rank 0 does): every rank waits for it in each collective.",
        snippet="""\
if rank == 0 and step % 100 == 0:        # rare, and off the critical path where it can be
    log_metrics(loss.detach())         # no .item() per step: it syncs
# move per-step preprocessing into DataLoader workers (num_workers > 0) on every rank alike""",
    ),
    "data loading": Fix(
        summary="The straggler's input pipeline is slower: more DataLoader workers, pinned memory, "
        "prefetching; check its data lives on as fast a disk as the others'.",
        snippet="""\
loader = DataLoader(dataset, batch_size=per_rank_batch, sampler=DistributedSampler(dataset),
                    num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=4)""",
    ),
    "synchronizations": Fix(
        summary="The straggler synchronizes with its GPU inside the step (.item(), .cpu(), printing a "
        "tensor) where the others do not: keep values on the GPU, read them every N steps.",
        snippet="""\
running = torch.zeros((), device="cuda")
running += loss.detach()                 # no sync
if step % 100 == 0:
    print((running / 100).item()); running.zero_()""",
    ),
    "slower GPU": Fix(
        summary="The same kernels with the same shapes run longer on the straggler's GPU: check its "
        "clocks, power and temperature (`gpudoctor monitor`), other processes on it, its PCIe/NVLink "
        "state; exclude or replace the GPU (the job runs at its speed).",
        snippet="""\
# on the straggler's host:
#   nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER     (clock event reasons)
#   gpudoctor monitor                                        (live clocks and why they drop)""",
    ),
    "uneven work": FIX_UNEVEN,
}


@dataclass(frozen=True)
class Cause:
    name: str  # a key of FIXES
    detail: str  # a sentence of evidence


def straggler(x: AcrossRanks, summaries: Sequence[RankSummary], step_us: float) -> Finding | None:
    s = x.overview.slowest
    if s is None or not s.straggler or step_us <= 0:
        return None
    slow = next(r for r in summaries if r.rank == s.rank)
    others = [r for r in summaries if r.rank != s.rank]
    uneven = bool(uneven_kernels(x))
    if s.paced_by == "gpu":  # unprofiled, its GPU paces the run: more or slower GPU work
        if uneven:
            return None  # different shapes on different ranks: load_imbalance says it, with its kernels
        return _finding(
            s,
            slow,
            x,
            s.catch_up_us or 0.0,
            step_us,
            _slower_gpu(slow, others, f"{us(s.work_us - s.others_work_us)} more"),
        )
    if s.traced_rank is not None:  # named by its GPU's idle time unprofiled, not by the trace
        uneven_work = load_imbalance(x, summaries, step_us)
        if uneven_work is not None and uneven_work.values["rank"] == s.rank:
            return None  # load_imbalance's
        return _finding(s, slow, x, s.catch_up_us or 0.0, step_us, own_host_cause(slow))
    waits = [w for r, w in zip(summaries, x.wait_us, strict=True) if r.rank != s.rank and w is not None]
    wait_us = statistics.median(waits) if waits else s.comm_wait_us
    if wait_us is None or wait_us <= 0:
        return None
    if s.catch_up_us is not None:  # the most the unprofiled step can lose: less than the traced wait
        saving_us = min(wait_us, s.catch_up_us)
    else:  # at most the others' wait goes, and never more than the step less their own time outside it
        busy_others = statistics.median(r.figures.work_us or 0.0 for r in others)
        saving_us = min(wait_us, max(step_us - busy_others, 0.0))
    cause = straggler_cause(slow, others, uneven)
    if cause.name == "uneven work":
        return None  # load_imbalance's
    return _finding(s, slow, x, saving_us, step_us, cause, wait_us)


def _finding(
    s: Slowest,
    slow: RankSummary,
    x: AcrossRanks,
    saving_us: float,
    step_us: float,
    cause: Cause,
    wait_us: float | None = None,
) -> Finding:
    if s.paced_by == "gpu":
        head = (
            f"Rank {s.rank}'s GPU works {us(s.work_us)} per step (compute and copies), {100 * s.spread:+.0f}% "
            f"against the other ranks' median ({us(s.others_work_us)}); with the transfers that is the "
            f"unprofiled {us(step_us)} step: the GPUs pace the run, and the others wait for this one."
        )
        evidence = [head, cause.detail]
    elif s.traced_rank is not None:
        evidence = [
            _idle_sentence(s),
            f"In the trace rank {s.traced_rank} looked the slowest: the profiler slowed its host more than the "
            "others' (the same ops took longer there), so the traced times per rank do not say which rank is "
            "late; the unprofiled utilization does.",
            cause.detail,
            f"Catching up saves at most {us(s.catch_up_us or 0.0)} of the unprofiled {us(step_us)} step: its own host "
            "time beyond the others' as traced (Python outside ops and the DataLoader, which the profiler hardly "
            "slows), no more than its GPU's idle time beyond theirs, nor than the step less the heaviest GPU's work "
            "and the transfer.",
        ]
    else:
        evidence = [
            f"Rank {s.rank} spends {us(s.work_us)} per step outside communication, {100 * s.spread:+.0f}% "
            f"against the other ranks' median ({us(s.others_work_us)}).",
            f"The others wait for it {us(wait_us or 0.0)} per step in their collectives: the time their kernel "
            "of each call runs beyond the same call's shortest over the ranks (where no rank waits).",
            cause.detail,
        ]
        if s.gpu_idle is not None:
            evidence.append(_idle_sentence(s))
        if s.catch_up_us is not None and wait_us is not None and s.catch_up_us < wait_us:
            evidence.append(
                f"Those are traced times, and the profiler slows every host: unprofiled, the {us(step_us)} step "
                f"less the heaviest GPU's work and the transfer"
                + (
                    ", its GPU's idle time beyond the others' and its own host time beyond theirs (Python outside "
                    "ops and the DataLoader),"
                    if s.gpu_idle is not None
                    else ""
                )
                + f" leaves at most {us(s.catch_up_us)} to gain."
            )
    bound = s.unprofiled_bound_us
    if (
        bound is not None
        and s.catch_up_us is not None
        and bound > UNEVEN_TRACE_FACTOR * max(s.catch_up_us, 1.0)
    ):
        evidence.append(
            f"Unprofiled, its GPU idled {us(bound)} per step beyond the others' (within the "
            f"step less the GPU floor); its own host time beyond theirs as traced is only {us(s.catch_up_us)}. "
            "A busy machine or the profiler can stretch one rank's host more than another's in the trace: "
            f"removing its extra work may save up to {us(bound)} "
            f"({pct(100 * bound / step_us)} of the step); the estimate keeps the smaller figure."
        )
    if x.collectives and x.link is not None:
        top = max(x.collectives, key=lambda c: c.bytes * c.calls)
        evidence.append(
            f"The transfers themselves are not the limit: the {size(top.bytes)} {top.collective.replace('_', '-')} "
            f"moves at {fmt_rate(top.busbw)} bus bandwidth where no rank waits, "
            f"{pct(100 * (top.link_share or 0.0))} of the link's {fmt_rate(x.link.bytes_per_s)}."
        )
    values = {"rank": s.rank, "spread": s.spread, "step_us": step_us}
    if wait_us is not None:
        values["others_wait_us"] = wait_us
    if s.catch_up_us is not None:
        values["catch_up_us"] = s.catch_up_us
    if s.unprofiled_bound_us is not None:
        values["unprofiled_bound_us"] = s.unprofiled_bound_us
    return finding(
        "straggler",
        f"Rank {s.rank} is a straggler: {cause.name}",
        100 * saving_us / step_us,
        evidence,
        FIXES[cause.name],
        values,
        sources=(slow.host_top_frame,) if cause.name == "host work" and slow.host_top_frame else (),
    )


def _idle_sentence(s: Slowest) -> str:
    return (
        f"Unprofiled, rank {s.rank}'s GPU sat idle {pct(100 * (s.gpu_idle or 0.0))} of each step waiting for its "
        f"host, the other ranks' {pct(100 * (s.others_gpu_idle or 0.0))} (NVML utilization over the light phase; "
        "a GPU waiting in a collective's kernel counts as busy): the others wait for it in their collectives."
    )


def own_host_cause(slow: RankSummary) -> Cause:
    """Where the straggler's own host time goes in the trace (DataLoader, synchronizations, the rest),
    when the trace cannot set it against the others' (the profiler slowed their hosts more)."""
    step = slow.figures.step_p50_us or 0.0
    share = slow.figures.idle_share_by_cause
    by = {
        "data loading": slow.dataloader_us,
        "synchronizations": share.get("sync", 0.0) * step,
        "host work": share.get("host_wait", 0.0) * step,
    }
    name = max(by, key=lambda k: by[k])
    if name == "data loading":
        return Cause(name, f"In the trace its host spends {us(by[name])} per step in DataLoader __next__.")
    if name == "synchronizations":
        return Cause(name, f"In the trace its GPU idles {us(by[name])} per step in host synchronizations.")
    return _host_work(slow, f"In the trace its GPU waits {us(by[name])} per step for its host between ops")


def _slower_gpu(slow: RankSummary, others: Sequence[RankSummary], extra: str) -> Cause:
    """`extra`: how much more GPU work than the others' median, in words ("3 ms more")."""
    clocks = _clock_detail(slow, others)
    return Cause(
        "slower GPU",
        f"Its extra time is GPU work: {extra} per step than the others' median, "
        "with the same kernels launched with the same shapes"
        + (f"; {clocks}" if clocks else " (no NVML record to tell whether its clocks were lower)")
        + ".",
    )


def straggler_cause(slow: RankSummary, others: Sequence[RankSummary], uneven_shapes: bool = False) -> Cause:
    """Where the slow rank's extra time outside communication goes, against the others' median."""

    def med(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    step = slow.figures.step_p50_us or 0.0

    def idle(r: RankSummary, cause: str) -> float:
        return r.figures.idle_share_by_cause.get(cause, 0.0) * (r.figures.step_p50_us or 0.0)

    d_compute = (slow.compute_us or 0.0) - med([r.compute_us or 0.0 for r in others])
    d_host = idle(slow, "host_wait") - med([idle(r, "host_wait") for r in others])
    d_sync = idle(slow, "sync") - med([idle(r, "sync") for r in others])
    d_loader = slow.dataloader_us - med([r.dataloader_us for r in others])
    if d_compute > max(d_host, d_sync, 0.0) and uneven_shapes:
        return Cause(
            "uneven work",
            f"Its extra time is GPU work, {us(d_compute)} more compute per step than the others' median, and "
            "the ranks launch the same kernels with different grids: it gets larger tensors (load_imbalance).",
        )
    if d_compute > max(d_host, d_sync, 0.0):
        return _slower_gpu(slow, others, f"{us(d_compute)} more compute")
    if d_sync > d_host:
        return Cause(
            "synchronizations",
            f"Its GPU idles in host synchronizations {us(d_sync)} more per step than the others'.",
        )
    head = f"Its GPU waits for its host {us(d_host)} more per step than the others' ({pct(100 * d_host / step) if step else 'n/a'} of its step)"
    if d_loader > 0.5 * max(d_host, 1e-9):
        return Cause("data loading", f"{head}: {us(d_loader)} more per step in DataLoader __next__.")
    return _host_work(slow, head)


def _host_work(slow: RankSummary, head: str) -> Cause:
    where = f", mostly in {slow.host_top_frame}" if slow.host_top_frame else ""
    return Cause(
        "host work",
        f"{head}, neither in the DataLoader nor in synchronizations: its own host work (Python between the "
        f"ops, logging, per-rank preprocessing{where}).",
    )


def _clock_detail(slow: RankSummary, others: Sequence[RankSummary]) -> str | None:
    if slow.clocks is None:
        return None
    parts = []
    mine = slow.clocks.sm_busy_mean_mhz
    theirs = [r.clocks.sm_busy_mean_mhz for r in others if r.clocks and r.clocks.sm_busy_mean_mhz]
    if mine and theirs and mine < (1 - CLOCK_DROP) * statistics.median(theirs):
        parts.append(f"its SM clock averaged {mine:.0f} MHz busy against {statistics.median(theirs):.0f} MHz")
    reasons = [(k, v) for k, v in slow.clocks.slowdown_shares.items() if v >= THROTTLE_SHARE]
    if reasons:
        k, v = max(reasons, key=lambda kv: kv[1])
        parts.append(f"NVML saw it slowed by {REASON_WORDS.get(k, k)} in {pct(100 * v)} of samples")
    return "; ".join(parts) + " (clock throttling)" if parts else "NVML saw no lower clock or slowdown reason"
