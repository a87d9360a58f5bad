"""The noise floor of `gpudoctor fix` on real workloads: per workload of
benchmarks/fix_workloads, (1) plain sequential processes — the script as written, timed by
plain_timer.py (CUDA-synchronized windows, no gpudoctor harness), one after another — and (2) `gpudoctor
fix --aa` on it: the harness's own rounds of the unchanged script and of a patch that changes nothing
(A B, B A, … forked from the fork server), fresh-interpreter rounds beside them, and the no-op switched
in blocks of one process. Records each side's mean step per process and their spread, the live no-op
verdicts, and the false-positive rate of ≥ 200 A/A comparisons resampled from the recorded processes and
blocks; `--merge` pools the workloads (the acceptance: harness spread ≤ 2× plain on each, pooled
false-positive rate ≤ 5%, no live no-op called faster or slower).

    PYTHONPATH=src python3 benchmarks/aa_noise.py --out $OUT/aa --only hf_trainer_bert,timm_convnext_fp32
    PYTHONPATH=src python3 benchmarks/aa_noise.py --out $OUT/aa --only '' --script benchmarks/outside/accelerate_timm.py
    .venv/bin/python benchmarks/aa_noise.py --out /tmp/aa --smoke --only item_logging        # the CPU path
    PYTHONPATH=src python3 benchmarks/aa_noise.py --merge DIR [--into benchmarks/results/aa_noise.json]

Writes $OUT/aa_noise_<name>.json as each workload ends (a workload that fails is recorded with its
error, the others go on) and $OUT/aa_noise.json with all of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fix_vs_expert import ROOT, TIMER, WORKLOADS_DIR, env, environment

DEFAULT = ("hf_trainer_bert", "timm_convnext_fp32", "torchvision_augment", "item_logging", "gpt2_train")
SPREAD_GOAL = 2.0  # the harness's spread at most twice the plain processes'
FPR_GOAL = 0.05


def spread(means: list[float], to_ms: float) -> dict[str, Any] | None:
    """Processes' mean steps (`to_ms` converts them to ms), and how far apart they are."""
    if len(means) < 2:
        return None
    mid = statistics.median(means)
    return {
        "processes": len(means),
        "mean_step_ms": [m * to_ms for m in means],
        "spread_pct": 100 * (max(means) - min(means)) / mid,
        "cv_pct": 100 * statistics.stdev(means) / statistics.fmean(means),
    }


def script_of(name: str, a: argparse.Namespace) -> list[str]:
    """The command line of workload `name`: a script given with `--script` (named by its file's stem,
    run as it is), else benchmarks/fix_workloads/NAME.py (with `--small` under `--smoke`)."""
    given = {Path(s).stem: Path(s).resolve() for s in getattr(a, "script", None) or []}
    if name in given:
        return [str(given[name])]
    return [str(WORKLOADS_DIR / f"{name}.py"), *(["--small"] if a.smoke else [])]


def plain_processes(name: str, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """The script as written, `--plain` times in a row, each a fresh interpreter timed by plain_timer."""
    means, errors = [], []
    for k in range(a.plain):
        target = out / "plain" / f"{name}-{k}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(TIMER), "--out", str(target), "--warmup", str(a.timer_warmup),
               "--window-s", str(a.window_s), "--windows", str(a.windows), "--", *script_of(name, a)]  # fmt: skip
        proc = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, check=False)
        if target.exists() and json.loads(target.read_text()).get("step_s"):
            means.append(json.loads(target.read_text())["step_s"])
        else:
            errors.append((proc.stdout + proc.stderr)[-600:])
    return {"spread": spread(means, 1e3), "errors": errors}


def harness(name: str, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """`gpudoctor fix --aa` on the script, as a user runs it; its aa.json."""
    aa_dir = out / "fix" / name
    cmd = [sys.executable, "-m", "gpudoctor", "fix", "--aa", "--out", str(aa_dir), "--rounds", str(a.rounds),
           "--blocks", str(a.blocks), "--block-s", str(a.block_s)]  # fmt: skip
    if a.smoke:
        cmd += [
            "--warmup",
            "2",
            "--steps",
            "5",
            "--warmup-s",
            "0",
            "--steps-s",
            "0.5",
            "--child-timeout",
            "300",
        ]
    cmd += script_of(name, a)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, check=False)
    (out / f"aa_{name}.log").write_text(proc.stdout + proc.stderr)
    report = aa_dir / "aa.json"
    if not report.exists():
        return {
            "error": f"gpudoctor fix --aa wrote no report (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-600:]}"
        }
    doc = json.loads(report.read_text())
    return {"aa": doc, "wall_s": time.perf_counter() - t0}


