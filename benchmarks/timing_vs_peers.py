"""gpudoctor's timing core against its peers, on one GPU, in one run:

1. agreement with Nsight Compute: gpudoctor's device time against ncu's `gpu__time_duration.sum` for the
   same kernels — hot (ncu --cache-control none) and cold (--cache-control all), clocks left alone;
2. repeatability: five repeats of a 4096³ bf16 matmul and a 2×256 MB add, gpudoctor against triton's
   do_bench / do_bench_cudagraph, torch.utils.benchmark, CUDA events around one call, sync + perf_counter;
3. verdicts: 20 trials of two identical functions ("same") and 20 of a real 3% improvement ("faster");
4. the device's measured ceilings.

    python benchmarks/timing_vs_peers.py --out DIR   (writes DIR/timing_vs_peers.json, prints a table)

Internally `--ncu-child` is the process that ncu profiles."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpudoctor.timing import Verdict, bench, compare, measured_ceilings

NCU_CALLS = 20  # launches of each op that ncu profiles
NCU_GRAPH_CALLS = 100  # launches of each op captured into one graph for ncu --graph-profiling graph
NCU_GRAPH_REPLAYS = 5
REPEATS = 5
TRIALS = 20
QUIET: dict[str, Any] = {"ceilings": False, "host_latency": False}  # default options otherwise


OP_NAMES = ("mm_bf16_4096", "add_2x256MB", "sum_256MB", "add_2x4MB", "add_2x4KB", "fill_1elem")


def make_ops() -> dict[str, tuple[Callable[[], Any], int]]:
    """name -> (fn, bytes it moves); inputs random, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    a, b = randn(4096, 4096, dtype=torch.bfloat16), randn(4096, 4096, dtype=torch.bfloat16)
    big_x, big_y = randn(64 << 20), randn(64 << 20)  # 256 MB each
    mid_x, mid_y = randn(1 << 20), randn(1 << 20)  # 4 MB each: L2-resident when hot
    tiny_x, tiny_y = randn(1024), randn(1024)  # 4 KB
    one = torch.empty(1, device="cuda")
    return {
        "mm_bf16_4096": (lambda: torch.mm(a, b), 3 * 4096 * 4096 * 2),
        "add_2x256MB": (lambda: torch.add(big_x, big_y), 3 * (256 << 20)),
        "sum_256MB": (lambda: big_x.sum(), 256 << 20),
        "add_2x4MB": (lambda: torch.add(mid_x, mid_y), 3 * (4 << 20)),
        "add_2x4KB": (lambda: torch.add(tiny_x, tiny_y), 3 * 4096),
        "fill_1elem": (lambda: one.fill_(1.0), 4),  # a near-empty kernel: calibrates ncu's own floor
    }


# ---------------------------------------------------------------- ncu
def ncu_child(graph: bool = False) -> None:
    """Run under ncu: each op NCU_CALLS times, the groups separated by a spin_kernel marker. With `graph`,
    each op is instead captured NCU_GRAPH_CALLS times into one CUDA graph, replayed NCU_GRAPH_REPLAYS
    times: ncu --graph-profiling graph then times the graph's back-to-back launches as one workload."""
    ops = make_ops()
    graphs = {name: capture_graph(fn, NCU_GRAPH_CALLS) for name, (fn, _) in ops.items()} if graph else {}
    for fn, _ in ops.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, (fn, _) in ops.items():
        torch.cuda._sleep(1000)  # "spin_kernel": marks where the next op's launches begin
        for _ in range(NCU_GRAPH_REPLAYS if graph else NCU_CALLS):
            graphs[name].replay() if graph else fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def capture_graph(fn: Callable[[], Any], calls: int) -> Any:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def run_ncu(cache_control: str, out_dir: Path, graph: bool = False) -> dict[str, Any]:
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"error": "ncu not on PATH"}
    cmd = [ncu, "--metrics", "gpu__time_duration.sum", "--clock-control", "none", "--cache-control", cache_control,
           "--profile-from-start", "off", "--csv"]  # fmt: skip
    if graph:
        cmd += ["--graph-profiling", "graph"]
    cmd += [sys.executable, __file__, "--ncu-child"] + (["--graph"] if graph else [])
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    parsed = parse_ncu_csv(proc.stdout, NCU_GRAPH_CALLS if graph else 1)
    if parsed is None:
        return {"error": f"no CSV from ncu (rc {proc.returncode}): {proc.stderr[-500:]}"}
    parsed["seconds"] = time.time() - t0
    return parsed


