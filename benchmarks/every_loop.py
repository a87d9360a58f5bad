"""Does `gpudoctor run` find the step and time it right? `gpudoctor run`, unmodified, on the loops people
run (the scripts in benchmarks/every_loop/, written as their users write them), each beside the same loop
timed plainly.

For each workload, in fresh processes one after another on the same machine (P G P, or P G P G P ...):
  plain      the script alone; after a warm-up it times a window of >= 2 s with the GPU synchronized at the
             window's two ends only (benchmarks/every_loop/_window.py, on when EVERY_LOOP_TIMING is set)
  gpudoctor  `python -m gpudoctor run -o DIR --light-seconds 6 script.py`: how the step was found, the
             unprofiled step time (the light phase's time over its steps), analysis.json, report.html;
             meanwhile the script times itself the plain way, window after window of >= 1 s, each
             synchronized at its two ends (EVERY_LOOP_CONTINUOUS)
The host of the GPU machine changes speed from process to process and within one
(lab/host_speed_probe.py: the same pure-Python loop 300-670 ms on one CPU, pinned): only timings of the same
steps in the same process compare. Accepted when the analysis and the report exist and the light phase's
step time agrees within 5% with the plain windows that fall inside it ("same process"). The plain runs
in their own processes are kept beside it ("other processes": the median of the plain runs), with the
machine's drift in them. The Lightning fit is also timed plainly
with a fused AdamW (the doctor must not call the optimizer the problem) and with 8 workers and pinned
memory (the input pipeline, which it must name first).

    PYTHONPATH=src python3 benchmarks/every_loop.py --out $OUT [--only bert_infer,lightning_fit]
    PYTHONPATH=src python3 benchmarks/every_loop.py --small --out /tmp/x   # CPU smoke test of the driver
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "every_loop"
REPO = HERE.parent.parent
# name -> (script, script args, extra plain variants: label -> args)
WORKLOADS: dict[str, tuple[str, list[str], dict[str, list[str]]]] = {
    "train_loop": ("train_loop.py", [], {}),
    "bert_infer": ("bert_infer.py", [], {}),
    "resnet_infer": ("resnet_infer.py", [], {}),
    "gpt2_generate": ("gpt2_generate.py", ["--steps", "80"], {}),
    "tensor_ops": ("tensor_ops.py", [], {}),
    "lightning_fit": (
        "lightning_fit.py",
        [],
        {"fused_adamw": ["--fused"], "workers8_pinned": ["--workers", "8", "--pin"]},
    ),
    "hf_trainer": ("hf_trainer.py", [], {}),
    "accelerate_loop": ("accelerate_loop.py", [], {}),
    "compiled": ("compiled.py", [], {}),
    "cuda_graph": ("cuda_graph.py", [], {}),
}
TOLERANCE = 0.05
LIGHT = ["--light-seconds", "6"]  # room for several 1 s plain windows inside the light phase


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code, output = 124, f"timed out after {timeout} s: {err.stdout or ''}{err.stderr or ''}"
    return code, output, time.perf_counter() - start


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def plain(script: str, args: list[str], timeout: float, small: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        timing = Path(tmp) / "timing.json"
        env = {**environment(), "EVERY_LOOP_TIMING": str(timing)}
        if small:
            env.update(EVERY_LOOP_SKIP="3", EVERY_LOOP_MIN_S="0.3")
        code, output, wall = run([sys.executable, script, *args], env, timeout)
        result: dict[str, Any] = {"exit_code": code, "wall_s": round(wall, 1)}
        if timing.exists():
            result.update(json.loads(timing.read_text()))
        else:
            result["error"] = output[-2000:]
        return result


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median step time (the lower middle one of an even number)."""
    timed = sorted((r for r in runs if r.get("step_us")), key=lambda r: r["step_us"])
    return timed[(len(timed) - 1) // 2] if timed else runs[0]


def under_gpudoctor(
    name: str, script: str, args: list[str], out: Path, timeout: float, gd_args: list[str] = ()
) -> dict[str, Any]:
    run_dir = out / f"run-{name}"
    windows = out / f"windows-{name}.json"
    cmd = [sys.executable, "-m", "gpudoctor", "run", "-o", str(run_dir), *LIGHT, *gd_args, script, *args]
    env = {
        **environment(),
        "EVERY_LOOP_TIMING": str(windows),
        "EVERY_LOOP_CONTINUOUS": "1",
        "EVERY_LOOP_SKIP": "0",
        "EVERY_LOOP_SKIP_S": "0",
        "EVERY_LOOP_MIN_S": "1.0",
    }
    code, output, wall = run(cmd, env, timeout)
    result: dict[str, Any] = {"exit_code": code, "wall_s": round(wall, 1), "run_dir": run_dir.name}
    record_file = run_dir / "record.json"
    if not record_file.exists():
        result["error"] = output[-3000:]
        return result
    record = json.loads(record_file.read_text())
    light = record.get("light") or {}
    times = light.get("times_us") or []
    step = record.get("step") or {}
    result.update(
        step_source=step.get("source"),
        step=step.get("description"),
        calls_per_step=step.get("calls_per_step"),
        light_steps=len(times),
        step_us=sum(times) / len(times) if times else None,
        light_median_us=light.get("median_us") if "median_us" in light else record.get("light_median_us"),
        profiler_overhead=record.get("profiler_overhead"),
        same_process=_inside(light, windows),
        analysis=(run_dir / "analysis.json").exists(),
        report=(run_dir / "report.html").exists(),
        notes=record.get("notes"),
    )
    if result["analysis"]:
        doc = json.loads((run_dir / "analysis.json").read_text())
        findings = doc["reports"][0]["findings"] if "reports" in doc else doc.get("findings", [])
        result["findings"] = [
            {"id": f["id"], "severity": f["severity"], "saving_pct": f["est_saving_pct"]} for f in findings
        ]
    if code != 0:
        result["error"] = output[-3000:]
    return result


def _inside(light: dict[str, Any], windows_file: Path) -> dict[str, Any] | None:
    """The plain windows the script timed inside the light phase: their steps, seconds, step time."""
    span = light.get("host_span_s")
    if not span or not windows_file.exists():
        return None
    windows = json.loads(windows_file.read_text())["windows"]
    inside = [w for w in windows if w["span_s"][0] >= span[0] and w["span_s"][1] <= span[1]]
    if not inside:
        return {"windows": 0}
    steps, seconds = sum(w["steps"] for w in inside), sum(w["seconds"] for w in inside)
    return {"windows": len(inside), "steps": steps, "seconds": seconds, "step_us": 1e6 * seconds / steps}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--small", action="store_true", help="tiny models (the CPU smoke test)")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--rounds", type=int, default=1, help="gpudoctor runs, each between two plain ones")
    parser.add_argument("--gd-args", default="", help="extra options of gpudoctor run (diagnosis)")
    parser.add_argument(
        "--results", type=Path, default=None, help="the results JSON (default OUT/every_loop.json)"
    )
    opts = parser.parse_args()
    opts.gd_args = opts.gd_args.split()
    opts.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in opts.only.split(",") if n] or list(WORKLOADS)
    import torch

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "versions": _versions(),
        "tolerance": TOLERANCE,
        "workloads": {},
    }
    for name in names:
        script, args, variants = WORKLOADS[name]
        args = [*args, *(["--small"] if opts.small else [])]
        if opts.small and name == "cuda_graph":
            continue
        entry: dict[str, Any] = {"script": f"benchmarks/every_loop/{script}", "args": args}
        plains, runs = [], []
        for i in range(opts.rounds):
            plains.append(plain(script, args, opts.timeout, opts.small))
            runs.append(under_gpudoctor(f"{name}-{i}", script, args, opts.out, opts.timeout, opts.gd_args))
        plains.append(plain(script, args, opts.timeout, opts.small))
        entry["plain_runs"], entry["gpudoctor_runs"] = plains, runs
        entry["plain"] = _median_run(plains)
        entry["gpudoctor"] = _median_run(runs)
        for label, extra in variants.items():
            entry[f"plain_{label}"] = plain(script, [*args, *extra], opts.timeout, opts.small)
        p, g = entry["plain"].get("step_us"), entry["gpudoctor"].get("step_us")
        entry["ratio_other_processes"] = g / p if p and g else None
        same = entry["gpudoctor"].get("same_process") or {}
        entry["ratio"] = g / same["step_us"] if same.get("step_us") and g else None
        entry["ok"] = bool(
            entry["ratio"] is not None
            and abs(entry["ratio"] - 1) <= TOLERANCE
            and entry["gpudoctor"].get("analysis")
            and entry["gpudoctor"].get("report")
        )
        results["workloads"][name] = entry
        _print_row(name, entry)
        (opts.results or opts.out / "every_loop.json").write_text(json.dumps(results, indent=1))
    _pack(opts.out)
    print()
    print(
        f"{'workload':16} {'plain':>10} {'gpudoctor':>10} {'ratio':>6} {'other':>6}  ok  first finding   step"
    )
    for name, e in results["workloads"].items():
        _print_row(name, e)
        spread = [
            f"{r['step_us'] / 1000:.2f}" for r in e["plain_runs"] + e["gpudoctor_runs"] if r.get("step_us")
        ]
        print(f"{'':16} plain, gpudoctor runs (ms): {' '.join(spread)}")


