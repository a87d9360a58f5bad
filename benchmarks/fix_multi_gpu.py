"""gpudoctor fix on several GPUs against an expert: for each data-parallel training script written as its
users write it (benchmarks/fix_multi_gpu/), run `gpudoctor fix --nproc 2` on it, then time plainly, as
torchrun groups on the same GPUs, alternating round by round (A B C, C B A, …), the script, the expert's
hand-fixed version (`--expert`) and a copy of the script with the fix's `fix.diff` applied by `patch` —
every rank timed from outside by fix_multi_gpu/_rank_timer.py (the optimizer's steps, CUDA synchronized
at the window's two ends only, the same steps on every rank), a group's step the slowest rank's. The
window's step count comes from a short calibration group of the script and of the expert's version
(a window of at least --window-s).

Per workload: each configuration's step and the speedups with 95% intervals (groups resampled), the
proof's speedup (fix.json's `proof`: the patched copy against the script as plain torchrun groups) and
its share of the expert's gain, (proof − 1) / (expert − 1), goal ≥ 80%, with the benchmark's own timing
of the patched copy and its share beside it; the fixes kept. The control (`ddp_tuned_control`, already
tuned) meets its goal by keeping nothing. Every process runs with NVLink multicast off; `--pin` puts each
timed rank on its share of its GPU's NUMA-local cores (PIN_CORES=1 to the timer; gpudoctor fix places its
own ranks). A workload that fails is recorded with its error; the others go on.

    PYTHONPATH=src python3 benchmarks/fix_multi_gpu.py --out $OUT/fmg --budget 3m --pin [--only NAMES]
    .venv/bin/python benchmarks/fix_multi_gpu.py --out /tmp/fmg --smoke --skip-fix   # the CPU path, gloo

Writes OUT/fix_multi_gpu.json (after each workload), the fix directories under OUT/fix/NAME, the
patched copies under OUT/patched/NAME, and each group's rank files and log under OUT/groups/NAME/.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fix_vs_expert import GOAL, NO_GAIN, environment, intervals, speedup_interval, summarize_fix
from multi_gpu import NO_MULTICAST
from patched_copy import make_patched_copy, proof_check

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS_DIR = ROOT / "benchmarks" / "fix_multi_gpu"
TIMER = WORKLOADS_DIR / "_rank_timer.py"
NPROC = 2
CONTROL = "ddp_tuned_control"  # nothing to gain: the goal is to keep nothing
TIMED_OUT = 124
SCHEMA = "gpudoctor.bench.fix_multi_gpu/1"

# name -> what the expert changes by hand (`--expert`)
WORKLOADS: dict[str, str] = {
    "ddp_resnet_loader": "workers from each rank's share of the cores, pinned memory, persistent workers, "
    "non-blocking copies, channels_last, cudnn.benchmark, bf16 autocast",
    "ddp_hf_lm": "no_sync() on all micro-batches but the last, bf16 autocast, TF32, "
    "find_unused_parameters=False, gradient_as_bucket_view=True, fused AdamW, the model compiled",
    "accelerate_ddp": 'Accelerator(mixed_precision="bf16"), padding to a multiple of 8, loader workers with '
    "pinned memory, TF32, fused AdamW",
    CONTROL: "nothing (already tuned)",
}
# options whose defaults differ on the CPU path (--smoke): (GPU, smoke)
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "budget": ("3m", "1m"),
    "pairs": (3, 2),
    "warmup_steps": (10, 3),
    "calibration_steps": (10, 5),
    "window_s": (2.0, 0.5),
    "min_steps": (10, 5),
    "group_timeout_s": (300.0, 180.0),
}


def timer_command(script: Path, script_args: list[str], out: Path, warmup: int, steps: int,
                  stacks_after_s: float | None = None) -> list[str]:  # fmt: skip
    """One timed torchrun group: every rank runs the script under _rank_timer.py (which dumps its threads'
    stacks after `stacks_after_s`, for a group that hangs)."""
    stacks = ["--stacks-after-s", f"{stacks_after_s:.0f}"] if stacks_after_s else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC),
            str(TIMER), "--out", str(out), "--warmup-steps", str(warmup), "--steps", str(steps), *stacks,
            "--", str(script), *script_args]  # fmt: skip


def fix_command(script: Path, script_args: list[str], out: Path, budget: str, extra: list[str]) -> list[str]:
    """`gpudoctor fix --nproc 2` on the script, as a user runs it."""
    return [sys.executable, "-m", "gpudoctor", "fix", "--nproc", str(NPROC), "--budget", budget,
            "--out", str(out), *extra, str(script), *script_args]  # fmt: skip


def run_env(pin: bool, smoke: bool) -> dict[str, str]:
    """Every process's environment: NVLink multicast off, gpudoctor importable, PIN_CORES=1 with --pin;
    on the CPU path no GPU and one thread per rank."""
    env = dict(os.environ) | NO_MULTICAST
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    if pin:
        env["PIN_CORES"] = "1"
    if smoke:
        env |= {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return env


def adopt_orphans() -> None:
    """Linux: become the subreaper of what this process starts, so that a loader worker orphaned by a
    rank that ended (os._exit) is reparented here and `end_leftovers` can end it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def end_leftovers() -> int:
    """Kill and reap every process still a child of this one (none should run between groups: a loader
    worker still at work would slow the next group); how many there were."""
    mine, left = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == mine:
            left.append(int(stat.parent.name))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return len(left)


