"""The multi-GPU diagnosis checked on a machine with two GPUs, in one call (issue "Several GPUs, on
several GPUs"): every run is `torchrun --nproc-per-node 2` of benchmarks/multi_gpu_train.py (ResNet-50,
bf16 autocast, as users write it), NVLink multicast off.

1. `nccl`: a plain all-reduce benchmark with torch.distributed, fp32 (DDP's gradient dtype), 1 MiB to
   1 GiB: CUDA-event time of each size after warm-up, algorithm and bus bandwidth (NCCL-tests' 2(n-1)/n).
2. `plain`: the DDP script with no gpudoctor: its own median step time (CUDA events).
3. `ddp`: the same under `torchrun -m gpudoctor run`: the light phase's step time against the plain one
   (acceptance: within 5%), the ranks traced on the same steps, the findings, the all-reduce's bus
   bandwidth as gpudoctor reports it (each call's transfer: its shortest kernel over the ranks)
   against the benchmark's at that size, interpolated between the sizes measured (acceptance: 10%).
4. `straggler`: rank 1 busy on the host STRAGGLE_MS per step: gpudoctor names rank 1 and its cause first.
5. `fsdp`: FSDP2 (`fully_shard`): all-gather / reduce-scatter exposure reported.
With --fixtures DIR, each gpudoctor run's rank traces are copied to DIR/<scenario>/rankK.json.gz with
a manifest, for the CPU tests. Results: OUT/multi_gpu.json.

    PYTHONPATH=src python3 benchmarks/multi_gpu.py --out $OUT [--fixtures $OUT/fixtures]
    PYTHONPATH=src python3 benchmarks/multi_gpu.py --out /tmp/x --cpu     # the CPU path: gloo, a tiny CNN
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "benchmarks" / "multi_gpu_train.py"
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GPUDOCTOR_RUN = ["-m", "gpudoctor", "run", "--warmup", "5", "--light-steps", "20", "--steps", "3"]

ALLREDUCE = r"""
import json, os, sys, torch, torch.distributed as dist
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda: torch.cuda.set_device(dev)
rows = []
for size in [int(s) for s in sys.argv[2].split(",")]:
    x = torch.ones(size // 4, dtype=torch.float32, device=dev)
    iters = max(5, min(50, (1 << 30) // size))
    for _ in range(5): dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize(); a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters): dist.all_reduce(x)
        b.record(); b.synchronize(); us = a.elapsed_time(b) * 1e3 / iters
    else:
        import time; t = time.perf_counter()
        for _ in range(iters): dist.all_reduce(x)
        us = (time.perf_counter() - t) * 1e6 / iters
    rows.append({"bytes": size, "time_us": us, "algbw": size / (us * 1e-6), "busbw": 2 * (n - 1) / n * size / (us * 1e-6)})
if rank == 0: json.dump({"world": n, "rows": rows}, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def torchrun(args: list[str], env: dict[str, str], timeout: int = 480) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def checked(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def nccl_bench(tmp: Path, env: dict[str, str], sizes: list[int]) -> dict[str, Any]:
    script, out = tmp / "allreduce.py", tmp / "allreduce.json"
    script.write_text(ALLREDUCE)
    checked(torchrun([str(script), str(out), ",".join(map(str, sizes))], env), "the all-reduce benchmark")
    return json.loads(out.read_text())


def plain(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    times = tmp / "plain_times"
    checked(torchrun([str(TRAIN)], {**env, "TIMES_OUT": str(times)}), "the plain run")
    ranks = [json.loads((times / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {"step_us": max(r["median_us"] for r in ranks), "ranks": [r["median_us"] for r in ranks]}


def under_gpudoctor(name: str, tmp: Path, env: dict[str, str], extra: dict[str, str]) -> dict[str, Any]:
    out = tmp / name
    t0 = time.perf_counter()
    done = torchrun([*GPUDOCTOR_RUN, "--out", str(out), str(TRAIN)], {**env, **extra})
    checked(done, f"gpudoctor run ({name})")
    doc = json.loads((out / "analysis.json").read_text())
    records = [json.loads((out / f"rank-{r}" / "record.json").read_text()) for r in (0, 1)]
    ranks = [_rank_result(r) for r in doc["ranks"]]
    return {
        "seconds": time.perf_counter() - t0,
        "dir": str(out),
        "alignment": doc["run"],
        "light_step_us": [r["light_median_us"] for r in records],
        "traced_step_us": [r["traced_median_us"] for r in records],
        "across": [
            {
                "id": f["id"],
                "title": f["title"],
                "est_saving_pct": f["est_saving_pct"],
                "evidence": f["evidence"],
            }
            for f in doc["across"]["findings"]
        ],
        "ranks": ranks,
        "collectives": _collectives(doc),
        "stdout_tail": done.stdout[-2500:],
    }


def _rank_result(report: dict[str, Any]) -> dict[str, Any]:
    comms = report["analysis"].get("comms") or {}
    steps = comms.get("steps") or []
    return {
        "rank": report["analysis"]["trace"]["rank"],
        "findings": [(f["id"], f["est_saving_pct"]) for f in report["findings"]],
        "exposed_comm_us": statistics.median(s["exposed_us"] for s in steps) if steps else None,
        "comm_us": statistics.median(s["comm_us"] for s in steps) if steps else None,
        "exposed_by_collective_us": comms.get("exposed_by_collective_us"),
        "link": (comms.get("link") or {}).get("source"),
    }


def _collectives(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The collectives matched across ranks, recomputed from the summaries (analysis.across_ranks)."""
    from gpudoctor.analysis.across_ranks import across_ranks
    from gpudoctor.analysis.rank_summary import RankSummary

    x = across_ranks([RankSummary.from_json(s) for s in doc["summaries"]])
    return [
        {
            "collective": c.collective,
            "bytes": c.bytes,
            "calls": c.calls,
            "transfer_us": c.transfer_us,
            "busbw": c.busbw,
            "link_share": c.link_share,
        }
        for c in x.collectives
    ]


def bench_busbw(bench: dict[str, Any], size: int) -> float:
    """The benchmark's bus bandwidth at `size`: interpolated in log2(size) between the sizes measured
    on either side (the nearest one outside their range)."""
    import math

    rows = sorted(bench["rows"], key=lambda r: r["bytes"])
    below = [r for r in rows if r["bytes"] <= size]
    above = [r for r in rows if r["bytes"] >= size]
    if not below or not above:
        return (above or below)[0 if above else -1]["busbw"]
    a, b = below[-1], above[0]
    if a["bytes"] == b["bytes"]:
        return a["busbw"]
    t = (math.log2(size) - math.log2(a["bytes"])) / (math.log2(b["bytes"]) - math.log2(a["bytes"]))
    return a["busbw"] + t * (b["busbw"] - a["busbw"])


def fixtures(dest: Path, runs: dict[str, dict[str, Any]]) -> None:
    for name, run in runs.items():
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        for r in (0, 1):
            shutil.copy(Path(run["dir"]) / f"rank-{r}" / "trace.json.gz", folder / f"rank{r}.json.gz")
        manifest = {
            "what": f"benchmarks/multi_gpu.py scenario {name}",
            "light_step_us": run["light_step_us"],
            "alignment": run["alignment"],
        }
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def environment(cuda: bool) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if cuda:
        env |= {
            "device": torch.cuda.get_device_name(0),
            "devices": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        }
    return env


def run_env(cpu: bool) -> dict[str, str]:
    env = {**os.environ, **NO_MULTICAST, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if cpu:  # a tiny CNN, one thread per rank: the path, on a small machine
        env |= {
            "MODEL": "tiny",
            "BATCH": "8",
            "STEPS": "32",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
        }
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument(
        "--cpu", action="store_true", help="gloo on the CPU with a tiny CNN: the path, not the figures"
    )
    p.add_argument("--straggle-ms", type=float, default=20.0)
    p.add_argument(
        "--fixtures", type=Path, default=None, help="copy the rank traces here (for the CPU tests)"
    )
    p.add_argument("--scenarios", default="nccl,plain,ddp,straggler,fsdp")
    args = p.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    if not args.cpu and (not cuda or torch.cuda.device_count() < 2):
        raise SystemExit("multi_gpu: needs 2 GPUs (or --cpu for the CPU path)")
    env = run_env(args.cpu)
    if args.cpu:  # a few dozen steps: the light phase by its step count alone
        GPUDOCTOR_RUN.extend(["--light-seconds", "0"])
    sizes = [1 << p for p in range(20, 31)] if cuda else [1 << p for p in range(20, 24)]
    wanted = set(args.scenarios.split(","))
    result: dict[str, Any] = {
        "schema": "gpudoctor.bench.multi_gpu/1",
        "environment": environment(cuda),
        "cpu_path": args.cpu,
        "straggle_ms": args.straggle_ms,
    }
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "nccl" in wanted:
            result["allreduce_bench"] = nccl_bench(tmp, env, sizes)
        if "plain" in wanted:
            result["plain"] = plain(tmp, env)
        scenarios = {
            "ddp": {},
            "straggler": {"STRAGGLE_MS": str(args.straggle_ms)},
            "fsdp": {"PARALLEL": "fsdp"},
        }
        for name, extra in scenarios.items():
            if name in wanted:
                runs[name] = under_gpudoctor(name, tmp, env, extra)
                print(
                    f"{name}: {runs[name]['seconds']:.0f} s, across ranks: {[f['id'] for f in runs[name]['across']]}",
                    flush=True,
                )
        result["runs"] = {k: {kk: vv for kk, vv in v.items() if kk != "dir"} for k, v in runs.items()}
        result["checks"] = checks(result, runs)
        if args.fixtures is not None:
            fixtures(args.fixtures, runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multi_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["checks"], indent=1))
    return 0


def checks(result: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "plain" in result and "ddp" in runs:
        light = max(runs["ddp"]["light_step_us"])
        out["unprofiled_vs_plain"] = {
            "plain_us": result["plain"]["step_us"],
            "gpudoctor_light_us": light,
            "ratio": light / result["plain"]["step_us"],
        }
    if "allreduce_bench" in result and "ddp" in runs and runs["ddp"]["collectives"]:
        out["bandwidth_vs_bench"] = [
            {
                "bytes": c["bytes"],
                "calls": c["calls"],
                "gpudoctor_busbw": c["busbw"],
                "bench_busbw": (ref := bench_busbw(result["allreduce_bench"], c["bytes"])),
                "ratio": c["busbw"] / ref,
            }
            for c in sorted(runs["ddp"]["collectives"], key=lambda c: -c["bytes"])
        ]
    if "straggler" in runs:
        across = runs["straggler"]["across"]
        out["straggler_first"] = across[0]["title"] if across else None
    for name, run in runs.items():
        out[f"{name}_aligned"] = run["alignment"]["aligned"]
    if "fsdp" in runs:
        out["fsdp_exposed_by_collective_us"] = [r["exposed_by_collective_us"] for r in runs["fsdp"]["ranks"]]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
