"""`allocator_thrash`: cudaMalloc / cudaFree inside the steps. The caching allocator should serve a
steady loop from its cache; these calls mean `torch.cuda.empty_cache()` in the loop, changing shapes,
or memory so tight that the allocator frees and retries. cudaFree also synchronizes the device."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

FIX = Fix(
    summary="Let the caching allocator keep its memory: no torch.cuda.empty_cache() in the loop, stable "
    "shapes (pad to a few bucket sizes), and expandable segments against fragmentation.",
    snippet="""\
# remove torch.cuda.empty_cache() from the training loop; if fragmentation is the problem:
import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"   # before the first CUDA call
print(torch.cuda.memory_stats()["num_alloc_retries"])                # should stay 0""",
)


def allocator_thrash(a: Analysis, f: Facts) -> Finding | None:
    if f.allocator_calls < 1:
        return None
    # The calls themselves, and the GPU idle they cause (cudaFree waits for the device to drain).
    saving_us = min(f.allocator_us + f.host_wait_us * f.host_scale, f.allocator_us * 2)
    evidence = [
        f"{f.allocator_calls:.0f} cudaMalloc/cudaFree calls {f.per} take {us(f.allocator_us)} of host "
        f"time {step_phrase(f)} ({pct(f.pct(f.allocator_us))}); a warm caching allocator makes none.",
        "cudaFree synchronizes the device, so the GPU's queue drains at each one.",
    ]
    return finding(
        "allocator_thrash",
        "Device memory is allocated and freed inside the steps",
        f.pct(saving_us),
        evidence,
        FIX,
        {"allocator_calls_per_step": f.allocator_calls, "allocator_us": f.allocator_us},
    )
