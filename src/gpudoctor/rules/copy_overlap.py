"""`copy_overlap`: host↔device copies from pinned memory that run alone — no kernel beside them — while
they could overlap compute: issued on the compute stream right before the kernels that use them (a
stream runs in order), or waited for at once. Pinned memory, `non_blocking=True` and the next batch's copy
started on a side stream while this one computes (or the DataLoader's `pin_memory` with a prefetching
loop) hide them. Pageable copies are `pageable_copy`'s; this rule claims the pinned ones."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, size, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

MIN_SHARE = 0.05  # of the step: exposed pinned copy time below this is not worth a stream
MIN_US = 50.0

FIX = Fix(
    summary="Start the next batch's copy on a side stream while this batch computes: pinned host memory, "
    "non_blocking=True, the compute stream waiting for the copy only when it needs the batch (with a "
    "DataLoader: pin_memory=True and a prefetching loop).",
    snippet="""\
copy_stream = torch.cuda.Stream()

def start_copy(cpu_batch):                        # cpu_batch in pinned memory (DataLoader(pin_memory=True))
    with torch.cuda.stream(copy_stream):
        return cpu_batch.to("cuda", non_blocking=True)

batches = iter(loader)
next_gpu = start_copy(next(batches))
for _ in range(len(loader) - 1):
    torch.cuda.current_stream().wait_stream(copy_stream)   # this batch's copy is done
    x = next_gpu
    x.record_stream(torch.cuda.current_stream())          # allocated on the copy stream
    next_gpu = start_copy(next(batches))                  # overlaps the compute below
    loss = model(x).mean()
    loss.backward()""",
)


def copy_overlap(a: Analysis, f: Facts) -> Finding | None:
    w = a.window
    if w is None:
        return None
    stats = [t for t in a.transfers.directions if t.direction in ("h2d", "d2h") and t.time_us > 0]
    if not stats:
        return None
    exposed_all = sum(w.busy_by_kind_us.get(f"memcpy_{t.direction}", 0.0) for t in stats) / f.steps
    pinned_share = sum(t.time_us * (1 - t.pageable_bytes / max(t.bytes, 1)) for t in stats) / sum(
        t.time_us for t in stats
    )
    exposed = exposed_all * pinned_share  # the pageable part is pageable_copy's
    compute = w.busy_by_kind_us.get("compute", 0.0) / f.steps
    # Overlapped perfectly, a copy hides behind compute that does not need it (the next batch's copy
    # behind this batch's kernels): at most the compute there is.
    saving = min(exposed, compute)
    if exposed < MIN_US or saving < MIN_SHARE * f.step_us:
        return None
    copies = sum(t.count for t in stats) / f.steps
    moved = sum(t.bytes * (1 - t.pageable_bytes / max(t.bytes, 1)) for t in stats) / f.steps
    on_compute = sum(t.on_compute_stream_us for t in stats) / max(sum(t.time_us for t in stats), 1e-9)
    where = (
        f"{pct(100 * on_compute)} of their time on a stream that also runs the kernels, which runs them "
        "in order"
        if on_compute >= 0.5
        else "on their own stream, yet with no kernel beside them: the compute waits for each copy as "
        "soon as it is issued"
    )
    evidence = [
        f"{copies:.0f} host↔device copies {f.per} move {size(moved)} from pinned memory; "
        f"{us(exposed)} {step_phrase(f)} ({pct(f.pct(exposed))}) of them run with no kernel beside them, "
        f"{where}.",
        f"The step computes {us(compute)} on the GPU: started a batch ahead on a side stream, the copies "
        f"can hide behind up to that much, so at most {us(saving)} goes.",
    ]
    return finding(
        "copy_overlap",
        "Copies run alone where they could overlap compute",
        f.pct(saving),
        evidence,
        FIX,
        {"exposed_copy_us": exposed, "compute_us": compute, "on_compute_stream_share": on_compute},
    )
