"""The multi-GPU diagnosis checked on a machine with two GPUs, in one call (issue "Several GPUs, on two
GPUs"): every run is `torchrun --nproc-per-node 2` of benchmarks/multi_gpu_train.py (ResNet-50, bf16
autocast, as users write it), NVLink multicast off in every process.

1. `nccl`: a plain all-reduce benchmark with torch.distributed, fp32 (DDP's gradient dtype), 1 MiB to
   1 GiB: CUDA-event time of each size after warm-up, algorithm and bus bandwidth (NCCL-tests' 2(n-1)/n).
2. `plain`: the script with no gpudoctor, in rounds (the first before gpudoctor's runs, the others
   after: their spread is the A/A noise of plain runs), each case: its mean step over a window
   synchronized at its ends after a 3 s warm-up (the truth), the per-step median beside it. Cases: DDP
   balanced, with a straggler (rank 1 busy on the host), with an uneven batch (rank 1's 1.5×) and the
   same 160 images shared out evenly (its fix), no communication at all (each rank its own replica:
   what exposed communication is held to), FSDP2 and FSDP2 without resharding after forward.
3. Under `torchrun -m gpudoctor run`: `ddp`, `straggler`, `uneven`, `fsdp`: the unprofiled step against
   the plain one (acceptance: within 5%), the ranks traced on the same steps, the findings, the
   predicted saving of the across-ranks finding against the measured one (the plain step of its fix
   against the planted case's; ±25%), exposed communication against the step without
   communication, the all-reduce's bus bandwidth against the benchmark's at that size (10%), the
   `destroy_process_group` warnings torch printed, and `short`: a script that ends before its trace.
With --fixtures DIR, each gpudoctor run's rank directories (record, rank info, trace) and analysis go
to DIR/<scenario>/, for the CPU tests. Results: OUT/multi_gpu.json.

    PYTHONPATH=src python3 benchmarks/multi_gpu.py --out $OUT [--fixtures $OUT/fixtures]
    PYTHONPATH=src python3 benchmarks/multi_gpu.py --out /tmp/x --cpu     # the CPU path: gloo, a tiny CNN
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # every_loop's window clock and its reading
TRAIN = ROOT / "benchmarks" / "multi_gpu_train.py"
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# a 3 s warm-up, as the plain runs have: these DDP steps take seconds to settle on the 2-GPU hosts
GPUDOCTOR_RUN = [
    "-m",
    "gpudoctor",
    "run",
    "--warmup",
    "5",
    "--warmup-seconds",
    "3",
    "--light-steps",
    "20",
    "--steps",
    "3",
]

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


def paired_row(cmp: Any) -> dict[str, Any]:
    """A paired comparison (`timing.paired.PairedComparison`) as the results files hold it: the ratio
    B/A, its 95% interval, the test, and whether the interval lies within ±5%."""
    return {
        "ratio": cmp.ratio,
        "ci95": [cmp.ci_low, cmp.ci_high],
        "p_value": cmp.p_value,
        "verdict": cmp.verdict,
        "test": cmp.test,
        "within_5pct": cmp.ci_low >= 0.95 and cmp.ci_high <= 1.05,
    }


def torchrun(
    args: list[str], env: dict[str, str], timeout: float = 480, nproc: int = 2
) -> subprocess.CompletedProcess[str]:
    """torchrun in a process group of its own; past `timeout` seconds the whole group is killed (a rank
    left hanging in a collective would hold its GPU for what runs next) and the run ends with -9."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *args,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\nno end after {timeout:.0f} s: killed with its ranks"
        return subprocess.CompletedProcess(cmd, -9, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


FAILURE_LOGS: Path | None = None  # where the whole output of a failed torchrun goes (--out)


def checked(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode:
        if FAILURE_LOGS is not None:
            FAILURE_LOGS.mkdir(parents=True, exist_ok=True)
            name = "".join(c if c.isalnum() else "_" for c in what)
            (FAILURE_LOGS / f"{name}.log").write_text(done.stdout + "\n---- stderr\n" + done.stderr)
        ranks = "\n".join(line for line in done.stderr.splitlines() if line.startswith("[rank"))
        raise SystemExit(f"{what} failed ({done.returncode}):\n{ranks[-3000:]}\n{done.stderr[-1500:]}")


def nccl_bench(tmp: Path, env: dict[str, str], sizes: list[int]) -> dict[str, Any]:
    script, out = tmp / "allreduce.py", tmp / "allreduce.json"
    script.write_text(ALLREDUCE)
    checked(torchrun([str(script), str(out), ",".join(map(str, sizes))], env), "the all-reduce benchmark")
    return json.loads(out.read_text())


PLAIN_CASES: dict[str, dict[str, str]] = {
    "balanced": {},
    "straggler": {"STRAGGLE_MS": "{straggle}"},
    "uneven": {"UNEVEN": "1.5"},
    "even": {"SHARED": "1.5"},  # the uneven case's 64 + 96 images shared out evenly (80 each): its fix
    "none": {"PARALLEL": "none"},
    "fsdp": {"PARALLEL": "fsdp"},
    "fsdp_keep": {"PARALLEL": "fsdp", "FSDP_RESHARD": "0"},
}
GPUDOCTOR_CASES: dict[str, dict[str, str]] = {
    "ddp": {},
    "straggler": {"STRAGGLE_MS": "{straggle}"},
    "uneven": {"UNEVEN": "1.5"},
    "fsdp": {"PARALLEL": "fsdp"},
    "ddp_bucket100": {"BUCKET_MB": "100"},  # one all-reduce of 98 MiB: the bandwidth at a size ≥ 64 MB
}
FIXTURE_CASES = ("ddp", "straggler", "uneven", "fsdp")  # the CPU tests' recordings
RUN_STEPS = "400"  # enough for every phase under gpudoctor run, which stops the script after its trace
SHORT_STEPS = "12"  # too few for the phases: what gpudoctor says under torchrun
DESTROY_WARNING = "destroy_process_group() was not called"


def case_env(extra: dict[str, str], straggle_ms: float) -> dict[str, str]:
    return {k: v.replace("{straggle}", str(straggle_ms)) for k, v in extra.items()}


def plain(name: str, tmp: Path, env: dict[str, str], extra: dict[str, str]) -> dict[str, Any]:
    """The script's own timing, no gpudoctor: the ranks step together, so the slower rank's figures."""
    times = tmp / f"plain_{name}"
    checked(torchrun([str(TRAIN)], {**env, **extra, "TIMES_OUT": str(times)}), f"the plain run ({name})")
    ranks = [json.loads((times / f"rank{r}.json").read_text()) for r in (0, 1)]
    slow = max(ranks, key=lambda r: r["mean_us"])["times_us"]
    quarter = max(len(slow) // 4, 1)
    return {
        "mean_us": max(r["mean_us"] for r in ranks),
        # as gpudoctor's light phase keeps its steps: the unsettled head left out (MSER-5)
        "settled_mean_us": max(settled_mean_us(r["times_us"]) for r in ranks),
        "median_us": max(r["median_us"] for r in ranks),
        "window_s": min(r["window_s"] for r in ranks),
        "warmup_steps": [r["warmup_steps"] for r in ranks],
        "first_quarter_mean_us": statistics.mean(slow[:quarter]),
        "last_quarter_mean_us": statistics.mean(slow[-quarter:]),
        "ranks_mean_us": [r["mean_us"] for r in ranks],
        "batch": [r["batch"] for r in ranks],
    }


def under_gpudoctor(name: str, tmp: Path, env: dict[str, str], extra: dict[str, str]) -> dict[str, Any]:
    out = tmp / name
    t0 = time.perf_counter()
    windows = {
        "WINDOWS_OUT": str(out / "windows"),
        "EVERY_LOOP_SKIP": "3",
        "EVERY_LOOP_SKIP_S": "0",
        "EVERY_LOOP_MIN_S": "0.5",
    }
    done = torchrun(
        [*GPUDOCTOR_RUN, "--out", str(out), str(TRAIN)], {**env, "STEPS": RUN_STEPS, **windows, **extra}
    )
    checked(done, f"gpudoctor run ({name})")
    doc = json.loads((out / "analysis.json").read_text())
    from gpudoctor.runner.record import RunRecord

    records = [json.loads((out / f"rank-{r}" / "record.json").read_text()) for r in (0, 1)]
    lights = [RunRecord.from_json(r).light for r in records]
    return {
        "seconds": time.perf_counter() - t0,
        "dir": str(out),
        "alignment": doc["run"],
        "light_step_us": [r["light_median_us"] for r in records],
        "light_mean_us": [light.mean_us if light else None for light in lights],
        "light_steps": [len(light.times_us) if light else 0 for light in lights],
        # whether each rank's light phase settled (`runner.settle`; extended alike where it had not)
        "light_settled": [bool(light and light.settling and light.settling.settled) for light in lights],
        # the script's own plain windows inside each rank's light phase: the same steps, the same process
        "same_process": [
            _inside(records[r].get("light") or {}, out / "windows" / f"rank{r}.json") for r in (0, 1)
        ],
        "traced_step_us": [r["traced_median_us"] for r in records],
        **analysis_findings(doc),
        "destroy_warnings": done.stderr.count(DESTROY_WARNING) + done.stdout.count(DESTROY_WARNING),
        "stdout_tail": done.stdout[-2500:],
    }


def _inside(light: dict[str, Any], windows_file: Path) -> dict[str, Any] | None:
    """The plain windows a rank timed inside its light phase: their steps, seconds and step time."""
    from every_loop import _inside as inside

    return inside(light, windows_file)


def too_short(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """A script that ends before the traced phase, under torchrun: what gpudoctor says, and its exit."""
    out = tmp / "short"
    done = torchrun([*GPUDOCTOR_RUN, "--out", str(out), str(TRAIN)], {**env, "STEPS": SHORT_STEPS})
    return {
        "returncode": done.returncode,
        "analysis": (out / "analysis.json").is_file(),
        "stdout_tail": done.stdout[-2000:],
        "stderr_tail": done.stderr[-2000:],
    }


def analysis_findings(doc: dict[str, Any]) -> dict[str, Any]:
    """From a combined analysis document (gpudoctor.ranks/1): the findings about the ranks together,
    each rank's, and the collectives matched across the ranks."""
    across = [
        {
            "id": f["id"],
            "title": f["title"],
            "est_saving_pct": f["est_saving_pct"],
            "evidence": f["evidence"],
            "values": f.get("values", {}),
        }
        for f in doc["across"]["findings"]
    ]
    return {
        "bound": doc["across"].get("bound"),
        "across": across,
        "ranks": [_rank_result(r) for r in doc["ranks"]],
        "collectives": _collectives(doc),
    }


def reanalyze(results: Path, fixtures_dir: Path) -> dict[str, Any]:
    """The findings of a recorded run derived again, on the CPU, from its rank traces and records
    (`--fixtures` of that run) by this tree's analysis; its measured figures (plain steps, the light
    phases, the benchmark's bandwidth) stay as they were measured."""
    from gpudoctor.doctor import diagnose_ranks

    result = json.loads(results.read_text())
    for name, run in result["runs"].items():
        folder = fixtures_dir / name
        if folder.is_dir():
            run.update(analysis_findings(diagnose_ranks(folder, all_reports=True).analysis_document() or {}))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    result["reanalyzed"] = {"commit": commit.stdout.strip(), "from": fixtures_dir.name}
    result["checks"] = checks(result, result["runs"])
    return result


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
    """Each run's rank directories (record, rank info, trace) and combined analysis, for the CPU tests."""
    for name, run in runs.items():
        if name not in FIXTURE_CASES:
            continue
        folder = dest / name
        for r in (0, 1):
            src, dst = Path(run["dir"]) / f"rank-{r}", folder / f"rank-{r}"
            dst.mkdir(parents=True, exist_ok=True)
            for f in ("record.json", "rank.json", "trace.json.gz"):
                if (src / f).is_file():
                    shutil.copy(src / f, dst / f)
        shutil.copy(Path(run["dir"]) / "analysis.json", folder / "analysis.json")
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
            "STEPS": "24",
            "WARMUP_S": "0.2",
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
    p.add_argument("--straggle-ms", type=float, default=15.0)
    p.add_argument(
        "--fixtures", type=Path, default=None, help="copy the rank directories here (for the CPU tests)"
    )
    p.add_argument("--scenarios", default="nccl,plain,ddp,straggler,uneven,fsdp,ddp_bucket100,short")
    p.add_argument(
        "--pin",
        action="store_true",
        help="every rank of every run, plain and gpudoctor's, on its share of its GPU's NUMA-local cores",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="rounds of the plain cases (the first before gpudoctor's)"
    )
    p.add_argument(
        "--reanalyze",
        type=Path,
        default=None,
        help="a results JSON: its runs' findings derived again from --fixtures (on the CPU), written to --out",
    )
    args = p.parse_args()
    if args.reanalyze is not None:
        if args.fixtures is None:
            raise SystemExit("multi_gpu: --reanalyze needs --fixtures (the run's recorded rank directories)")
        done = reanalyze(args.reanalyze, args.fixtures)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / args.reanalyze.name).write_text(json.dumps(done, indent=1) + "\n")
        print(json.dumps(done["checks"], indent=1))
        return 0
    global FAILURE_LOGS
    FAILURE_LOGS = args.out / "failures"
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    if not args.cpu and (not cuda or torch.cuda.device_count() < 2):
        raise SystemExit("multi_gpu: needs 2 GPUs (or --cpu for the CPU path)")
    env = run_env(args.cpu) | ({"PIN_CORES": "1"} if args.pin else {})
    if args.cpu:  # a few dozen steps: the light phase by its step count alone
        GPUDOCTOR_RUN.extend(["--light-seconds", "0", "--warmup-seconds", "0"])
    sizes = [1 << p for p in range(20, 31)] if cuda else [1 << p for p in range(20, 24)]
    wanted = set(args.scenarios.split(","))
    result: dict[str, Any] = {
        "schema": "gpudoctor.bench.multi_gpu/2",
        "environment": environment(cuda),
        "pinned": args.pin,
        "cpu_path": args.cpu,
        "straggle_ms": args.straggle_ms,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    runs: dict[str, dict[str, Any]] = {}

    def save() -> None:  # after every case: a failure later loses nothing measured
        result["runs"] = {k: {kk: vv for kk, vv in v.items() if kk != "dir"} for k, v in runs.items()}
        result["checks"] = checks(result, runs)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "multi_gpu.json").write_text(json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "nccl" in wanted:
            result["allreduce_bench"] = nccl_bench(tmp, env, sizes)
            save()
        rounds: list[dict[str, Any]] = result.setdefault("plain_rounds", [])

        def plain_round() -> None:
            done: dict[str, Any] = {}
            rounds.append(done)
            for name, extra in PLAIN_CASES.items():
                try:
                    done[name] = plain(name, tmp, env, case_env(extra, args.straggle_ms))
                except SystemExit as err:  # one case failing keeps the others
                    result.setdefault("failed", {})[f"plain_{name}_{len(rounds)}"] = str(err)[-4000:]
                    continue
                print(f"plain {name} (round {len(rounds)}): {done[name]['mean_us'] / 1e3:.2f} ms", flush=True)
                result["plain"] = plain_summary(rounds)
                save()

        if "plain" in wanted:
            plain_round()
        for name, extra in GPUDOCTOR_CASES.items():
            if name in wanted:
                try:
                    runs[name] = under_gpudoctor(name, tmp, env, case_env(extra, args.straggle_ms))
                except SystemExit as err:  # one case failing keeps the others
                    result.setdefault("failed", {})[name] = str(err)[-4000:]
                    continue
                print(
                    f"{name}: {runs[name]['seconds']:.0f} s, across ranks: {[f['id'] for f in runs[name]['across']]}",
                    flush=True,
                )
                save()
        for _ in range(args.rounds - 1 if "plain" in wanted else 0):  # after gpudoctor's: drift shows
            plain_round()
        if "short" in wanted:
            result["short"] = too_short(tmp, env)
        save()
        if args.fixtures is not None:
            fixtures(args.fixtures, runs)
    print(json.dumps(result["checks"], indent=1))
    return 0


def settled_mean_us(times_us: list[float]) -> float:
    """The mean step of `times_us` without the head gpudoctor's light phase would leave out as still
    settling (`runner.settle`): the plain figure that is like for like with the light phase's mean."""
    from gpudoctor.runner.settle import settle

    kept, _ = settle(times_us)
    return statistics.fmean(kept) if kept else statistics.fmean(times_us)


def plain_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each plain case over its rounds: the median of the rounds' mean and median steps, and how far
    its rounds are apart (max over min, minus one: the A/A spread of plain runs)."""
    out: dict[str, Any] = {}
    for name in PLAIN_CASES:
        rows = [r[name] for r in rounds if name in r]
        if not rows:
            continue
        means = [r["mean_us"] for r in rows]
        settled = [r["settled_mean_us"] for r in rows if "settled_mean_us" in r]
        out[name] = {
            "mean_us": statistics.median(means),
            **({"settled_mean_us": statistics.median(settled)} if len(settled) == len(rows) else {}),
            "median_us": statistics.median(r["median_us"] for r in rows),
            "rounds_mean_us": means,
            "spread": max(means) / min(means) - 1,
        }
    return out


FIXED = {"straggler": "balanced", "uneven": "even"}  # each planted case's fix: the same work, balanced


def _saving(plains: dict[str, Any], case: str, key: str = "mean_us") -> float | None:
    """The measured share of the `case` step that goes with its fix (plain, the same call)."""
    fixed = FIXED[case]
    if case not in plains or fixed not in plains:
        return None
    return 100 * (plains[case][key] - plains[fixed][key]) / plains[case][key]


def checks(result: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plains = result.get("plain", {})
    out["plain_aa_spread"] = {k: v["spread"] for k, v in plains.items() if len(v["rounds_mean_us"]) > 1}
    truth_case = {"ddp": "balanced", "straggler": "straggler", "uneven": "uneven", "fsdp": "fsdp"}
    for name, run in runs.items():
        out[f"{name}_aligned"] = run["alignment"]["aligned"]
        out[f"{name}_destroy_warnings"] = run["destroy_warnings"]
        if not (all(run["light_step_us"]) and all(run.get("light_mean_us") or [None])):
            continue
        # what gpudoctor reports as the unprofiled step (the light phase's median), and its mean
        median, mean = max(run["light_step_us"]), max(run["light_mean_us"])
        same = [w for w in run.get("same_process") or [] if w and w.get("steps")]
        if same:  # the acceptance figure: the same steps timed plainly in the same processes
            plain_same = max(w["step_us"] for w in same)
            out[f"{name}_unprofiled_vs_same_process"] = {
                "plain_windows_us": plain_same,
                "windows": [w["windows"] for w in same],
                "gpudoctor_mean_us": mean,
                "ratio": mean / plain_same,
            }
        ref = plains.get(truth_case.get(name, ""))
        if ref is not None:  # other processes: the machine's drift between them in it
            out[f"{name}_unprofiled_vs_plain"] = {
                "light_settled": all(run["light_settled"]) if run.get("light_settled") else None,
                "plain_median_us": ref["median_us"],
                "gpudoctor_median_us": median,
                "ratio": median / ref["median_us"],
                "plain_mean_us": ref["mean_us"],
                "gpudoctor_mean_us": mean,
                "mean_ratio": mean / ref["mean_us"],
            }
            if "settled_mean_us" in ref:  # like for like: both without their unsettled head
                out[f"{name}_unprofiled_vs_plain"]["settled_mean_ratio"] = mean / ref["settled_mean_us"]
    for name, rule in (("straggler", "straggler"), ("uneven", "load_imbalance")):
        if name not in runs:
            continue
        across = runs[name]["across"]
        found = next((f for f in across if f["id"] == rule), None)
        measured = _saving(plains, name)
        out[f"{name}_first"] = across[0]["id"] if across else None
        out[f"{name}_title"] = across[0]["title"] if across else None
        out[f"{name}_predicted_vs_measured"] = {
            "predicted_pct": found["est_saving_pct"] if found else None,
            "measured_pct": measured,
            "measured_median_pct": _saving(plains, name, "median_us"),
            "ratio": found["est_saving_pct"] / measured if found and measured else None,
        }
    if "ddp" in runs:
        out["balanced_quiet"] = [f["id"] for f in runs["ddp"]["across"]]
    for name in ("ddp", "ddp_bucket100"):
        if "allreduce_bench" in result and name in runs and runs[name]["collectives"]:
            out[f"{name}_bandwidth_vs_bench"] = [
                {
                    "bytes": c["bytes"],
                    "calls": c["calls"],
                    "gpudoctor_busbw": c["busbw"],
                    "bench_busbw": (ref := bench_busbw(result["allreduce_bench"], c["bytes"])),
                    "ratio": c["busbw"] / ref,
                }
                for c in sorted(runs[name]["collectives"], key=lambda c: -c["bytes"])
            ]
    for name, case in (("ddp", "balanced"), ("fsdp", "fsdp")):
        if name in runs and case in plains and "none" in plains:
            truth = plains[case]["mean_us"] - plains["none"]["mean_us"]
            out[f"{name}_exposed_vs_truth"] = {
                "no_communication_us": plains["none"]["mean_us"],
                "measured_cost_us": truth,
                "findings": [r["findings"] for r in runs[name]["ranks"]],
                "exposed_comm_us": [r["exposed_comm_us"] for r in runs[name]["ranks"]],
            }
    if "fsdp" in runs:
        out["fsdp_exposed_by_collective_us"] = [r["exposed_by_collective_us"] for r in runs["fsdp"]["ranks"]]
        if "fsdp" in plains and "fsdp_keep" in plains:
            out["fsdp_reshard_cost_us"] = plains["fsdp"]["mean_us"] - plains["fsdp_keep"]["mean_us"]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
