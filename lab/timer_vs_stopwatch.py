"""Why do the proof and the benchmark's timer disagree on `lm_three_modules`' patched copy (1.98× against
1.56×: 10.7 ms a step in the proof's plain processes, 13.5–14.2 ms in `plain_timer.py`'s, both steady
within a process; `benchmarks/results/fix_runs/lm_three_modules_10m/`)? Times one script (default: that
patched copy, made here from the committed `fix.diff`) and the expert's version in fresh processes under
each timer, alternating round by round:

- `stopwatch`: the proof's way — `python script.py`, the proof's stopwatch as `sitecustomize`, the proof's
  settings (warm-up 5 steps and 1 s, then 2 s in 0.5 s windows);
- `timer`: `benchmarks/fix_workloads/plain_timer.py` as `fix_vs_expert.py` runs it (warm-up 8 steps, Inductor's
  compile workers stopped, then 5 windows of 1 s);
- `timer_keep`: the same, the compile workers left running (`--keep-compile-workers`);
- `timer_warm`: the same with the stopwatch's warm-up in steps (`--warmup 90`);
- `stopwatch_long`: the stopwatch timing 5 s, as the timer does.

    PYTHONPATH=src python3 lab/timer_vs_stopwatch.py --out X.json [--rounds 3] [--script S -- ARGS]

A table of each configuration's process means last. GPU (the CPU with `--small`: the plumbing only)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "benchmarks" / "fix_workloads" / "lm_three_modules.py"
DIFF = ROOT / "benchmarks" / "results" / "fix_runs" / "lm_three_modules_10m" / "fix.diff"
STOPWATCH = ROOT / "src" / "gpudoctor" / "fixes" / "stopwatch.py"
TIMER = ROOT / "benchmarks" / "fix_workloads" / "plain_timer.py"
PROOF = {"source": "optimizer", "module": None, "warmup": 5, "warmup_s": 1.0, "steps": 15, "steps_s": 2.0,
         "window_s": 0.5}  # fmt: skip


def patched_copy(work: Path) -> Path:
    copy = work / "copy" / WORKLOAD.name
    copy.parent.mkdir(parents=True)
    shutil.copy(WORKLOAD, copy)
    subprocess.run(["patch", "-s", str(copy), str(DIFF)], check=True)
    return copy


def stopwatch(script: Path, args: list[str], work: Path, tag: str, steps_s: float) -> dict:
    boot = work / "boot"
    if not boot.exists():
        boot.mkdir()
        shutil.copy(STOPWATCH, boot / "sitecustomize.py")
    out = work / f"{tag}.json"
    settings = PROOF | {"out": str(out), "steps_s": steps_s, "window_s": max(steps_s / 4, 0.05)}
    env = os.environ | {"PYTHONPATH": str(boot), "GPUDOCTOR_PROOF_STOPWATCH": json.dumps(settings)}
    proc = subprocess.run([sys.executable, str(script), *args], env=env, cwd=script.parent,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if not out.exists():
        return {"error": (proc.stdout + proc.stderr)[-600:]}
    doc = json.loads(out.read_text())
    return {"step_ms": (doc.get("mean_step_us") or 0) / 1e3 or None, "windows": doc.get("windows")}


def timer(script: Path, args: list[str], work: Path, tag: str, extra: list[str]) -> dict:
    out = work / f"{tag}.json"
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    }
    proc = subprocess.run([sys.executable, str(TIMER), "--out", str(out), "--windows", "5", *extra, "--",
                           str(script), *args], env=env, cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    if not out.exists():
        return {"error": (proc.stdout + proc.stderr)[-600:]}
    doc = json.loads(out.read_text())
    return {"step_ms": (doc.get("step_s") or 0) * 1e3 or None, "windows": doc.get("windows")}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--script", help="a script of one's own (default: lm_three_modules' patched copy)")
    parser.add_argument("--small", action="store_true", help="the workload's --small (CPU plumbing)")
    parser.add_argument("--no-expert", action="store_true", help="leave out the expert's version")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    args = [x for x in a.args if x != "--"] + (["--small"] if a.small else [])
    work = Path(tempfile.mkdtemp(prefix="timer_vs_stopwatch_"))
    script = Path(a.script).resolve() if a.script else patched_copy(work)
    configs = {
        "stopwatch": lambda s, ar, t: stopwatch(s, ar, work, t, 2.0),
        "timer": lambda s, ar, t: timer(s, ar, work, t, []),
        "timer_keep": lambda s, ar, t: timer(s, ar, work, t, ["--keep-compile-workers"]),
        "timer_warm": lambda s, ar, t: timer(s, ar, work, t, ["--warmup", "90"]),
        "stopwatch_long": lambda s, ar, t: stopwatch(s, ar, work, t, 5.0),
    }
    sides = {"patched": (script, args)}
    if not a.script and not a.no_expert:
        sides["expert"] = (WORKLOAD, [*args, "--expert"])
    rows: list[dict] = []
    for k in range(a.rounds):
        for side, (s, ar) in sides.items():
            for name, run in configs.items():
                if side == "expert" and name not in ("stopwatch", "timer"):
                    continue
                r = run(s, ar, f"{side}-{name}-{k}") | {"side": side, "config": name, "round": k}
                rows.append(r)
                print(f"round {k} {side:8s} {name:15s} {r.get('step_ms') or r.get('error', '')}", flush=True)
    table = {}
    for r in rows:
        if r.get("step_ms"):
            table.setdefault(f"{r['side']} {r['config']}", []).append(r["step_ms"])
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    doc = {"device": device, "torch": torch.__version__, "script": str(script), "args": args, "rows": rows,
           "means_ms": {k: statistics.fmean(v) for k, v in table.items()}}  # fmt: skip
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{'configuration':28s} {'processes (ms a step)':40s} mean")
    for key, values in table.items():
        print(f"{key:28s} {' '.join(f'{v:6.2f}' for v in values):40s} {statistics.fmean(values):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
