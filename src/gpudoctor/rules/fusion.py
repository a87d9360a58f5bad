"""`unfused_elementwise`: memory-bound elementwise, normalization and reduction kernels dominate GPU
time; each reads and writes the whole tensor, where a compiler would fuse the chain into a few passes."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, kernel, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.precision import autocast, backward, for_device, per_profile, setup

MIN_SHARE = 0.35  # of kernel time
# The share of each category's time that fusion removes. Fusing a chain of k elementwise passes into
# one saves (k-1)/k of its memory traffic: standalone elementwise kernels are the most fusable (into
# their neighbours); normalizations, softmax and reductions already make one or two passes, and fusion
# saves the elementwise work around them.
FUSABLE = {"elementwise": 0.6, "normalization": 0.3, "reduction": 0.3, "softmax": 0.3}
MEMORY_BOUND = tuple(FUSABLE)

FIXES = per_profile(
    lambda p: Fix(
        summary="Compile the model (or the hot function) with torch.compile, which fuses chains of "
        "elementwise and normalization ops into single kernels.",
        snippet=f"""\
{setup(p)}model = torch.compile(model)            # or: fn = torch.compile(fn) for a hot function
{autocast(p)}
    loss = criterion(model(inputs), targets)
{backward(p, optimizer=False)}""",
    )
)
FIX = FIXES["sm80+"]


def unfused_elementwise(a: Analysis, f: Facts) -> Finding | None:
    cats = a.kernels.time_by_category_us
    total = sum(cats.values())
    memory_bound = sum(cats.get(c, 0.0) for c in MEMORY_BOUND)
    if not total or memory_bound / total < MIN_SHARE:
        return None
    per_step = f.per_step(memory_bound)
    saving_us = f.per_step(sum(share * cats.get(c, 0.0) for c, share in FUSABLE.items()))
    top = [k for k in a.kernels.top if k.category in MEMORY_BOUND][:3]
    evidence = [
        f"Elementwise, normalization and reduction kernels take {pct(100 * memory_bound / total)} of GPU "
        f"kernel time: {us(per_step)} {step_phrase(f)}.",
        "The largest: "
        + "; ".join(f"{kernel(k.name)} ({us(k.total_us / f.steps)} {f.per})" for k in top)
        + "."
        if top
        else "Each such kernel reads and writes its whole tensor.",
    ]
    if cats.get("compiled"):
        evidence.append(f"Compiled (fused) kernels already run {us(f.per_step(cats['compiled']))} {f.per}.")
    return finding(
        "unfused_elementwise",
        "Memory-bound elementwise and normalization kernels dominate",
        f.pct(saving_us),
        evidence,
        for_device(FIXES, a),
        {"memory_bound_us": per_step, "share_of_kernel_time": memory_bound / total},
    )
