"""The cases planted in the zoo transformer (see `transformer.py`): `allocator_thrash` (`empty_cache()` after
every step of a loop whose sequence length changes per batch) and `memory_pressure` (the control transformer
while the process holds a buffer that brings peak allocated memory to ~93% of the device)."""

from __future__ import annotations

import torch

from gpudoctor.workloads.base import Step, Workload
from gpudoctor.workloads.zoo import transformer
from gpudoctor.workloads.zoo._common import close_all, synchronize
from gpudoctor.workloads.zoo.case import ZooCase

VARYING = transformer.GptShape(
    layers=2, d_model=1024, heads=16, vocab=8192, batch=16, seq_lens=(512, 384, 448, 320, 480, 352)
)
VARYING_SMALL = transformer.GptShape(layers=2, d_model=64, heads=4, vocab=256, batch=2, seq_lens=(32, 24, 28))
PEAK_FRACTION = 0.93
_HEADROOM_BYTES = 1 << 30  # never take the last GiB the driver reports free: that would OOM, not pressure


def _empty_cache() -> None:
    torch.cuda.empty_cache()


def _thrash(device: torch.device, small: bool, empty_cache: bool) -> Step:
    shape = VARYING_SMALL if small else VARYING
    hook = _empty_cache if empty_cache and device.type == "cuda" else None
    info = {"empty_cache_every_step": empty_cache, "variant": "slow" if empty_cache else "fixed"}
    return transformer.build_gpt_train(device, shape, after_step=hook, info=info)


def _pressure(device: torch.device, small: bool, hold: bool) -> Step:
    step = transformer.build_gpt_train(
        device, transformer.SMALL if small else transformer.CONTROL, compile=True
    )
    held: list[torch.Tensor] = []
    info = {**step.info, "variant": "slow" if hold else "fixed", "held_buffer_bytes": 0}
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step.run()  # one step to learn the workload's own peak (both variants, to stay alike)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        free, total = torch.cuda.mem_get_info(device)
        size = max(0, min(int(PEAK_FRACTION * total) - peak, free - _HEADROOM_BYTES)) if hold else 0
        # "The validation set, cached on the GPU": memory the process holds but this loop never touches.
        held.append(torch.empty(size, dtype=torch.uint8, device=device))
        info |= {"held_buffer_bytes": size, "expected_peak_fraction": (peak + size) / total}
    elif hold:
        held.append(torch.empty(1 << 20, dtype=torch.uint8))
        info["held_buffer_bytes"] = 1 << 20
    return Step(run=step.run, close=close_all(held.clear, step.close), info=info)


def build_thrash_slow(device: torch.device, *, small: bool = False) -> Step:
    return _thrash(device, small, empty_cache=True)


def build_thrash_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _thrash(device, small, empty_cache=False)


def build_pressure_slow(device: torch.device, *, small: bool = False) -> Step:
    return _pressure(device, small, hold=True)


def build_pressure_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _pressure(device, small, hold=False)


ALLOCATOR_THRASH = ZooCase(
    rule="allocator_thrash",
    title="torch.cuda.empty_cache() after every step",
    slow=Workload(
        "allocator_thrash.slow", "GPT training, varying seq len, empty_cache() each step", build_thrash_slow
    ),
    fixed=Workload("allocator_thrash.fixed", "the same without empty_cache()", build_thrash_fixed),
    samples_per_step_slow=VARYING.batch,
    samples_per_step_fixed=VARYING.batch,
    note=(
        "Planted: torch.cuda.empty_cache() at the end of each step returns every cached block to the driver, "
        "so the next step (a different sequence length: differently sized temporaries) re-allocates with "
        "cudaMalloc, and each cudaFree synchronizes the device. Fix: delete the call; to fight fragmentation "
        "instead, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
    ),
)

MEMORY_PRESSURE = ZooCase(
    rule="memory_pressure",
    title="peak allocated memory at ~93% of the device",
    slow=Workload(
        "memory_pressure.slow", "control transformer while holding a buffer to ~93% peak", build_pressure_slow
    ),
    fixed=Workload("memory_pressure.fixed", "the control transformer alone", build_pressure_fixed),
    samples_per_step_slow=transformer.CONTROL.batch,
    samples_per_step_fixed=transformer.CONTROL.batch,
    note=(
        "Planted: a tensor held outside the loop, sized at build time from torch.cuda.mem_get_info() so that "
        "peak allocated memory is ~93% of the device's. The step itself is the control's, so the measured "
        "saving is ~0: this is a risk (the next larger batch OOMs or triggers allocator retries), not a "
        "slowdown. Fix: free or move off the GPU what the loop does not use. Both traces profile memory."
    ),
    profile_slow={"profile_memory": True},
    profile_fixed={"profile_memory": True},
)
