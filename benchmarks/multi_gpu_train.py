"""A data-parallel training script as its users write it, for benchmarks/multi_gpu.py: torchvision's
ResNet-50 under bf16 autocast, SGD with momentum, synthetic ImageNet-shaped batches, launched by
torchrun (one process per GPU, NCCL). Environment:

    PARALLEL=ddp|fsdp      DistributedDataParallel, or FSDP2 (`fully_shard` on each ResNet stage and the root)
    STRAGGLE_MS=20         rank 1 does this much extra host work (a busy loop) before every step
    BATCH=64 STEPS=40      per-rank batch size, steps
    MODEL=resnet50|tiny    tiny: a small CNN, for the CPU path (gloo) where torchvision or time is missing
    TIMES_OUT=dir          each rank writes dir/rankK.json: its step times (CUDA events, else perf_counter)
                           after 3 warm-up steps, as a user logging throughput would measure them

The timing is the script's own and the same with and without gpudoctor, so the plain run's step time
and `gpudoctor run`'s light phase are measured alike."""

from __future__ import annotations

import json
import os
import statistics
import time
from itertools import pairwise
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

PARALLEL = os.environ.get("PARALLEL", "ddp")
STRAGGLE_S = float(os.environ.get("STRAGGLE_MS", "0")) / 1e3
BATCH, STEPS = int(os.environ.get("BATCH", "64")), int(os.environ.get("STEPS", "40"))
WARMUP = 3


def tiny() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 1000),
    )  # fmt: skip


def build(device: torch.device) -> torch.nn.Module:
    if os.environ.get("MODEL", "resnet50") == "tiny":
        return tiny().to(device)
    import torchvision

    return torchvision.models.resnet50().to(device, memory_format=torch.channels_last)


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = build(device)
    if PARALLEL == "fsdp":
        from torch.distributed.fsdp import fully_shard

        stages = [m for name, m in model.named_children() if name.startswith("layer")]  # ResNet's four
        for stage in stages or [m for m in model.children() if any(True for _ in m.parameters())]:
            fully_shard(stage)
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    size = 224 if os.environ.get("MODEL", "resnet50") != "tiny" else 64
    images = torch.randn(BATCH, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (BATCH,), device=device)
    straggle = STRAGGLE_S if rank == 1 else 0.0
    marks: list[object] = []
    for step in range(STEPS):
        if straggle:  # host work before the step on one rank: logging, a slow data pipeline, ...
            end = time.perf_counter() + straggle
            while time.perf_counter() < end:
                pass
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= WARMUP - 1:
            if cuda:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()  # type: ignore[attr-defined]
            else:
                marks.append(time.perf_counter())
    out = os.environ.get("TIMES_OUT")
    if out:
        if cuda:
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) * 1e3 for a, b in pairwise(marks)]  # type: ignore[attr-defined]
        else:
            times = [(b - a) * 1e6 for a, b in pairwise(marks)]  # type: ignore[operator]
        Path(out).mkdir(parents=True, exist_ok=True)
        doc = {"rank": rank, "median_us": statistics.median(times), "times_us": times}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
