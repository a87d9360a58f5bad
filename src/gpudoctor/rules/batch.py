"""`small_batch`: kernels too small to fill the device — fewer thread blocks than SMs — so most of the
GPU sits unused even while it is "busy"; a larger batch (more work per launch) uses it for free."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, us
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


def small_batch(a: Analysis, f: Facts) -> Finding | None:
    k = a.kernels
    compute_us = k.total_us - k.time_by_category_us.get("communication", 0.0)  # NCCL: few blocks by design
    if (
        compute_us <= 0
        or k.under_one_wave_us / compute_us < MIN_UNDER_WAVE_SHARE
        or k.under_one_wave_fill is None
        or k.under_one_wave_fill > MAX_FILL
    ):
        return None
    fill = k.under_one_wave_fill
    # Per sample, a batch that fills the GPU saves the unused part of the under-filled kernels, and
    # shares the per-launch host overhead (the GPU's wait for launches) among more samples. Waiting
    # for data or for synchronizations grows with the batch, so it does not count.
    unused_us = f.per_step(k.under_one_wave_us) * (1 - fill)
    saving_us = unused_us + f.launch_wait_us
    sms = a.device.sm_count if a.device and a.device.sm_count else None
    evidence = [
        f"{pct(100 * k.under_one_wave_us / compute_us)} of compute kernel time is in kernels with fewer thread blocks "
        f"than the GPU has SMs{f' ({sms})' if sms else ''}: on average they use {pct(100 * fill)} of them.",
        f"The GPU is busy {pct(100 * f.busy_fraction)} of each {us(f.step_us)} step; per sample, a batch that "
        f"fills the GPU could take up to {pct(f.pct(saving_us))} less time.",
    ]
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
        },
    )
