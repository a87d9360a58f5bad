"""`pageable_copy`: each step receives a 64 MB float32 batch (4096 x 4096 features) as a numpy array from a
host-side producer and trains a bf16 MLP (hidden 8192: ~6 ms of GPU work) on it. Slow:
`torch.from_numpy(a).to(device)`, a synchronous copy from pageable memory while the GPU idles. Fixed: two
pinned staging buffers allocated once; the next batch is `copy_`-ed into one and sent with
`non_blocking=True` on a copy stream while the GPU computes this one."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything
from gpudoctor.workloads.zoo._common import RoundRobin, close_all, fused_optimizer_kwargs
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 4096


class Prefetcher:
    """Double-buffered host-to-device copies: pinned staging buffers, a copy stream, one batch ahead."""

    def __init__(self, source: RoundRobin[np.ndarray], device: torch.device) -> None:
        shape = source.items[0].shape
        self.source, self.device = source, device
        self.staging = [torch.empty(shape, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.stream = torch.cuda.Stream(device)
        self.slot = 0
        self.ready = self.start_next()

    def start_next(self) -> torch.Tensor:
        """Stage the next batch and start its copy; call it after launching this step's compute."""
        slot, self.slot = self.slot, 1 - self.slot
        self.copied[slot].synchronize()  # the copy that last read this buffer is done (two steps ago)
        self.staging[slot].copy_(torch.from_numpy(self.source.next()))
        with torch.cuda.stream(self.stream):
            batch = self.staging[slot].to(self.device, non_blocking=True)
            self.copied[slot].record()
        self.ready = batch
        return batch

    def take(self) -> torch.Tensor:
        """The batch staged last, ordered after its copy on the compute stream."""
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self.stream)
        self.ready.record_stream(compute)  # it was allocated on the copy stream
        return self.ready


def _build(device: torch.device, small: bool, tuned: bool) -> Step:
    seed_everything(0)
    batch, features, hidden = (16, 64, 64) if small else (BATCH, 4096, 8192)
    rng = np.random.default_rng(0)
    # What a host-side producer (a reader, a simulator) hands over each step: new pageable numpy arrays.
    produced = RoundRobin([rng.standard_normal((batch, features), dtype=np.float32) for _ in range(3)])
    model = nn.Sequential(
        nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused_optimizer_kwargs(device))
    prefetch = Prefetcher(produced, device) if tuned and device.type == "cuda" else None
    staging = torch.empty(batch, features) if tuned and prefetch is None else None

    host_memory = "pageable"
    if tuned:
        host_memory = "pinned staging x2" if prefetch is not None else "staging (not pinned on cpu)"

    def next_batch() -> torch.Tensor:
        if prefetch is not None:
            return prefetch.take()
        if staging is not None:  # CPU: the same staging copy, without pinning or streams
            return staging.copy_(torch.from_numpy(produced.next()))
        return torch.from_numpy(produced.next()).to(device)  # pageable and synchronous

    def run() -> None:
        x = next_batch()
        with autocast(device):
            pred = model(x)
        loss = F.mse_loss(pred.float().squeeze(1), x[:, 0])  # predict the first feature from all
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if prefetch is not None:
            prefetch.start_next()  # the host stages the next batch while the GPU runs this step

    info = {
        "model": "zoo.mlp3",
        "batch": batch,
        "batch_bytes": batch * features * 4,
        "dtype": "bf16-autocast",
        "host_memory": host_memory,
        "non_blocking": prefetch is not None,
        "copy_stream": prefetch is not None,
        "variant": "fixed" if tuned else "slow",
    }
    return Step(run=run, close=close_all(produced.items.clear), info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, tuned=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, tuned=True)


CASE = ZooCase(
    rule="pageable_copy",
    title="64 MB batch copied from pageable memory with a blocking .to(device)",
    slow=Workload(
        "pageable_copy.slow", "MLP on a 64 MB batch sent by a pageable, synchronous .to()", build_slow
    ),
    fixed=Workload(
        "pageable_copy.fixed",
        "pinned double-buffered staging, non_blocking copy on a side stream",
        build_fixed,
    ),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: a 64 MB host-to-device copy from pageable memory each step; the host blocks on it and "
        "the GPU computes nothing meanwhile. Fix: allocate pinned staging buffers once, copy_ into them, "
        ".to(device, non_blocking=True) on a copy stream one batch ahead, so the copy overlaps compute."
    ),
)
