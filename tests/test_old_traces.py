"""Traces as users have them (tests/fixtures/old_traces, made by tools/make_old_traces.py from the recorded
ones): PyTorch 1.9's categories and keys read as today's, memory events without allocator totals, a
warm-up step at a trace's start left out of every figure over the steps, toy traces too small to diagnose,
and older device-property keys."""

from __future__ import annotations

import gzip
import importlib.util
import json
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.cli.main import app
from gpudoctor.device import DeviceInfo
from gpudoctor.rules.facts import facts_of
from gpudoctor.rules.finding import Diagnosis, Severity
from gpudoctor.rules.registry import diagnose
from gpudoctor.trace.iterations import DATALOADER, PROFILER_STEPS, find_iterations
from gpudoctor.trace.load import load_trace
from gpudoctor.trace.model import Kind
from gpudoctor.trace.steps import Step, leading_warmup

FIXTURES = Path(__file__).parent / "fixtures"
OLD = FIXTURES / "old_traces"
PT19 = OLD / "pt19_sync_every_step.json.gz"
TWO_STEPS = OLD / "pt19_two_steps.json.gz"
WARMUP = OLD / "warmup_first_step.json.gz"
TOY = OLD / "toy_four_kernels.json.gz"
RECORDED = FIXTURES / "traces" / "sync_every_step_stack.json.gz"  # what PT19 was made from
SERIOUS = (Severity.CRITICAL, Severity.MAJOR)


@cache
def _analysis(path: Path) -> Analysis:
    return analyze(load_trace(path))


@cache
def _diagnosis(path: Path) -> Diagnosis:
    return diagnose(_analysis(path))


def _raw(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _cli(*args: str | Path) -> Any:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, [str(a) for a in args])


@cache
def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_old_traces", FIXTURES.parent.parent / "tools" / "make_old_traces.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fixtures_are_what_the_tool_makes(tmp_path: Path) -> None:
    sizes = _tool().make(tmp_path)
    for name in sizes:
        assert (tmp_path / name).read_bytes() == (OLD / name).read_bytes(), name


# --- 1. PyTorch <= 1.9: ProfilerStep#N as an "Operator" -------------------------------------------


def test_pytorch_1_9_step_markers_are_the_steps_with_the_traces_own_numbers() -> None:
    # GIVEN the recorded trace as PyTorch 1.9 writes it: ProfilerStep#3-#5 are "Operator" events
    assert {e["cat"] for e in _raw(PT19)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")} == {
        "Operator"
    }
    found = find_iterations(load_trace(PT19))
    # THEN they are the steps, numbered as in the trace, each as long as in the recorded trace (whose
    # times were whole microseconds then)
    assert found.source.kind == PROFILER_STEPS
    recorded = find_iterations(load_trace(RECORDED)).steps
    assert [s.number for s in found.steps] == [s.number for s in recorded] == [3, 4, 5]
    for old, new in zip(found.steps, recorded, strict=True):
        assert old.duration_us == pytest.approx(new.duration_us, abs=2.0)
        assert old.start_us - found.steps[0].start_us == pytest.approx(
            new.start_us - recorded[0].start_us, abs=2.0
        )


def test_torch_ranges_written_as_ops_are_annotations_and_ops_keep_their_kernels() -> None:
    trace = load_trace(PT19)
    kinds = {trace.names[int(n)]: Kind(int(k)) for n, k in zip(trace.name, trace.kind, strict=True)}
    assert kinds["ProfilerStep#4"] == Kind.USER_ANNOTATION
    assert next(k for n, k in kinds.items() if n.startswith("Optimizer.step#")) == Kind.USER_ANNOTATION
    assert kinds["aten::mm"] == Kind.CPU_OP
    # the lower-case "external id" of runtime calls and kernels links them to their ops as today's key does
    old = {o.name: o.kernels for o in _analysis(PT19).ops}
    now = {o.name: o.kernels for o in _analysis(RECORDED).ops}
    assert old["aten::mm"] == now["aten::mm"] > 0
    assert {k: v for k, v in old.items() if v} == {k: v for k, v in now.items() if v}
    assert [(f.id, f.severity) for f in _diagnosis(PT19).findings] == [
        (f.id, f.severity) for f in _diagnosis(RECORDED).findings
    ]


def test_profiler_steps_recorded_as_cpu_ops_are_steps_too(tmp_path: Path, trace_doc: Any) -> None:
    doc = trace_doc("dataloader_bound")
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            e["cat"] = "cpu_op"
    path = tmp_path / "cpu_op_steps.json"
    path.write_text(json.dumps(doc))
    found = find_iterations(load_trace(path))
    marked = find_iterations(load_trace(FIXTURES / "traces" / "dataloader_bound.json.gz"))
    assert found.source.kind == PROFILER_STEPS
    assert [(s.number, s.duration_us) for s in found.steps] == [
        (s.number, s.duration_us) for s in marked.steps
    ]


