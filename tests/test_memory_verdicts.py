"""Memory verdicts that promise only what they know: an out-of-memory error's batch that fits is an upper
bound that counts what the step had yet to allocate, and a leak names the script's line that keeps what
another line allocated (analysis.keeping), where the run recorded the script's text."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor.analysis.keeping import keeping_line
from gpudoctor.analysis.memory_breakdown import CATEGORIES
from gpudoctor.analysis.memory_run import SCHEMA, MemoryAnalysis, OomReport, analyze_memory
from gpudoctor.rules.memory_registry import memory_findings
from gpudoctor.runner.rundir import read_snapshot

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[1]
LEAK = REPO / "tests" / "fixtures" / "memory" / "leak"

LOOP = """\
import torch
logged = []
cache = {}
for step in range(10):
    out = model(x)
    loss = out.sum()
    logged.append(out)
    cache[step] = loss
    kept = [model(x)]
    history.append(model(x))
"""


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        (5, 7),  # out = model(x) ... logged.append(out)
        (6, 8),  # loss = out.sum() ... cache[step] = loss
        (10, 10),  # history.append(model(x)): the allocating line keeps it itself
        (1, None),  # import torch: nothing allocated, nothing kept
        (9, None),  # a list literal assigned to a fresh name each step: not stored anywhere
    ],
)
def test_the_keeping_line_is_the_one_that_stores_what_was_allocated(line: int, kept: int | None) -> None:
    assert keeping_line(LOOP, line) == kept


def test_the_keeping_line_is_looked_for_in_the_same_function_only() -> None:
    source = "def step():\n    out = f()\n    return out\n\ndef other():\n    out = g()\n    xs.append(out)\n"
    assert keeping_line(source, 2) is None
    assert keeping_line(source, 6) == 7
    assert keeping_line("def broken(:\n", 1) is None


def test_the_recorded_leak_names_the_append_that_keeps_the_loss() -> None:
    # GIVEN the leak recorded on the H100 (benchmarks/memory_cases/leak.py: line 29 computes a held-out
    # loss with its graph, line 30 appends it to a list), with the script's text the run now records
    run = json.loads((LEAK / "memory_run.json").read_text())
    run["script_source"] = (REPO / "benchmarks" / "memory_cases" / "leak.py").read_text()
    snapshots = {n: read_snapshot(LEAK, m["file"]) for n, m in (run.get("snapshots") or {}).items()}
    m = analyze_memory(run, {k: v for k, v in snapshots.items() if v is not None}, None)
    # THEN the growing line is the loss's, and the line that keeps it is the append
    assert m.leak is not None and m.leak.sites
    top = m.leak.sites[0]
    assert top.site.startswith("memory_cases/leak.py:29") and top.kept_by == "memory_cases/leak.py:30"
    (f,) = [f for f in memory_findings(m) if f.id == "memory_leak"]
    assert "kept by memory_cases/leak.py:30" in " ".join(f.evidence)
    assert "memory_cases/leak.py:30" in f.sources


def test_without_the_scripts_text_the_leak_names_only_the_allocating_line() -> None:
    run = json.loads((LEAK / "memory_run.json").read_text())
    snapshots = {n: read_snapshot(LEAK, m["file"]) for n, m in (run.get("snapshots") or {}).items()}
    m = analyze_memory(run, {k: v for k, v in snapshots.items() if v is not None}, None)
    assert m.leak is not None and all(s.kept_by is None for s in m.leak.sites)


def _oom_analysis(**categories: int) -> MemoryAnalysis:
    oom = OomReport(
        step=0,
        requested=4 * GiB,
        device_free=1 * GiB,
        capacity=80 * GiB,
        allocated=78 * GiB,
        reserved=79 * GiB,
        largest_free_block=0,
        categories=dict.fromkeys(CATEGORIES, 0) | categories,
        sites=(),
        failing_line="mlp.py:20 in forward",
        message="CUDA out of memory",
    )
    return MemoryAnalysis(
        SCHEMA, "cuda:0", 80 * GiB, 79 * GiB, True, (), 0, 0, None, None, None, None, oom, None, ""
    )


def test_an_oom_in_the_first_forward_counts_the_backward_and_optimizer_still_to_come() -> None:
    # GIVEN the case: a 24-layer 8192-wide float32 MLP (6 GiB of parameters) out of memory in its
    # first forward with 68 GiB of activations held (the batch that fits, measured: half of it)
    m = _oom_analysis(activations=68 * GiB, parameters=6 * GiB)
    (f,) = memory_findings(m)
    text = " ".join(f.evidence)
    # THEN the batch said to fit leaves room for the gradients (6 GiB) and Adam's state (12 GiB), is
    # stated as an upper bound, and names what it cannot count
    assert "A batch of at most 69% of this one can fit, and that is an upper bound" in text
    assert "gradients" in text and "optimizer step" in text and "remaining activations are not" in text
    assert "gpudoctor batch" in text


def test_an_oom_after_the_first_step_is_still_a_bound() -> None:
    m = _oom_analysis(activations=60 * GiB, parameters=6 * GiB, gradients=6 * GiB, optimizer_state=12 * GiB)
    text = " ".join(memory_findings(replace(m, oom=replace(m.oom, step=3)))[0].evidence)  # type: ignore[arg-type]
    assert "upper bound" in text and "partway through the step" in text
