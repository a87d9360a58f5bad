"""`pageable_copy`: host↔device copies from pageable memory, which are staged through a pinned bounce
buffer, run at a fraction of the link's bandwidth and block the host. Nsight Systems' "pageable
memcpy" and "synchronous memcpy" rules."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, size, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.util.units import fmt_rate

MIN_BYTES_PER_STEP = 1 << 20

FIX = Fix(
    summary="Copy from pinned (page-locked) host memory with non_blocking=True, and start the next "
    "batch's copy while the GPU computes (DataLoader(pin_memory=True) does the pinning).",
    snippet="""\
# allocate once, reuse every step
staging = torch.empty(batch_shape, dtype=torch.float32, pin_memory=True)
copy_stream = torch.cuda.Stream()

staging.copy_(next_batch_cpu)                      # host-side fill into pinned memory
with torch.cuda.stream(copy_stream):
    batch_gpu = staging.to("cuda", non_blocking=True)   # DMA, does not block the host
torch.cuda.current_stream().wait_stream(copy_stream)
batch_gpu.record_stream(torch.cuda.current_stream())
out = model(batch_gpu)""",
)


def pageable_copy(a: Analysis, f: Facts) -> Finding | None:
    stats = [t for t in a.transfers.directions if t.direction in ("h2d", "d2h") and t.pageable_count]
    pageable_bytes = sum(t.pageable_bytes for t in stats) / f.steps
    if pageable_bytes < MIN_BYTES_PER_STEP:
        return None
    # Time of the pageable copies on the GPU: pinned, asynchronous copies overlap with compute, so
    # at most this much of the step can go (what the blocking cost the host is already inside it).
    copy_us = sum(t.time_us * t.pageable_bytes / max(t.bytes, 1) for t in stats) / f.steps
    blocking = sum(t.blocking_count for t in stats) / f.steps
    lines = [
        f"{t.direction.upper()}: {t.pageable_count // f.steps} pageable copies {f.per}, "
        f"{size(t.pageable_bytes / f.steps)} at {fmt_rate(t.bandwidth)}"
        for t in stats
    ]
    evidence = [
        "; ".join(lines) + f"; {blocking:.0f} {f.per} blocked the host until done.",
        f"They take {us(copy_us)} of GPU time {step_phrase(f)} ({pct(f.pct(copy_us))}), serialized with "
        f"compute.",
    ]
    return finding(
        "pageable_copy",
        "Copies from pageable host memory block the host and cannot overlap",
        f.pct(copy_us),
        evidence,
        FIX,
        {"pageable_bytes_per_step": pageable_bytes, "copy_us": copy_us, "blocking_per_step": blocking},
    )
