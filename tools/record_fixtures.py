"""Record Kineto trace fixtures of the built-in workloads, with their unprofiled step times.

Each fixture: build the workload, warm it up, time unprofiled steps (CUDA events on a GPU, perf_counter on
the CPU), then profile wait=1, warmup=2, active=N steps with `prof.step()` after each (so `ProfilerStep#N`
annotations exist), export the Chrome trace and gzip it to `<fixture>.json.gz`. `manifest.json` in the out
dir records, per fixture, how it was made and on what. Run from the repo root:

    PYTHONPATH=src python tools/record_fixtures.py [--cpu] [--only NAME,...] [--copy-to DIR]
    PYTHONPATH=src python tools/record_fixtures.py --bench-trace      # benchmarks/data/resnet50_10steps
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "traces"
BENCH_OUT = REPO / "benchmarks" / "data"
MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
# Files over this are split into parts when copied out: the GPU machine returns files of 16 MiB at most.
COPY_PART_BYTES = 15 * 1024 * 1024

try:
    from gpudoctor import workloads
    from gpudoctor.runner import profile as capture
    from gpudoctor.runner.profile import StepTraceOptions
    from gpudoctor.timing.api import driver_version
    from gpudoctor.util.units import fmt_bytes, fmt_us
except ImportError:  # run without PYTHONPATH=src
    sys.path.insert(0, str(REPO / "src"))
    from gpudoctor import workloads
    from gpudoctor.runner import profile as capture
    from gpudoctor.runner.profile import StepTraceOptions
    from gpudoctor.timing.api import driver_version
    from gpudoctor.util.units import fmt_bytes, fmt_us


@dataclass(frozen=True)
class FixtureSpec:
    """One trace to record: which workload, how many active steps, which profiler options, where."""

    fixture: str
    workload: str
    active_steps: int
    with_stack: bool
    profile_memory: bool
    record_shapes: bool
    out_dir: Path
    with_flops: bool = False

    @property
    def path(self) -> Path:
        return self.out_dir / f"{self.fixture}.json.gz"

    def options(self) -> dict[str, bool]:
        return {
            "with_stack": self.with_stack,
            "profile_memory": self.profile_memory,
            "record_shapes": self.record_shapes,
            "with_flops": self.with_flops,
        }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=None, help=f"output dir (default {DEFAULT_OUT.relative_to(REPO)})"
    )
    p.add_argument("--only", default="", help="comma-separated workload or fixture names")
    p.add_argument("--active-steps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="record on the CPU even if a GPU is present")
    p.add_argument("--scale", choices=("auto", "small", "full"), default="auto", help="auto: small on CPU")
    p.add_argument("--with-stack", action="store_true")
    p.add_argument("--profile-memory", action="store_true")
    p.add_argument("--record-shapes", action="store_true")
    p.add_argument("--bench-trace", action="store_true", help="only conv_bf16_train, 10 steps, all options")
    p.add_argument("--warmup-steps", type=int, default=5, help="unprofiled steps before timing")
    p.add_argument("--timing-steps", type=int, default=20, help="unprofiled steps timed (median reported)")
    p.add_argument("--copy-to", type=Path, default=None, help="also copy the traces and manifest here")
    args = p.parse_args(argv)
    if args.active_steps < 1 or args.timing_steps < 1 or args.warmup_steps < 0:
        p.error("--active-steps and --timing-steps must be >= 1, --warmup-steps >= 0")
    return args


def build_plan(args: argparse.Namespace) -> list[FixtureSpec]:
    """The fixtures to record: every workload (plus a stack+memory sync fixture), or the benchmark trace."""
    if args.bench_trace:
        out = args.out or BENCH_OUT
        return [FixtureSpec("resnet50_10steps", "conv_bf16_train", 10, True, True, True, out)]
    out = args.out or DEFAULT_OUT
    flags = (args.with_stack, args.profile_memory, args.record_shapes)
    plan = [FixtureSpec(name, name, args.active_steps, *flags, out) for name in workloads.names()]
    plan.append(
        FixtureSpec(
            "sync_every_step_stack", "sync_every_step", args.active_steps, True, True, args.record_shapes, out
        )
    )
    # shapes and Kineto's FLOP counts, for the roofline: only when asked for by name (--only)
    shapes = FixtureSpec(
        "transformer_shapes", "transformer_train", args.active_steps, False, False, True, out, True
    )
    if args.only:
        plan.append(shapes)
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        known = {s.workload for s in plan} | {s.fixture for s in plan}
        if unknown := wanted - known:
            raise SystemExit(f"record_fixtures: unknown name(s) {sorted(unknown)}; known: {sorted(known)}")
        plan = [s for s in plan if s.workload in wanted or s.fixture in wanted]
    return plan


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: workloads.Step, device: torch.device, n: int) -> tuple[list[float], str]:
    """`n` unprofiled step times in µs, each step bracketed on its own, and how they were taken."""
    samples: list[float] = []
    if device.type == "cuda":
        for _ in range(n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step.run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        return samples, "cuda_events"
    for _ in range(n):
        t0 = time.perf_counter()
        step.run()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples, "perf_counter"


def profile_steps(step: workloads.Step, device: torch.device, spec: FixtureSpec) -> int:
    """Profile wait=1, warmup=2, active=N steps into `spec.path` (gzipped); returns the file's size."""
    options = StepTraceOptions(
        active=spec.active_steps,
        cuda=device.type == "cuda",
        with_stack=spec.with_stack,
        profile_memory=spec.profile_memory,
        record_shapes=spec.record_shapes,
        with_flops=spec.with_flops,
    )
    return capture.profile_steps(step.run, spec.path, options).stat().st_size