def _pack(out: Path) -> None:
    """The run directories in one archive (the device returns few files), then removed."""
    import shutil
    import tarfile

    dirs = sorted(p for p in out.glob("run-*") if p.is_dir())
    if not dirs:
        return
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        for d in dirs:
            tar.add(d, arcname=d.name)
    for d in dirs:
        shutil.rmtree(d)


def _print_row(name: str, e: dict[str, Any]) -> None:
    g = e["gpudoctor"].get("step_us")
    p = (e["gpudoctor"].get("same_process") or {}).get("step_us")
    first = (e["gpudoctor"].get("findings") or [{"id": "-"}])[0]["id"]
    ratio = f"{e['ratio']:.3f}" if e.get("ratio") else "-"
    other = f"{e['ratio_other_processes']:.2f}" if e.get("ratio_other_processes") else "-"
    print(
        f"{name:16} {_ms(p):>10} {_ms(g):>10} {ratio:>6} {other:>6}  {'yes' if e['ok'] else 'NO ':3} {first:15} "
        f"{e['gpudoctor'].get('step') or e['gpudoctor'].get('error', '')[-200:]}",
        flush=True,
    )


def _ms(us: float | None) -> str:
    return f"{us / 1000:.2f} ms" if us else "-"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("transformers", "lightning", "accelerate", "torchvision", "triton"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


if __name__ == "__main__":
    main()
