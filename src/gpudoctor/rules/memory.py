"""`memory_pressure`: peak memory near the device's capacity (TensorBoard's "memory > 90%" rule): the
next larger batch or sequence fails, and the allocator starts freeing and retrying."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, size
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix, Severity

THRESHOLD = 0.90

FIX = Fix(
    summary="Make room: free what the loop keeps alive, checkpoint activations, compute in bfloat16, "
    "and let the allocator use expandable segments.",
    snippet="""\
from torch.utils.checkpoint import checkpoint

class Block(torch.nn.Module):
    def forward(self, x):
        return checkpoint(self._forward, x, use_reentrant=False)   # recompute activations in backward

print(torch.cuda.memory_summary(abbreviated=True))   # what holds the memory
# os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  (set before the first CUDA call)""",
)


def memory_pressure(a: Analysis, f: Facts) -> Finding | None:
    m = a.memory
    if m is None or not m.capacity:
        return None
    share = max(m.peak_reserved, m.peak_allocated) / m.capacity
    if share < THRESHOLD:
        return None
    first = (
        f"Allocated memory rose by {size(m.peak_allocated)} ({pct(100 * m.peak_allocated / m.capacity)} "
        f"of {size(m.capacity)}) from the trace's start; the events carry no allocator totals, so the "
        "peak is at least that."
        if m.is_rise
        else f"Peak memory reserved {size(m.peak_reserved)} ({pct(100 * m.peak_reserved / m.capacity)} "
        f"of {size(m.capacity)}); peak allocated {size(m.peak_allocated)}."
    )
    evidence = [
        first,
        "Near the limit, the allocator frees its cache and retries (each retry synchronizes), and any "
        "larger input runs out of memory. It costs no time yet: the saving is 0.",
    ]
    return finding(
        "memory_pressure",
        "Memory is nearly full",
        0.0,
        evidence,
        FIX,
        {"peak_share": share, "peak_reserved": m.peak_reserved, "capacity": m.capacity},
        severity=Severity.CRITICAL if share >= 0.97 else Severity.MAJOR,
    )
