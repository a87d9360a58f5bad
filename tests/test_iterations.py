"""Steps in traces without `ProfilerStep#N` markers (`trace.iterations`): every recorded fixture has
markers, so the oracle is the fixture itself — strip the markers (and, level by level, the anchors the
inference would use first) from its JSON, and the iterations found must be the marked steps and the
doctor must say what it said on the marked trace. Traces recorded without markers
(tests/fixtures/zoo_unmarked, `tools/record_zoo.py --no-step-markers`) are checked against their planted
cause when present."""

from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.report.html import render_html
from gpudoctor.report.markdown import render_markdown
from gpudoctor.rules import Diagnosis, diagnose
from gpudoctor.trace import load_trace
from gpudoctor.trace.iterations import (
    DATALOADER,
    GPUDOCTOR_STEPS,
    LAUNCHES,
    MODULE,
    NONE,
    OPTIMIZER,
    PROFILER_STEPS,
    anchored_spans,
    find_iterations,
)
from gpudoctor.trace.periodicity import boundaries, find_period
from gpudoctor.trace.steps import find_steps

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
MARKED = sorted(
    p.relative_to(FIXTURES).as_posix()
    for folder in ("traces", "zoo", "ddp", "ddp_stack", "runs")
    for p in (FIXTURES / folder).rglob("*.json.gz")
)
ZOO = FIXTURES / "zoo"
ZOO_CASES: dict[str, Any] = json.loads((ZOO / "manifest.json").read_text())["cases"]
UNMARKED = FIXTURES / "zoo_unmarked"
UNMARKED_CASES: dict[str, Any] = (
    json.loads((UNMARKED / "manifest.json").read_text())["cases"]
    if (UNMARKED / "manifest.json").exists()
    else {}
)
# What each source infers from, and the names stripped so that the ones before it cannot be used.
LEVELS: dict[str, tuple[str, ...]] = {
    OPTIMIZER: ("ProfilerStep#",),
    DATALOADER: ("ProfilerStep#", "Optimizer.step#"),
    MODULE: ("ProfilerStep#", "Optimizer.step#", "enumerate(DataLoader)#"),
    LAUNCHES: ("ProfilerStep#", "Optimizer.step#", "enumerate(DataLoader)#", "nn.Module: "),
}
ANCHOR = {OPTIMIZER: "Optimizer.step#", DATALOADER: "enumerate(DataLoader)#", MODULE: "nn.Module: "}
# The profiler's own start before the first step is in no marked step and may be in the first inferred one.
TOLERANCE_US = 150.0
# The zoo's four planted causes the issue names: a launch-bound loop, a num_workers=0 loader, an
# empty_cache() per step and a per-parameter optimizer.
ACCEPTANCE = ("launch_overhead", "input_pipeline", "allocator_thrash", "optimizer_unfused")


@functools.cache
def _doc(fixture: str) -> Any:
    with gzip.open(FIXTURES / fixture, "rt") as f:
        return json.load(f)


def _events(doc: Any) -> list[dict[str, Any]]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _names(fixture: str) -> set[str]:
    return {str(e.get("name", "")) for e in _events(_doc(fixture))}


