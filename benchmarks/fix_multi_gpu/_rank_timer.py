"""Time one rank of a data-parallel training script from outside, for benchmarks/fix_multi_gpu.py: run
as torchrun's script, it runs the user's script unmodified (as `__main__`, its own arguments) and counts
its steps with torch.optim's global optimizer-step post-hook (the first optimizer that steps is the step;
no gpudoctor code). After `--warmup-steps` — and the batches the script's DataLoader workers hold in
flight, the most of any rank: a loader-paced loop runs through them at the GPU's pace first — it times
`--steps` steps with CUDA synchronized at the window's two ends only, writes OUT/rank{RANK}.json and ends
the process at that same step on every rank (after a barrier where a process group is up), so that no
rank waits in a collective for one that left. PIN_CORES=1: the rank first pins itself to its share of its
GPU's NUMA-local cores (benchmarks/multi_gpu_train.py's pinning); its loader workers inherit it.

    torchrun --standalone --nproc-per-node 2 benchmarks/fix_multi_gpu/_rank_timer.py --out DIR \\
        --warmup-steps 10 --steps 50 -- benchmarks/fix_multi_gpu/ddp_hf_lm.py [--expert]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import runpy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent


@dataclass
class Window:
    """The step count and the timed window of one rank (mutable: the hook advances it)."""

    warmup: int
    steps: int
    out: Path
    rank: int
    seen: int = 0
    owner: int | None = None  # id() of the optimizer whose steps are counted
    in_flight: int = 0  # the most batches any DataLoader iterated here holds ahead
    start_at: int | None = None  # the step after which the window opens, agreed by every rank
    t0: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def agree_max(value: int) -> int:
    """The largest `value` of all ranks (one all-reduce on the default group; `value` alone without
    one). Called at the same step on every rank, so the collectives match."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    on_gpu = dist.get_backend() == "nccl"
    t = torch.tensor([value], device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def rank_result(w: Window, window_s: float) -> dict[str, Any]:
    """What one rank writes: its window and what it ran on."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "rank": w.rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "warmup_steps": w.start_at,
        "in_flight": w.in_flight,
        "steps": w.steps,
        "window_s": window_s,
        "step_s": window_s / w.steps,
        "device": torch.cuda.get_device_name(torch.cuda.current_device()) if cuda else "cpu",
        "torch": torch.__version__,
        "pid": os.getpid(),
        **w.extra,
    }


def finish(w: Window, result: dict[str, Any]) -> None:
    """Write this rank's result (whole or not at all), meet the other ranks, and end the process here:
    every rank ends at the same step, none is left in a collective, nothing of the script runs on."""
    w.out.mkdir(parents=True, exist_ok=True)
    target = w.out / f"rank{w.rank}.json"
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(target)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def on_step(w: Window, optimizer: object) -> None:
    """The optimizer-step post-hook's body: count, open the window, close it."""
    if w.owner is None:
        w.owner = id(optimizer)
    if id(optimizer) != w.owner:
        return  # a second optimizer, or an outer wrapper's step around the inner one: not another step
    w.seen += 1
    if w.start_at is None:  # the first step: every loader has been iterated once
        w.start_at = max(1, w.warmup + agree_max(w.in_flight))
    if w.seen == w.start_at:
        sync()
        w.t0 = time.perf_counter()
    elif w.seen == w.start_at + w.steps:
        sync()
        finish(w, rank_result(w, time.perf_counter() - w.t0))


def watch_loaders(w: Window) -> None:
    """Record, at each DataLoader's iteration, how many batches its workers hold ahead."""
    from torch.utils.data import DataLoader

    iterate = DataLoader.__iter__

    def counted(loader: DataLoader) -> object:  # type: ignore[type-arg]
        workers = int(getattr(loader, "num_workers", 0) or 0)
        if workers:
            w.in_flight = max(w.in_flight, workers * int(getattr(loader, "prefetch_factor", None) or 2))
        return iterate(loader)

    DataLoader.__iter__ = counted  # type: ignore[method-assign]


def pin(local_rank: int) -> list[int] | None:
    """PIN_CORES=1: this process on its share of its GPU's local cores (None where not asked or no GPU)."""
    if os.environ.get("PIN_CORES") != "1":
        return None
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from multi_gpu_train import pin_to_gpu_cores
    finally:
        sys.path.remove(str(BENCHMARKS))
    return pin_to_gpu_cores(local_rank)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for rank{RANK}.json")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--steps", type=int, required=True, help="steps in the timed window")
    p.add_argument("--stacks-after-s", type=float, help="dump every thread's stack after this long")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    a = p.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command or a.steps < 1 or a.warmup_steps < 0:
        p.error("give --steps >= 1, --warmup-steps >= 0 and -- SCRIPT [ARGS...]")
    if a.stacks_after_s:
        faulthandler.dump_traceback_later(a.stacks_after_s, exit=False)
    rank = int(os.environ.get("RANK", "0"))
    cores = pin(int(os.environ.get("LOCAL_RANK", "0")))
    import torch.optim.optimizer as optim

    w = Window(a.warmup_steps, a.steps, a.out, rank, extra={"cores": cores, "command": command})
    watch_loaders(w)
    optim.register_optimizer_step_post_hook(lambda opt, args, kwargs: on_step(w, opt))
    script = Path(command[0]).resolve()
    sys.argv = [str(script), *command[1:]]
    sys.path[0] = str(script.parent)
    runpy.run_path(str(script), run_name="__main__")
    # the script ended before the window closed: no figure from this rank
    print(f"_rank_timer: {script.name} ended after {w.seen} steps, before step "
          f"{(w.start_at or a.warmup_steps) + a.steps} that closes the window", file=sys.stderr)  # fmt: skip
    return 1


if __name__ == "__main__":
    sys.exit(main())
