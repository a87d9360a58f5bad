"""Comparisons with significance, on seeded cost models: two identical functions are "same" and a real
3% improvement is "faster" in at least 19 of 20 trials (the acceptance bar, here without a GPU); too
few noisy samples are "ambiguous"; a saved baseline turns a significant slowdown into a regression."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpudoctor.timing import (
    BenchFileError,
    Measurement,
    Verdict,
    bench,
    check_regression,
    compare,
    load_measurements,
    save_measurements,
)
from gpudoctor.timing.compare import decide, match_baseline
from gpudoctor.timing.fakes import CostModel, FakeBackend, FakeClock, ScriptedSensor


def measure(
    base_us: float, seed: int, *, noise: float = 0.003, drift: float = 1.0, label: str = "f", **options
):
    clock = FakeClock()
    model = CostModel(base_us=base_us, noise=noise, drift=drift, seed=seed)
    return bench(lambda: None, backend=FakeBackend(model, clock), clock=clock, sensor=ScriptedSensor(clock),
                 label=label, host_latency=False, **options)  # fmt: skip


def run_to_run_drift(rng: np.random.Generator) -> float:
    return float(np.exp(rng.normal(0, 0.002)))  # clocks and temperature differ a little between runs


def test_identical_functions_are_same_in_19_of_20_trials() -> None:
    rng = np.random.default_rng(11)
    verdicts = [
        compare(measure(100, 2 * i, drift=run_to_run_drift(rng)), measure(100, 2 * i + 1, drift=run_to_run_drift(rng))).verdict
        for i in range(20)
    ]  # fmt: skip
    assert verdicts.count(Verdict.SAME) >= 19, verdicts


def test_a_real_3_percent_improvement_is_faster_in_19_of_20_trials() -> None:
    rng = np.random.default_rng(12)
    verdicts = [
        compare(measure(100, 2 * i, drift=run_to_run_drift(rng)), measure(97, 2 * i + 1, drift=run_to_run_drift(rng))).verdict
        for i in range(20)
    ]  # fmt: skip
    assert verdicts.count(Verdict.FASTER) >= 19, verdicts


def test_a_3_percent_slowdown_is_slower_with_its_ratio_and_interval() -> None:
    c = compare(measure(100, 1), measure(103, 2, label="g"))
    assert c.verdict is Verdict.SLOWER
    assert c.ratio == pytest.approx(1.03, abs=0.005)
    assert c.ci_low < c.ratio < c.ci_high and c.ci_low > 1
    assert c.p_value < 1e-6
    assert (c.baseline, c.candidate) == ("f", "g")
    assert c.speedup == pytest.approx(1 / c.ratio)


def test_few_noisy_samples_are_ambiguous() -> None:
    few = {"min_samples": 5, "max_samples": 5, "noise": 0.2}
    c = compare(measure(100, 1, **few), measure(103, 2, **few))
    assert c.verdict is Verdict.AMBIGUOUS


@pytest.mark.parametrize(
    ("ratio", "lo", "hi", "p", "expected"),
    [
        (1.002, 0.995, 1.008, 0.3, Verdict.SAME),
        (1.004, 1.002, 1.006, 0.001, Verdict.SAME),  # significant, but within ±1%: drift, not a change
        (0.97, 0.965, 0.975, 1e-9, Verdict.FASTER),
        (1.05, 1.04, 1.06, 1e-9, Verdict.SLOWER),
        (0.995, 0.985, 0.999, 0.01, Verdict.AMBIGUOUS),  # below 1 but the estimate is within ±1%
        (0.97, 0.90, 1.05, 0.2, Verdict.AMBIGUOUS),  # too noisy to tell
    ],
)
def test_the_decision_rule(ratio: float, lo: float, hi: float, p: float, expected: Verdict) -> None:
    assert decide(ratio, lo, hi, p, same_within=0.01, alpha=0.05) is expected


def test_comparing_across_devices_says_so() -> None:
    a = measure(100, 1)
    b = measure(100, 2)
    b = Measurement.from_json({**b.to_json(), "device_name": "Other GPU"})
    assert "different devices" in (compare(a, b).note or "")


# ---- baseline files and regressions ----
def test_saved_measurements_load_back(tmp_path: Path) -> None:
    ms = [measure(100, 1, label="a"), measure(50, 2, label="b")]
    path = save_measurements(tmp_path / "base.json", ms)
    assert load_measurements(path) == ms
    single = tmp_path / "one.json"
    single.write_text(json.dumps(ms[0].to_json()))
    assert load_measurements(single) == ms[:1]
    assert match_baseline(ms, "b") == ms[1] and match_baseline(ms, "zzz") is None


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not JSON"), ('{"schema": "other"}', "not a gpudoctor benchmark file"),
     ('{"schema": "gpudoctor.bench", "measurements": 3}', "not a list"),
     ('{"schema": "gpudoctor.bench", "measurements": [{"schema": "gpudoctor.measurement", "schema_version": 99}]}',
      "schema version")],
)  # fmt: skip
def test_bad_baseline_files_are_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BenchFileError, match=message):
        load_measurements(path)
    with pytest.raises(BenchFileError, match="no such file"):
        load_measurements(tmp_path / "missing.json")


def test_a_significant_slowdown_beyond_the_threshold_is_a_regression() -> None:
    base = measure(100, 1)
    check = check_regression(base, measure(108, 2), threshold=0.05)
    assert check.regressed
    assert "regression" in check.message and "+8" in check.message


def test_a_slowdown_within_the_threshold_or_a_speedup_is_not() -> None:
    base = measure(100, 1)
    assert not check_regression(base, measure(103, 2), threshold=0.05).regressed
    assert not check_regression(base, measure(90, 3), threshold=0.05).regressed
    assert not check_regression(base, measure(100, 4), threshold=0.0).regressed


def test_a_small_threshold_is_not_hidden_by_the_same_band() -> None:
    check = check_regression(measure(100, 1), measure(100.8, 2), threshold=0.005)
    assert check.regressed
