"""`optimizer_unfused`: a deep MLP (52 Linear + LayerNorm + GELU layers, width 1024: 210 parameter tensors)
trained under bf16 autocast with Adam. Slow: `Adam(foreach=False)`, the per-parameter loop that launches ~7
small kernels per tensor. Fixed: `Adam(fused=True)` on CUDA (a handful of multi-tensor kernels); on the CPU,
where fused kernels are not the point, `foreach=True`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything
from gpudoctor.workloads.zoo._common import Forward, RoundRobin, fused_optimizer_kwargs
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 16384
DEPTH = 52


def _build(device: torch.device, small: bool, fused: bool) -> Step:
    seed_everything(0)
    batch, width, classes = (8, 32, 10) if small else (BATCH, 1024, 1000)
    model = models.mlp(width, width, DEPTH, classes).to(device).train()
    kwargs = fused_optimizer_kwargs(device) if fused else {"foreach": False}
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, **kwargs)
    gen = torch.Generator(device="cpu").manual_seed(0)
    batches = RoundRobin(
        [
            (
                torch.randn(batch, width, generator=gen).to(device),
                torch.randint(0, classes, (batch,), generator=gen).to(device),
            )
            for _ in range(2)
        ]
    )

    # The model is compiled in both variants (fused elementwise work), so what is left to planted is the
    # optimizer, which torch.compile of the model does not touch.
    forward = Forward(model)

    def run() -> None:
        x, y = batches.next()
        with autocast(device):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if device.type == "cuda":
        forward.compile(run, 3)

    info = {
        **forward.info(),
        "model": "builtin.mlp",
        "batch": batch,
        "hidden": width,
        "depth": DEPTH,
        "parameter_tensors": sum(1 for _ in model.parameters()),
        "dtype": "bf16-autocast",
        "optimizer": "Adam(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")",
        "variant": "fixed" if fused else "slow",
    }
    return Step(run=run, close=batches.items.clear, info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, fused=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, fused=True)


CASE = ZooCase(
    rule="optimizer_unfused",
    title="Adam(foreach=False) over 210 parameter tensors",
    slow=Workload("optimizer_unfused.slow", "deep MLP, Adam(foreach=False)", build_slow),
    fixed=Workload("optimizer_unfused.fixed", "the same with Adam(fused=True)", build_fixed),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: the single-tensor Adam loop: ~7 elementwise kernels per parameter tensor, ~1,500 tiny "
        "launches per step inside Optimizer.step. Fix: torch.optim.Adam(params, fused=True) (or "
        "foreach=True, the default when every parameter is on CUDA)."
    ),
)
