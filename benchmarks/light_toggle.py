"""What `gpudoctor run`'s light phase costs a data-parallel step, with the drift between and within
processes cancelled: each rank of benchmarks/multi_gpu_train.py's loop (DDP ResNet-50 bf16, FSDP2, a
straggler, an uneven batch) alternates blocks of steps with and without gpudoctor's capture installed —
its step detector, its step clock's CUDA events, its reads of the allocator's statistics, its NVML
sampler, the allocator's history in its warm-up — in pairs whose order is a coin (`timing.paired`),
and the loop times each block itself, synchronized at its two ends. The paired sign-flip test over the
block pairs (`gpudoctor fix`'s) gives the light phase's cost as a ratio with its 95% interval.

Process pairs could not bound that cost to ±5% on these hosts: plain processes of the same DDP script
were 7–48% apart, and their steps drifted 24–35 ms inside one process
(multi_gpu_overhead_*.json). Adjacent blocks of one process share its start, its GPU's clocks and
whatever state the process drifts through.

Each B block installs a fresh `runner.capture.LiveCapture` (as `gpudoctor run` and `gpudoctor.profile()`
do), runs untimed until every rank's capture is in its light phase (its warm-up, with the allocator's
history on, is not the light phase), times its steps, and uninstalls it; each A block runs SETTLE
untimed steps, then its steps. Every rank takes the same blocks at the same steps (the seed and the
block's steps are agreed). Left out: the store posts by which `gpudoctor run`'s ranks agree where the
light phase ends (a few in a run, not per step).

    PYTHONPATH=src python3 benchmarks/light_toggle.py --out $OUT [--nproc 2] [--pairs 10] \\
        [--cases ddp,straggler,uneven,fsdp] [--block-s 1.0] [--pin] [--no-nvml]
    PYTHONPATH=src python3 benchmarks/light_toggle.py --out /tmp/t --cpu --pairs 2 --cases ddp   # the CPU path
    PYTHONPATH=src python3 benchmarks/light_toggle.py --pool benchmarks/results/light_toggle_h100x2_*.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SETTLE = 3  # untimed steps before an A block (a B block: until every rank's capture is in its light phase)
MAX_SETTLE = 200  # a B block's untimed steps at most (the capture's warm-up is capped at 53)
CALIBRATE = 10  # steps timed after the warm-up: the pace that sizes the blocks
SCHEMA = "gpudoctor.bench.light_toggle/1"
SCRIPT_FILES = (str(HERE / "light_toggle.py"), str(HERE / "multi_gpu_train.py"))  # the loop's code
CASES: dict[str, dict[str, str]] = {
    "ddp": {"PARALLEL": "ddp"},
    "straggler": {"PARALLEL": "ddp", "STRAGGLE_MS": "15"},
    "uneven": {"PARALLEL": "ddp", "UNEVEN": "1.5"},
    "fsdp": {"PARALLEL": "fsdp"},
}


def light_options() -> Any:
    """`gpudoctor run --light`'s light phase, held open: no end of its own while a block runs."""
    from gpudoctor.runner.capture import LiveOptions

    nvml = os.environ.get("LIGHT_NVML", "1") != "0"  # --no-nvml: the capture without its NVML sampler
    return LiveOptions(warmup=3, warmup_seconds=0.0, light_steps=10**9, light_seconds=1e9, light_only=True,
                       run_to_end=True, settle=False, nvml=nvml, memory_history="outside-light")  # fmt: skip


