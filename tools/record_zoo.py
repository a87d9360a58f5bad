"""Record the zoo of planted bottlenecks: traces of every case's slow and fixed variant and of every control,
with their unprofiled step times and the measured slow -> fixed saving.

Each workload: build, warm up, time unprofiled steps back to back (one CUDA event between consecutive steps
and no sync in between, so the host runs ahead as in a real loop), then profile wait=1, warmup=2, active=3
steps (fixed variants: active=2) with the case's profiler options into `<out>/<case>__slow.json.gz`,
`<case>__fixed.json.gz` or `<control>.json.gz`, and merge what was measured into `<out>/manifest.json`.
The GPU is freed between workloads. With --no-step-markers, the profiler records a window of
`--iterations` steps without `prof.step()` (no ProfilerStep#N annotation, no schedule: the first step
pays the profiler's start, as in a script that wraps its loop in `with profile():`), into
tests/fixtures/zoo_unmarked by default: the traces `gpudoctor analyze` must find iterations in. Run from
the repo root:

    PYTHONPATH=src python tools/record_zoo.py [--only RULE,CONTROL,...] [--out DIR] [--cpu]
                                              [--copy-to DIR] [--tar FILE]
                                              [--no-step-markers [--iterations N]]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import gzip
import itertools
import json
import shutil
import statistics
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "zoo"
DEFAULT_OUT_UNMARKED = REPO / "tests" / "fixtures" / "zoo_unmarked"
MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1

try:
    from gpudoctor.runner import profile as capture
    from gpudoctor.util.units import fmt_bytes, fmt_us
    from gpudoctor.workloads import Step, Workload, zoo
except ImportError:  # run without PYTHONPATH=src
    sys.path.insert(0, str(REPO / "src"))
    from gpudoctor.runner import profile as capture
    from gpudoctor.util.units import fmt_bytes, fmt_us
    from gpudoctor.workloads import Step, Workload, zoo

# The fixture recorder next door owns the environment record and the split-for-transfer copy.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_fixtures import COPY_PART_BYTES, copy_out, environment  # noqa: E402


@dataclass(frozen=True)
class Recording:
    """One trace to record: a case variant ("slow"/"fixed") or a control ("control")."""

    owner: str  # the case's rule id or the control's name
    role: str
    workload: Workload
    profile: Mapping[str, bool]
    active_steps: int
    path: Path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=None, help="output dir (default tests/fixtures/zoo, or zoo_unmarked)"
    )
    p.add_argument("--only", default="", help="comma-separated case rule ids and/or control names")
    p.add_argument("--cpu", action="store_true", help="record on the CPU even if a GPU is present")
    p.add_argument("--scale", choices=("auto", "small", "full"), default="auto", help="auto: small on CPU")
    p.add_argument("--warmup-steps", type=int, default=10, help="unprofiled steps before timing")
    p.add_argument("--timing-steps", type=int, default=30, help="unprofiled steps timed")
    p.add_argument("--copy-to", type=Path, default=None, help="also copy the traces and manifest here")
    p.add_argument("--tar", type=Path, default=None, help="also write one uncompressed tar of everything")
    p.add_argument(
        "--no-step-markers",
        action="store_true",
        help="profile a window of steps without prof.step(): traces with no ProfilerStep#N annotation",
    )
    p.add_argument("--iterations", type=int, default=5, help="steps in a --no-step-markers window")
    args = p.parse_args(argv)
    if args.timing_steps < 1 or args.warmup_steps < 0 or args.iterations < 1:
        p.error("--timing-steps and --iterations must be >= 1 and --warmup-steps >= 0")
    if args.out is None:
        args.out = DEFAULT_OUT_UNMARKED if args.no_step_markers else DEFAULT_OUT
    return args


def select(only: str) -> tuple[list[zoo.ZooCase], list[zoo.ZooControl]]:
    """The cases and controls named in `only` (all of them when empty), in registry order."""
    cases, controls = zoo.cases(), zoo.controls()
    if not only:
        return cases, controls
    wanted = {n.strip() for n in only.split(",") if n.strip()}
    if unknown := wanted - set(zoo.names()):
        raise SystemExit(f"record_zoo: unknown name(s) {sorted(unknown)}; known: {', '.join(zoo.names())}")
    return [c for c in cases if c.rule in wanted], [c for c in controls if c.name in wanted]


def plan_case(case: zoo.ZooCase, out: Path) -> list[Recording]:
    return [
        Recording(case.rule, "slow", case.slow, case.profile_slow, 3, out / f"{case.rule}__slow.json.gz"),
        Recording(case.rule, "fixed", case.fixed, case.profile_fixed, 2, out / f"{case.rule}__fixed.json.gz"),
    ]


def plan_control(control: zoo.ZooControl, out: Path) -> Recording:
    return Recording(
        control.name, "control", control.workload, control.profile, 3, out / f"{control.name}.json.gz"
    )


def time_steps(step: Step, device: torch.device, n: int) -> tuple[list[float], str]:
    """`n` unprofiled step times in µs. On a GPU: events recorded between consecutive steps with no sync
    in between (a per-step sync would hide exactly what host_sync and the prefetching fixes are about)."""
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        events[0].record()
        for end in events[1:]:
            step.run()
            end.record()
        events[-1].synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in itertools.pairwise(events)], "cuda_events"
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        step.run()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples, "perf_counter"


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def record(rec: Recording, device: torch.device, small: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Build, warm up, time and profile one workload; returns its manifest entry. Frees it after."""
    t0 = time.perf_counter()
    step = rec.workload.build(device, small=small)
    build_s = time.perf_counter() - t0
    on_gpu = device.type == "cuda"
    try:
        for _ in range(args.warmup_steps):
            step.run()
        if on_gpu:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        samples, method = time_steps(step, device, args.timing_steps)
        active = args.iterations if args.no_step_markers else rec.active_steps
        options = capture.StepTraceOptions(active=active, cuda=on_gpu, **rec.profile)
        walls: list[float] = []
        run = step.run

        def timed_run() -> None:  # host wall time per profiled step: what the profiler's overhead costs
            t = time.perf_counter()
            run()
            walls.append((time.perf_counter() - t) * 1e6)

        profile = profile_unmarked if args.no_step_markers else capture.profile_steps
        size = profile(timed_run, rec.path, options).stat().st_size
        peak = torch.cuda.max_memory_allocated(device) if on_gpu else None
        total = torch.cuda.get_device_properties(device).total_memory if on_gpu else None
        info = dict(step.info)
    finally:
        step.close()
        del step
        free(device)
    return {
        "workload": rec.workload.name,
        "file": rec.path.name,
        "file_bytes": size,
        "profiler_schedule": None
        if args.no_step_markers
        else {"wait": 1, "warmup": 2, "active": active, "repeat": 1},
        "step_markers": not args.no_step_markers,
        "iterations": active,
        "profile_options": dict(rec.profile),
        "workload_info": info,
        "build_s": build_s,
        "warmup_steps": args.warmup_steps,
        "unprofiled_step_us": {"median": statistics.median(samples), "samples": samples, "method": method},
        "profiled_step_wall_us": walls[-active:],
        "peak_memory_allocated_bytes": peak,
        "peak_memory_fraction": peak / total if peak is not None and total else None,
    }


