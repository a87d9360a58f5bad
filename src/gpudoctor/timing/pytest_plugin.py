"""pytest plugin: the `gpudoctor_bench` fixture times a function with `gpudoctor.timing.bench`, keeps
the measurement for `--gpudoctor-save FILE`, and, with `--gpudoctor-compare FILE`, fails the test when it
is significantly slower than the saved baseline by more than `--gpudoctor-threshold` (default 5%).
Registered through the `pytest11` entry point; `-p gpudoctor.timing.pytest_plugin` loads it explicitly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.timing.compare import REGRESSION_THRESHOLD, RegressionCheck, check_regression, match_baseline
from gpudoctor.timing.measurement import BenchFileError, Measurement, load_measurements, save_measurements


@dataclass
class _Session:
    baseline: list[Measurement] | None
    threshold: float
    save_path: Path | None
    measurements: list[Measurement] = field(default_factory=list)
    checks: list[RegressionCheck] = field(default_factory=list)


_STATE = pytest.StashKey[_Session]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpudoctor", "gpudoctor benchmarks (the gpudoctor_bench fixture)")
    group.addoption(
        "--gpudoctor-save", metavar="FILE", help="Save every gpudoctor_bench measurement to FILE."
    )
    group.addoption(
        "--gpudoctor-compare",
        metavar="FILE",
        help="Compare each measurement with the one of the same name in FILE; fail on a regression.",
    )
    group.addoption(
        "--gpudoctor-threshold",
        metavar="FRACTION",
        type=float,
        default=REGRESSION_THRESHOLD,
        help="A significant slowdown beyond this fraction fails the test (default %(default)s).",
    )


def pytest_configure(config: pytest.Config) -> None:
    compare = config.getoption("--gpudoctor-compare", None)
    save = config.getoption("--gpudoctor-save", None)
    try:
        baseline = load_measurements(compare) if compare else None
    except BenchFileError as err:
        raise pytest.UsageError(f"--gpudoctor-compare: {err}") from None
    config.stash[_STATE] = _Session(
        baseline=baseline,
        threshold=config.getoption("--gpudoctor-threshold", REGRESSION_THRESHOLD),
        save_path=Path(save) if save else None,
    )


class BenchFixture:
    """Call it like `gpudoctor.timing.bench`: `gpudoctor_bench(fn, *args, name=None, **options)`. The
    measurement's label is the test's node id (with `[name]` for several in one test)."""

    def __init__(self, node_id: str, session: _Session) -> None:
        self._node_id = node_id
        self._session = session

    def __call__(
        self, fn: Callable[..., object], *args: Any, name: str | None = None, threshold: float | None = None,
        **options: Any,
    ) -> Measurement:  # fmt: skip
        from gpudoctor.timing.api import bench

        label = f"{self._node_id}[{name}]" if name else self._node_id
        m = bench(fn, *args, label=label, **options)
        self._session.measurements.append(m)
        base = match_baseline(self._session.baseline, label) if self._session.baseline else None
        if base is not None:
            check = check_regression(base, m, self._session.threshold if threshold is None else threshold)
            self._session.checks.append(check)
            if check.regressed:
                pytest.fail(f"gpudoctor: {check.message}", pytrace=False)
        return m


@pytest.fixture
def gpudoctor_bench(request: pytest.FixtureRequest) -> BenchFixture:
    """Time a function correctly (GPU or CPU) and check it against the saved baseline, if any."""
    return BenchFixture(request.node.nodeid, request.config.stash[_STATE])


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(_STATE, None)
    if session is None or not session.measurements:
        return
    from gpudoctor.util.units import fmt_us

    terminalreporter.section("gpudoctor benchmarks")
    checks = {c.comparison.candidate: c for c in session.checks}
    for m in session.measurements:
        s = m.stats
        line = f"{m.label}: {fmt_us(s.median)} ±{s.rel_ci:.2%} ({m.device_name}, {m.method}, {s.n} samples)"
        if m.label in checks:
            line += f" — {checks[m.label].message.split(': ', 1)[1]}"
        terminalreporter.write_line(line)
    if session.save_path:
        terminalreporter.write_line(f"saved to {session.save_path}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is not None and state.save_path and state.measurements:
        save_measurements(state.save_path, state.measurements)