def parse_ncu_csv(text: str, launches: int = 1) -> dict[str, Any] | None:
    """Per op (in launch order, split at the spin_kernel markers): the median over calls of the summed
    gpu__time_duration of one call's kernels, in µs. A result that times a graph of `launches` calls of
    the op counts as one call and is divided by `launches`."""
    rows = list(csv.reader(io.StringIO(text)))
    header = next((r for r in rows if r and r[0] == "ID"), None)
    if header is None:
        return None
    col = {name: i for i, name in enumerate(header)}
    kernels = []
    for r in rows:
        if len(r) != len(header) or r[0] == "ID" or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit, value = r[col["Metric Unit"]], float(r[col["Metric Value"]].replace(",", ""))
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                 "second": 1e6, "s": 1e6}[unit]  # fmt: skip
        kernels.append(
            (
                r[col["Kernel Name"]],
                value * scale / (1 if "spin_kernel" in r[col["Kernel Name"]] else launches),
            )
        )
    groups: list[list[tuple[str, float]]] = []
    for name, us in kernels:
        if "spin_kernel" in name:
            groups.append([])
        elif groups:
            groups[-1].append((name, us))
    result: dict[str, Any] = {}
    for op, group in zip(make_op_names(), groups, strict=False):
        per_call = len(group) / (NCU_CALLS if launches == 1 else NCU_GRAPH_REPLAYS)
        k = max(1, round(per_call))
        call_times = [sum(us for _, us in group[i : i + k]) for i in range(0, len(group) - k + 1, k)]
        result[op] = {"kernels_per_call": per_call, "median_us": statistics.median(call_times),
                      "kernels": sorted({n[:80] for n, _ in group}), "durations_us": [us for _, us in group]}  # fmt: skip
    return result


def make_op_names() -> list[str]:
    return list(OP_NAMES)


# ---------------------------------------------------------------- peers
def events_one_call(fn: Callable[[], Any], reps: int = 100) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def sync_perf_counter(fn: Callable[[], Any], reps: int = 100) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def peers() -> dict[str, Callable[[Callable[[], Any]], float]]:
    out: dict[str, Callable[[Callable[[], Any]], float]] = {}
    try:
        import triton.testing as tt

        out["triton_do_bench"] = lambda fn: tt.do_bench(fn, return_mode="median") * 1e3
        out["triton_do_bench_cudagraph"] = lambda fn: tt.do_bench_cudagraph(fn, return_mode="median") * 1e3
    except Exception as err:  # triton missing or too old
        print(f"triton peers unavailable: {err}")
    import torch.utils.benchmark as tub

    out["torch_utils_benchmark"] = lambda fn: (
        tub.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2).median * 1e6
    )
    out["events_one_call"] = events_one_call
    out["sync_perf_counter"] = sync_perf_counter
    return out


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


# ---------------------------------------------------------------- sections
def section_agreement(ops: dict, out_dir: Path, results: dict) -> None:
    ours: dict[str, Any] = {}
    for name, (fn, nbytes) in ops.items():
        hot = bench(fn, label=name, nbytes=nbytes, ceilings=False, kernel_time=True)
        sustained = bench(fn, label=name, nbytes=nbytes, ceilings=False, cooldown=0.0, host_latency=False)
        cold = bench(fn, label=name, nbytes=nbytes, mode="cold", ceilings=False)
        ours[name] = {"hot": summary(hot), "sustained": summary(sustained), "cold": summary(cold)}
    results["agreement"] = {"gpudoctor": ours}
    dump(results, out_dir)
    for key, cache_control, graph in (
        ("none", "none", False),
        ("all", "all", False),
        ("graph", "none", True),
    ):
        results["agreement"][f"ncu_{key}"] = run_ncu(cache_control, out_dir, graph=graph)
        dump(results, out_dir)
    table = {}
    # ncu_none/all: each launch alone (ncu's own ~1.3 µs floor included); ncu_graph: a graph of
    # NCU_GRAPH_CALLS back-to-back launches timed as one, per launch — what gpudoctor's device time is
    for name in ops:
        row = {}
        for label, mode, key, cc in (("device vs ncu graph", "hot", "median_us", "graph"),
                                     ("device vs ncu kernel", "hot", "median_us", "none"),
                                     ("CUPTI vs ncu kernel", "hot", "kernel_us", "none"),
                                     ("sustained vs ncu graph", "sustained", "median_us", "graph"),
                                     ("cold vs ncu kernel cold", "cold", "median_us", "all")):  # fmt: skip
            ncu = results["agreement"][f"ncu_{cc}"].get(name)
            g = ours[name][mode].get(key)
            if isinstance(ncu, dict) and g:
                row[label] = {"gpudoctor_us": g, "ncu_us": ncu["median_us"], "diff": g / ncu["median_us"] - 1}
        table[name] = row
    results["agreement"]["table"] = table


