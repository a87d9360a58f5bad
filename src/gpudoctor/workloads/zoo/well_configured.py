"""The controls: well-configured workloads with nothing planted. The doctor must give them no critical or
major finding and say what bounds them instead."""

from __future__ import annotations

import torch

from gpudoctor.workloads.base import Step, Workload
from gpudoctor.workloads.zoo import cnn, transformer
from gpudoctor.workloads.zoo.case import ZooControl

CNN_BATCH = 256


def build_control_transformer(device: torch.device, *, small: bool = False) -> Step:
    shape = transformer.SMALL if small else transformer.CONTROL
    return transformer.build_gpt_train(device, shape, info={"variant": "control"}, compile=True)


def build_control_cnn(device: torch.device, *, small: bool = False, batch: int = CNN_BATCH) -> Step:
    batch, size = (2, 32) if small else (batch, 224)
    return cnn.build_cnn_train(
        device,
        small=small,
        batch=batch,
        size=size,
        channels_last=True,
        info={"variant": "control"},
        compile=True,
    )


CONTROL_TRANSFORMER = Workload(
    "control_transformer",
    "GPT 4x1024, seq 1024, batch 8: torch.compile, bf16 autocast, SDPA, fused AdamW, tokens on the device",
    build_control_transformer,
)
CONTROL_CNN = Workload(
    "control_cnn",
    "ResNet (1-1-1-1 bottlenecks) batch 256 @ 224: torch.compile, bf16 autocast, channels_last, fused SGD, "
    "data on device",
    build_control_cnn,
)

CONTROLS = (
    ZooControl(
        name="control_transformer",
        title="compute-bound transformer training",
        workload=CONTROL_TRANSFORMER,
        samples_per_step=transformer.CONTROL.batch,
        note="Nothing planted: GPU-bound on bf16 matmuls and flash attention; the host runs well ahead.",
    ),
    ZooControl(
        name="control_cnn",
        title="well-fed CNN training",
        workload=CONTROL_CNN,
        samples_per_step=CNN_BATCH,
        note="Nothing planted: GPU-bound on bf16 NHWC convolutions; data already on the device.",
    ),
)
