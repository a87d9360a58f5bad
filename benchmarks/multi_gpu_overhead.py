"""What `gpudoctor run`'s light phase (no profiler) costs a data-parallel step, judged as `gpudoctor fix`
judges a fix: benchmarks/multi_gpu_train.py (DDP ResNet-50 bf16, or FSDP2 with --parallel fsdp) under
torchrun, plainly (its own timing: the mean step over a window synchronized at its ends after a 3 s
warm-up) and under `gpudoctor run --light` (the light phase's mean step, after the same warm-up), in process pairs whose order
goes A B, B A, … (`timing.paired.abba`: drift between processes cancels in the pairs), judged by the
paired test on ln(gpudoctor / plain) (`timing.paired.paired_compare`): the ratio with its 95% interval,
and "same" where that interval lies within ±5%. Like for like: both sides time `--steps` steps after the
same warm-up, and each side's mean leaves out the unsettled head that the light phase leaves out of its
own (`runner.settle`, MSER-5, applied to the plain run's per-step times too); the ratio of every step's
mean stands beside it (`every_step`). `--parts` adds the light phase with its parts switched off
one at a time (NVML sampling, the allocator's history), each paired with plain the same way. On --nproc
ranks (2: the multi-GPU case; 1: the same script as one rank). Results: OUT/multi_gpu_overhead_N.json and a
table.

    PYTHONPATH=src python3 benchmarks/multi_gpu_overhead.py --out $OUT [--nproc 2] [--pairs 4] [--parallel fsdp] \
        [--steps 400]
    PYTHONPATH=src python3 benchmarks/multi_gpu_overhead.py --out /tmp/o --cpu --pairs 2   # the CPU path
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
from multi_gpu import TRAIN, checked, environment, paired_row, run_env, settled_mean_us, torchrun

# a 3 s warm-up, as the plain timing has (multi_gpu_train.py's WARMUP_S; multi_gpu.py's runs alike): these
# DDP steps take seconds to settle, and the two must time the same stretch of the run to isolate
# gpudoctor's cost (`gpudoctor run`'s default is 1 s)
LIGHT = ["-m", "gpudoctor", "run", "--light", "--warmup", "5", "--warmup-seconds", "3", "--light-steps", "100",
         "--light-seconds", "3"]  # fmt: skip
VARIANTS: dict[str, list[str]] = {
    "gpudoctor": [],
    "no_nvml": ["--no-nvml"],
    "no_nvml_no_history": ["--no-nvml", "--memory-history", "off"],
}


def plain(tmp: Path, env: dict[str, str], nproc: int) -> dict[str, Any]:
    times = tmp / f"plain_{time.monotonic_ns()}"
    checked(torchrun([str(TRAIN)], {**env, "TIMES_OUT": str(times)}, nproc=nproc), "plain")
    ranks = [json.loads((times / f"rank{r}.json").read_text()) for r in range(nproc)]
    return {
        "quarter_means_us": quarter_means([r["times_us"] for r in ranks]),
        "median_us": max(r["median_us"] for r in ranks),
        "mean_us": max(r["mean_us"] for r in ranks),
        # like for like with the light phase's mean: its unsettled head left out as gpudoctor's is
        "settled_mean_us": max(settled_mean_us(r["times_us"]) for r in ranks),
        "steps": min(len(r["times_us"]) for r in ranks),
    }


def light(tmp: Path, env: dict[str, str], nproc: int, flags: list[str]) -> dict[str, Any]:
    from gpudoctor.runner.record import RunRecord

    out = tmp / f"gd_{time.monotonic_ns()}"
    cmd = [*LIGHT, *flags, "--out", str(out), str(TRAIN)]
    checked(torchrun(cmd, {**env, "STEPS": "100000"}, nproc=nproc), f"gpudoctor run {' '.join(flags)}")
    folders = [out / f"rank-{r}" for r in range(nproc)]  # under torchrun, one rank or several
    lights = [RunRecord.from_json(json.loads((f / "record.json").read_text())).light for f in folders]
    every = [(*(x.settling.dropped_us if x.settling else ()), *x.times_us) for x in lights if x]
    return {
        "quarter_means_us": quarter_means(every),  # its head too: where the steps drift, and how
        "median_us": max(x.median_us for x in lights if x),
        "mean_us": max(x.mean_us for x in lights if x),  # its kept steps: what gpudoctor reports
        "settled_mean_us": max(x.mean_us for x in lights if x),
        "all_mean_us": max(statistics.fmean(t) for t in every if t),  # its head too, as plain's mean_us
        "steps": min(len(x.times_us) for x in lights if x),
    }


def quarter_means(ranks: list[Any]) -> list[float]:
    """The mean step of each quarter of the timed steps, the slowest rank's at each: a drift within the
    process (the DDP step on one H100 host went from 21.5 to 33.9 ms over 400 plain steps) shows here."""
    out = []
    for k in range(4):
        means = [statistics.fmean(q) for t in ranks if (q := t[k * len(t) // 4 : (k + 1) * len(t) // 4])]
        out.append(max(means) if means else float("nan"))
    return out


def main() -> int:
    from gpudoctor.timing.paired import Pair, abba, paired_compare

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--pairs", type=int, default=4, help="process pairs per variant (plain beside it)")
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument(
        "--steps",
        type=int,
        default=100,
        help="timed steps on both sides (plain STEPS, the light phase's --light-steps), after the same warm-up",
    )
    p.add_argument(
        "--parts", action="store_true", help="also the light phase with NVML, then the history, off"
    )
    p.add_argument(
        "--cpu", action="store_true", help="gloo on the CPU with a tiny CNN: the path, not the figures"
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="every rank, plain and gpudoctor's, on its share of its GPU's NUMA-local cores",
    )
    args = p.parse_args()
    if args.pairs < 2:
        p.error("--pairs: a paired comparison needs two pairs or more")
    env = {**run_env(args.cpu), "PARALLEL": args.parallel, **({"PIN_CORES": "1"} if args.pin else {})}
    # the same number of timed steps on both sides: the light phase ends at --light-steps (no floor of
    # seconds, which would run it longer than the plain window)
    env["STEPS"] = str(args.steps)
    LIGHT[LIGHT.index("--light-steps") + 1] = str(args.steps)
    LIGHT[LIGHT.index("--light-seconds") + 1] = "0"
    if args.cpu:
        LIGHT[LIGHT.index("--warmup-seconds") + 1] = env["WARMUP_S"]  # as the plain timing's
    variants = VARIANTS if args.parts else {"gpudoctor": VARIANTS["gpudoctor"]}
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for variant, flags in variants.items():
            for b_first in abba(args.pairs)[::2]:  # each pair by its first process: A B, B A, …
                order = ("gd", "plain") if b_first else ("plain", "gd")
                got = {
                    side: light(tmp, env, args.nproc, flags) if side == "gd" else plain(tmp, env, args.nproc)
                    for side in order
                }
                rows.setdefault(variant, []).append({"b_first": b_first, **got})
                print(variant, {k: round(v["mean_us"] / 1e3, 2) for k, v in got.items()},
                      {k: [round(q / 1e3, 1) for q in v["quarter_means_us"]] for k, v in got.items()}, flush=True)  # fmt: skip
    table = {}
    for variant, pairs in rows.items():
        # like for like: each side's mean without its unsettled head (the light phase leaves it out)
        cmp = paired_compare(
            [Pair(r["plain"]["settled_mean_us"], r["gd"]["settled_mean_us"], r["b_first"]) for r in pairs],
            unit="process pair",
        )
        raw = paired_compare(
            [Pair(r["plain"]["mean_us"], r["gd"]["all_mean_us"], r["b_first"]) for r in pairs],
            unit="process pair",
        )
        table[variant] = {
            "compared": "settled means (each side's unsettled head left out, as the light phase does)",
            "every_step": {"ratio": raw.ratio, "ci95": [raw.ci_low, raw.ci_high], "verdict": raw.verdict},
            **paired_row(cmp),
            "plain_spread_pct": 100
            * (max(q := [r["plain"]["mean_us"] for r in pairs]) - min(q))
            / statistics.median(q),
            "pairs": pairs,
        }
    result = {
        "schema": "gpudoctor.bench.multi_gpu_overhead/2",
        "environment": environment(not args.cpu),
        "pinned": args.pin,
        "nproc": args.nproc,
        "parallel": args.parallel,
        "table": table,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"multi_gpu_overhead_{args.nproc}_{args.parallel}.json").write_text(
        json.dumps(result, indent=1) + "\n"
    )
    for k, v in table.items():
        lo, hi = v["ci95"]
        print(
            f"{k:22s} gpudoctor/plain {v['ratio']:.3f}× (95% {lo:.3f}–{hi:.3f}, {v['verdict']}), "
            f"plain processes {v['plain_spread_pct']:.1f}% apart"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
