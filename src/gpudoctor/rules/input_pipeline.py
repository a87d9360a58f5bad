"""`input_pipeline`: the GPU waits while the host loads or prepares data (DataLoader `__next__` on the
critical path). TensorBoard's "DataLoader > 5% of the step" rule, with the GPU's idle time as the bound."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

FIX = Fix(
    summary="Load and prepare batches in worker processes, into pinned memory, ahead of the GPU.",
    snippet="""\
loader = torch.utils.data.DataLoader(
    dataset, batch_size=batch_size, shuffle=True,
    num_workers=8,            # about the CPU cores you can spare; 0 loads on the training thread
    pin_memory=True,          # page-locked batches: faster, asynchronous copies
    persistent_workers=True,  # keep workers alive between epochs
    prefetch_factor=4,        # batches each worker prepares ahead
)
for inputs, targets in loader:
    inputs = inputs.to("cuda", non_blocking=True)
    targets = targets.to("cuda", non_blocking=True)
    ...""",
)


def input_pipeline(a: Analysis, f: Facts) -> Finding | None:
    loader_share = f.dataloader_us / f.traced_step_us if f.traced_step_us else 0.0
    if loader_share < 0.05:
        return None
    # The fix hides loading behind GPU work: it saves at most the GPU's idle time while loading.
    waiting = f.dataloader_wait_us * f.host_scale
    saving_us = waiting
    evidence = [
        f"DataLoader __next__ takes {us(f.dataloader_us)} {step_phrase(f)} ({pct(100 * loader_share)}), "
        f"on the training thread.",
        f"Meanwhile the GPU idles {us(waiting)} {f.per} waiting for it; it is busy "
        f"{pct(100 * f.busy_fraction)} of the time.",
    ]
    return finding(
        "input_pipeline",
        "The GPU waits for the data loader",
        f.pct(saving_us),
        evidence,
        FIX,
        {"dataloader_us": f.dataloader_us, "gpu_wait_us": waiting, "step_us": f.step_us},
    )
