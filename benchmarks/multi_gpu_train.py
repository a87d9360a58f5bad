"""A data-parallel training script as its users write it, for benchmarks/multi_gpu.py: torchvision's
ResNet-50 under bf16 autocast, SGD with momentum, synthetic ImageNet-shaped batches, launched by
torchrun (one process per GPU, NCCL). Environment:

    PARALLEL=ddp|fsdp|none DistributedDataParallel, FSDP2 (`fully_shard` on each ResNet stage and the
                           root), or none: each rank trains its own replica with no collective at all
                           (the step without communication, the truth exposed communication is held to)
    FSDP_RESHARD=1|0       0: `reshard_after_forward=False` on every FSDP unit (no all-gather in backward)
    STRAGGLE_MS=20         rank 1 does this much extra host work (a busy loop) before every step
    UNEVEN=1.5             rank 1's batch is this many times the others' (load imbalance)
    BUCKET_MB=25           DDP's gradient bucket cap (100: ResNet-50's 98 MiB of gradients in one all-reduce)
    SHARED=1.5             every rank gets the mean batch of UNEVEN=1.5's two ranks (its fix: the same images)
    BATCH=64               per-rank batch size
    WARMUP_S=3 STEPS=100   warm-up for this long (at least 3 steps; on the H100 the first 2–3 s of
                           ResNet-50 steps run up to 1.7× slower than later ones), then STEPS timed steps
    MODEL=resnet50|tiny    tiny: a small CNN, for the CPU path (gloo) where torchvision or time is missing
    TIMES_OUT=dir          each rank writes dir/rankK.json: the mean step over the timed window with the
                           GPU synchronized at its two ends (what a step costs), and the per-step times
                           from CUDA events recorded at each step's end (no sync between them)
    PIN_CORES=1            each rank pins its threads to its share of its GPU's NUMA-local cores
                           (tools/gpu_cores.py: whole physical cores, split between the local ranks that
                           share them), as `torchrun --numa-binding` would without numactl: the benchmarks
                           set it alike for the plain runs and gpudoctor's (--pin), so that where a rank's
                           process lands is not a difference between runs
    WINDOWS_OUT=dir        each rank times itself window after window (benchmarks/every_loop/_window.py,
                           EVERY_LOOP_* for its settings) into dir/rankK.json: under `gpudoctor run`, the
                           windows inside its light phase time the same steps plainly, in the same process

The timing is the script's own and the same with and without gpudoctor, so the plain run's step time
and `gpudoctor run`'s light phase are measured alike."""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

PARALLEL = os.environ.get("PARALLEL", "ddp")
STRAGGLE_S = float(os.environ.get("STRAGGLE_MS", "0")) / 1e3
UNEVEN = float(os.environ.get("UNEVEN", "1"))
SHARED = float(os.environ.get("SHARED", "1"))
BUCKET_MB = int(os.environ.get("BUCKET_MB", "25"))
RESHARD = os.environ.get("FSDP_RESHARD", "1") != "0"
BATCH, STEPS = int(os.environ.get("BATCH", "64")), int(os.environ.get("STEPS", "100"))
WARMUP_S, WARMUP_MIN = float(os.environ.get("WARMUP_S", "3")), 3


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

    # FSDP2 shards contiguous parameters only: channels_last weights for DDP and no communication
    layout = torch.contiguous_format if PARALLEL == "fsdp" else torch.channels_last
    return torchvision.models.resnet50().to(device, memory_format=layout)


def parallel(model: torch.nn.Module, local: int, cuda: bool) -> torch.nn.Module:
    if PARALLEL == "none":
        return model
    if PARALLEL == "fsdp":
        from torch.distributed.fsdp import fully_shard

        stages = [m for name, m in model.named_children() if name.startswith("layer")]  # ResNet's four
        for stage in stages or [m for m in model.children() if any(True for _ in m.parameters())]:
            fully_shard(stage, reshard_after_forward=RESHARD)
        fully_shard(model, reshard_after_forward=RESHARD)
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local] if cuda else None, bucket_cap_mb=BUCKET_MB
    )


def warmup_steps(started: float, cuda: bool) -> int:
    """The step the timed window starts after, the same on every rank (a rank that stopped earlier
    would leave the others in a collective): from the first steps' pace, enough for WARMUP_S."""
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    steps = math.ceil(max(WARMUP_S - elapsed, 0.0) / (elapsed / WARMUP_MIN))
    more = torch.tensor([steps], device="cuda" if cuda else "cpu")
    dist.all_reduce(more, op=dist.ReduceOp.MAX)
    return WARMUP_MIN + int(more.item())