def summarize(name: str, plain: dict[str, Any], h: dict[str, Any]) -> dict[str, Any]:
    aa = h.get("aa") or {}
    hs = aa.get("harness") or {}
    harness_spread = spread(list(hs.get("means_us") or []), 1e-3)
    plain_spread = plain["spread"]
    ratio = ratios(harness_spread, plain_spread)
    live = {k: (aa.get(k) or {}).get("verdict") for k in ("processes", "blocks")}
    return {
        "workload": name,
        "plain": plain,
        "harness": harness_spread,
        "harness_fresh_interpreters": spread(list((aa.get("plain") or {}).get("means_us") or []), 1e-3),
        "spread_ratio": ratio,
        "meets_spread_goal": ratio is not None and ratio <= SPREAD_GOAL,
        "live_no_op_verdicts": live,
        "live_false_verdicts": sum(v in ("faster", "slower") for v in live.values()),
        "false_positives": aa.get("false_positives") or [],
        "aa_notes": aa.get("notes") or [],
        "aa_wall_s": h.get("wall_s"),
        "error": h.get("error"),
    }


def ratios(harness: dict[str, Any] | None, plain: dict[str, Any] | None) -> float | None:
    """The harness's spread over the plain processes' at equal counts (`fixes.attempt.spread_ratio`: the
    range of 8 processes is wider than that of 4 drawn alike), and beside it in the harness's record the
    ratio of their coefficients of variation."""
    if not harness or not plain:
        return None
    from gpudoctor.fixes.attempt import spread_ratio

    cv_h, cv_p = harness.get("cv_pct"), plain.get("cv_pct")
    harness["cv_ratio"] = cv_h / cv_p if cv_h and cv_p else None
    harness["raw_range_ratio"] = harness["spread_pct"] / plain["spread_pct"] if plain["spread_pct"] else None
    return spread_ratio(harness["mean_step_ms"], plain["mean_step_ms"])


