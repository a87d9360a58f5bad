"""What `gpudoctor run`'s light phase (no profiler) costs a data-parallel step, and which of its parts
costs it: benchmarks/multi_gpu_train.py (DDP ResNet-50 bf16) under torchrun, plainly (its own timing:
the mean step over a window synchronized at its ends after a 3 s warm-up, and the per-step median),
then under `gpudoctor run --light` with its parts switched off one at a time (NVML sampling, the
allocator's history), in rounds so that drift shows. On --nproc ranks (2: the multi-GPU case; 1: the
same script as one rank). Results: OUT/multi_gpu_overhead.json and a table.

    PYTHONPATH=src python3 benchmarks/multi_gpu_overhead.py --out $OUT [--nproc 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi_gpu import TRAIN, checked, environment, run_env, torchrun

LIGHT = ["-m", "gpudoctor", "run", "--light", "--warmup", "5", "--light-steps", "100", "--light-seconds", "3"]
VARIANTS: dict[str, list[str]] = {
    "gpudoctor": [],
    "no_nvml": ["--no-nvml"],
    "no_nvml_no_history": ["--no-nvml", "--memory-history", "off"],
}


def plain(tmp: Path, env: dict[str, str], nproc: int) -> dict[str, Any]:
    times = tmp / f"plain_{time.monotonic_ns()}"
    checked(torchrun([str(TRAIN)], {**env, "TIMES_OUT": str(times)}, nproc=nproc), "plain")
    ranks = [json.loads((times / f"rank{r}.json").read_text()) for r in range(nproc)]
    return {"median_us": max(r["median_us"] for r in ranks), "mean_us": max(r["mean_us"] for r in ranks)}


def light(tmp: Path, env: dict[str, str], nproc: int, flags: list[str]) -> dict[str, Any]:
    from gpudoctor.runner.record import RunRecord

    out = tmp / f"gd_{time.monotonic_ns()}"
    cmd = [*LIGHT, *flags, "--out", str(out), str(TRAIN)]
    checked(torchrun(cmd, {**env, "STEPS": "100000"}, nproc=nproc), f"gpudoctor run {' '.join(flags)}")
    folders = [out / f"rank-{r}" for r in range(nproc)]  # under torchrun, one rank or several
    lights = [RunRecord.from_json(json.loads((f / "record.json").read_text())).light for f in folders]
    return {
        "median_us": max(x.median_us for x in lights if x),
        "mean_us": max(x.mean_us for x in lights if x),
        "steps": min(len(x.times_us) for x in lights if x),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--cpu", action="store_true", help="gloo on the CPU with a tiny CNN: the path, not the figures"
    )
    args = p.parse_args()
    env = run_env(args.cpu)
    if args.cpu:
        LIGHT[LIGHT.index("--light-seconds") + 1] = "0.2"
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for _ in range(args.rounds):
            rows.setdefault("plain", []).append(plain(tmp, env, args.nproc))
            for variant, flags in VARIANTS.items():
                rows.setdefault(variant, []).append(light(tmp, env, args.nproc, flags))
            print({k: round(v[-1]["median_us"] / 1e3, 2) for k, v in rows.items()}, flush=True)
    plain_median = statistics.median(r["median_us"] for r in rows["plain"])
    plain_mean = statistics.median(r["mean_us"] for r in rows["plain"])
    table = {
        k: {
            "median_us": (m := statistics.median(r["median_us"] for r in v)),
            "mean_us": (a := statistics.median(r["mean_us"] for r in v)),
            "vs_plain_median": m / plain_median,
            "vs_plain_mean": a / plain_mean,
            "rounds": v,
        }
        for k, v in rows.items()
    }
    result = {
        "schema": "gpudoctor.bench.multi_gpu_overhead/1",
        "environment": environment(not args.cpu),
        "nproc": args.nproc,
        "table": table,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"multi_gpu_overhead_{args.nproc}.json").write_text(json.dumps(result, indent=1) + "\n")
    for k, v in table.items():
        print(
            f"{k:22s} median {v['median_us'] / 1e3:7.2f} ms ({v['vs_plain_median']:.3f}×)  mean {v['mean_us'] / 1e3:7.2f} ms ({v['vs_plain_mean']:.3f}×)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
