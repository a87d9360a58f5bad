"""Is the link the limit? The bus bandwidth collectives reach (NCCL-tests' definition) against the link they
cross (NVML's, else `device.links`' reference). `comm_link_bound` (one rank): the costliest collective
reaches ≥ 70% of the link while communication is exposed, so fewer bytes or more overlap are the fix; a
call that waited only looks slower, so it can miss, never invent. `comm_bandwidth_low` (across ranks): the
transfer time still reaches under 25% of the link on messages of 4 MiB and more: a slow path, or latency."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpudoctor.analysis.across_ranks import AcrossRanks
from gpudoctor.analysis.rank_summary import RankSummary
from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, size, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.util.units import fmt_rate

LINK_BOUND = 0.7
LOW = 0.25
MIN_BYTES = 4 << 20  # smaller messages are latency-bound on any link

FIX_BOUND = Fix(
    summary="The link is the limit: move fewer bytes (all-reduce gradients in bf16, accumulate gradients "
    "over micro-batches with no_sync, shard with FSDP/ZeRO so each rank sends less) or hide the transfer "
    "under backward (smaller DDP buckets so all-reduces start earlier).",
    snippet="""\
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

model.register_comm_hook(None, default_hooks.bf16_compress_hook)   # half the bytes of fp32 gradients
with model.no_sync():                                              # no all-reduce on this micro-batch
    loss_fn(model(x0), y0).backward()
loss_fn(model(x1), y1).backward()                                  # one all-reduce for both""",
)

FIX_LOW = Fix(
    summary="The collectives move far slower than the link allows even when no rank waits: check the "
    "path NCCL takes (`NCCL_DEBUG=INFO` prints the transport and protocol; `nvidia-smi topo -m` the "
    "link), that peer-to-peer is on (NCCL_P2P_DISABLE unset, no IOMMU/ACS blocking it), and send fewer, "
    "larger messages (larger DDP buckets, coalesced collectives).",
    snippet="""\
# launch with the transport NCCL picked printed at start-up:
#   NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH torchrun --nproc-per-node 8 train.py
#   ("via P2P/CUMEM" or "NVLS" is NVLink; "via SHM" or "NET/Socket" is through host memory or the NIC)
model = DDP(model, device_ids=[local_rank], bucket_cap_mb=100)    # fewer, larger all-reduces""",
)


def comm_link_bound(a: Analysis, f: Facts) -> Finding | None:
    c = a.comms
    w = a.window
    if c is None or c.link is None or not c.collectives or w is None:
        return None
    top = max(c.collectives, key=lambda s: s.total_us)
    share = top.busbw_best / c.link.bytes_per_s
    exposed_us = f.per_step(w.busy_by_kind_us.get("communication", 0.0))
    if share < LINK_BOUND or top.bytes < MIN_BYTES or exposed_us <= 0:
        return None
    evidence = [
        f"The {size(top.bytes)} {top.collective.replace('_', '-')} ({top.calls} calls) reaches "
        f"{fmt_rate(top.busbw_best)} bus bandwidth in its fastest call, {pct(100 * share)} of the link's "
        f"{fmt_rate(c.link.bytes_per_s)} ({c.link.source}): the bytes take the time, not waiting.",
        f"{us(exposed_us)} {step_phrase(f)} ({pct(f.pct(exposed_us))}) of communication has no compute "
        "beside it.",
    ]
    return finding(
        "comm_link_bound",
        "Collectives run at the link's speed: the bytes are the cost",
        f.pct(min(exposed_us, f.step_us)),
        evidence,
        FIX_BOUND,
        {"busbw": top.busbw_best, "link_bytes_per_s": c.link.bytes_per_s, "exposed_comm_us": exposed_us},
    )


def comm_bandwidth_low(x: AcrossRanks, summaries: Sequence[RankSummary], step_us: float) -> Finding | None:
    """Across ranks: large messages whose transfer (no waiting) still runs far under the link; at most
    the ranks' median exposed communication goes."""
    exposed = [s.comm_exposed_us for s in summaries if s.comm_exposed_us is not None]
    if x.link is None or step_us <= 0 or not exposed:
        return None
    steps = max(len(x.steps_compared), 1)
    slow = [
        c for c in x.collectives if c.bytes >= MIN_BYTES and c.link_share is not None and c.link_share < LOW
    ]
    if not slow:
        return None
    # Reaching 70% of the link would take each transfer this long; the difference is the bound.
    saving_us = (
        sum(
            max(c.transfer_us - c.transfer_us * (c.link_share or 0.0) / LINK_BOUND, 0.0) * c.calls
            for c in slow
        )
        / steps
    )
    saving_us = min(saving_us, statistics.median(exposed))
    top = slow[0]
    evidence = [
        f"The {size(top.bytes)} {top.collective.replace('_', '-')} takes {us(top.transfer_us)} on the rank "
        f"that waits for no one (the shortest kernel of each call over the ranks): {fmt_rate(top.busbw)} "
        f"bus bandwidth, {pct(100 * (top.link_share or 0.0))} of the link's {fmt_rate(x.link.bytes_per_s)} "
        f"({x.link.source}).",
        f"{len(slow)} collective(s) of {size(MIN_BYTES)} or more run under {LOW:.0%} of the link; at "
        f"{LINK_BOUND:.0%} of it they would take {us(saving_us)} less per step.",
    ]
    return finding(
        "comm_bandwidth_low",
        "Collectives move far slower than the link, even with no rank waiting",
        100 * saving_us / step_us,
        evidence,
        FIX_LOW,
        {"busbw": top.busbw, "link_bytes_per_s": x.link.bytes_per_s, "saving_us": saving_us},
    )
