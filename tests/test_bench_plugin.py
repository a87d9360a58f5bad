"""The `gpudoctor_bench` pytest fixture, run inside pytester sessions: it returns a Measurement labelled
with the test's id, saves every measurement with --gpudoctor-save, and with --gpudoctor-compare fails a
test that is significantly slower than its baseline by more than --gpudoctor-threshold."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gpudoctor.timing import load_measurements, save_measurements
from gpudoctor.timing import pytest_plugin as plugin

pytest_plugins = ["pytester"]

# Imported here, before any in-process pytester run: pytester drops the modules a run imported, and
# torch (like numpy) cannot be imported a second time in one process.
torch = pytest.importorskip("torch")

TEST_FILE = """
def test_loop(gpudoctor_bench):
    m = gpudoctor_bench(lambda: sum(range(N)), device="cpu", min_time_s=0.01, timeout_s=0.3, min_samples=5)
    assert m.median_us > 0
    assert m.label.endswith("test_loop")

def test_two(gpudoctor_bench):
    a = gpudoctor_bench(lambda: 1 + 1, name="a", device="cpu", min_time_s=0.0, timeout_s=0.2)
    assert a.label.endswith("test_two[a]")
"""


@pytest.fixture
def args() -> list[str]:
    """-p for the plugin unless its pytest11 entry point loads it anyway (gpudoctor installed)."""
    installed = any(ep.value == plugin.__name__ for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", plugin.__name__]


def write_tests(pytester: pytest.Pytester, n: int) -> None:
    pytester.makepyfile(test_speed=f"N = {n}\n" + TEST_FILE)


def test_the_fixture_measures_and_saves(pytester: pytest.Pytester, args: list[str]) -> None:
    write_tests(pytester, 100)
    out = pytester.path / "bench.json"
    result = pytester.runpytest_inprocess(*args, "--gpudoctor-save", str(out))
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*gpudoctor benchmarks*", "*test_loop: *samples*"])
    labels = [m.label for m in load_measurements(out)]
    assert labels == ["test_speed.py::test_loop", "test_speed.py::test_two[a]"]


def test_a_regression_against_the_baseline_fails_the_test(pytester: pytest.Pytester, args: list[str]) -> None:
    write_tests(pytester, 100)
    base = pytester.path / "base.json"
    pytester.runpytest_inprocess(*args, "--gpudoctor-save", str(base)).assert_outcomes(passed=2)
    # the loop gets 30 times longer: test_loop must fail, test_two (unchanged, loose threshold) must pass.
    # The threshold is 200%: a 33 ns lambda read 1.57x its baseline once on a loaded host (session 38)
    write_tests(pytester, 3000)
    result = pytester.runpytest_inprocess(
        *args, "--gpudoctor-compare", str(base), "--gpudoctor-threshold", "2.0"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_loop*regression*slower than the baseline*"])


def test_a_test_missing_from_the_baseline_is_only_measured(
    pytester: pytest.Pytester, args: list[str], tmp_path: Path
) -> None:
    write_tests(pytester, 100)
    empty = save_measurements(tmp_path / "empty.json", [])
    result = pytester.runpytest_inprocess(*args, "--gpudoctor-compare", str(empty))
    result.assert_outcomes(passed=2)


def test_an_unreadable_baseline_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], tmp_path: Path
) -> None:
    write_tests(pytester, 100)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "nope"}))
    result = pytester.runpytest_inprocess(*args, "--gpudoctor-compare", str(bad))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpudoctor-compare*not a gpudoctor benchmark file*"])
