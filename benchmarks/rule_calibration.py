"""The rules' estimates against what fixing their cause measured: every fix that `gpudoctor fix` timed
and that a rule predicted, from `benchmarks/results/fix_vs_expert.json` (or fix directories'
`calibration.json`), and each planted case of the zoo against its hand-written fix
(`benchmarks/results/zoo_predicted_vs_real.json`, `--zoo`), grouped by rule, one case per workload (its
best fix); a fix that answers several findings judges their joint estimate (`a+b`). A rule is *systematically off* when at least `--min-cases` of its fixes were measured,
all on the same side of the prediction, and their median error is over `--points` percentage points:
then its estimate should change; anything less is noise or too little evidence.

    python3 benchmarks/rule_calibration.py [--from benchmarks/results/fix_vs_expert.json] [DIR ...]
        [--zoo benchmarks/results/zoo_predicted_vs_real.json | --no-zoo]
        [--out benchmarks/results/rule_calibration.json]

No GPU needed: it reads results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FROM = ROOT / "benchmarks" / "results" / "fix_vs_expert.json"
DEFAULT_ZOO = ROOT / "benchmarks" / "results" / "zoo_predicted_vs_real.json"


def joint_pct(savings: list[float]) -> float:
    """What removing several causes at once saves, each estimated alone: 1 − Π(1 − s). A fix answering
    several findings (torch.compile: launch overhead, host Python, unfused elementwise) removes them
    together, so its measurement judges their joint estimate, not each alone."""
    kept = 1.0
    for s in savings:
        kept *= 1 - min(max(s, 0.0), 100.0) / 100
    return 100 * (1 - kept)


def case(
    rules: list[str], fix: str, workload: str, device: Any, predicted: float, f: dict[str, Any]
) -> dict[str, Any]:
    return {"rule": "+".join(sorted(rules)), "fix": fix, "workload": workload, "device": device,
            "predicted_pct": predicted, "measured_pct": f["measured_pct"],
            "ci_low_pct": f.get("ci_low_pct"), "ci_high_pct": f.get("ci_high_pct")}  # fmt: skip


def cases_from_benchmark(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    cases = []
    for w in doc.get("workloads", []):
        device = (w.get("environment") or {}).get("device")
        own = w["fix"].get("findings")  # each rule's own estimate (results from before: the fix's largest)
        for f in w["fix"]["fixes"]:
            rules = list(f.get("rules") or ())
            if not rules or f.get("predicted_saving_pct") is None or f.get("measured_saving_pct") is None:
                continue
            predicted = joint_pct([own[r] for r in rules]) if own else f["predicted_saving_pct"]
            measured = {"measured_pct": f["measured_saving_pct"], "ci_low_pct": f.get("ci_low_pct"),
                        "ci_high_pct": f.get("ci_high_pct")}  # fmt: skip
            cases.append(case(rules, f["fix"], w["workload"], device, predicted, measured))
    return cases


def cases_from_zoo(path: Path) -> list[dict[str, Any]]:
    """Each planted case whose rule came first and promised a saving, against its expert fix timed
    unprofiled (the cases that are 0 by design — the same step both ways — say nothing here)."""
    doc = json.loads(path.read_text())
    env = doc.get("environment") or {}
    device = env.get("device") or env.get("device_name")
    return [
        case(
            [c["rule"]],
            "by hand",
            f"zoo:{c['rule']}",
            device,
            c["predicted_saving_pct"],
            {"measured_pct": c["measured_saving_pct"]},
        )
        for c in doc.get("cases", [])
        if c.get("top_finding") == c["rule"]
        and c.get("predicted_saving_pct")
        and c.get("measured_saving_pct") is not None
    ]


def cases_from_fix_dir(path: Path) -> list[dict[str, Any]]:
    """A fix directory's calibration.json: one entry per rule a fix answers, each with its own estimate;
    one case per fix, against their joint estimate."""
    doc = json.loads((path / "calibration.json").read_text())
    workload = Path(doc["argv"][0]).stem if doc.get("argv") else path.name
    by_fix: dict[str, list[dict[str, Any]]] = {}
    for e in doc.get("entries", []):
        if e.get("predicted_pct") is not None and e.get("measured_pct") is not None:
            by_fix.setdefault(e["fix"], []).append(e)
    return [
        case(
            [e["rule"] for e in es],
            fix,
            workload,
            doc.get("device"),
            joint_pct([e["predicted_pct"] for e in es]),
            es[0],
        )
        for fix, es in by_fix.items()
    ]


def best_per_workload(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One case per finding (or findings a fix answers together) and workload: the fix that saved the
    most. A finding promises what removing its cause saves; of the fixes that answer it (TF32 and
    bfloat16 for idle tensor cores, channels_last and cudnn.benchmark for a conv layout), the best
    measures that, and an alternative that does little is not evidence that the promise was too high."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in cases:
        key = (c["rule"], c["workload"], c.get("device"))
        if key not in best or c["measured_pct"] > best[key]["measured_pct"]:
            best[key] = c
    return list(best.values())


def judge(cases: list[dict[str, Any]], min_cases: int, points: float) -> dict[str, Any]:
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for c in best_per_workload(cases):
        by_rule.setdefault(c["rule"], []).append(c)
    rules = {}
    for rule, cs in sorted(by_rule.items()):
        errors = [c["measured_pct"] - c["predicted_pct"] for c in cs]
        median = statistics.median(errors)
        same_side = all(e > 0 for e in errors) or all(e < 0 for e in errors)
        off = len(cs) >= min_cases and same_side and abs(median) > points
        rules[rule] = {
            "cases": len(cs),
            "median_error_points": round(median, 1),
            "errors_points": [round(e, 1) for e in errors],
            "systematically_off": off,
            "verdict": (
                f"{'under' if median > 0 else 'over'}-estimates by {abs(median):.0f} points: change its estimate"
                if off
                else "within the evidence"
                if len(cs) >= min_cases
                else f"{len(cs)} case(s): too few to judge"
            ),
            "detail": [
                {
                    k: c.get(k)
                    for k in (
                        "workload",
                        "fix",
                        "device",
                        "predicted_pct",
                        "measured_pct",
                        "ci_low_pct",
                        "ci_high_pct",
                    )
                }
                for c in cs
            ],
        }
    return rules


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", type=Path, help="fix directories (their calibration.json)")
    p.add_argument("--from", dest="source", type=Path, default=None, help="a fix_vs_expert.json")
    p.add_argument("--zoo", type=Path, default=DEFAULT_ZOO, help="the zoo's predicted-vs-real results")
    p.add_argument("--no-zoo", action="store_true", help="leave the zoo out")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rule_calibration.json")
    p.add_argument("--min-cases", type=int, default=3)
    p.add_argument("--points", type=float, default=10.0)
    a = p.parse_args()
    source = a.source or (DEFAULT_FROM if not a.dirs else None)
    cases = cases_from_benchmark(source) if source else []
    for d in a.dirs:
        cases += cases_from_fix_dir(d)
    zoo = None if a.no_zoo or not a.zoo.is_file() else a.zoo
    if zoo is not None:
        cases += cases_from_zoo(zoo)
    rules = judge(cases, a.min_cases, a.points)
    named = [s for s in (source, zoo) if s is not None]
    doc = {"sources": [_shown(s) for s in [*named, *a.dirs]], "min_cases": a.min_cases,
           "points": a.points, "rules": rules}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    width = max((len(r) for r in rules), default=4)
    print(f"{'rule':{width}} {'cases':>5} {'median error':>13}  verdict")
    for rule, r in rules.items():
        print(f"{rule:{width}} {r['cases']:5d} {r['median_error_points']:+13.1f}  {r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
