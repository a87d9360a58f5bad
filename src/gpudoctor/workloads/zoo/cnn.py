"""The zoo's CNN: a bottleneck ResNet with one block per stage (`models.ResNet((1, 1, 1, 1))`), trained with
SGD momentum under bf16 autocast, cuDNN autotuning on, labels and images already on the device. The knobs are
what the CNN cases plant: memory layout (`conv_layout`) and batch size (`small_batch`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, autocast, seed_everything
from gpudoctor.workloads.zoo._common import (
    Forward,
    RoundRobin,
    close_all,
    fused_optimizer_kwargs,
    set_flag,
)

MODEL_NAME = "builtin.resnet_1111"


def resnet(*, small: bool, num_classes: int, base: int = 64) -> nn.Module:
    return models.ResNet((1, 1, 1, 1), base=8 if small else base, num_classes=num_classes)


def make_trainer(
    device: torch.device, *, small: bool, num_classes: int, channels_last: bool, base: int = 64
) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    """Model, optimizer, and the call that restores `cudnn.benchmark` (an expert turns it on for CNNs)."""
    model = resnet(small=small, num_classes=num_classes, base=base).to(device).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, **fused_optimizer_kwargs(device)
    )
    return model, opt, set_flag(torch.backends.cudnn, "benchmark", True)


def train_step(
    model: Callable[[torch.Tensor], torch.Tensor],
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
) -> torch.Tensor:
    with autocast(device):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def build_cnn_train(
    device: torch.device,
    *,
    small: bool,
    batch: int,
    size: int,
    channels_last: bool,
    info: Mapping[str, object] | None = None,
    compile: bool = False,
) -> Step:
    """A training step on two pre-made device batches of `batch` images of `size`x`size`; `compile`
    runs the model through torch.compile (on CUDA; eager if compiling fails, as `info` says)."""
    seed_everything(0)
    classes = 10 if small else 1000
    model, opt, restore = make_trainer(device, small=small, num_classes=classes, channels_last=channels_last)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    gen = torch.Generator(device="cpu").manual_seed(0)
    batches = RoundRobin(
        [
            (
                torch.randn(batch, 3, size, size, generator=gen).to(device, memory_format=layout),
                torch.randint(0, classes, (batch,), generator=gen).to(device),
            )
            for _ in range(2)
        ]
    )

    forward = Forward(model)

    def run() -> None:
        x, y = batches.next()
        train_step(forward, opt, x, y, device)

    if compile and device.type == "cuda":  # compiled here, outside any timed or profiled step
        forward.compile(run, 3)

    full_info = {
        **forward.info(),
        "model": MODEL_NAME,
        "batch": batch,
        "image_size": size,
        "dtype": "bf16-autocast",
        "memory_format": "channels_last" if channels_last else "NCHW",
        "optimizer": "SGD(momentum, fused)" if device.type == "cuda" else "SGD(momentum, foreach)",
        "data": "on device",
        **(info or {}),
    }
    return Step(run=run, close=close_all(batches.items.clear, restore), info=full_info)
