"""`communication_exposed`: collective communication (NCCL all-reduce, all-gather, ...) that the GPU does
alone, with no compute beside it. In data-parallel training the gradient all-reduce should hide under
the backward pass; when it does not, either the link is the limit or — far more often, and what an
all-reduce that takes milliseconds and varies from call to call says — the collective is waiting for a
slower rank: a straggler with more host work, a slower input pipeline or a larger share of the data."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, kernel, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.util.units import fmt_us

COMMUNICATION = "communication"
UNEVEN = 1.5  # mean over median of one collective's durations that says it waits for other ranks

FIX = Fix(
    summary="Find the slowest rank and even out its work (`gpudoctor analyze TRACE_DIR` compares the "
    "ranks); then let the all-reduce hide under backward: larger DDP buckets, fewer all-reduces with "
    "gradient accumulation, half the bytes with a bf16 compression hook.",
    snippet="""\
import contextlib
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

model = DDP(model, device_ids=[local_rank], bucket_cap_mb=100, gradient_as_bucket_view=True)
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


def communication_exposed(a: Analysis, f: Facts) -> Finding | None:
    w = a.window
    if w is None:
        return None
    exposed_us = f.per_step(w.busy_by_kind_us.get(COMMUNICATION, 0.0))  # comm with no compute beside it
    if exposed_us <= 0:
        return None
    # At most the exposed communication goes, and never more than the step minus the other GPU work.
    saving_us = min(exposed_us, max(f.step_us - (f.busy_us - exposed_us), 0.0))
    concurrent = a.timeline.concurrent_kinds_us.get(COMMUNICATION, 0.0)
    whole = a.timeline.gpu_window
    exposed_share = (
        whole.busy_by_kind_us.get(COMMUNICATION, 0.0) / concurrent if whole and concurrent else 1.0
    )
    comm_kernels = [k for k in a.kernels.top if k.category == COMMUNICATION]
    evidence = [
        f"{us(exposed_us)} {step_phrase(f)} ({pct(f.pct(exposed_us))}) the GPU only communicates: "
        f"{pct(100 * exposed_share)} of its communication time has no compute beside it.",
    ]
    if comm_kernels:
        k = comm_kernels[0]
        uneven = k.mean_us >= UNEVEN * k.median_us
        evidence.append(
            f"{kernel(k.name)} runs {k.calls} times, {fmt_us(k.median_us)} median and {fmt_us(k.mean_us)} "
            "mean"
            + (
                ": the same collective taking this unevenly long is usually waiting for a slower rank, not "
                "moving data."
                if uneven
                else "."
            )
        )
    return finding(
        "communication_exposed",
        "Communication is exposed: the GPU waits on collectives",
        f.pct(saving_us),
        evidence,
        FIX,
        {"exposed_comm_us": exposed_us, "exposed_share": exposed_share, "step_us": f.step_us},
    )
