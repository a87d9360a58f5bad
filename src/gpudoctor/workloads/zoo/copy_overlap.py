"""`copy_overlap`: each step trains a bf16 MLP on a 64 MB float32 batch already in pinned host memory. Slow:
`.to(device, non_blocking=True)` on the compute stream right before the forward, so the stream runs the
copy with nothing beside it. Fixed: the next batch's copy started on a side stream while this batch
computes, the compute stream waiting for it only when it needs it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything
from gpudoctor.workloads.zoo._common import RoundRobin, close_all, fused_optimizer_kwargs
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 4096


class SideStreamPrefetcher:
    """Pinned host batches sent one step ahead on a copy stream."""

    def __init__(self, source: RoundRobin[torch.Tensor], device: torch.device) -> None:
        self.source, self.device = source, device
        self.stream = torch.cuda.Stream(device)
        self.ready = self._start()

    def _start(self) -> torch.Tensor:
        with torch.cuda.stream(self.stream):
            return self.source.next().to(self.device, non_blocking=True)

    def take(self) -> torch.Tensor:
        """This step's batch, ordered after its copy; the next one's copy starts behind this compute."""
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self.stream)
        batch = self.ready
        batch.record_stream(compute)  # allocated on the copy stream
        self.ready = self._start()
        return batch


def _build(device: torch.device, small: bool, tuned: bool) -> Step:
    seed_everything(0)
    batch, features, hidden = (16, 64, 64) if small else (BATCH, 4096, 8192)
    pinned = device.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    host = RoundRobin(
        [torch.randn(batch, features, generator=gen).pin_memory() if pinned else torch.randn(batch, features)
         for _ in range(3)]
    )  # fmt: skip
    model = nn.Sequential(
        nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused_optimizer_kwargs(device))
    prefetch = SideStreamPrefetcher(host, device) if tuned and pinned else None

    def run() -> None:
        x = prefetch.take() if prefetch is not None else host.next().to(device, non_blocking=True)
        with autocast(device):
            pred = model(x)
        loss = F.mse_loss(pred.float().squeeze(1), x[:, 0])  # predict the first feature from all
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    info = {
        "model": "zoo.mlp3",
        "batch": batch,
        "batch_bytes": batch * features * 4,
        "dtype": "bf16-autocast",
        "host_memory": "pinned" if pinned else "pageable (cpu)",
        "non_blocking": True,
        "copy_stream": prefetch is not None,
        "copy_ahead": tuned,
        "copy_ahead_fallback": "in order: no streams on the cpu" if tuned and prefetch is None else None,
        "variant": "fixed" if tuned else "slow",
    }
    return Step(run=run, close=close_all(host.items.clear), info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, tuned=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, tuned=True)


CASE = ZooCase(
    rule="copy_overlap",
    title="pinned, non_blocking 64 MB copy on the compute stream, serialized with the step's kernels",
    slow=Workload(
        "copy_overlap.slow", "MLP on a pinned 64 MB batch copied on the compute stream", build_slow
    ),
    fixed=Workload(
        "copy_overlap.fixed",
        "the next batch's copy started on a side stream behind this compute",
        build_fixed,
    ),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: a 64 MB host-to-device copy from pinned memory with non_blocking=True, issued on the "
        "compute stream before the forward: the stream runs it alone, then the kernels. Fix: start the next "
        "batch's copy on a side stream while this batch computes (wait_stream before use, record_stream); "
        "the saving is bounded by the copy time and by the compute it can hide behind."
    ),
)
