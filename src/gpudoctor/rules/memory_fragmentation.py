"""`memory_fragmentation`: the allocator reserves far more than the tensors use, in free pieces split
off segments that a new request of another size cannot use (changing shapes: varying sequence lengths,
the last smaller batch), or it had to free its cache and retry, or it calls cudaMalloc/cudaFree in
steady steps. Expandable segments let it grow segments in place instead; fewer distinct shapes help
whatever the allocator."""

from __future__ import annotations

from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.rules.base import finding, pct, size
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.memory_base import severity_of_share

MIN_SLACK = 256 << 20
MIN_SLACK_SHARE = 0.25  # of the reserved peak
MIN_SPLIT = 128 << 20

FIX = Fix(
    summary="Let the allocator grow its segments in place (expandable_segments), and give it fewer "
    "distinct shapes: pad sequences to a few bucket lengths, drop the last partial batch.",
    snippet="""\
import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"    # before the first CUDA call
# fewer shapes: pad each batch to the next multiple of 64 tokens
length = -(-batch.shape[1] // 64) * 64
batch = torch.nn.functional.pad(batch, (0, length - batch.shape[1]), value=pad_id)
loader = DataLoader(dataset, batch_size=32, drop_last=True)""",
)
FIX_EXPANDABLE = Fix(
    summary="Expandable segments are on already: give the allocator fewer distinct shapes (pad to a few "
    "bucket lengths, drop the last partial batch).",
    snippet=FIX.snippet.split("\n", 2)[2],
)


def memory_fragmentation(m: MemoryAnalysis) -> Finding | None:
    f = m.fragmentation
    if f is None or f.peak_reserved <= 0:
        return None
    slack = max(f.peak_reserved - f.peak_allocated, 0)
    split = f.inactive_split_bytes >= MIN_SPLIT and slack >= max(MIN_SLACK, MIN_SLACK_SHARE * f.peak_reserved)
    churn = f.device_allocs_per_step >= 1 or f.device_frees_per_step >= 1
    if not (split or f.alloc_retries or churn):
        return None
    evidence = [
        f"Over {f.steps} timed steps the allocator reserved up to {size(f.peak_reserved)} for tensors "
        f"peaking at {size(f.peak_allocated)}: {size(slack)} ({pct(100 * slack / f.peak_reserved)}) "
        "reserved and unused at the peak.",
    ]
    if f.inactive_split_bytes:
        blocks = f" in {f.inactive_split_blocks} pieces" if f.inactive_split_blocks else ""
        largest = f", the largest {size(f.largest_free_block)}" if f.largest_free_block else ""
        evidence.append(
            f"Up to {size(f.inactive_split_bytes)} sat free inside split segments at a step boundary{blocks}{largest}: "
            "a request of another size cannot use it, so the allocator reserves more."
        )
    if f.alloc_retries:
        evidence.append(
            f"{f.alloc_retries} times an allocation failed and succeeded only after the allocator freed its "
            "whole cache (each retry synchronizes the device); near the limit this ends in an out-of-memory error."
        )
    if churn:
        evidence.append(
            f"{f.device_allocs_per_step:.1f} cudaMalloc and {f.device_frees_per_step:.1f} cudaFree calls per "
            "step in steady state (a warm cache makes none; cudaFree synchronizes)."
        )
    return finding(
        "memory_fragmentation",
        "GPU memory is fragmented: reserved far above what tensors use",
        0.0,
        evidence,
        FIX_EXPANDABLE if f.expandable_segments else FIX,
        {
            "peak_reserved": f.peak_reserved,
            "peak_allocated": f.peak_allocated,
            "slack": slack,
            "inactive_split_bytes": f.inactive_split_bytes,
            "alloc_retries": f.alloc_retries,
            "device_allocs_per_step": f.device_allocs_per_step,
        },
        severity=severity_of_share(slack / f.peak_reserved),
        memory_bytes=slack,
    )