@pytest.fixture(scope="module")
def stripped(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`stripped(fixture, prefixes)`: the fixture's trace without the events named with those prefixes."""
    folder = tmp_path_factory.mktemp("stripped")

    @functools.cache
    def strip(fixture: str, prefixes: tuple[str, ...]) -> Path:
        doc = _doc(fixture)
        kept = [e for e in _events(doc) if not str(e.get("name", "")).startswith(prefixes)]
        out = {**doc, "traceEvents": kept} if isinstance(doc, dict) else kept
        path = folder / f"{fixture.replace('/', '_')}.{len(prefixes)}.json"
        path.write_text(json.dumps(out))
        return path

    return strip


def _close(found: float, marked: float) -> bool:
    return abs(found - marked) <= max(0.05 * marked, TOLERANCE_US)


@pytest.mark.parametrize("fixture", MARKED)
def test_iterations_found_without_markers_are_the_marked_steps(fixture: str, stripped: Any) -> None:
    # GIVEN a recorded trace and its ProfilerStep#N steps
    marked = find_steps(load_trace(FIXTURES / fixture))
    assert marked, "every committed fixture has step markers: they are the oracle here"
    names = _names(fixture)
    levels = [k for k in LEVELS if k == LAUNCHES or any(n.startswith(ANCHOR[k]) for n in names)]
    for level in levels:
        # WHEN the markers (and every anchor used before this level) are stripped from its JSON
        found = find_iterations(load_trace(stripped(fixture, LEVELS[level])))
        # THEN this level's source finds as many iterations as there were steps, as long in all and
        # in the median (the phase may differ: per-step times are compared through these two)
        assert found.source.kind == level and found.source.inferred, found.source
        assert len(found.steps) == len(marked), (level, found.source.description)
        total, marked_total = sum(s.duration_us for s in found.steps), sum(s.duration_us for s in marked)
        assert _close(total, marked_total), (level, total, marked_total)
        median = float(np.median([s.duration_us for s in found.steps]))
        assert _close(median, float(np.median([s.duration_us for s in marked]))), level


def _first(d: Diagnosis) -> str | None:
    return d.findings[0].id if d.findings else None


@functools.cache
def _zoo_diagnosis(file: str, unprofiled_us: float, path: Path | None = None) -> tuple[Analysis, Diagnosis]:
    a = analyze(load_trace(path or ZOO / file), unprofiled_step_us=unprofiled_us)
    return a, diagnose(a)


@pytest.mark.parametrize("rule", sorted(ZOO_CASES))
def test_the_doctor_says_the_same_without_markers(rule: str, stripped: Any) -> None:
    # GIVEN a zoo case's slow trace, diagnosed with its markers
    slow = ZOO_CASES[rule]["slow"]
    unprofiled = slow["unprofiled_step_us"]["median"]
    _, marked = _zoo_diagnosis(slow["file"], unprofiled)
    # WHEN its ProfilerStep#N markers are stripped
    path = stripped(f"zoo/{slow['file']}", LEVELS[OPTIMIZER])
    a, unmarked = _zoo_diagnosis(slow["file"], unprofiled, path)
    # THEN it says how it found the steps, and names the same first cause (the planted one)
    assert a.steps_source is not None and a.steps_source.inferred
    assert a.steps_source.description.startswith("inferred:")
    assert _first(unmarked) == _first(marked) == rule, [(f.id, f.est_saving_pct) for f in unmarked.findings]
    assert unmarked.saving_of == "step"


@pytest.mark.parametrize("rule", ACCEPTANCE)
def test_the_planted_cause_comes_first_without_markers(rule: str, stripped: Any) -> None:
    # GIVEN the four planted causes, recorded with markers then stripped of them
    slow = ZOO_CASES[rule]["slow"]
    path = stripped(f"zoo/{slow['file']}", LEVELS[OPTIMIZER])
    a, d = _zoo_diagnosis(slow["file"], slow["unprofiled_step_us"]["median"], path)
    # THEN the first finding names the planted cause, on per-iteration figures
    assert len(a.steps) == len(find_steps(load_trace(ZOO / slow["file"])))
    assert _first(d) == rule


@pytest.mark.parametrize(
    "rule",
    sorted(UNMARKED_CASES) or [pytest.param("none", marks=pytest.mark.skip("no zoo_unmarked recorded"))],
)
def test_recorded_without_markers_the_planted_cause_comes_first(rule: str) -> None:
    # GIVEN a zoo case recorded on the GPU without prof.step() (a window of N steps)
    case = UNMARKED_CASES[rule]
    slow = case["slow"]
    a, d = _zoo_diagnosis(slow["file"], slow["unprofiled_step_us"]["median"], UNMARKED / slow["file"])
    # THEN the steps are inferred, one per step run, and the first finding is the planted cause
    assert a.steps_source is not None and a.steps_source.inferred
    assert len(a.steps) == slow["iterations"]
    assert _first(d) == rule


# ---- the sources, one by one ------------------------------------------------------------------


def test_gpudoctor_step_annotations_mark_steps(stripped: Any, tmp_path: Path) -> None:
    # GIVEN a trace whose steps are marked `gpudoctor.step` (as gpudoctor run marks them) instead
    doc = _doc("traces/sync_every_step.json.gz")
    renamed = [
        {**e, "name": "gpudoctor.step"} if str(e.get("name", "")).startswith("ProfilerStep#") else e
        for e in _events(doc)
    ]
    path = tmp_path / "gd.json"
    path.write_text(json.dumps({**doc, "traceEvents": renamed}))
    found = find_iterations(load_trace(path))
    marked = find_steps(load_trace(FIXTURES / "traces/sync_every_step.json.gz"))
    # THEN they are the steps, numbered from 1, with the same windows; and they are not "inferred"
    assert found.source.kind == GPUDOCTOR_STEPS and not found.source.inferred
    assert [s.number for s in found.steps] == [1, 2, 3]
    assert [s.duration_us for s in found.steps] == [s.duration_us for s in marked]


def test_profiler_steps_come_first() -> None:
    found = find_iterations(load_trace(FIXTURES / "traces/dataloader_bound.json.gz"))
    assert found.source.kind == PROFILER_STEPS and found.source.description == "ProfilerStep#N annotations"
    assert not found.source.inferred


def _python_trace(generates: int, calls: int) -> dict[str, Any]:
    """A with_stack-like trace: a script calls `generate` `generates` times, each calling the root
    module `calls` times; each call runs one op that launches one kernel."""
    events: list[dict[str, Any]] = []
    ids = iter(range(1, 10_000))
    correlation = iter(range(1, 10_000))
    t = 0.0

    def frame(name: str, ts: float, dur: float, parent: int | None) -> int:
        pid = next(ids)
        events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts,
                       "dur": dur, "args": {"Python id": pid, "Python parent id": parent}})  # fmt: skip
        return pid

    total = generates * (calls * 100.0 + 50.0) + 10.0
    script = frame("run.py(1): <module>", 0.0, total, None)
    t = 5.0
    for _ in range(generates):
        outer = frame("gen.py(10): generate", t, calls * 100.0 + 40.0, script)
        t += 20.0
        for _ in range(calls):
            frame("nn.Module: TinyLM_0", t, 90.0, outer)
            c = next(correlation)
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10,
                           "dur": 60.0, "args": {"External id": c}})  # fmt: skip
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t + 20, "dur": 10.0, "args": {"correlation": c, "External id": c}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t + 40,
                           "dur": 30.0, "args": {"correlation": c, "External id": c, "device": 0, "stream": 7}})  # fmt: skip
            t += 100.0
        t += 30.0
    return {"traceEvents": events}


