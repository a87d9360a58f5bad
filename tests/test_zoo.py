"""The doctor on the zoo of planted bottlenecks recorded on the GPU (tests/fixtures/zoo, recorded by
tools/record_zoo.py): on each slow trace the first finding is the planted cause; the well-configured
controls get no critical or major finding. Each diagnosis gets the step time measured without the
profiler, as `gpudoctor run` would give it."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis.summary import analyze
from gpudoctor.rules import Diagnosis, Severity, diagnose
from gpudoctor.trace import load_trace
from gpudoctor.workloads import zoo

ZOO = Path(__file__).parent / "fixtures" / "zoo"
MANIFEST: dict[str, Any] = (
    json.loads((ZOO / "manifest.json").read_text()) if (ZOO / "manifest.json").exists() else {}
)
CASES = MANIFEST.get("cases", {})
CONTROLS = MANIFEST.get("controls", {})
pytestmark = pytest.mark.skipif(not MANIFEST, reason="no zoo recorded (tools/record_zoo.py on a GPU)")


@functools.cache
def diagnosis(file: str, unprofiled_us: float) -> Diagnosis:
    return diagnose(analyze(load_trace(ZOO / file), unprofiled_step_us=unprofiled_us))


def of(entry: dict[str, Any]) -> Diagnosis:
    return diagnosis(entry["file"], entry["unprofiled_step_us"]["median"])


@pytest.mark.parametrize("rule", sorted(CASES))
def test_the_planted_cause_comes_first(rule: str) -> None:
    d = of(CASES[rule]["slow"])
    assert d.findings, f"nothing found; bound: {d.bound}"
    assert d.findings[0].id == rule, [(f.id, f.est_saving_pct) for f in d.findings]


@pytest.mark.parametrize("rule", sorted(set(CASES) - {"memory_pressure", "profiler_distortion"}))
def test_the_fix_removes_or_shrinks_the_finding(rule: str) -> None:
    slow, fixed = of(CASES[rule]["slow"]).get(rule), of(CASES[rule]["fixed"]).get(rule)
    assert slow is not None
    assert fixed is None or fixed.est_saving_pct < slow.est_saving_pct / 2


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_controls_have_no_critical_or_major_finding(name: str) -> None:
    d = of(CONTROLS[name])
    serious = [
        (f.id, f.est_saving_pct) for f in d.findings if f.severity in (Severity.CRITICAL, Severity.MAJOR)
    ]
    assert not serious, d.bound
    assert d.bound.startswith("GPU-bound")


def test_every_rule_has_a_case() -> None:
    from gpudoctor.rules import RULES

    # these need several GPUs (docs/rules.md): data_parallel is checked on a synthetic trace,
    # communication_exposed and host_python on the DDP recording in tests/fixtures/ddp (test_rules.py),
    # the collectives' rules on the DDP recordings and crafted FSDP / pipeline traces (test_multi_gpu.py)
    several = {"data_parallel", "communication_exposed", "host_python", "comm_link_bound", "fsdp_exposed"}
    expected = {r.__name__ for r in RULES} - several - {"pipeline_bubble"}
    assert expected <= set(CASES)
    assert all(zoo.case(rule).rule == rule for rule in CASES)