def _driver_version() -> str | None:
    version = driver_version()  # through NVML
    if version is not None:
        return version
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What the fixture was recorded on; a value that cannot be read is None."""
    env: dict[str, Any] = {
        "device_type": device.type,
        "device_name": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": None,
        "cuda_driver_api": None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        env["torchvision"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device_name"] = props.name
        env["sm_count"] = props.multi_processor_count
        env["device_memory_bytes"] = props.total_memory
        env["capability"] = f"{props.major}.{props.minor}"
        env["driver"] = _driver_version()
        get_api = getattr(torch._C, "_cuda_getDriverVersion", None)
        env["cuda_driver_api"] = get_api() if get_api else None
    return env


def record(spec: FixtureSpec, device: torch.device, small: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Build, warm up, time and profile one fixture; returns its manifest entry. Frees the workload after."""
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    step = workloads.get(spec.workload).build(device, small=small)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for _ in range(args.warmup_steps):
            step.run()
        _sync(device)
        samples, method = time_steps(step, device, args.timing_steps)
        _sync(device)
        size = profile_steps(step, device, spec)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        info = dict(step.info)
    finally:
        step.close()
        del step
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
    return {
        "workload": spec.workload,
        "file": spec.path.name,
        "file_bytes": size,
        "active_steps": spec.active_steps,
        "profiler_schedule": {"wait": 1, "warmup": 2, "active": spec.active_steps, "repeat": 1},
        "options": spec.options(),
        "scale": "small" if small else "full",
        "workload_info": info,
        "warmup_steps": args.warmup_steps,
        "unprofiled_step_us": {
            "median": statistics.median(samples),
            "samples": samples,
            "method": method,
        },
        "peak_memory_allocated_bytes": peak,
        "environment": environment(device),
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_manifest(out_dir: Path, entries: dict[str, dict[str, Any]]) -> Path:
    """Merge `entries` into `out_dir/manifest.json` by fixture name (re-recording one keeps the others)."""
    path = out_dir / MANIFEST
    fixtures: dict[str, Any] = {}
    if path.exists():
        try:
            fixtures = json.loads(path.read_text()).get("fixtures", {})
        except (json.JSONDecodeError, AttributeError):
            fixtures = {}
    fixtures.update(entries)
    doc = {"schema_version": MANIFEST_SCHEMA, "fixtures": dict(sorted(fixtures.items()))}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return path


def copy_out(files: Sequence[Path], dest: Path) -> None:
    """Copy `files` to `dest`; a file over COPY_PART_BYTES goes as `NAME.partNN` pieces to `cat` together."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        if f.stat().st_size <= COPY_PART_BYTES:
            shutil.copy2(f, dest / f.name)
            continue
        with f.open("rb") as src:
            part = 0
            while chunk := src.read(COPY_PART_BYTES):
                (dest / f"{f.name}.part{part:02d}").write_bytes(chunk)
                part += 1
        print(f"split {f.name} into {part} parts: cat {f.name}.part* > {f.name}")


def print_table(entries: dict[str, dict[str, Any]]) -> None:
    rows = [("fixture", "steps", "size", "unprofiled step")]
    for name, e in entries.items():
        rows.append(
            (
                name,
                str(e["active_steps"]),
                fmt_bytes(e["file_bytes"]),
                fmt_us(e["unprofiled_step_us"]["median"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = build_plan(args)
    use_cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    small = args.scale == "small" or (args.scale == "auto" and device.type == "cpu")
    print(f"recording {len(plan)} fixture(s) on {device} ({'small' if small else 'full'} scale)", flush=True)
    entries: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for spec in plan:
        t0 = time.perf_counter()
        entries[spec.fixture] = record(spec, device, small, args)
        print(f"  {spec.fixture}: {time.perf_counter() - t0:.1f} s -> {spec.path}", flush=True)
    manifest = write_manifest(plan[0].out_dir, entries)  # every fixture of a plan shares one out dir
    if args.copy_to:
        copy_out([spec.path for spec in plan] + [manifest], args.copy_to)
    print_table(entries)
    print(f"total {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