def test_a_model_called_many_times_in_one_outer_call_makes_one_step_of_that_call(tmp_path: Path) -> None:
    # GIVEN a loop of 4 generate calls, each calling the model 6 times (one token each)
    path = tmp_path / "generate.json"
    path.write_text(json.dumps(_python_trace(generates=4, calls=6)))
    a = analyze(load_trace(path))
    # THEN a step is one call of generate, with 6 model calls in each, and a time per call
    assert a.steps_source is not None and a.steps_source.kind == MODULE
    assert len(a.steps) == 4 and a.steps_source.call == "generate"
    assert a.steps_source.calls_per_step == 6
    assert "one call of generate each (6 calls of TinyLM_0 per iteration)" in a.steps_source.description
    html = render_html(a, diagnose(a))
    assert "6 model calls per step" in html


def test_a_model_called_once_per_loop_pass_makes_one_step_per_call(tmp_path: Path) -> None:
    # GIVEN one generate call only: its model calls are the repeating unit
    path = tmp_path / "once.json"
    path.write_text(json.dumps(_python_trace(generates=1, calls=5)))
    found = find_iterations(load_trace(path))
    assert found.source.kind == MODULE and len(found.steps) == 5
    assert found.source.calls_per_step is None and found.source.call == "TinyLM_0"


def test_the_period_is_the_iteration_not_a_repeated_layer() -> None:
    # GIVEN 6 iterations of: an input copy, 12 identical layers of 4 kernels, a loss and 3 optimizer
    # kernels; the first iteration launches 9 extra kernels (autotuning) and one later one a stray kernel
    layer = [10, 11, 12, 13]
    iteration = [1, *(layer * 12), 2, 3, 4, 5]
    seq = [90 + i for i in range(9)] + iteration
    for i in range(5):
        seq += iteration[:20] + ([99] if i == 2 else []) + iteration[20:]
    tokens = np.array(seq)
    # THEN the period is the iteration's length, not the layer's
    assert find_period(tokens) == len(iteration)
    # AND the boundaries start each iteration, the differing first one included
    starts = boundaries(tokens, len(iteration), np.ones(len(tokens)))
    assert len(starts) == 6 and starts[0] == 0
    assert all(tokens[b] == 1 for b in starts[1:])