def worker(out: Path, pairs: int, block_s: float, seed: int) -> None:
    """One rank of the toggled loop (under torchrun)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from multi_gpu_train import setup

    from gpudoctor.runner.capture import LiveCapture
    from gpudoctor.timing.paired import random_orders, sides

    loop = setup()
    rank, cuda, device, step = loop.rank, loop.cuda, loop.device, loop.step
    gpu_state = nvml_reader(device) if cuda else (lambda: None)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def agreed(value: float, op: Any) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    warmup_s = float(os.environ.get("WARMUP_S", "3"))
    started = time.perf_counter()
    while agreed(time.perf_counter() - started, dist.ReduceOp.MIN) < warmup_s:
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(CALIBRATE):
        step()
    sync()
    pace = agreed((time.perf_counter() - t0) / CALIBRATE, dist.ReduceOp.MAX)
    steps = max(2, math.ceil(block_s / pace))
    b_first = random_orders(pairs, np.random.default_rng(seed))
    blocks: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix=f"light_toggle_rank{rank}_"))
    for k, on in enumerate(sides(b_first)):
        capture = None
        if on:
            capture = LiveCapture(tmp / f"block{k}", light_options(), SCRIPT_FILES)
            capture.install()
        settle = 0
        while True:  # untimed: every rank ready (its capture in the light phase), the same step on each
            step()
            settle += 1
            ready = capture is None or capture.phase == "light"
            if settle >= (1 if on else SETTLE) and agreed(1.0 if ready else 0.0, dist.ReduceOp.MIN) > 0:
                break
            if settle >= MAX_SETTLE:
                raise SystemExit(f"rank {rank}: the capture found no light phase in {MAX_SETTLE} steps")
        sync()
        before = gpu_state()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        elapsed = time.perf_counter() - t0
        after = gpu_state()
        phase = capture.phase if capture is not None else None
        if capture is not None:
            capture.uninstall()
        blocks.append({"candidate": on, "steps": steps, "elapsed_us": 1e6 * elapsed, "settle": settle,
                       "phase": phase, "gpu": [before, after]})  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)  # the captures' run folders: their memory files, nothing measured
    out.mkdir(parents=True, exist_ok=True)
    doc = {"rank": rank, "batch": loop.batch, "cores": loop.cores, "pace_us": 1e6 * pace, "block_steps": steps,
           "b_first": list(b_first), "blocks": blocks}  # fmt: skip
    (out / f"rank{rank}.json").write_text(json.dumps(doc))
    dist.barrier()  # every rank tears down together (gloo aborted one that did so alone, 1 run in 6)
    dist.destroy_process_group()


def nvml_reader(device: Any) -> Any:
    """A function reading this rank's GPU's SM clock, power and clock-event reasons (NVML, a few tens of
    µs, at both ends of every block on both sides alike): whether the block-to-block drift of the step
    follows the GPU's clocks. A function returning None where NVML is not there."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        # by UUID: torch's pci_bus_id is a number, not NVML's key
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # no NVML, no such GPU: the blocks are timed all the same
        return lambda: None
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda _: None
    )

    def read() -> dict[str, Any] | None:
        try:
            return {
                "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                "reasons": reasons(handle),
            }
        except Exception:  # a read that fails leaves that block's state unknown
            return None

    return read


def as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def row_text(case: str, t: dict[str, Any]) -> str:
    lo, hi = t["ci95"]
    return (f"{case:10s} light/plain {t['ratio']:.4f}× (95% {lo:.4f}–{hi:.4f}, {t['verdict']}) over "
            f"{t['pairs']} block pairs of {'/'.join(map(str, as_list(t['block_steps'])))} steps; plain blocks "
            f"{t['plain_blocks_spread_pct']:.1f}% apart{clocks_text(t['clocks'])}")  # fmt: skip


def clocks_text(clocks: dict[str, Any] | None) -> str:
    """ "; SM clocks 1410–1980 MHz, step against clock r −0.93/−0.91" (per rank), or nothing."""
    if not clocks:
        return ""
    lo = min(r["sm_mhz_min"] for r in clocks["ranks"])
    hi = max(r["sm_mhz_max"] for r in clocks["ranks"])
    rs = "/".join(
        "n/a" if r["step_vs_sm_clock_r"] is None else f"{r['step_vs_sm_clock_r']:+.2f}"
        for r in clocks["ranks"]
    )
    return f"; SM clocks {lo:.0f}–{hi:.0f} MHz, step against clock r {rs}"