def test_a_step_of_a_pytorch_1_9_trace_is_analyzed_by_its_own_number() -> None:
    result = _cli("analyze", PT19, "--step", "4")
    assert result.exit_code == 0, result.output
    assert "step 4 only" in result.output and "Traceback" not in result.output
    assert _analysis(PT19).steps[1].number == 4
    refused = _cli("analyze", PT19, "--step", "1")
    assert refused.exit_code == 2 and "(steps: 3, 4, 5)" in refused.stderr


def test_the_terminal_report_of_a_pytorch_1_9_trace_shows_its_step_numbers() -> None:
    result = _cli("analyze", PT19)
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert "steps: ProfilerStep#N annotations" in result.output
    assert "3 steps (#3–#5)" in result.output


def test_a_two_step_pytorch_1_9_trace_has_its_two_steps() -> None:
    a = _analysis(TWO_STEPS)
    assert a.steps_source is not None and a.steps_source.kind == PROFILER_STEPS
    assert [s.number for s in a.steps] == [3, 4]


# --- 2. [memory] events with only Bytes -----------------------------------------------------------


def test_memory_without_allocator_totals_is_the_rise_from_the_traces_start() -> None:
    cuda = [
        e["args"]["Bytes"]
        for e in sorted(_raw(PT19)["traceEvents"], key=lambda e: e["ts"])
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
    ]
    assert cuda and all("Total Allocated" not in e.get("args", {}) for e in _raw(PT19)["traceEvents"])
    m = _analysis(PT19).memory
    assert m is not None and m.is_rise and not m.reserved_recorded
    assert m.peak_allocated == max(int(np.cumsum(cuda).max()), 0) > 0
    result = _cli("analyze", PT19)
    memory = result.output.split("Memory ─")[1]
    assert "from the trace's start" in memory and "reserved not recorded" in memory
    assert "-1 B" not in result.output and "-0.0%" not in result.output


def test_memory_with_allocator_totals_is_still_their_peak() -> None:
    m = _analysis(RECORDED).memory
    assert m is not None and not m.is_rise and m.reserved_recorded
    raw = [e["args"] for e in _raw(RECORDED)["traceEvents"] if e.get("name") == "[memory]"]
    assert m.peak_allocated == max(a["Total Allocated"] for a in raw if a.get("Device Type") == 1)


# --- 4. warm-up steps -----------------------------------------------------------------------------


def _steps(*durations: float, gpu: bool = True) -> list[Step]:
    out, t = [], 0.0
    for i, d in enumerate(durations):
        g = (t, t + d) if gpu and d > 0 else (None, None)
        out.append(Step(i + 1, t, t + d, *g, t, t + d))
        t += d
    return out


@pytest.mark.parametrize(
    ("durations", "warm"),
    [
        ((20, 1, 1, 1), 1),
        ((40, 8, 1, 1, 1), 2),  # two warm-up steps, each far over the steps after it
        ((1, 1, 1, 1), 0),
        ((2.5, 1, 1, 1), 0),  # a slow first step, not a warm-up
        ((20, 1, 1, 25), 0),  # a later step is longer still: the first is no outlier
        ((20, 1), 1),
        ((5,), 0),
        ((0.3, 0.09), 0),  # 3.3x, but 2 ms more: a busy host's first profiled step, not a warm-up
    ],
)
def test_leading_warmup_steps(durations: tuple[float, ...], warm: int) -> None:
    # durations in units of 10 ms
    assert leading_warmup(_steps(*(10_000 * d for d in durations))) == warm


def test_a_step_with_gpu_work_is_not_judged_against_a_stub_without_any() -> None:
    steps = _steps(20, 1)
    stub = Step(2, 20, 21, None, None, 20, 21)
    assert leading_warmup([steps[0], stub]) == 0


def test_a_first_step_twenty_times_the_others_is_left_out_and_rules_nothing() -> None:
    # GIVEN a GPU-bound loop's three steps after a warm-up step 20x as long (autotuning, allocations)
    a = _analysis(WARMUP)
    assert [s.number for s in a.warmup_steps] == [2] and [s.number for s in a.steps] == [3, 4, 5]
    assert a.warmup_steps[0].duration_us > 19 * a.step_time_us.p50  # type: ignore[union-attr]
    assert a.warmup_steps[0].cpu.allocator_calls == 100
    # THEN no critical or major finding: the findings are the loop's own (those of its trace without it)
    d = _diagnosis(WARMUP)
    assert not [f.id for f in d.findings if f.severity in SERIOUS]
    base = _diagnosis(FIXTURES / "zoo" / "control_cnn.json.gz")
    assert [(f.id, f.severity) for f in d.findings] == [(f.id, f.severity) for f in base.findings]
    assert d.bound.startswith("GPU-bound")
    # AND the figures over the steps are the loop's: its kernels, not the autotuning's
    assert a.kernels.count == _analysis(FIXTURES / "zoo" / "control_cnn.json.gz").kernels.count
    assert a.step_time_us is not None and a.step_time_us.count == 3


