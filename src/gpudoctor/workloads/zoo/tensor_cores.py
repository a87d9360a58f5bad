"""`tensor_cores_unused`: an MLP (3 × 4096 hidden, batch 4096) trained with fused AdamW in float32 with TF32
off (set by the build, restored by `close`), so every GEMM runs on the CUDA cores; fixed, the same step
under bfloat16 autocast. `tf32_not_bf16`: the same MLP with TF32 on, its GEMMs on the tensor cores in
TF32; fixed, under bfloat16 autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything
from gpudoctor.workloads.zoo._common import (
    RoundRobin,
    close_all,
    fused_optimizer_kwargs,
    set_matmul_precision,
)
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 4096


def _build(device: torch.device, small: bool, bf16: bool, precision: str = "highest") -> Step:
    seed_everything(0)
    batch, d_in, hidden, depth, classes = (8, 32, 64, 2, 10) if small else (BATCH, 4096, 4096, 3, 1000)
    restore = set_matmul_precision(precision)
    model = models.mlp(d_in, hidden, depth, classes).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **fused_optimizer_kwargs(device))
    gen = torch.Generator(device="cpu").manual_seed(0)
    batches = RoundRobin(
        [
            (
                torch.randn(batch, d_in, generator=gen).to(device),
                torch.randint(0, classes, (batch,), generator=gen).to(device),
            )
            for _ in range(2)
        ]
    )

    def run() -> None:
        x, y = batches.next()
        with autocast(device, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    info = {
        "model": "builtin.mlp",
        "batch": batch,
        "hidden": hidden,
        "depth": depth,
        "dtype": "bf16-autocast" if bf16 else "fp32",
        "float32_matmul_precision": precision,
        "optimizer": "AdamW(fused)" if device.type == "cuda" else "AdamW(foreach)",
        "variant": "fixed" if bf16 else "slow",
    }
    return Step(run=run, close=close_all(batches.items.clear, restore), info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, bf16=False)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, bf16=True)


def build_tf32(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, bf16=False, precision="high")


def build_tf32_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, bf16=True, precision="high")


CASE = ZooCase(
    rule="tensor_cores_unused",
    title="fp32 matmuls with TF32 off: no tensor cores",
    slow=Workload("tensor_cores_unused.slow", "fp32 MLP training, TF32 off", build_slow),
    fixed=Workload("tensor_cores_unused.fixed", "the same under bf16 autocast", build_fixed),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: ~1.3 TFLOP of fp32 GEMMs per step at full fp32 precision (SIMT kernels, no tensor cores). "
        'Fix: torch.autocast("cuda", dtype=torch.bfloat16) around forward and loss (or TF32 via '
        'torch.set_float32_matmul_precision("high") for a smaller gain).'
    ),
)

TF32_CASE = ZooCase(
    rule="tf32_not_bf16",
    title="fp32 matmuls in TF32 on the tensor cores, not bfloat16",
    slow=Workload("tf32_not_bf16.slow", "fp32 MLP training, TF32 on", build_tf32),
    fixed=Workload("tf32_not_bf16.fixed", "the same under bf16 autocast", build_tf32_fixed),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: ~1.3 TFLOP of float32 GEMMs per step in TF32 (tensor cores, 416 TFLOP/s on an H100 "
        'against bfloat16\'s 775). Fix: torch.autocast("cuda", dtype=torch.bfloat16) around forward and loss.'
    ),
)
