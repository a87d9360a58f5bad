"""`inference`: an eval-mode ResNet under `torch.inference_mode()`; each step makes its input on the CPU in
pageable memory (uint8 -> float preprocessing), copies it with a synchronous `.to(device)`, and copies the
outputs back with `.cpu()`."""

from __future__ import annotations

import torch

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, seed_everything

NAME = "inference"


def build(device: torch.device, *, small: bool = False) -> Step:
    seed_everything(0)
    batch, size, classes = (2, 32, 10) if small else (128, 224, 1000)
    base = 8 if small else 64
    layers = (1, 1, 1, 1) if small else (2, 2, 2, 2)
    model = models.ResNet(layers, base=base, num_classes=classes).to(device).eval()
    gen = torch.Generator(device="cpu").manual_seed(0)
    # "Decoded" uint8 NCHW images in ordinary (pageable) host memory, as an image pipeline hands them over.
    decoded = [
        torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=gen) for _ in range(2)
    ]
    counter = [0]
    results: list[torch.Tensor] = []

    def run() -> None:
        with torch.inference_mode():
            raw = decoded[counter[0] % len(decoded)]
            counter[0] += 1
            x_cpu = raw.float().div_(255.0)  # a new pageable host tensor every step
            x = x_cpu.to(device)  # synchronous pageable host-to-device copy
            probs = model(x).softmax(dim=1).cpu()  # device-to-host copy, blocks the host
            results[:] = list(probs.topk(5, dim=1))

    def close() -> None:
        decoded.clear()
        results.clear()

    model_name = "builtin.resnet_tiny" if small else "builtin.resnet26"
    info = {"model": model_name, "batch": batch, "image_size": size, "dtype": "fp32", "mode": "inference"}
    return Step(run=run, close=close, info=info)


WORKLOAD = Workload(
    NAME, "eval ResNet under inference_mode with pageable .to(device) and .cpu() per step", build
)