def test_the_report_says_which_steps_are_warm_up() -> None:
    result = _cli("analyze", WARMUP)
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert "4 steps (1 warm-up left out)" in result.output
    assert "step #2 (" in result.output and "is a warm-up at the trace's start" in result.output
    table = result.output.split("Step time ─")[1].split("GPU time ─")[0]
    assert "2 warm-up" in table and "3 steps (#3–#5)" in table


def test_a_recorded_warm_up_is_left_out() -> None:
    # HTA's AlexNet benchmark: a 12.9 s warm-up forward, then the measured one
    a = _analysis(FIXTURES / "hta" / "alexnet.json.gz")
    assert [s.number for s in a.warmup_steps] == [1] and [s.number for s in a.steps] == [2]


@pytest.mark.parametrize("path", [PT19, TWO_STEPS, WARMUP, FIXTURES / "hta" / "alexnet.json.gz"])
def test_the_shares_of_one_step_add_up_to_it(path: Path) -> None:
    f = facts_of(_analysis(path))
    assert f is not None
    causes = f.host_wait_us + f.sync_idle_us + f.launch_gap_us + f.other_idle_us
    assert f.busy_us + causes == pytest.approx(f.traced_step_us, rel=1e-9)
    assert f.busy_us <= f.traced_step_us * (1 + 1e-9)


# --- 5. toy traces --------------------------------------------------------------------------------


def test_a_four_kernel_trace_is_too_little_gpu_work() -> None:
    a = _analysis(TOY)
    assert a.kernels.count == 4 and not a.steps  # not cut into steps of microseconds
    d = _diagnosis(TOY)
    assert d.bound.startswith("Too little GPU work") and not d.judged
    assert not [f for f in d.findings if f.severity in SERIOUS]
    result = _cli("analyze", TOY)
    assert (
        result.exit_code == 0 and "Too little GPU work" in result.output and "Traceback" not in result.output
    )


def test_steps_inferred_in_a_toy_trace_are_too_little_gpu_work_too(tmp_path: Path) -> None:
    # GIVEN the four additions, each after a DataLoader batch: four inferred iterations
    doc = _tool().toy_four_kernels()
    adds = [e for e in doc["traceEvents"] if e["name"] == "aten::add"]
    for e in adds:
        loader = {
            **e,
            "cat": "user_annotation",
            "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        }
        doc["traceEvents"].append({**loader, "ts": e["ts"] - 20.0, "dur": 15.0, "args": {}})
    path = tmp_path / "toy_loader.json"
    path.write_text(json.dumps(doc))
    a = analyze(load_trace(path))
    assert a.steps_source is not None and a.steps_source.kind == DATALOADER and len(a.steps) == 4
    d = diagnose(a)
    assert d.bound.startswith("Too little GPU work") and "no marked step" in d.bound
    assert not [f for f in d.findings if f.severity in SERIOUS]


# --- 6. older device-property keys ----------------------------------------------------------------


def test_compute_properties_name_the_gpu() -> None:
    doc = _raw(TWO_STEPS)
    assert "computeProperties" in doc and "deviceProperties" not in doc
    device = _analysis(TWO_STEPS).device
    assert device is not None and device.name == "NVIDIA H200"
    assert (
        device.sm_count == 132 and device.compute_capability == (9, 0) and device.max_threads_per_sm == 2048
    )
    result = _cli("analyze", TWO_STEPS)
    assert result.exit_code == 0 and "no GPU recorded" not in result.output
    assert "NVIDIA H200, 132 SMs" in result.output and "sm_90" in result.output


def test_cuda_device_prop_names_are_read() -> None:
    # the form of the TensorBoard plugin's test traces
    props = {"id": 1, "name": "Tesla V100-DGXS-32GB", "totalGlobalMem": 34087305216, "major": 7, "minor": 0,
             "maxThreadsPerBlock": 1024, "maxThreadsPerMultiProcessor": 2048, "regsPerMultiprocessor": 65536,
             "warpSize": 32, "sharedMemPerMultiprocessor": 98304, "multiProcessorCount": 80}  # fmt: skip
    assert DeviceInfo.from_kineto(props) == DeviceInfo(
        index=1, name="Tesla V100-DGXS-32GB", total_memory_bytes=34087305216, sm_count=80,
        compute_capability=(7, 0), max_threads_per_sm=2048, max_threads_per_block=1024, regs_per_sm=65536,
        shared_mem_per_sm_bytes=98304,
    )  # fmt: skip


@pytest.mark.parametrize("path", [PT19, TWO_STEPS, WARMUP, TOY])
def test_every_fixture_reports_in_every_form(path: Path, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    result = _cli("analyze", path, "--html", html)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert html.stat().st_size > 0
    as_json = _cli("analyze", path, "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)
