"""`data_parallel`: one process drives several GPUs (torch.nn.DataParallel): every step scatters the
batch, replicates the model, gathers outputs and reduces gradients through device 0, all under one
Python thread and its GIL. TensorBoard's "DataParallel → DistributedDataParallel" rule."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

# What DataParallel's autograd functions are called in a trace (torch.nn.parallel._functions).
DP_OPS = ("Broadcast", "ReduceAddCoalesced", "Gather", "Scatter", "DataParallel")

FIX = Fix(
    summary="Use DistributedDataParallel: one process per GPU, gradients all-reduced by NCCL while the "
    "backward pass runs (launch with torchrun --nproc_per_node=N).",
    snippet="""\
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("nccl")                      # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])
sampler = torch.utils.data.distributed.DistributedSampler(dataset)
loader = torch.utils.data.DataLoader(dataset, batch_size=per_gpu_batch, sampler=sampler,
                                     num_workers=8, pin_memory=True)""",
)


def data_parallel(a: Analysis, f: Facts) -> Finding | None:
    devices = a.trace.gpu_devices
    if len(devices) < 2:
        return None
    dp_ops = sorted({o.name for o in a.ops if any(p in o.name for p in DP_OPS)})
    # DDP overlaps gradient reduction with backward and gives each GPU its own Python thread: at most
    # the idle time of the step goes (measured on the main device, which DataParallel loads the most).
    evidence = [
        f"One process runs GPU work on {len(devices)} devices ({', '.join(map(str, devices))})"
        + (f", through {', '.join(dp_ops[:4])}." if dp_ops else "."),
        f"The main GPU idles {us(f.idle_us)} {step_phrase(f)} ({pct(f.pct(f.idle_us))}).",
    ]
    return finding(
        "data_parallel",
        "Several GPUs are driven from one process (DataParallel)",
        f.pct(f.idle_us),
        evidence,
        FIX,
        {"devices": len(devices), "idle_us": f.idle_us},
    )
