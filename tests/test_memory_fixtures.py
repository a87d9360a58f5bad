"""The memory analysis on what `gpudoctor run` recorded on a GPU for the planted cases of
benchmarks/memory_cases (tools/record_memory.py → tests/fixtures/memory/<case>/: the run's memory record
and torch's allocator snapshots). Each planted cause is the first memory finding; a step's categories
account for its measured peak; the lines and modules named are the planted ones. Skipped until the
fixtures are recorded (the synthetic snapshots of test_memory_analysis.py cover the logic meanwhile)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.analysis.memory_breakdown import repeated_blocks
from gpudoctor.analysis.memory_run import MemoryAnalysis, analyze_memory
from gpudoctor.rules.memory_registry import memory_findings
from gpudoctor.runner.rundir import read_snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "memory"
MANIFEST = FIXTURES / "manifest.json"
CASES = json.loads(MANIFEST.read_text())["cases"] if MANIFEST.is_file() else {}
needs_fixtures = pytest.mark.skipif(not CASES, reason="record them on a GPU: tools/record_memory.py")


def analysis_of(case: str) -> MemoryAnalysis:
    folder = FIXTURES / case
    run: dict[str, Any] = json.loads((folder / "memory_run.json").read_text())
    snapshots = {
        name: read_snapshot(folder, meta["file"]) for name, meta in (run.get("snapshots") or {}).items()
    }
    timeline = read_snapshot(folder, (run.get("timeline") or {}).get("file"))
    if isinstance(run.get("oom"), dict) and run.get("error"):
        run["oom"] = {**run["oom"], "message": run["error"]}
    return analyze_memory(run, {k: v for k, v in snapshots.items() if v is not None}, timeline)


@needs_fixtures
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_planted_cause_is_the_first_memory_finding(case: str) -> None:
    findings = memory_findings(analysis_of(case))
    assert findings and findings[0].id == CASES[case]["expected_first"], [f.id for f in findings]


# The leak recording (H100, 2026-11-25) was made while the light phase read the allocator's statistics in
# groups and its last group went unread: the detail step's number was one off there (fixed since in
# runner.capture; `tools/record_memory.py --only leak` re-records it, and this mark must then go).
STALE: dict[str, str] = {}  # case -> why its recording is known to be out of date


@needs_fixtures
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=STALE[c])) if c in STALE else c
        for c in sorted(c for c in CASES if c != "oom")
    ],
)
def test_the_categories_account_for_the_measured_peak_of_the_detail_step(case: str) -> None:
    m = analysis_of(case)
    b = m.breakdown
    assert b is not None and b.step is not None
    measured = next(s.peak_allocated for s in m.steps if s.step == b.step)
    assert b.peak == measured  # the allocator's own peak; the replay's rounding is `unattributed`
    assert b.categories["unattributed"] <= 0.05 * measured


@needs_fixtures
def test_gpt2s_parameters_and_adamw_state_are_found_at_their_addresses() -> None:
    m = analysis_of("gpt2")
    assert m.census is not None and m.breakdown is not None
    params = 124_439_808 * 4  # GPT-2 small, the head tied to the token embedding
    assert m.census.parameters == pytest.approx(params, rel=0.01)
    assert m.census.optimizer_state == pytest.approx(2 * params, rel=0.01)
    assert m.breakdown.categories["parameters"] == pytest.approx(m.census.parameters, rel=0.02)
    assert m.breakdown.categories["optimizer_state"] == pytest.approx(m.census.optimizer_state, rel=0.02)
    blocks = repeated_blocks(m.breakdown.modules)
    assert {x.type for x in blocks} == {"GPT2Block"} and len(blocks) == 12


@needs_fixtures
def test_the_oom_names_the_tensor_kinds_and_the_line() -> None:
    m = analysis_of("oom")
    assert m.oom is not None and m.oom.failing_line is not None
    assert "lm.py" in m.oom.failing_line or "train_lm.py" in m.oom.failing_line
    held = {c: b for c, b in m.oom.categories.items() if b}
    assert max(held, key=held.__getitem__) == "activations"
    finding = memory_findings(m)[0]
    assert "activations" in finding.evidence[1] and "batch" in " ".join(finding.evidence)


@needs_fixtures
def test_the_leak_names_the_logging_line_and_its_bytes_per_step() -> None:
    m = analysis_of("leak")
    assert m.leak is not None and m.leak.sites
    assert m.leak.sites[0].site.startswith("memory_cases/leak.py:")
    assert m.leak.sites[0].bytes == pytest.approx(m.leak.bytes_per_step, rel=0.1)


@needs_fixtures
def test_fragmentation_is_reserved_far_above_allocated() -> None:
    f = analysis_of("fragmentation").fragmentation
    assert f is not None and f.peak_reserved - f.peak_allocated >= 0.25 * f.peak_reserved
