"""`optimizer_unfused`: the optimizer step launches kernels parameter by parameter (a Python loop over
tensors), where `foreach` or `fused=True` implementations launch a handful for all parameters."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

MIN_LAUNCHES = 100  # foreach Adam launches a few dozen per step, fused Adam a few
# The share of a per-parameter optimizer's kernel time a fused step saves (docs/results.md, "Constants").
FUSED_KERNEL_SAVING = 0.8

FIX = Fix(
    summary="Use the fused (or foreach) implementation of the optimizer.",
    snippet="""\
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)   # CUDA parameters
# or, where fused is not available: torch.optim.AdamW(..., foreach=True)""",
)


def optimizer_unfused(a: Analysis, f: Facts) -> Finding | None:
    if f.optimizer_launches < MIN_LAUNCHES:
        return None
    # A fused step is a few launches: the GPU's wait for the optimizer's launches goes, and the update
    # itself makes one pass over the parameters and their state instead of one per elementwise op.
    waiting = f.optimizer_wait_us * f.host_scale
    saving_us = waiting + FUSED_KERNEL_SAVING * f.optimizer_kernel_us
    evidence = [
        f"Optimizer.step launches {f.optimizer_launches:.0f} kernels {f.per} and takes {us(f.optimizer_us)} "
        f"of host time {step_phrase(f)} ({pct(f.pct(f.optimizer_us))}).",
        f"A per-parameter loop: the GPU idles {us(waiting)} {f.per} waiting for its launches, and runs its "
        f"{us(f.optimizer_kernel_us)} of kernels as many small passes.",
    ]
    return finding(
        "optimizer_unfused",
        "The optimizer step runs parameter by parameter",
        f.pct(saving_us),
        evidence,
        FIX,
        {"optimizer_launches": f.optimizer_launches, "optimizer_us": f.optimizer_us},
    )