def compare(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The block pairs (each block's time the slowest rank's) and the paired test on them. Pure."""
    from multi_gpu import paired_row

    from gpudoctor.timing.paired import paired_compare, pairs_in_order

    n = len(ranks[0]["blocks"])
    if any(len(r["blocks"]) != n for r in ranks):
        raise ValueError("the ranks timed different numbers of blocks")
    blocks = []
    for k in range(n):
        row = [r["blocks"][k] for r in ranks]
        if len({b["candidate"] for b in row}) != 1:
            raise ValueError(f"block {k}: the ranks ran different sides")
        if row[0]["candidate"] and any(b["phase"] != "light" for b in row):
            raise ValueError(f"block {k}: a capture left its light phase while the block ran")
        blocks.append((row[0]["candidate"], max(b["elapsed_us"] for b in row) / row[0]["steps"]))
    pairs = pairs_in_order(blocks)
    cmp = paired_compare(pairs, unit="block pair")
    a = [m for on, m in blocks if not on]
    b = [m for on, m in blocks if on]
    return {
        **paired_row(cmp),
        "pairs": len(pairs),
        "plain_block_mean_us": statistics.fmean(a),
        "light_block_mean_us": statistics.fmean(b),
        # the drift the pairs cancel: the plain blocks' spread over the run
        "plain_blocks_spread_pct": 100 * (max(a) - min(a)) / statistics.median(a),
        "block_steps": ranks[0]["block_steps"],
        "b_settle_steps": [b["settle"] for r in ranks[:1] for b in r["blocks"] if b["candidate"]],
        "clocks": clocks_row(ranks),
    }


def clocks_row(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whether the blocks' step times follow the GPUs' SM clocks: per rank, the correlation of each
    block's mean step with its SM clock (the mean of its two ends), and the clocks' range. None where
    NVML read nothing. Pure."""
    out = []
    for r in ranks:
        rows = [(b["elapsed_us"] / b["steps"], [g["sm_mhz"] for g in b.get("gpu") or [] if g])
                for b in r["blocks"]]  # fmt: skip
        rows = [(t, statistics.fmean(mhz)) for t, mhz in rows if mhz]
        if len(rows) < 3:
            continue
        times, mhz = zip(*rows, strict=True)
        corr = statistics.correlation(times, mhz) if len(set(mhz)) > 1 and len(set(times)) > 1 else None
        out.append(
            {"rank": r["rank"], "step_vs_sm_clock_r": corr, "sm_mhz_min": min(mhz), "sm_mhz_max": max(mhz)}
        )
    return {"ranks": out} if out else None


def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' block pairs of each case taken together (each rank's blocks one run after the
    other: a pair never spans two runs) and judged as one run's. Pure."""
    table: dict[str, Any] = {}
    for case in dict.fromkeys(c for r in results for c in r["table"]):
        runs = [r["table"][case]["ranks"] for r in results if case in r["table"]]
        ranks = [  # rank k: its blocks of every run, one run after the other
            {**same_rank[0], "blocks": [b for r in same_rank for b in r["blocks"]]}
            for same_rank in zip(*runs, strict=True)
        ]
        table[case] = {
            **compare(ranks),
            "runs": len(runs),
            "block_steps": [run[0]["block_steps"] for run in runs],
        }
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--block-s", type=float, default=1.0, help="each block's length at the calibrated pace")
    p.add_argument("--cases", default="ddp,straggler,uneven,fsdp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pin", action="store_true", help="every rank on its share of its GPU's local cores")
    p.add_argument("--no-nvml", action="store_true",
                   help="the capture without its NVML sampler (10 Hz): that part's share of the cost")  # fmt: skip
    p.add_argument(
        "--cpu", action="store_true", help="gloo on the CPU with a tiny CNN: the path, not the figures"
    )
    p.add_argument("--case-timeout-s", type=float, default=300.0, help="a case's torchrun, at most")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a rank, under torchrun
    p.add_argument("--pool", type=Path, nargs="+", help="only judge these results files' pairs together")
    args = p.parse_args()
    if args.pool:
        for case, t in pooled([json.loads(f.read_text()) for f in args.pool]).items():
            print(row_text(case, t), f"({t['runs']} runs)")
        return 0
    if args.worker is not None:
        worker(args.worker, args.pairs, args.block_s, args.seed)
        return 0
    if args.out is None:
        p.error("--out is required")
    if args.pairs < 2:
        p.error("--pairs: a paired comparison needs two pairs or more")
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)} (of {', '.join(CASES)})")
    from multi_gpu import environment, run_env, torchrun

    table: dict[str, Any] = {}
    failed: dict[str, str] = {}

    def write(cases_left: list[str]) -> None:  # after each case: a run cut short keeps the cases it ended
        result = {"schema": SCHEMA, "environment": environment(not args.cpu), "nproc": args.nproc,
                  "pinned": args.pin, "capture_nvml": not args.no_nvml, "pairs": args.pairs,
                  "block_s": args.block_s, "table": table, "failed": failed, "cases_left": cases_left}  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"light_toggle_{args.nproc}.json").write_text(json.dumps(result, indent=1) + "\n")

    cases = args.cases.split(",")
    with tempfile.TemporaryDirectory() as name:
        for k, case in enumerate(cases):
            env = {**run_env(args.cpu), **CASES[case], **({"PIN_CORES": "1"} if args.pin else {}),
                   **({"LIGHT_NVML": "0"} if args.no_nvml else {})}  # fmt: skip
            folder = Path(name) / case
            cmd = [str(Path(__file__).resolve()), "--worker", str(folder), "--pairs", str(args.pairs),
                   "--block-s", str(args.block_s), "--seed", str(args.seed)]  # fmt: skip
            done = torchrun(cmd, env, timeout=args.case_timeout_s, nproc=args.nproc)
            if done.returncode:  # its ranks are gone, their GPUs free; the other cases would fail alike
                failed[case] = f"exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"
                print(f"{case:10s} failed: {failed[case][-300:]}", flush=True)
                break
            ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(args.nproc)]
            table[case] = {**compare(ranks), "ranks": ranks}
            print(row_text(case, table[case]), flush=True)
            write(cases[k + 1 :])
    write([c for c in cases if c not in table])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
