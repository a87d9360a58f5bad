"""benchmarks/rule_calibration.py: a rule is systematically off only on enough cases, all on one side,
by more than the threshold."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("rule_calibration", ROOT / "benchmarks" / "rule_calibration.py")
assert spec is not None and spec.loader is not None
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


def case(rule: str, predicted: float, measured: float) -> dict[str, object]:
    return {
        "rule": rule,
        "fix": "compile",
        "workload": "w",
        "predicted_pct": predicted,
        "measured_pct": measured,
    }


def test_a_rule_off_on_the_same_side_in_enough_cases_is_systematically_off() -> None:
    rules = calibration.judge(
        [case("launch_overhead", 28, 54), case("launch_overhead", 28, 44), case("launch_overhead", 25, 40),
         case("tensor_cores_unused", 87, 90), case("tensor_cores_unused", 87, 82), case("tensor_cores_unused", 60, 75),
         case("optimizer_unfused", 52, 80)],
        min_cases=3,
        points=10.0,
    )  # fmt: skip
    off = rules["launch_overhead"]
    assert off["systematically_off"] and off["median_error_points"] == 16.0
    assert off["verdict"] == "under-estimates by 16 points: change its estimate"
    assert not rules["tensor_cores_unused"]["systematically_off"]  # both sides: noise, not a bias
    assert rules["tensor_cores_unused"]["verdict"] == "within the evidence"
    assert rules["optimizer_unfused"]["verdict"] == "1 case(s): too few to judge"


def test_the_committed_results_read() -> None:
    cases = calibration.cases_from_benchmark(ROOT / "benchmarks" / "results" / "fix_vs_expert.json")
    assert {c["rule"] for c in cases} >= {"tensor_cores_unused", "optimizer_unfused"}
    assert all(c["measured_pct"] is not None and c["predicted_pct"] is not None for c in cases)


def test_the_zoo_gives_one_case_per_planted_rule_that_promised_a_saving() -> None:
    cases = calibration.cases_from_zoo(ROOT / "benchmarks" / "results" / "zoo_predicted_vs_real.json")
    rules = [c["rule"] for c in cases]
    assert len(rules) == len(set(rules)) and {"unfused_elementwise", "optimizer_unfused"} <= set(rules)
    # the cases that are 0 by design (both variants run the same step) are left out
    assert "memory_pressure" not in rules and "profiler_distortion" not in rules
    assert all(c["predicted_pct"] > 0 and c["workload"].startswith("zoo:") for c in cases)
