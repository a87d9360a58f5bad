"""`communication_exposed`: collective communication (NCCL all-reduce, all-gather, ...) that the GPU does
alone, with no compute beside it. In data-parallel training the gradient all-reduce should hide under
the backward pass; when it does not, either the link is the limit or — far more often, and what an
all-reduce that takes milliseconds and varies from call to call says — the collective is waiting for a
slower rank: a straggler with more host work, a slower input pipeline or a larger share of the data."""

from __future__ import annotations

import statistics

from gpudoctor.analysis.comms import CommReport
from gpudoctor.analysis.precision import LowPrecision
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, kernel, pct, size, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.precision import compress_comment, compress_hook, for_device, per_profile
from gpudoctor.util.units import fmt_rate, fmt_us

COMMUNICATION = "communication"
UNEVEN = 1.5  # mean over median of one collective's durations that says it waits for other ranks
# Exposed time of these collectives is another rule's: FSDP's (fsdp_exposed), pipeline stages' (pipeline_bubble)
OTHER_RULES = ("all_gather", "reduce_scatter", "send_recv")

_BF16 = Fix(
    summary="Find the slowest rank and even out its work (`gpudoctor analyze TRACE_DIR` compares the "
    "ranks); then let the all-reduce hide under backward: DDP buckets sized so the first starts early "
    "and the last is small, gradient_as_bucket_view (no copy into the buckets), static_graph (a fixed "
    "bucket order from the first iterations), fewer all-reduces with gradient accumulation, half the "
    "bytes with a bf16 compression hook.",
    snippet="""\
import contextlib
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

model = DDP(model, device_ids=[local_rank], bucket_cap_mb=25,      # try 10-100: the all-reduces start
            gradient_as_bucket_view=True, static_graph=True)        # earlier in backward, or cost fewer calls
model.register_comm_hook(None, default_hooks.bf16_compress_hook)   # all-reduce gradients in bf16

# communicate once per `accumulation_steps` micro-batches
for i, (inputs, targets) in enumerate(loader):
    sync = (i + 1) % accumulation_steps == 0
    with contextlib.nullcontext() if sync else model.no_sync():
        (criterion(model(inputs), targets) / accumulation_steps).backward()
    if sync:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)""",
)


def _fix(p: LowPrecision) -> Fix:
    """The fix with the gradient compression hook of the device's reduced precision."""
    bits = "bf16" if p.dtype == "bfloat16" else "fp16"
    return Fix(
        summary=_BF16.summary.replace("a bf16 compression hook", f"a {bits} compression hook"),
        snippet=_BF16.snippet.replace(
            "default_hooks.bf16_compress_hook)   # all-reduce gradients in bf16",
            f"default_hooks.{compress_hook(p)})   # all-reduce gradients in {bits}{compress_comment(p)}",
        ),
    )


FIXES = per_profile(_fix)
FIX = FIXES["sm80+"]


def communication_exposed(a: Analysis, f: Facts) -> Finding | None:
    w = a.window
    if w is None:
        return None
    exposed_us = f.per_step(w.busy_by_kind_us.get(COMMUNICATION, 0.0))  # comm with no compute beside it
    if a.comms is not None:
        exposed_us -= f.per_step(sum(a.comms.exposed_by_collective_us.get(k, 0.0) for k in OTHER_RULES))
    if exposed_us <= 1e-6:
        return None
    traced_us = exposed_us
    exposed_us = exposed_in_step(f, traced_us)
    saving_us = exposed_us  # at most the exposed communication goes
    concurrent = a.timeline.concurrent_kinds_us.get(COMMUNICATION, 0.0)
    whole = a.timeline.gpu_window
    exposed_share = (
        whole.busy_by_kind_us.get(COMMUNICATION, 0.0) / concurrent if whole and concurrent else 1.0
    )
    comm_kernels = [k for k in a.kernels.top if k.category == COMMUNICATION]
    waiting = bool(comm_kernels) and comm_kernels[0].mean_us >= UNEVEN * comm_kernels[0].median_us
    evidence = [exposed_sentence(f, exposed_us, traced_us, "the GPU only communicates")]
    evidence[0] += f": {pct(100 * exposed_share)} of its communication time has no compute beside it."
    if comm_kernels:
        k = comm_kernels[0]
        evidence.append(
            f"{kernel(k.name)} runs {k.calls} times, {fmt_us(k.median_us)} median and {fmt_us(k.mean_us)} "
            "mean"
            + (
                ": the same collective taking this unevenly long is usually waiting for a slower rank, not "
                "moving data."
                if waiting
                else "."
            )
        )
    if a.comms is not None:
        evidence += comm_evidence(a.comms, waiting)
    return finding(
        "communication_exposed",
        "Communication is exposed: the GPU waits on collectives",
        f.pct(saving_us),
        evidence,
        for_device(FIXES, a),
        {
            "exposed_comm_us": exposed_us,
            "traced_exposed_comm_us": traced_us,
            "exposed_share": exposed_share,
            "step_us": f.step_us,
        },
    )


