"""The cases planted in the zoo CNN (see `cnn.py`): `conv_layout` (NCHW under bf16 autocast), `small_batch`
(batch 4) and `profiler_distortion` (the control CNN profiled with stacks, shapes and memory)."""

from __future__ import annotations

import torch

from gpudoctor.workloads.base import Step, Workload
from gpudoctor.workloads.zoo import cnn, well_configured
from gpudoctor.workloads.zoo.case import ZooCase

LAYOUT_BATCH = 64
SMALL_BATCH, LARGE_BATCH = 4, 256
HEAVY_PROFILE = {"with_stack": True, "record_shapes": True, "profile_memory": True}


def build_layout_slow(device: torch.device, *, small: bool = False) -> Step:
    return _layout(device, small, channels_last=False)


def build_layout_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _layout(device, small, channels_last=True)


def build_batch_slow(device: torch.device, *, small: bool = False) -> Step:
    return _batch(device, small, SMALL_BATCH)


def build_batch_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _batch(device, small, LARGE_BATCH)


def build_heavily_profiled(device: torch.device, *, small: bool = False) -> Step:
    return _control_cnn(device, small, heavy=True)


def build_plainly_profiled(device: torch.device, *, small: bool = False) -> Step:
    return _control_cnn(device, small, heavy=False)


def _layout(device: torch.device, small: bool, channels_last: bool) -> Step:
    batch, size = (2, 32) if small else (LAYOUT_BATCH, 224)
    variant = {"variant": "fixed" if channels_last else "slow"}
    return cnn.build_cnn_train(
        device, small=small, batch=batch, size=size, channels_last=channels_last, info=variant
    )


def _batch(device: torch.device, small: bool, batch: int) -> Step:
    variant = {"variant": "fixed" if batch == LARGE_BATCH else "slow"}
    return cnn.build_cnn_train(
        device, small=small, batch=batch, size=16 if small else 128, channels_last=True, info=variant
    )


# Sized so that the GPU's step (about 11 ms on an H200) is longer than the host's unprofiled (about 6.5
# ms, the compiled step's wrappers) but shorter than the host's with the profiler recording every Python
# call, op shape and allocation (about 20 ms): GPU-bound really, host-bound in the trace.
DISTORTION_BATCH = 160


def _control_cnn(device: torch.device, small: bool, heavy: bool) -> Step:
    step = well_configured.build_control_cnn(device, small=small, batch=DISTORTION_BATCH)
    wanted = "+".join(HEAVY_PROFILE) if heavy else "default"
    info = {**step.info, "variant": "slow" if heavy else "fixed", "profile_options": wanted}
    return Step(run=step.run, close=step.close, info=info)


CONV_LAYOUT = ZooCase(
    rule="conv_layout",
    title="NCHW convolutions under bf16 autocast",
    slow=Workload("conv_layout.slow", "ResNet training, bf16 autocast, NCHW", build_layout_slow),
    fixed=Workload(
        "conv_layout.fixed", "the same model and input in torch.channels_last", build_layout_fixed
    ),
    samples_per_step_slow=LAYOUT_BATCH,
    samples_per_step_fixed=LAYOUT_BATCH,
    note=(
        "Planted: NCHW tensors into bf16 cuDNN convolutions, whose fast kernels are NHWC: cuDNN transposes "
        "activations and gradients around every convolution (nchwToNhwc / nhwcToNchw kernels), and "
        "BatchNorm runs the generic NCHW kernels (batch_norm_backward_kernel, ..._collect_statistics_...: "
        "over half the GPU time of the H200 ResNet-50 fixture). Fix: model.to(memory_format="
        "torch.channels_last) and x.to(memory_format=torch.channels_last)."
    ),
)

SMALL_BATCH_CASE = ZooCase(
    rule="small_batch",
    title="batch 4: kernels too small to fill the GPU",
    slow=Workload("small_batch.slow", "ResNet training at batch 4 @ 128", build_batch_slow),
    fixed=Workload("small_batch.fixed", "the same at batch 256", build_batch_fixed),
    samples_per_step_slow=SMALL_BATCH,
    samples_per_step_fixed=LARGE_BATCH,
    note=(
        "Planted: batch 4, so most kernels launch fewer blocks than the GPU has SMs and the step is a chain "
        "of short, under-filled kernels. Fix: batch 256 (scale the learning rate, or accumulate gradients); "
        "compare throughput per sample, not step time."
    ),
)

PROFILER_DISTORTION = ZooCase(
    rule="profiler_distortion",
    title="profiled with with_stack, record_shapes and profile_memory",
    slow=Workload(
        "profiler_distortion.slow",
        "the control CNN at batch 160, to be profiled with stacks, shapes and memory",
        build_heavily_profiled,
    ),
    fixed=Workload(
        "profiler_distortion.fixed",
        "the control CNN at batch 160, to be profiled with default options",
        build_plainly_profiled,
    ),
    samples_per_step_slow=DISTORTION_BATCH,
    samples_per_step_fixed=DISTORTION_BATCH,
    note=(
        "Planted: nothing in the workload (unprofiled it is the control CNN); the profiler records Python "
        "stacks, input shapes and every allocation, which adds host time to every op and can open GPU gaps "
        "that do not exist unprofiled. Fix: profile with default options (add with_stack only to find a "
        "source line). Measured saving of the unprofiled steps is ~0 by construction."
    ),
    profile_slow=HEAVY_PROFILE,
)
