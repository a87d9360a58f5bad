"""`conv_bf16_train`: ResNet-50 training under bf16 autocast with SGD momentum, batch 64 at 224x224, NCHW,
synthetic data already on the device. The baseline compute-bound workload (the benchmark trace's source)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything

NAME = "conv_bf16_train"


def build(device: torch.device, *, small: bool = False) -> Step:
    seed_everything(0)
    batch, size, classes = (2, 32, 10) if small else (64, 224, 1000)
    model, model_name = models.resnet50(small=small, num_classes=classes)
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    # A few distinct batches so the step reads data as a real loop would, without any host work.
    gen = torch.Generator(device="cpu").manual_seed(0)
    images = [torch.randn(batch, 3, size, size, generator=gen).to(device) for _ in range(2)]
    labels = [torch.randint(0, classes, (batch,), generator=gen).to(device) for _ in range(2)]
    counter = [0]

    def run() -> None:
        i = counter[0] % len(images)
        counter[0] += 1
        x, y = images[i], labels[i]
        with autocast(device):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def close() -> None:
        images.clear()
        labels.clear()

    info = {
        "model": model_name,
        "batch": batch,
        "image_size": size,
        "dtype": "bf16-autocast",
        "optimizer": "SGD",
    }
    return Step(run=run, close=close, info=info)


WORKLOAD = Workload(NAME, "ResNet-50 training, bf16 autocast, SGD momentum, batch 64 @ 224 NCHW", build)
