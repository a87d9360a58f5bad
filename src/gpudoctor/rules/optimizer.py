"""`optimizer_unfused`: the optimizer step launches kernels parameter by parameter (a Python loop over
tensors), where `foreach` or `fused=True` implementations launch a handful for all parameters."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

MIN_LAUNCHES = 100  # foreach Adam launches a few dozen per step, fused Adam a few

FIX = Fix(
    summary="Use the fused (or foreach) implementation of the optimizer.",
    snippet="""\
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)   # CUDA parameters
# or, where fused is not available: torch.optim.AdamW(..., foreach=True)""",
)


def optimizer_unfused(a: Analysis, f: Facts) -> Finding | None:
    if f.optimizer_launches < MIN_LAUNCHES:
        return None
    # A fused step is a few launches: nearly all of the optimizer's host time goes, but only the part
    # the GPU spent waiting for it shortens the step.
    waiting = f.host_wait_us * f.host_scale
    saving_us = min(
        0.9 * f.optimizer_us,
        waiting + 0.5 * f.per_step(a.kernels.time_by_category_us.get("elementwise", 0.0)),
    )
    evidence = [
        f"Optimizer.step launches {f.optimizer_launches:.0f} kernels per step and takes {us(f.optimizer_us)} "
        f"of host time {step_phrase(f)} ({pct(f.pct(f.optimizer_us))}).",
        f"The GPU idles {us(saving_us)} per step waiting for it: a per-parameter loop, each parameter's "
        "update several tiny kernels.",
    ]
    return finding(
        "optimizer_unfused",
        "The optimizer step runs parameter by parameter",
        f.pct(saving_us),
        evidence,
        FIX,
        {"optimizer_launches": f.optimizer_launches, "optimizer_us": f.optimizer_us},
    )