def test_a_sequence_that_does_not_repeat_has_no_period() -> None:
    rng = np.random.default_rng(0)
    assert find_period(rng.integers(0, 1000, 500)) is None
    assert find_period(np.arange(50)) is None


def test_anchors_tile_the_loop_in_launches_not_in_time() -> None:
    # GIVEN 3 optimizer steps, each the end of an iteration of 10 launches (the step's own launches 2),
    # iterations of uneven length, the trace starting with the first iteration at t=0
    call_start = np.array([i * 10.0 + (3.0 if i >= 10 else 0) + (5.0 if i >= 20 else 0) for i in range(30)])
    call_end = call_start + 1.0
    opt = np.array([8, 18, 28])
    starts, ends = call_start[opt] - 0.5, call_start[opt + 1] + 1.5
    spans = anchored_spans(starts, ends, True, (0.0, 300.0), (call_start, call_end))
    # THEN each iteration starts when the previous optimizer step has ended, before its own first launch
    assert [round(a, 1) for a, _ in spans] == [0.0, 91.5, 194.5]
    assert all(ends[i - 1] <= spans[i][0] < call_start[10 * i] for i in (1, 2))
    # AND the last ends with its optimizer step, not with a thread that goes on long after the loop
    later = anchored_spans(starts, ends, True, (0.0, 1000.0), (call_start, call_end))
    assert later[-1][1] == pytest.approx(ends[-1])


def test_without_launches_optimizer_steps_end_their_iterations_exactly() -> None:
    # GIVEN a CPU-only trace (no launch calls) of 4 iterations of uneven length, each ending with an
    # optimizer step of uneven length, the profiler started at t=0 just before the loop's first forward
    no_launches = (np.zeros(0), np.zeros(0))
    starts = np.array([60.0, 175.0, 280.0, 400.0])
    ends = starts + np.array([56.0, 50.0, 62.0, 55.0])
    # WHEN the iterations are cut at the anchors
    spans = anchored_spans(starts, ends, True, (0.0, 460.0), no_launches)
    # THEN the first starts with the trace (not before it), each next one exactly where the previous
    # optimizer step ended (none cuts into an optimizer step or into the forward before it)
    assert [a for a, _ in spans] == [0.0, *ends[:-1]]
    assert [b for _, b in spans][:-1] == ends[:-1].tolist() and spans[-1][1] >= ends[-1]


# ---- without any repetition ---------------------------------------------------------------------


def _one_iteration(tmp_path: Path, file: str) -> Path:
    """The first step of a zoo trace alone, without markers or anchors: nothing repeats."""
    trace = load_trace(ZOO / file)
    step = find_steps(trace)[0]
    origin = trace.meta.origin_us
    doc = _doc(f"zoo/{file}")
    anchors = ("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)#")
    gpu = ("kernel", "gpu_memcpy", "gpu_memset")

    def keep(e: dict[str, Any]) -> bool:
        if str(e.get("name", "")).startswith(anchors):
            return False
        if e.get("ph") != "X":
            return True
        limit = step.window_end_us if e.get("cat") in gpu else step.end_us
        return float(e.get("ts", 0)) < limit + origin

    path = tmp_path / f"one_{file.removesuffix('.gz')}"
    path.write_text(json.dumps({**doc, "traceEvents": [e for e in _events(doc) if keep(e)]}))
    return path


@pytest.mark.parametrize("file", ["optimizer_unfused__slow.json.gz", "allocator_thrash__slow.json.gz"])
def test_without_repetition_the_figures_cover_the_traced_time(tmp_path: Path, file: str) -> None:
    # GIVEN one iteration alone, with no marker and no anchor, diagnosed with a per-step time it lacks
    a = analyze(load_trace(_one_iteration(tmp_path, file)), unprofiled_step_us=1000.0)
    d = diagnose(a)
    # THEN there are no steps; the traced time is one whole, with its host figures
    assert a.steps == () and a.steps_source is not None and a.steps_source.kind == NONE
    assert a.whole_trace is not None and a.whole_trace.cpu.launch_count > 100
    assert "figures cover the traced time" in a.steps_source.description
    # AND every saving is a share of the traced time, said so, never per step; the unprofiled step
    # time does not apply to a whole trace
    assert d.saving_of == "traced time" and "traced" in d.bound
    assert d.summary["step_us"] == pytest.approx(a.whole_trace.duration_us)
    assert d.findings
    for f in d.findings:
        assert 0 <= f.est_saving_pct <= 100
        assert not any("per step" in e or ("each " in e and " step" in e) for e in f.evidence), f.evidence
    # AND the reports say it
    md = render_markdown(a, d)
    assert "shares of the traced time" in md and "kernel launches per second" in md
    assert "up to" in render_html(a, d) and "of the traced time" in render_html(a, d)