def _window_clock(rank: int) -> Callable[[], None]:
    """every_loop's window clock, one file per rank; a no-op without WINDOWS_OUT."""
    folder = os.environ.get("WINDOWS_OUT")
    if not folder:
        return lambda: None
    Path(folder).mkdir(parents=True, exist_ok=True)
    os.environ.update(EVERY_LOOP_TIMING=str(Path(folder) / f"rank{rank}.json"), EVERY_LOOP_CONTINUOUS="1")
    sys.path.insert(0, str(Path(__file__).resolve().parent / "every_loop"))
    import _window  # reads the environment at import

    return _window.tick


def pin_to_gpu_cores(local: int) -> list[int] | None:
    """With PIN_CORES=1 on a GPU: every thread of this process on the local rank's share of its GPU's
    NUMA-local cores (threads made later inherit it); the cores, or None where not asked. Asked and not
    done is an error: a run recorded as pinned that was not misleads."""
    if os.environ.get("PIN_CORES") != "1" or not torch.cuda.is_available():
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from gpu_cores import assign, parse_cpulist, sysfs_bus

    def sysfs(i: int) -> str:
        """GPU i's PCI address as sysfs names it: NVML's (as tools/gpu_cores.py reads nvidia-smi's), else
        from torch's numbers (domain, bus, device)."""
        p = torch.cuda.get_device_properties(i)
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(p.uuid)
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            return sysfs_bus(bus.decode() if isinstance(bus, bytes) else bus)
        except Exception:  # no NVML: torch's numbers
            return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"

    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    pci = Path("/sys/bus/pci/devices")
    try:
        local_cpus = {
            i: parse_cpulist((pci / sysfs(i) / "local_cpulist").read_text())
            for i in range(min(ranks, torch.cuda.device_count()))
        }
    except (OSError, ValueError, AttributeError, TypeError) as err:
        raise SystemExit(
            f"PIN_CORES=1: the GPUs' local cores are not known ({type(err).__name__}: {err})"
        ) from err
    share = assign(local_cpus, set(os.sched_getaffinity(0))).get(local)
    if not share:
        raise SystemExit(f"PIN_CORES=1: local rank {local} got no cores of {sorted(os.sched_getaffinity(0))}")
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), share)
    return share


@dataclass(frozen=True)
class Loop:
    """One rank's training loop, set up as the environment says (also benchmarks/light_toggle.py's)."""

    rank: int
    cuda: bool
    device: torch.device
    batch: int
    cores: list[int] | None
    step: Callable[[], None]  # one training step: the straggler's host work, forward, backward, update


def setup() -> Loop:
    """The process group, this rank's model, optimizer and batch, and its step."""
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    cores = pin_to_gpu_cores(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = parallel(build(device), local, cuda)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    size = 224 if os.environ.get("MODEL", "resnet50") != "tiny" else 64
    batch = round(BATCH * UNEVEN) if rank == 1 else BATCH
    if SHARED != 1:
        batch = round(BATCH * (1 + SHARED) / 2)
    images = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    straggle = STRAGGLE_S if rank == 1 else 0.0

    def step() -> None:
        if straggle:  # host work before the step on one rank: logging, a slow data pipeline, ...
            end = time.perf_counter() + straggle
            while time.perf_counter() < end:
                pass
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return Loop(rank, cuda, device, batch, cores, step)


def main() -> None:
    loop = setup()
    rank, cuda, batch, cores = loop.rank, loop.cuda, loop.batch, loop.cores
    tick = _window_clock(rank)
    out = os.environ.get("TIMES_OUT")  # without it (under gpudoctor run) no sync and no event: a plain loop
    marks: list[object] = []
    window: list[float] = []
    started, step, timed = time.perf_counter(), 0, -1  # timed: the step the timed window starts after
    while (out and timed < 0) or step - max(timed, 0) < STEPS:
        loop.step()
        step += 1
        tick()
        if not out:
            continue
        if step == WARMUP_MIN:
            timed = warmup_steps(started, cuda)
        if 0 <= timed <= step:
            if cuda:
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()  # type: ignore[attr-defined]
            else:
                marks.append(time.perf_counter())
        if step == timed or (timed >= 0 and step - timed == STEPS):  # the window's ends, GPU drained
            if cuda:
                torch.cuda.synchronize()
            window.append(time.perf_counter())
    if out:
        if cuda:
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) * 1e3 for a, b in pairwise(marks)]  # type: ignore[attr-defined]
        else:
            times = [(b - a) * 1e6 for a, b in pairwise(marks)]  # type: ignore[operator]
        Path(out).mkdir(parents=True, exist_ok=True)
        doc = {
            "rank": rank,
            "batch": batch,
            "mean_us": (window[1] - window[0]) * 1e6 / len(times),
            "window_s": window[1] - window[0],
            "median_us": statistics.median(times),
            "warmup_steps": timed,
            "cores": cores,
            "times_us": times,
        }
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