def profile_unmarked(run_step: Callable[[], None], dest: Path, options: capture.StepTraceOptions) -> Path:
    """Run `options.active` steps inside one `torch.profiler.profile()` window, never calling
    `prof.step()`, and write the trace to `dest` (.json.gz): no ProfilerStep#N annotation in it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if options.cuda and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    dest.parent.mkdir(parents=True, exist_ok=True)
    raw = dest.with_name(dest.name.removesuffix(".gz"))
    with profile(
        activities=activities,
        record_shapes=options.record_shapes,
        profile_memory=options.profile_memory,
        with_stack=options.with_stack,
        with_flops=options.with_flops,
    ) as prof:
        for _ in range(options.active):
            run_step()
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.GzipFile(dest, "wb", compresslevel=6, mtime=0) as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)
    raw.unlink()
    return dest


def case_entry(case: zoo.ZooCase, slow: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    per_sample_slow = slow["unprofiled_step_us"]["median"] / case.samples_per_step_slow
    per_sample_fixed = fixed["unprofiled_step_us"]["median"] / case.samples_per_step_fixed
    return {
        "rule": case.rule,
        "title": case.title,
        "note": case.note,
        "files": {"slow": slow["file"], "fixed": fixed["file"]},
        "samples_per_step": {"slow": case.samples_per_step_slow, "fixed": case.samples_per_step_fixed},
        "measured_saving": 1.0 - per_sample_fixed / per_sample_slow,
        "slow": slow,
        "fixed": fixed,
    }


def write_manifest(out: Path, doc: dict[str, Any]) -> Path:
    """Merge `doc`'s cases and controls into `out/manifest.json` (re-recording one keeps the others)."""
    path = out / MANIFEST
    old: dict[str, Any] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            old = {}
    for key in ("cases", "controls"):
        doc[key] = {**old.get(key, {}), **doc[key]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return path


def write_tar(dest: Path, files: Sequence[Path]) -> list[Path]:
    """One tar of `files` (already gzipped: no compression on top); split into parts if over the limit."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    if dest.stat().st_size <= COPY_PART_BYTES:
        return [dest]
    copy_out([dest], dest.parent / f"{dest.name}.parts")
    dest.unlink()
    return sorted((dest.parent / f"{dest.name}.parts").iterdir())


def print_table(cases: Mapping[str, dict[str, Any]], controls: Mapping[str, dict[str, Any]]) -> None:
    rows = [("case", "slow step", "fixed step", "saving/sample", "slow trace", "fixed trace")]
    for rule, e in cases.items():
        if "error" in e:
            rows.append((rule, "error", "", "", "", ""))
            continue
        rows.append(
            (
                rule,
                fmt_us(e["slow"]["unprofiled_step_us"]["median"]),
                fmt_us(e["fixed"]["unprofiled_step_us"]["median"]),
                f"{100 * e['measured_saving']:.0f}%",
                fmt_bytes(e["slow"]["file_bytes"]),
                fmt_bytes(e["fixed"]["file_bytes"]),
            )
        )
    for name, e in controls.items():
        step = "error" if "error" in e else fmt_us(e["unprofiled_step_us"]["median"])
        rows.append((name, step, "", "", "" if "error" in e else fmt_bytes(e["file_bytes"]), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases, controls = select(args.only)
    use_cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    small = args.scale == "small" or (args.scale == "auto" and device.type == "cpu")
    env = environment(device)
    stamp = {
        "device": env["device_name"],
        "torch": env["torch"],
        "cuda": env["cuda"],
        "scale": "small" if small else "full",
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    print(
        f"recording {len(cases)} case(s), {len(controls)} control(s) on {device} ({stamp['scale']})",
        flush=True,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    case_entries: dict[str, dict[str, Any]] = {}
    control_entries: dict[str, dict[str, Any]] = {}
    written: list[Path] = []
    for case in cases:
        try:
            slow, fixed = (record(r, device, small, args) for r in plan_case(case, args.out))
            case_entries[case.rule] = {**case_entry(case, slow, fixed), **stamp}
            written += [args.out / slow["file"], args.out / fixed["file"]]
        except Exception as exc:  # record the rest of the zoo; the manifest says what failed
            traceback.print_exc()
            case_entries[case.rule] = {"rule": case.rule, "error": f"{type(exc).__name__}: {exc}", **stamp}
            free(device)
        print(f"  {case.rule}: done at {time.perf_counter() - started:.1f} s", flush=True)
    for control in controls:
        rec = plan_control(control, args.out)
        try:
            entry = record(rec, device, small, args)
            control_entries[control.name] = {"note": control.note, **entry, **stamp}
            written.append(rec.path)
        except Exception as exc:
            traceback.print_exc()
            control_entries[control.name] = {"error": f"{type(exc).__name__}: {exc}", **stamp}
            free(device)
        print(f"  {control.name}: done at {time.perf_counter() - started:.1f} s", flush=True)
    doc = {
        "schema_version": MANIFEST_SCHEMA,
        "environment": env,
        "cases": case_entries,
        "controls": control_entries,
    }
    manifest = write_manifest(args.out, doc)
    written.append(manifest)
    if args.copy_to:
        copy_out(written, args.copy_to)
    if args.tar:
        print("tar:", ", ".join(str(p) for p in write_tar(args.tar, written)))
    print_table(case_entries, control_entries)
    traces = sum(p.stat().st_size for p in written if p.name.endswith(".json.gz"))
    print(f"traces {fmt_bytes(traces)}; total {time.perf_counter() - started:.1f} s", flush=True)
    failed = [n for n, e in {**case_entries, **control_entries}.items() if "error" in e]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