# ---- the analysis says how the steps were found ---------------------------------------------------


def test_the_step_source_is_in_the_json_and_old_analyses_still_load(stripped: Any) -> None:
    a = analyze(load_trace(stripped("zoo/launch_overhead__slow.json.gz", LEVELS[OPTIMIZER])))
    doc = json.loads(json.dumps(a.to_json()))
    assert doc["steps_source"]["kind"] == LAUNCHES
    assert doc["steps_source"]["description"].startswith("inferred: the launch sequence repeats every 122")
    assert Analysis.from_json(doc) == Analysis.from_json(json.loads(json.dumps(doc)))
    # GIVEN an analysis.json written before steps were inferred (no such keys)
    for key in ("steps_source", "whole_trace"):
        del doc[key]
    old = Analysis.from_json(doc)
    # THEN it loads, and renders without the sentence
    assert old.steps_source is None and old.whole_trace is None
    assert "inferred" not in render_markdown(old, diagnose(old))


def test_the_zoo_recorder_records_without_markers_on_the_cpu(tmp_path: Path) -> None:
    # GIVEN the zoo recorder's --no-step-markers on the CPU, for one case, 4 steps in the window
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = tmp_path / "zoo_unmarked"
    args = ["--cpu", "--only", "host_sync", "--out", str(out), "--no-step-markers", "--iterations", "4"]
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "record_zoo.py"),
            *args,
            "--warmup-steps",
            "1",
            "--timing-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # THEN its traces have no ProfilerStep#N annotation, the manifest says so, and the 4 steps are found
    entry = json.loads((out / "manifest.json").read_text())["cases"]["host_sync"]["slow"]
    assert entry["step_markers"] is False and entry["iterations"] == 4 and entry["profiler_schedule"] is None
    with gzip.open(out / entry["file"], "rt") as f:
        names = {str(e.get("name", "")) for e in json.load(f)["traceEvents"]}
    assert not any(n.startswith("ProfilerStep#") for n in names)
    found = find_iterations(load_trace(out / entry["file"]))
    assert found.source.kind == OPTIMIZER and len(found.steps) == 4


def test_a_closure_inside_the_optimizer_step_is_part_of_one_iteration(tmp_path: Path) -> None:
    # GIVEN a Lightning-style loop: each Optimizer.step runs the forward and backward as a closure
    # (marked gpudoctor.closure, as gpudoctor run marks it), then launches its own update
    events: list[dict[str, Any]] = []
    corr = 0

    def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> None:
        events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}
        )

    def launch(ts: float, kernel: str) -> None:
        nonlocal corr
        corr += 1
        x("cuda_runtime", "cudaLaunchKernel", ts, 5.0, correlation=corr)
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": ts + 20,
                       "dur": 30.0, "args": {"correlation": corr, "device": 0, "stream": 7}})  # fmt: skip

    for i in range(4):
        t = 10.0 + 1000.0 * i
        x("user_annotation", "Optimizer.step#AdamW.step", t, 800.0)
        x("user_annotation", "gpudoctor.closure", t + 10, 600.0)
        for j in range(6):
            launch(t + 20 + 90 * j, f"forward_backward_{j}")
        for j in range(3):
            launch(t + 650 + 40 * j, f"update_{j}")
    path = tmp_path / "closure.json"
    path.write_text(json.dumps({"traceEvents": events}))
    found = find_iterations(load_trace(path))
    # THEN one iteration per optimizer step, each holding its closure's work and its update
    assert found.source.kind == OPTIMIZER and len(found.steps) == 4
    for s in found.steps:
        assert s.gpu_start_us is not None and s.gpu_end_us is not None
        first_forward, last_update_end = 20 + 20, 650 + 2 * 40 + 20 + 30  # from the step's start
        assert s.gpu_end_us - s.gpu_start_us == pytest.approx(last_update_end - first_forward)