def run_logged(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, float, int]:
    """Run `cmd` in a session of its own, its output to `log`; past `timeout_s` it is asked to stop
    (SIGTERM: torchrun stops its ranks), then killed. (exit status, seconds, leftover processes ended)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as sink:
        sink.write(shlex.join(cmd) + "\n")
        sink.flush()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = TIMED_OUT
    return rc, time.perf_counter() - t0, end_leftovers()


def read_ranks(folder: Path, world: int = NPROC) -> tuple[list[dict[str, Any]], str | None]:
    """Every rank's result from `folder` (rank{R}.json), and what is missing or inconsistent."""
    ranks = []
    for r in range(world):
        try:
            ranks.append(json.loads((folder / f"rank{r}.json").read_text()))
        except (OSError, ValueError) as err:
            return ranks, f"rank {r} wrote no result ({type(err).__name__})"
    steps = {(x["warmup_steps"], x["steps"]) for x in ranks}
    if len(steps) > 1:
        return ranks, f"the ranks timed different steps: {sorted(steps)}"
    return ranks, None


def slowest(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank that paces the group: every rank waits for it at each collective."""
    return max(ranks, key=lambda x: x["step_s"])


def steps_for(step_s: float, window_s: float, least: int, most: int = 100_000) -> int:
    """Steps for a window of at least `window_s` at `step_s` a step."""
    return max(least, min(most, math.ceil(window_s / step_s)))


def round_order(k: int, labels: list[str]) -> list[str]:
    """A B C in even rounds, C B A in odd ones: drift over the rounds falls alike on each."""
    return labels if k % 2 == 0 else labels[::-1]


def time_group(name: str, label: str, tag: str, config: tuple[Path, list[str]], steps: int,
               a: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """One torchrun group of one configuration: its slowest rank's window, or why there is none."""
    folder = a.out / "groups" / name / f"{label}-{tag}"
    for old in folder.glob("rank*.json"):
        old.unlink()
    cmd = timer_command(config[0], config[1], folder, a.warmup_steps, steps, a.group_timeout_s - 20)
    rc, wall_s, leftovers = run_logged(cmd, env, folder / "log.txt", a.group_timeout_s)
    ranks, error = read_ranks(folder)
    group: dict[str, Any] = {"label": label, "tag": tag, "steps": steps, "exit_code": rc, "wall_s": wall_s,
                             "leftovers_ended": leftovers, "ranks": ranks}  # fmt: skip
    if error or rc != 0:
        tail = (folder / "log.txt").read_text()[-1500:]
        why = "timed out" if rc == TIMED_OUT else f"exit {rc}"
        return group | {"step_s": None, "error": f"{error or 'no error from the ranks'}; {why}: {tail}"}
    pace = slowest(ranks)
    return group | {"step_s": pace["step_s"], "window_s": pace["window_s"], "pacing_rank": pace["rank"]}


def calibrated_steps(calibration: dict[str, dict[str, Any]], labels: list[str], a: argparse.Namespace) -> dict[str, int]:  # fmt: skip
    """Each configuration's window in steps: the script's from its own calibration, the others' from the
    expert's (the fastest, normally), or the script's where the expert's failed."""
    pace = {k: g["step_s"] for k, g in calibration.items() if g.get("step_s")}
    if not pace:
        return {}
    return {
        label: steps_for(pace.get(label, pace.get("expert", pace.get("plain"))), a.window_s, a.min_steps)
        for label in labels
    }


def measure(name: str, configs: dict[str, tuple[Path, list[str]]], a: argparse.Namespace,
            env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """Calibrate, then --pairs rounds of every configuration in alternating order; judged by
    `timing_result`."""
    calibration = {
        label: time_group(name, label, "calibration", configs[label], a.calibration_steps, a, env)
        for label in ("plain", "expert")
    }
    steps = calibrated_steps(calibration, list(configs), a)
    groups: list[dict[str, Any]] = []
    if steps:
        for k in range(a.pairs):
            for label in round_order(k, list(configs)):
                groups.append(time_group(name, label, str(k), configs[label], steps[label], a, env))
    result = timing_result(groups)
    result |= {"steps": steps, "warmup_steps": a.warmup_steps, "calibration": calibration}
    if not steps:
        result["error"] = "neither calibration group gave a step time: " + "; ".join(
            str(g.get("error"))[:600] for g in calibration.values()
        )
    return result


def timing_result(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """Each configuration's median group (its slowest rank's step), the speedups over the script with
    95% intervals (groups resampled), and the share of the expert's gain by the patched copy's timing."""
    labels = list(dict.fromkeys(g["label"] for g in groups))
    ok = {c: [g for g in groups if g["label"] == c and g.get("step_s")] for c in labels}
    median = {c: statistics.median(g["step_s"] for g in gs) if gs else None for c, gs in ok.items()}
    runs = {c: [[[g["window_s"], g["steps"]]] for g in gs] for c, gs in ok.items()}
    result: dict[str, Any] = {
        "step_ms": {c: v * 1e3 if v else None for c, v in median.items()},
        "groups": {c: len(gs) for c, gs in ok.items()},
        "errors": {c: [g["error"] for g in groups if g["label"] == c and g.get("error")] for c in labels},
        "runs": runs,
        "group_records": groups,
    }
    for c in ("expert", "patched"):
        if median.get("plain") and median.get(c):
            result[f"{c}_speedup"] = median["plain"] / median[c]
            result[f"{c}_speedup_ci"] = speedup_interval(runs, c) if len(ok[c]) > 1 else None
    if all(len(ok.get(c, [])) > 1 for c in ("plain", "expert", "patched")):
        share_ci, ratio_ci = intervals({"plain": runs["plain"], "expert": runs["expert"],
                                        "gpudoctor": runs["patched"]})  # fmt: skip
        result |= {"share_of_expert_by_patched_ci": share_ci, "patched_over_expert_ci": ratio_ci}
    return result


def judged(name: str, kept: list[str] | None, timing: dict[str, Any], proof: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The proof's figure against the expert's gain (patched_copy.proof_check: its share, the patched
    copy's share, their agreement) and the goal: the control keeps nothing; elsewhere the proof's share
    ≥ GOAL, or, where the expert gains nothing, the proof no slower than the expert. A fix that kept
    nothing made no proof: its speedup is 1."""
    check = proof_check(proof, timing, NO_GAIN)
    proven = (check.get("proof") or {}).get("speedup")
    if proven is None and kept == []:
        proven = 1.0
        check["share_of_expert_by_proof"] = 0.0 if (timing.get("expert_speedup") or 0) > 1 + NO_GAIN else None
    expert = timing.get("expert_speedup")
    if name == CONTROL:
        meets = None if kept is None else not kept
        goal = "keep nothing"
    elif expert is None or proven is None:
        meets, goal = None, f"the proof's share of the expert's gain >= {GOAL:.0%}"
    elif expert <= 1 + NO_GAIN:
        meets, goal = proven >= expert - NO_GAIN, "the expert gains nothing: the proof no slower than it"
    else:
        meets, goal = check["share_of_expert_by_proof"] >= GOAL, f"the proof's share of the expert's gain >= {GOAL:.0%}"  # fmt: skip
    return {"proof_check": check, "proof_speedup": proven, "goal": goal, "meets_goal": meets,
            "share_of_expert_by_proof_range": share_range(check.get("proof"), timing.get("expert_speedup_ci"))}  # fmt: skip


def share_range(proof: dict[str, Any] | None, expert_ci: list[float] | None) -> list[float] | None:
    """The proof's share of the expert's gain at the two ends of both intervals — the proof's 95% (from
    fix.json) and the expert's speedup's (groups resampled) — a conservative range; None where either is
    missing or the expert's interval reaches down to no gain."""
    low_high = (proof or {}).get("speedup_ci")
    if not low_high or not expert_ci or expert_ci[0] <= 1 + NO_GAIN:
        return None
    return [(low_high[0] - 1) / (expert_ci[1] - 1), (low_high[1] - 1) / (expert_ci[0] - 1)]


def run_fix(name: str, script: Path, script_args: list[str], a: argparse.Namespace,
            env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any] | None]:  # fmt: skip
    """`gpudoctor fix --nproc 2` on the workload: how the command went, and its fix.json summarized
    (summarize_fix; the raw `final` and `proof` where the summary cannot read it)."""
    fix_dir = a.out / "fix" / name
    cmd = fix_command(script, script_args, fix_dir, a.budget, shlex.split(a.fix_args))
    env = {k: v for k, v in env.items() if k != "PIN_CORES"}  # the timer's: gpudoctor places its ranks
    rc, wall_s, leftovers = run_logged(cmd, env, a.out / "logs" / f"fix_{name}.log", a.fix_timeout_s)
    run = {"command": shlex.join(cmd), "exit_code": rc, "wall_s": wall_s, "leftovers_ended": leftovers}
    report = fix_dir / "fix.json"
    if not report.is_file():
        tail = (a.out / "logs" / f"fix_{name}.log").read_text()[-1500:]
        return run | {"error": f"gpudoctor fix wrote no fix.json (exit {rc}): {tail}"}, None
    try:
        return run, summarize_fix(fix_dir)
    except (KeyError, TypeError, ValueError) as err:  # a report this summary does not know
        raw = json.loads(report.read_text())
        return run, {"final": raw.get("final"), "proof": raw.get("proof"), "diff": raw.get("diff"),
                     "summary_error": f"{type(err).__name__}: {err}"}  # fmt: skip


def one_workload(name: str, a: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The fix (unless --skip-fix), the patched copy, the timing and the verdict of one workload."""
    script, small = WORKLOADS_DIR / f"{name}.py", ["--small"] if a.smoke else []
    record: dict[str, Any] = {"workload": name, "script": str(script.relative_to(ROOT)),
                              "expert": WORKLOADS[name], "control": name == CONTROL}  # fmt: skip
    configs: dict[str, tuple[Path, list[str]]] = {
        "plain": (script, small),
        "expert": (script, ["--expert", *small]),
    }
    summary = None
    if not a.skip_fix:
        record["fix_run"], summary = run_fix(name, script, small, a, env)
        record["fix"] = summary
        copy = make_patched_copy(script, a.out / "fix" / name / "fix.diff", a.out / "patched" / name, ROOT)
        record["patched"] = copy.to_json()
        if copy.script:
            configs["patched"] = (Path(copy.script), small)
    kept = None if summary is None else list(summary.get("final") or [])
    record["kept"] = kept
    if name == CONTROL and kept == []:
        # nothing kept, nothing to prove: the control's plain and expert runs are the same script
        record["timing"] = {"skipped": "the control kept nothing: no patched copy to time"}
    else:
        record["timing"] = measure(name, configs, a, env)
    record |= judged(name, kept, record["timing"], None if summary is None else summary.get("proof"))
    if name == CONTROL:
        record["control_kept_nothing"] = None if kept is None else not kept
    return record


def salvaged(name: str, a: argparse.Namespace) -> dict[str, Any]:
    """One workload's record read back from an interrupted run's --out (its machine released mid-run):
    the fix's report and the groups that wrote every rank's result, judged as `one_workload` judges; no
    process is started. `timing.salvaged` names what was missing."""
    script = WORKLOADS_DIR / f"{name}.py"
    record: dict[str, Any] = {"workload": name, "script": str(script.relative_to(ROOT)),
                              "expert": WORKLOADS[name], "control": name == CONTROL}  # fmt: skip
    fix_dir = a.out / "fix" / name
    summary = summarize_fix(fix_dir) if (fix_dir / "fix.json").is_file() else None
    record["fix"] = summary
    record["fix_run"] = {"salvaged": str(fix_dir)} if summary else {"error": "no fix.json"}
    kept = None if summary is None else list(summary.get("final") or [])
    record["kept"] = kept
    calibration, groups, missing = {}, [], []
    for folder in sorted((a.out / "groups" / name).glob("*-*"), key=lambda f: f.stat().st_mtime):
        label, tag = folder.name.rsplit("-", 1)
        ranks, error = read_ranks(folder)
        if error:
            missing.append(f"{folder.name}: {error}")
            continue
        pace = slowest(ranks)
        group = {"label": label, "tag": tag, "steps": pace["steps"], "exit_code": None, "ranks": ranks,
                 "step_s": pace["step_s"], "window_s": pace["window_s"], "pacing_rank": pace["rank"]}  # fmt: skip
        if tag == "calibration":
            calibration[label] = group
        else:
            groups.append(group)
    record["timing"] = timing_result(groups) | {"calibration": calibration, "salvaged": missing or "complete"}
    return record | judged(name, kept, record["timing"], None if summary is None else summary.get("proof"))


def environment_of(a: argparse.Namespace) -> dict[str, Any]:
    """What the groups ran on, read in a child process (no CUDA context held here while timing)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--environment"]
    done = subprocess.run(cmd, env=run_env(False, a.smoke), capture_output=True, text=True, check=False)
    try:
        info = json.loads(done.stdout)
    except ValueError:
        info = {"error": (done.stdout + done.stderr)[-600:]}
    return info | {"world_size": NPROC, "pinned": a.pin, "multicast_off": NO_MULTICAST,
                   "host": platform.node()}  # fmt: skip


def print_environment() -> None:
    """fix_vs_expert's environment, and the data-parallel side: every GPU, NCCL, accelerate."""
    from importlib import metadata

    info = environment()
    import torch

    if torch.cuda.is_available():
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for package in ("accelerate", "timm", "pillow"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info[package] = metadata.version(package)
    info["cpus"] = len(os.sched_getaffinity(0))
    print(json.dumps(info))


def table(records: list[dict[str, Any]]) -> str:
    """The results, one line per workload."""

    def x(v: float | None, fmt: str = "{:.2f}×") -> str:
        return "—" if v is None else fmt.format(v)

    rows = [("workload", "kept", "plain ms", "expert ms", "patched ms", "expert", "patched", "proof",
             "share (proof)", "share (patched)", "goal")]  # fmt: skip
    for r in records:
        t, check = r.get("timing") or {}, r.get("proof_check") or {}
        ms = t.get("step_ms") or {}
        kept = "+".join(r["kept"]) or "nothing" if r.get("kept") is not None else "—"
        if (r.get("fix_run") or {}).get("error") or r.get("error"):
            kept = "failed"
        rows.append((r["workload"], kept[:40], x(ms.get("plain"), "{:.1f}"), x(ms.get("expert"), "{:.1f}"),
                     x(ms.get("patched"), "{:.1f}"), x(t.get("expert_speedup")), x(t.get("patched_speedup")),
                     x(r.get("proof_speedup")), x(check.get("share_of_expert_by_proof"), "{:.0%}"),
                     x(check.get("share_of_expert_by_patched"), "{:.0%}"),
                     {True: "met", False: "missed", None: "—"}[r.get("meets_goal")]))  # fmt: skip
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def status(records: list[dict[str, Any]]) -> str:
    """One line: how many scripts reach the goal by the proof's figure, what the control kept, where
    gpudoctor fix failed."""
    ran = [r for r in records if r.get("fix_run")]
    if not ran:
        return "no gpudoctor fix run: the scripts and their experts' versions timed only"
    scripts = [r for r in ran if not r.get("control")]
    met = [r for r in scripts if r.get("meets_goal")]
    words = f"{len(met)} of {len(scripts)} scripts reach {GOAL:.0%} of the expert's gain by the proof's figure"  # fmt: skip
    control = next((r for r in ran if r.get("control")), None)
    if control is not None and control.get("kept") is not None:
        words += f"; the control kept {'+'.join(control['kept']) or 'nothing'}"
    failed = [r["workload"] for r in ran if r["fix_run"].get("error")]
    return words + (f"; gpudoctor fix failed on {', '.join(failed)}" if failed else "")


def budget_s(text: str) -> float:
    """Seconds in a --budget as gpudoctor fix reads it ("90", "90s", "3m", "1.5h"); a bad one is a usage
    error there, so here it only sizes the timeout (10 minutes)."""
    scale = {"s": 1, "m": 60, "min": 60, "h": 3600}
    number = text.strip().rstrip("sminh")
    unit = text.strip()[len(number) :] or "s"
    try:
        return float(number) * scale[unit]
    except (KeyError, ValueError):
        return 600.0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    p.add_argument("--budget", help="gpudoctor fix --budget, per workload (default 3m; smoke 1m)")
    p.add_argument(
        "--skip-fix", action="store_true", help="no gpudoctor fix: time the script and expert only"
    )
    p.add_argument("--fix-args", default="", help="more options for gpudoctor fix (one string)")
    p.add_argument(
        "--fix-timeout-s", type=float, help="stop a fix run after this long (default 2×budget + 10 min)"
    )
    p.add_argument("--pin", action="store_true", help="each rank on its share of its GPU's NUMA-local cores")
    p.add_argument("--pairs", type=int, help="rounds of every configuration (default 3; smoke 2)")
    p.add_argument("--warmup-steps", type=int, help="steps before the window, beside the loader's in flight")
    p.add_argument("--calibration-steps", type=int, help="steps timed by each calibration group")
    p.add_argument("--window-s", type=float, help="a window lasts at least this long (default 2 s)")
    p.add_argument("--min-steps", type=int, help="a window holds at least this many steps")
    p.add_argument("--group-timeout-s", type=float, help="stop a group with no result after this long")
    p.add_argument("--smoke", action="store_true", help="the CPU path: gloo, --small, a short budget")
    p.add_argument(
        "--salvage", action="store_true",
        help="read an interrupted run's --out back into fix_multi_gpu.json (what finished), running nothing",
    )  # fmt: skip
    p.add_argument("--environment", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for key, (gpu, smoke) in DEFAULTS.items():
        if getattr(a, key) is None:
            setattr(a, key, smoke if a.smoke else gpu)
    if a.environment:
        return a
    if a.out is None:
        p.error("--out is required")
    a.names = [n for n in a.only.split(",") if n] or list(WORKLOADS)
    unknown = sorted(set(a.names) - set(WORKLOADS))
    if unknown:
        p.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    if a.fix_timeout_s is None and not a.skip_fix:
        a.fix_timeout_s = 2 * budget_s(a.budget) + 600
    return a


OPTIONS = ("budget", "skip_fix", "fix_args", "pin", "pairs", "warmup_steps", "calibration_steps", "window_s",
           "min_steps", "smoke")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.environment:
        print_environment()
        return 0
    if a.salvage:
        records = [salvaged(name, a) for name in a.names]
        doc = {
            "schema": SCHEMA,
            "goal_share_of_expert": GOAL,
            "workloads": records,
            "status": status(records),
        }
        (a.out / "fix_multi_gpu.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(table(records))
        print(doc["status"])
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    adopt_orphans()
    env = run_env(a.pin, a.smoke)
    doc: dict[str, Any] = {"schema": SCHEMA, "goal_share_of_expert": GOAL,
                           "share_definition": "(speedup - 1) / (expert speedup - 1)",
                           "environment": environment_of(a), "options": {k: getattr(a, k) for k in OPTIONS},
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workloads": []}  # fmt: skip
    for name in a.names:
        t0 = time.perf_counter()
        print(f"=== {name}", flush=True)
        try:
            record = one_workload(name, a, env)
        except Exception as err:  # one workload's failure must not lose the others' results
            record = {"workload": name, "control": name == CONTROL, "error": f"{type(err).__name__}: {err}"}
        record["wall_s"] = time.perf_counter() - t0
        doc["workloads"].append(record)
        doc["status"] = status(doc["workloads"])
        (a.out / "fix_multi_gpu.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(table([record]).splitlines()[-1], f"({record['wall_s']:.0f} s)", flush=True)
    print(table(doc["workloads"]))
    print(doc["status"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
