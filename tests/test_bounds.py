"""Bounds that can be reached: no finding promises more than its fix can remove on the workload — on the
recorded fixtures, with and without step markers. `small_batch` needs a batch dimension and kernels that
under-fill the GPU, and the GPU's wait for launches is claimed once between it and `launch_overhead`."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.rules import Diagnosis, diagnose
from gpudoctor.rules.facts import facts_of
from gpudoctor.trace import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
ZOO = FIXTURES / "zoo"
ZOO_CASES: dict[str, Any] = json.loads((ZOO / "manifest.json").read_text())["cases"]
TRACES = FIXTURES / "traces"
TRACE_FIXTURES: dict[str, Any] = json.loads((TRACES / "manifest.json").read_text())["fixtures"]
# Findings whose fix only removes GPU idle time: none may promise more than the step's idle share.
IDLE_ONLY = ("input_pipeline", "launch_overhead", "host_python", "host_sync", "data_parallel")


@functools.cache
def _analysis(path: Path, unprofiled_us: float | None) -> Analysis:
    return analyze(load_trace(path), unprofiled_step_us=unprofiled_us)


def _slow(rule: str) -> tuple[Path, float]:
    slow = ZOO_CASES[rule]["slow"]
    return ZOO / slow["file"], slow["unprofiled_step_us"]["median"]


def _recorded() -> list[tuple[Path, float]]:
    zoo = [_slow(rule) for rule in sorted(ZOO_CASES)]
    traces = [(TRACES / e["file"], e["unprofiled_step_us"]["median"]) for e in TRACE_FIXTURES.values()]
    return zoo + traces


def _stripped(path: Path, tmp_path: Path) -> Path:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    out = tmp_path / path.name.removesuffix(".gz")
    out.write_text(json.dumps({**doc, "traceEvents": events}))
    return out


def _check_bounds(a: Analysis, d: Diagnosis) -> None:
    f = facts_of(a)
    assert f is not None
    idle_pct = f.pct(f.idle_us)
    for finding in d.findings:
        if finding.id in IDLE_ONLY:
            assert finding.est_saving_pct <= idle_pct + 0.1, (finding.id, finding.est_saving_pct, idle_pct)
    # The GPU's wait for launches is one time: small_batch's share of it and launch_overhead's add up to
    # at most all of it (plus, for small_batch, the under-filled kernels' unused share).
    small, launch = d.get("small_batch"), d.get("launch_overhead")
    if small is not None:
        claimed = f.pct(small.values["unused_us"] + f.launch_wait_us)
        assert small.est_saving_pct + (launch.est_saving_pct if launch else 0.0) <= claimed + 0.2


@pytest.mark.parametrize(("path", "unprofiled"), _recorded(), ids=lambda v: getattr(v, "stem", ""))
def test_no_finding_promises_more_than_its_fix_can_remove(
    path: Path, unprofiled: float, tmp_path: Path
) -> None:
    for trace in (path, _stripped(path, tmp_path)):
        a = _analysis(trace, unprofiled)
        _check_bounds(a, diagnose(a))


def test_the_launch_wait_goes_to_the_batch_where_kernels_are_under_filled() -> None:
    # GIVEN the zoo's batch-4 ResNet step: 267 launches of kernels using ~40% of the SMs, the GPU waiting
    # for the host most of the step
    a = _analysis(*_slow("small_batch"))
    d = diagnose(a)
    small, launch = d.get("small_batch"), d.get("launch_overhead")
    assert small is not None and launch is not None
    # THEN small_batch comes first: a batch that fills the GPU (1/fill larger) removes the kernels'
    # unused share and spreads that share of the launch wait over more samples, saying why it applies
    assert d.findings[0].id == "small_batch"
    fill = small.values["sm_fill"]
    assert "an optimizer step" in small.evidence[0] and "convolutions" in small.evidence[0]
    assert f"{1 / fill:.1f}× larger" in small.evidence[1]
    assert small.values["amortized_launch_wait_us"] == pytest.approx(
        facts_of(a).launch_wait_us * (1 - fill), rel=1e-3
    )  # type: ignore[union-attr]
    # AND launch_overhead claims only the rest of that wait, and says so
    assert "this finding claims the rest" in launch.evidence[-1]


def test_small_batch_needs_a_batch_dimension() -> None:
    # GIVEN the same analysis, had nothing in the trace shown a batch (a loop of plain tensor ops)
    a = _analysis(*_slow("small_batch"))
    plain = dataclasses.replace(a, batch_evidence=())
    d, before = diagnose(plain), diagnose(a)
    # THEN there is no small_batch, and the whole wait for launches is launch_overhead's again
    assert d.get("small_batch") is None
    launch, shared = d.get("launch_overhead"), before.get("launch_overhead")
    assert launch is not None and shared is not None
    assert launch.est_saving_pct > shared.est_saving_pct
    assert d.findings[0].id == "launch_overhead"


def test_the_zoo_launch_bound_loop_has_no_batch_to_grow() -> None:
    # GIVEN the zoo's launch-bound loop: ~120 tiny kernels launched from Python, no model, no loader,
    # no optimizer THEN nothing shows a batch dimension, and no finding is about the batch
    a = _analysis(*_slow("launch_overhead"))
    assert a.batch_evidence == ()
    assert diagnose(a).get("small_batch") is None


def test_an_analysis_saved_before_batch_evidence_is_judged_as_before() -> None:
    # GIVEN an analysis.json without the batch evidence (unknown) THEN small_batch still applies
    doc = _analysis(*_slow("small_batch")).to_json()
    del doc["batch_evidence"]
    old = Analysis.from_json(json.loads(json.dumps(doc)))
    assert old.batch_evidence is None and diagnose(old).get("small_batch") is not None