def pooled(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    """Every workload's resampled A/A comparisons together, per unit and over all."""
    by_unit: dict[str, list[float]] = {}
    for w in workloads:
        for f in w.get("false_positives") or []:
            counts = by_unit.setdefault(f["unit"], [0.0, 0.0])
            counts[0] += f["rate"] * f["comparisons"]
            counts[1] += f["comparisons"]
    false, total = sum(c[0] for c in by_unit.values()), sum(c[1] for c in by_unit.values())
    return {
        "by_unit": {
            u: {"comparisons": int(n), "false_positive_rate": k / n if n else None}
            for u, (k, n) in by_unit.items()
        },
        "comparisons": int(total),
        "false_positive_rate": false / total if total else None,
        "meets_fpr_goal": bool(total >= 200 and false / total <= FPR_GOAL),
        "live_false_verdicts": sum(w.get("live_false_verdicts") or 0 for w in workloads),
        "workloads_meeting_spread_goal": [w["workload"] for w in workloads if w.get("meets_spread_goal")],
    }


def merge(runs: Path, into: Path) -> None:
    doc = json.loads(into.read_text()) if into.exists() else {}
    by_name = {w["workload"]: w for w in doc.get("workloads", [])}
    for path in sorted(runs.rglob("aa_noise_*.json")):
        w = json.loads(path.read_text())
        if w.get("smoke") or (w.get("environment") or {}).get("device") in (None, "cpu"):
            print(f"{path}: a smoke or CPU run, left out")
            continue
        by_name[w["workload"]] = w
    workloads = list(by_name.values())
    for w in workloads:  # the ratios as this tree computes them
        w["spread_ratio"] = ratios(w.get("harness"), (w.get("plain") or {}).get("spread"))
        w["meets_spread_goal"] = w["spread_ratio"] is not None and w["spread_ratio"] <= SPREAD_GOAL
    doc.update(goals={"spread_ratio": SPREAD_GOAL, "false_positive_rate": FPR_GOAL}, workloads=workloads,
               pooled=pooled(workloads))  # fmt: skip
    into.write_text(json.dumps(doc, indent=1) + "\n")
    for w in workloads:
        print(_line(w))
    print(json.dumps(doc["pooled"]))


def _line(w: dict[str, Any]) -> str:
    if w.get("error"):
        return f"{w['workload']}: failed: {str(w['error'])[:300]}"
    p, h = (w.get("plain") or {}).get("spread"), w.get("harness")
    fp = ", ".join(
        f"{f['unit']} ×{f.get('pairs', '?')} {100 * f['rate']:.1f}% of {f['comparisons']}"
        for f in w.get("false_positives") or []
    )
    return (
        (
            f"{w['workload']}: harness {h['spread_pct']:.1f}% apart"
            if h
            else f"{w['workload']}: harness not measured"
        )
        + (
            f", plain {p['spread_pct']:.1f}% (ratio at equal counts {w['spread_ratio']:.2f}"
            f", of CVs {h.get('cv_ratio') or float('nan'):.2f})"
            if p and w.get("spread_ratio")
            else ""
        )
        + f"; live no-op verdicts {w.get('live_no_op_verdicts')}; false positives: {fp}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--only", default=None,
                   help=f"comma-separated workloads (default: {','.join(DEFAULT)}; '' for none)")  # fmt: skip
    p.add_argument("--script", action="append", default=[], type=Path,
                   help="a training script of one's own (any path; repeatable), named by its file's stem")  # fmt: skip
    p.add_argument("--plain", type=int, default=4, help="plain sequential processes per workload")
    p.add_argument("--rounds", type=int, default=4, help="gpudoctor fix --aa --rounds (process pairs)")
    p.add_argument("--blocks", type=int, default=8, help="gpudoctor fix --aa --blocks (pairs, recorded 3×)")
    p.add_argument("--block-s", type=float, default=0.5)
    p.add_argument("--timer-warmup", type=int, default=8)
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny models (--small), short rounds: the CPU path")
    p.add_argument("--merge", type=Path, help="only merge the workloads measured under this folder …")
    p.add_argument("--into", type=Path, default=ROOT / "benchmarks" / "results" / "aa_noise.json",
                   help="… into this results file")  # fmt: skip
    a = p.parse_args()
    if a.merge:
        merge(a.merge, a.into)
        return 0
    if a.out is None:
        p.error("--out is required")
    names = list(DEFAULT) if a.only is None else [n for n in a.only.split(",") if n]
    unknown = [n for n in names if not (WORKLOADS_DIR / f"{n}.py").is_file()]
    if unknown:
        p.error(f"unknown workloads {unknown}")
    missing = [str(s) for s in a.script if not s.is_file()]
    if missing:
        p.error(f"no such script: {', '.join(missing)}")
    stems = [s.stem for s in a.script]
    if len(set(stems + names)) < len(stems) + len(names):
        p.error("two workloads of one name (a script's file stem names it)")
    names += stems
    if not names:
        p.error("no workload: name some with --only or --script")
    if a.smoke:
        a.block_s, a.window_s, a.windows, a.timer_warmup = 0.1, 0.3, 2, 3
    a.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        try:
            result = summarize(name, plain_processes(name, a.out, a), harness(name, a.out, a))
        except Exception as err:  # one workload's failure must not lose the others' results
            result = {"workload": name, "error": f"{type(err).__name__}: {err}"}
        command = [
            str(Path(c).relative_to(ROOT)) if Path(c).is_relative_to(ROOT) else c for c in script_of(name, a)
        ]
        result.update(wall_s=time.perf_counter() - t0, environment=environment(), smoke=a.smoke, command=command,
                      options={k: getattr(a, k) for k in ("plain", "rounds", "blocks", "block_s", "windows")})  # fmt: skip
        (a.out / f"aa_noise_{name}.json").write_text(json.dumps(result, indent=1))
        print(_line(result), flush=True)
    found = [json.loads(f.read_text()) for f in sorted(a.out.glob("aa_noise_*.json"))]
    (a.out / "aa_noise.json").write_text(json.dumps({"workloads": found, "pooled": pooled(found)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