def exposed_in_step(f: Facts, traced_us: float) -> float:
    """Exposed communication per step as the step can hold it. The GPU's other work (kernels) runs at
    its own speed under the profiler, but a collective that waits for another rank lasts as long as
    that rank's host takes to get there, and the profiler slows hosts: against the unprofiled step, at
    most the step less the GPU's other work."""
    return min(traced_us, max(f.step_us - (f.busy_us - traced_us), 0.0))


def exposed_sentence(f: Facts, exposed_us: float, traced_us: float, what: str) -> str:
    """'X of each unprofiled step (N%) <what>', with the traced figure beside it where the step could
    not hold it (no share of a step over 100%)."""
    head = f"{us(exposed_us)} {step_phrase(f)} ({pct(f.pct(exposed_us))}) {what}"
    if traced_us <= exposed_us * 1.001:
        return head
    return (
        f"At most {head} ({us(traced_us)} per traced {us(f.traced_step_us)} step: a collective that waits "
        "for a slower rank lasts as long as that rank's host, which the profiler slows)"
    )


def comm_evidence(c: CommReport, waiting: bool = False) -> list[str]:
    """Per step, communication beside compute and alone; the all-reduces per step (DDP's buckets) and
    the bandwidth of the busiest one."""
    out = []
    if c.steps:
        total = statistics.median(s.comm_us for s in c.steps)
        exposed = statistics.median(s.exposed_us for s in c.steps)
        out.append(
            f"Per step (median): {us(total)} of communication, {us(max(total - exposed, 0.0))} of it beside "
            f"compute (overlapped) and {us(exposed)} alone (exposed)."
        )
    reduces = [x for x in c.calls if x.collective == "all_reduce" and x.step is not None]
    steps = sorted({x.step for x in reduces if x.step is not None})
    if reduces and steps:
        one = [x for x in reduces if x.step == steps[len(steps) // 2]]
        sizes = ", ".join(size(x.bytes) for x in one[:8]) + (", …" if len(one) > 8 else "")
        out.append(
            f"{len(one)} all-reduces per step, in issue order: {sizes} (DDP's gradient buckets: the first "
            "can start only when its gradients are ready in backward, the last runs after backward ends)."
        )
    if c.collectives:
        top = max(c.collectives, key=lambda s: s.bytes * s.calls)  # where most of the bytes go
        line = (
            f"The {size(top.bytes)} {top.collective.replace('_', '-')} moves at {fmt_rate(top.busbw_best)} "
            f"bus bandwidth in its fastest call ({fmt_rate(top.busbw_median)} median)"
        )
        if c.link is not None:
            line += (
                f", {pct(100 * top.busbw_best / c.link.bytes_per_s)} of the link's "
                f"{fmt_rate(c.link.bytes_per_s)} ({c.link.source})"
            )
        if waiting:
            line += "; a kernel that waits for another rank counts the wait as transfer time: the ranks compared show the transfer alone"
        out.append(line + ".")
    return out
