"""`small_batch`: kernels too small to fill the device (fewer thread blocks than SMs) in work with a batch
dimension, so most of the GPU sits unused while "busy". The bound is a batch just large enough to fill
it: per sample, the under-filled kernels' unused share goes, and so does that share of the launch wait,
which is this finding's, not `launch_overhead`'s (`launch_wait_share`)."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

MIN_UNDER_WAVE_SHARE = 0.5  # of kernel time in kernels with fewer blocks than SMs
MAX_FILL = 0.5  # and those kernels use under half the SMs on average

FIX = Fix(
    summary="Give each step more work: a larger batch (scale the learning rate, or accumulate "
    "gradients), or batch requests together for inference.",
    snippet="""\
loader = torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=True,
                                     num_workers=8, pin_memory=True)
# training: keep the effective batch with gradient accumulation if memory is short
for i, (inputs, targets) in enumerate(loader):
    loss = criterion(model(inputs.to("cuda", non_blocking=True)), targets.to("cuda", non_blocking=True))
    (loss / accumulation_steps).backward()
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)""",
)


def under_filled(a: Analysis) -> float | None:
    """The mean SM fill of the under-filled kernels where small_batch applies — a batch dimension exists
    and most compute time is in kernels of under one wave at low fill — else None."""
    if a.batch_evidence is not None and not a.batch_evidence:
        return None  # nothing in the trace has a batch to make larger (None: an older analysis, unknown)
    k = a.kernels
    compute_us = k.total_us - k.time_by_category_us.get("communication", 0.0)  # NCCL: few blocks by design
    if (
        compute_us <= 0
        or k.under_one_wave_us / compute_us < MIN_UNDER_WAVE_SHARE
        or k.under_one_wave_fill is None
        or k.under_one_wave_fill > MAX_FILL
    ):
        return None
    return k.under_one_wave_fill


def launch_wait_share(a: Analysis) -> float:
    """The share of the GPU's wait for launches that `launch_overhead` may claim: all of it, or where
    small_batch applies, what a batch that fills the GPU leaves (the fill)."""
    fill = under_filled(a)
    return 1.0 if fill is None else fill


def small_batch(a: Analysis, f: Facts) -> Finding | None:
    fill = under_filled(a)
    if fill is None:
        return None
    k = a.kernels
    compute_us = k.total_us - k.time_by_category_us.get("communication", 0.0)
    unused_us = f.per_step(k.under_one_wave_us) * (1 - fill)
    amortized_us = f.launch_wait_us * (1 - fill)
    saving_us = unused_us + amortized_us
    sms = a.device.sm_count if a.device and a.device.sm_count else None
    evidence = [
        f"{pct(100 * k.under_one_wave_us / compute_us)} of compute kernel time is in kernels with fewer thread blocks "
        f"than the GPU has SMs{f' ({sms})' if sms else ''}: on average they use {pct(100 * fill)} of them; "
        f"the work has a batch dimension ({', '.join(a.batch_evidence or ('a batch',))}).",
        f"A batch {1 / fill:.1f}× larger fills them in about the same time: per sample, their unused share "
        f"({us(unused_us)} {step_phrase(f)}) goes, and the GPU's wait for launches ({us(f.launch_wait_us)}) is "
        f"shared by {1 / fill:.1f}× the samples: up to {pct(f.pct(saving_us))} less time per sample.",
    ]
    if amortized_us > 0:
        evidence.append(
            "Where the batch cannot grow (latency-bound inference), a CUDA graph removes the launch wait "
            "instead (launch_overhead): the two fixes share that time, each claims its part once."
        )
    return finding(
        "small_batch",
        "Kernels are too small to fill the GPU",
        f.pct(saving_us),
        evidence,
        FIX,
        {
            "under_one_wave_share": k.under_one_wave_us / compute_us,
            "sm_fill": fill,
            "busy_fraction": f.busy_fraction,
            "unused_us": unused_us,
            "amortized_launch_wait_us": amortized_us,
        },
    )