def summary(m: Any) -> dict[str, Any]:
    s = m.stats
    return {
        "median_us": s.median, "rel_ci": s.rel_ci, "rel_iqr": s.rel_iqr, "n": s.n, "calls": m.calls_per_sample,
        "method": m.method, "host_latency_us": m.host_stats.median if m.host_stats else None,
        "throttled": m.throttled_count, "reasons": list(m.clocks.reasons_seen),
        "sm_mhz": sorted({x for x in m.sample_sm_mhz if x}), "warmup_samples": m.warmup.samples,
        "warmup_steady": m.warmup.steady, "stop": m.stop_reason, "elapsed_s": m.elapsed_s,
        "bandwidth": m.bandwidth, "notes": list(m.notes), "warnings": list(m.warnings),
        "kernel_us": m.kernel_stats.median if m.kernel_stats else None,
        "kernels_per_call": m.kernels.kernels_per_call if m.kernels else None,
    }  # fmt: skip


def samples_of(m: Any) -> dict[str, Any]:
    return {"samples_us": list(m.samples_us), "sm_mhz": list(m.sample_sm_mhz), "throttled": list(m.throttled),
            "max_sm_mhz": m.clocks.max_sm_mhz, "warmup": m.warmup.samples}  # fmt: skip


def section_repeats(ops: dict, out_dir: Path, results: dict) -> None:
    kept: dict[str, list[Any]] = {}

    def ours(key: str, **options: Any) -> Callable[[Callable[[], Any]], float]:
        def timer(fn: Callable[[], Any]) -> float:
            m = bench(fn, ceilings=False, **options)
            kept.setdefault(key, []).append(m)
            return m.median_us

        return timer

    methods = {
        "gpudoctor": ours("default"),
        "gpudoctor_sustained": ours("sustained", cooldown=0.0),
        **peers(),
    }
    out: dict[str, Any] = {}
    for name in ("mm_bf16_4096", "add_2x256MB", "add_2x4KB"):
        fn, _ = ops[name]
        out[name] = {}
        kept.clear()
        for method, timer in methods.items():
            try:
                values = [timer(fn) for _ in range(REPEATS)]
                out[name][method] = {"values_us": values, "median_us": statistics.median(values),
                                     "spread": spread(values)}  # fmt: skip
            except Exception as err:
                out[name][method] = {"error": f"{type(err).__name__}: {err}"}
        out[name]["gpudoctor_runs"] = {k: [summary(m) for m in ms] for k, ms in kept.items()}
        if name == "mm_bf16_4096":
            out[name]["gpudoctor_samples"] = {k: samples_of(ms[0]) for k, ms in kept.items()}
        results["repeats"] = out
        dump(results, out_dir)


