"""Does `gpudoctor run` take the profiler's distortion out?

A plain ResNet-50 bf16 training script, written as a user would, is run three ways, each in a fresh process:
  plain   no profiler and no gpudoctor; the script itself records a CUDA event after each optimizer step
  light   `gpudoctor run --light` (step times from CUDA events at the optimizer hook, NVML, memory)
  traced  `gpudoctor run` (light phase, then torch.profiler for --steps steps)
The truth: GPU busy time per step (union of the kernels, copies and memsets of the traced run's trace —
the profiler slows the host, not the kernels) over the plain run's median step time. Compared with
gpudoctor's reported busy % (observer.json: busy over the light phase's step time) and with the naive
trace reading (busy over the traced step time). Also: the light mode's overhead (light vs plain).

    PYTHONPATH=src python3 benchmarks/run_observer_effect.py --results benchmarks/results/run_observer_effect.json
    (--tiny: a small conv net on the CPU, to smoke-test the script itself)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TRAIN = """\
import argparse
import json

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--channels-last", action="store_true")
parser.add_argument("--tiny", action="store_true")
parser.add_argument("--time-to", default=None)  # the benchmark's plain run: CUDA-event step times
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
if args.tiny:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 1000),
    )
    size = 32
else:
    import torchvision

    model = torchvision.models.resnet50()
    size = 224
fmt = torch.channels_last if args.channels_last else torch.contiguous_format
model = model.to(device, memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(args.batch, 3, size, size, device=device).to(memory_format=fmt)
y = torch.randint(0, 1000, (args.batch,), device=device)
marks = []
for step in range(args.steps):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if args.time_to:
        if device == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append(event)
        else:
            import time
            marks.append(time.perf_counter())
if device == "cuda":
    torch.cuda.synchronize()
if args.time_to:
    if device == "cuda":
        times = [a.elapsed_time(b) * 1e3 for a, b in zip(marks, marks[1:])]
    else:
        times = [(b - a) * 1e6 for a, b in zip(marks, marks[1:])]
    with open(args.time_to, "w") as f:
        json.dump(times, f)
print("loss", float(loss))
"""

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def sh(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
    if proc.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - t0


def trace_busy_per_step(trace: Path) -> tuple[float, int]:
    """Union of GPU activity intervals over the trace, per ProfilerStep: computed from the raw JSON,
    independently of gpudoctor's loader."""
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    )
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    return busy / max(len(steps), 1), len(steps)


def _minus(a: float | None, b: float) -> float | None:
    return None if a is None else a - b


LIGHT_VARIANTS = {"nvml_100ms": [], "no_nvml": ["--no-nvml"], "nvml_500ms": ["--nvml-interval", "500"]}


def plain_median(
    work: Path, script: Path, extra: list[str], warmup: int, light_steps: int, name: str
) -> float:
    times_file = work / f"{name}.json"
    n = warmup + light_steps + 1
    sh(
        [sys.executable, str(script), "--steps", str(n), "--time-to", str(times_file), *extra],
        work / f"{name}.log",
    )
    return statistics.median(json.loads(times_file.read_text())[warmup - 1 :])


def one_layout(
    work: Path, script: Path, extra: list[str], warmup: int, light_steps: int, repeats: int
) -> dict[str, Any]:
    """Plain and light runs alternated `repeats` times (each light variant once per repeat), then one
    traced run; the truth uses the median over the plain runs."""
    tag = "channels_last" if "--channels-last" in extra else "contiguous"
    base = [
        sys.executable,
        "-m",
        "gpudoctor",
        "run",
        "--warmup",
        str(warmup),
        "--light-steps",
        str(light_steps),
    ]
    plains: list[float] = []
    lights: dict[str, list[float]] = {name: [] for name in LIGHT_VARIANTS}
    nvml_samples = 0
    for r in range(repeats):
        plains.append(plain_median(work, script, extra, warmup, light_steps, f"plain_{tag}_{r}"))
        for name, flags in LIGHT_VARIANTS.items():
            out = work / f"light_{tag}_{name}_{r}"
            sh([*base, "--light", *flags, "--out", str(out), str(script), *extra], work / f"{out.name}.log")
            record = json.loads((out / "record.json").read_text())
            lights[name].append(record["light_median_us"])
            nvml_samples = max(nvml_samples, len(record["nvml_samples"]))
    traced_dir = work / f"traced_{tag}"
    sh([*base, "--out", str(traced_dir), str(script), *extra], work / f"traced_{tag}.log")
    traced_record = json.loads((traced_dir / "record.json").read_text())
    observer = json.loads((traced_dir / "observer.json").read_text())
    busy, steps = trace_busy_per_step(traced_dir / "trace.json.gz")
    plain = statistics.median(plains)
    truth = 100 * busy / plain
    return {
        "layout": tag,
        "plain_median_us_runs": plains,
        "plain_median_us": plain,
        "light_median_us_runs": lights,
        "light_overhead_pct": {k: 100 * (statistics.median(v) / plain - 1) for k, v in lights.items()},
        "traced_run_light_median_us": traced_record["light_median_us"],
        "traced_median_us": traced_record["traced_median_us"],
        "profiler_overhead_pct_reported": 100 * (traced_record["profiler_overhead"] or 0.0),
        "profiler_overhead_pct_vs_plain": 100 * (traced_record["traced_median_us"] / plain - 1),
        "trace_steps": steps,
        "gpu_busy_us_per_step_raw_trace": busy,
        "gpu_busy_us_per_step_gpudoctor": observer["gpu_busy_us_per_step"],
        "busy_pct_truth": truth,
        "busy_pct_gpudoctor": observer["busy_pct_unprofiled"],
        "busy_pct_naive_trace": observer["busy_pct_traced"],
        "gpudoctor_error_points": _minus(observer["busy_pct_unprofiled"], truth),
        "naive_error_points": _minus(observer["busy_pct_traced"], truth),
        "nvml_samples_light_run": nvml_samples,
        "nvml_missing": traced_record["nvml_missing"],
        "environment": traced_record["environment"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/run_observer_effect.json"))
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--light-steps", type=int, default=40)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--layouts", default="contiguous,channels_last")
    parser.add_argument("--repeats", default="1,2", help="repeats per layout, comma-separated")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gpudoctor-observer-"))
    work.mkdir(parents=True, exist_ok=True)
    script = work / "train_resnet50.py"
    script.write_text(TRAIN)
    extra = ["--tiny", "--batch", "8"] if args.tiny else []
    rows = []
    repeats = [int(r) for r in args.repeats.split(",")]
    for i, layout in enumerate(args.layouts.split(",")):
        flags = [*extra, "--channels-last"] if layout == "channels_last" else extra
        row = one_layout(
            work, script, flags, args.warmup, args.light_steps, repeats[min(i, len(repeats) - 1)]
        )
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "environment"}, indent=1), flush=True)
    doc = {
        "benchmark": "run_observer_effect",
        "workload": "tiny conv net (smoke test)" if args.tiny else "ResNet-50, bf16 autocast, batch 64, SGD",
        "warmup": args.warmup,
        "light_steps": args.light_steps,
        "traced_steps": 5,
        "results": rows,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
