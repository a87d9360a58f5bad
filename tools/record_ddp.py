"""Record a two-GPU DistributedDataParallel training run, one Kineto trace per rank, for the multi-rank
fixtures (tests/fixtures/ddp/): a GPT decoder under bf16 autocast, gradients all-reduced by NCCL, with
rank 1 made a straggler by host work planted in its step (--straggler-ms), so rank 0's all-reduce waits.

Each rank: warm up, time unprofiled steps (CUDA events), then profile wait=1, warmup=2, active=N steps
with `prof.step()` after each into `rank<R>.json.gz`; `manifest.json` says how and on what. Run from the
repo root on a machine with two GPUs (NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is set here):

    PYTHONPATH=src python tools/record_ddp.py --out tests/fixtures/ddp [--straggler-ms 8] [--active-steps 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from gpudoctor.runner import profile as capture
from gpudoctor.runner.profile import StepTraceOptions
from gpudoctor.workloads import models
from gpudoctor.workloads.base import seed_everything

WORLD = 2
VOCAB, SEQ, D_MODEL, HEADS, LAYERS, BATCH = 32768, 512, 1024, 16, 4, 8


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    device = torch.device("cuda", rank)
    seed_everything(0)
    model = models.GPT(VOCAB, SEQ, D_MODEL, HEADS, LAYERS).to(device).train()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator(device="cpu").manual_seed(rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen).to(device)
    straggle_s = args.straggler_ms / 1e3 if rank == 1 else 0.0

    def straggle() -> None:  # host work before the step (data loading, logging) on one rank only
        if args.straggle == "sleep":  # waiting on I/O; also keeps a with_stack trace small
            time.sleep(straggle_s)
            return
        end = time.perf_counter() + straggle_s
        while time.perf_counter() < end:
            pass

    def step() -> None:
        if straggle_s:
            straggle()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = ddp(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(args.timing_steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    dist.barrier()
    dest = args.out / f"rank{rank}.json.gz"
    capture.profile_steps(step, dest, StepTraceOptions(active=args.active_steps, with_stack=args.with_stack))
    entry = {
        "file": dest.name,
        "rank": rank,
        "straggler_ms": args.straggler_ms if rank == 1 else 0.0,
        "unprofiled_step_us": {
            "median": statistics.median(samples),
            "samples": samples,
            "method": "cuda_events",
        },
        "file_bytes": dest.stat().st_size,
    }
    (args.out / f".rank{rank}.entry.json").write_text(json.dumps(entry))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/ddp"))
    p.add_argument("--straggler-ms", type=float, default=8.0, help="host work per step on rank 1")
    p.add_argument("--active-steps", type=int, default=3)
    p.add_argument("--timing-steps", type=int, default=20)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--straggle", choices=("spin", "sleep"), default="spin", help="how rank 1 spends its time")
    p.add_argument(
        "--with-stack", action="store_true", help="record Python stacks (use with --straggle sleep)"
    )
    args = p.parse_args()
    if torch.cuda.device_count() < WORLD:
        raise SystemExit(f"record_ddp: needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mp.spawn(worker, args=(args, args.port), nprocs=WORLD, join=True)
    ranks: dict[str, Any] = {}
    for r in range(WORLD):
        part = args.out / f".rank{r}.entry.json"
        ranks[f"rank{r}"] = json.loads(part.read_text())
        part.unlink()
    props = torch.cuda.get_device_properties(0)
    manifest = {
        "schema_version": 1,
        "what": "DDP, 2 ranks, NCCL all-reduce; GPT decoder "
        f"({LAYERS}x{D_MODEL}, seq {SEQ}, batch {BATCH} per rank), bf16 autocast, fused AdamW",
        "profiler_schedule": {"wait": 1, "warmup": 2, "active": args.active_steps, "repeat": 1},
        "straggle": args.straggle,
        "with_stack": args.with_stack,
        "ranks": ranks,
        "environment": {
            "device_name": props.name,
            "device_count": torch.cuda.device_count(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        },
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for name, e in ranks.items():
        print(
            f"{name}: step {e['unprofiled_step_us']['median'] / 1e3:.2f} ms, {e['file_bytes'] / 1024:.0f} KiB"
        )
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