def section_verdicts(out_dir: Path, results: dict) -> None:
    n = 64 << 20
    g = torch.Generator(device="cuda").manual_seed(1)
    x, y = torch.randn(n, device="cuda", generator=g), torch.randn(n, device="cuda", generator=g)
    k = int(n * 0.97)
    xs, ys = x[:k], y[:k]

    def f1() -> Any:
        return torch.add(x, y)

    def f2() -> Any:
        return torch.add(x, y)

    def f3() -> Any:
        return torch.add(xs, ys)

    # the true ratio of the 3% case, from two long measurements
    long_a = bench(f1, min_time_s=2.0, max_noise=0.0005, ceilings=False)
    long_b = bench(f3, min_time_s=2.0, max_noise=0.0005, ceilings=False)
    out: dict[str, Any] = {"true_ratio_3pct": long_b.median_us / long_a.median_us, "same": [], "faster": []}
    for _ in range(TRIALS):
        a, b = bench(f1, label="f1", **QUIET), bench(f2, label="f2", **QUIET)
        c = compare(a, b)
        out["same"].append({"verdict": c.verdict.value, "ratio": c.ratio, "ci": [c.ci_low, c.ci_high]})
    for _ in range(TRIALS):
        a, b = bench(f1, label="f1", **QUIET), bench(f3, label="f3", **QUIET)
        c = compare(a, b)
        out["faster"].append({"verdict": c.verdict.value, "ratio": c.ratio, "ci": [c.ci_low, c.ci_high]})
    out["same_count"] = sum(t["verdict"] == Verdict.SAME.value for t in out["same"])
    out["faster_count"] = sum(t["verdict"] == Verdict.FASTER.value for t in out["faster"])
    results["verdicts"] = out


def section_ceilings(out_dir: Path, results: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        os.environ["GPUDOCTOR_CACHE_DIR"] = d
        c = measured_ceilings("cuda", remeasure=True)
    results["ceilings"] = c.to_json()


def environment() -> dict[str, Any]:
    import gpudoctor

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "gpudoctor": gpudoctor.__version__}  # fmt: skip
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception:
        pass
    return env


def dump(results: dict, out_dir: Path) -> None:
    (out_dir / "timing_vs_peers.json").write_text(json.dumps(results, indent=1, default=str))


def print_table(results: dict) -> None:
    print(f"\n== {results['environment'].get('device')} · torch {results['environment'].get('torch')}")
    agree = results.get("agreement", {}).get("table", {})
    if agree:
        print("gpudoctor vs ncu gpu__time_duration: µs ours/ncu (diff); ncu graph = per launch of a graph of "
              f"{NCU_GRAPH_CALLS} back-to-back launches, ncu kernel = each launch alone (hot: --cache-control none)")  # fmt: skip
        for name, row in agree.items():
            cells = [
                f"{label} {v['gpudoctor_us']:.4g}/{v['ncu_us']:.4g} ({v['diff']:+.1%})"
                for label, v in row.items()
            ]
            print(f"  {name:13} " + " | ".join(cells))
    reps = results.get("repeats", {})
    if reps:
        print("five repeats: median µs (spread)")
        for name, by_method in reps.items():
            cells = [
                f"{m} {v['median_us']:.4g} ({v['spread']:.1%})" for m, v in by_method.items() if "spread" in v
            ]
            print(f"  {name:14} " + " | ".join(cells))
    v = results.get("verdicts")
    if v:
        print(f"verdicts: same {v['same_count']}/{TRIALS}, faster {v['faster_count']}/{TRIALS} "
              f"(true ratio {v['true_ratio_3pct']:.4f})")  # fmt: skip
    c = results.get("ceilings")
    if c:
        flops = ", ".join(f"{k} {x / 1e12:.0f}" for k, x in c["matmul_flops"].items())
        print(f"ceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s; matmul TFLOP/s {flops}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--ncu-child", action="store_true")
    parser.add_argument("--graph", action="store_true", help="with --ncu-child: replay graphs of the ops")
    parser.add_argument("--sections", default="agreement,repeats,verdicts,ceilings")
    args = parser.parse_args()
    if args.ncu_child:
        ncu_child(graph=args.graph)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"schema": "gpudoctor.bench.acceptance", "environment": environment()}
    ops = make_ops()
    sections = {
        "agreement": lambda: section_agreement(ops, args.out, results),
        "repeats": lambda: section_repeats(ops, args.out, results),
        "verdicts": lambda: section_verdicts(args.out, results),
        "ceilings": lambda: section_ceilings(args.out, results),
    }
    for name in args.sections.split(","):
        t0 = time.time()
        try:
            sections[name]()
        except Exception:
            results.setdefault("errors", {})[name] = traceback.format_exc()
            traceback.print_exc()
        results.setdefault("seconds", {})[name] = time.time() - t0
        print(f"[{name}: {time.time() - t0:.0f} s]", flush=True)
        dump(results, args.out)
    print_table(results)


if __name__ == "__main__":
    main()
