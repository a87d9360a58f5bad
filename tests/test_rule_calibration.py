"""benchmarks/rule_calibration.py: a rule is systematically off only on enough cases, all on one side,
by more than the threshold."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("rule_calibration", ROOT / "benchmarks" / "rule_calibration.py")
assert spec is not None and spec.loader is not None
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


def case(
    rule: str, predicted: float, measured: float, workload: str = "", fix: str = "compile"
) -> dict[str, object]:
    return {
        "rule": rule,
        "fix": fix,
        "workload": workload or f"w{predicted}{measured}",
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


def test_a_rule_is_judged_by_the_best_of_the_fixes_that_answer_it_per_workload() -> None:
    # channels_last saved 14% of ResNet-50's step on the H100, cudnn.benchmark nothing: one case, 14%
    conv = [case("conv_layout", 30.5, 14.3, "convnet", "channels_last"),
            case("conv_layout", 30.5, -0.8, "convnet", "cudnn_benchmark"),
            case("conv_layout", 45.8, 33.9, "zoo")]  # fmt: skip
    rules = calibration.judge(conv, min_cases=3, points=10.0)
    assert rules["conv_layout"]["cases"] == 2 and rules["conv_layout"]["errors_points"] == [-16.2, -11.9]
    assert rules["conv_layout"]["verdict"] == "2 case(s): too few to judge"


def test_a_fix_answering_several_findings_judges_their_joint_estimate(tmp_path: Path) -> None:
    # CUDA graphs answered launch overhead (10.9%) and host Python (28.6%) on the Lightning fit at once
    assert calibration.joint_pct([10.9, 28.6]) == pytest.approx(100 * (1 - 0.891 * 0.714))
    assert calibration.joint_pct([40.0]) == pytest.approx(40.0)
    results = {"workloads": [{"workload": "lightning_fit", "environment": {"device": "H100"},
                              "fix": {"findings": {"launch_overhead": 10.9, "host_python": 28.6},
                                      "fixes": [{"fix": "compile:reduce-overhead", "rules": ["launch_overhead", "host_python"],
                                                 "predicted_saving_pct": 28.6, "measured_saving_pct": 51.8}]}}]}  # fmt: skip
    path = tmp_path / "fve.json"
    path.write_text(json.dumps(results))
    (c,) = calibration.cases_from_benchmark(path)
    assert c["rule"] == "host_python+launch_overhead" and c["predicted_pct"] == pytest.approx(36.4, abs=0.1)


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
