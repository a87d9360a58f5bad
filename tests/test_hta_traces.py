"""HTA's own test traces (tests/fixtures/hta, vendored from facebookresearch/HolisticTraceAnalysis): each one
labelled for what it holds, ops charged by the launch they enclose where older Kineto's ids collide, the
AMD trace's vendor, architecture and GEMMs, and headlines that agree with the figures."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.report.terminal import render_header
from gpudoctor.rules.registry import diagnose
from gpudoctor.trace.links import external_ids_collide
from gpudoctor.trace.load import load_trace

HTA = Path(__file__).parent / "fixtures" / "hta"


@cache
def _analysis(name: str) -> Analysis:
    return analyze(load_trace(HTA / name))


@cache
def _ops_of_every_step(name: str) -> dict[str, tuple[int, float, float]]:
    """Per op name, its kernels, GPU self and GPU total time over every step of the trace, a warm-up
    step too (the analysis's own op table leaves one out): each step analyzed alone."""
    trace = load_trace(HTA / name)
    a = _analysis(name)
    out: dict[str, tuple[int, float, float]] = {}
    for step in (*a.warmup_steps, *a.steps):
        for o in analyze(trace, step=step.number).ops:
            k, own, total = out.get(o.name, (0, 0.0, 0.0))
            out[o.name] = (k + o.kernels, own + o.gpu_self_us, total + o.gpu_total_us)
    return out


def _raw(name: str) -> list[dict[str, Any]]:
    with gzip.open(HTA / name, "rb") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


# --- what each file holds ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mtia_inference_excerpt.json.gz", "mtia_single_rank_excerpt.json.gz"])
def test_mtia_traces_are_named_as_mtia_not_cpu_only(name: str) -> None:
    a = _analysis(name)
    device_events = sum(1 for e in _raw(name) if e.get("cat") == "mtia_ccp_events")
    assert a.trace.accelerator is not None and a.trace.accelerator.vendor == "MTIA"
    reason = a.trace.no_gpu_reason or ""
    assert "MTIA" in reason and f"{device_events:,} mtia_ccp_events" in reason
    assert not any("CPU-only" in n for n in a.notes)
    assert "MTIA" in diagnose(a).bound


def test_mtia_inference_names_its_device() -> None:
    assert "on ARTEMIS" in (_analysis("mtia_inference_excerpt.json.gz").trace.no_gpu_reason or "")


def test_cupti_profiler_range_trace_says_what_it_holds() -> None:
    a = _analysis("cupti_profiler.json.gz")
    reason = a.trace.no_gpu_reason or ""
    assert "CUPTI profiler-range" in reason and "77 kernels" in reason and "A100" in reason
    assert not any("CPU-only" in n for n in a.notes)
    assert "profiler-range" in diagnose(a).bound


def test_traces_with_gpu_activity_have_no_reason_to_give() -> None:
    assert _analysis("alexnet.json.gz").trace.no_gpu_reason is None


# --- older traces: External id == correlation id ------------------------------------------------------


def _enclosing_attribution(name: str) -> Counter[str]:
    """Per op name, the GPU activities whose launching call (same correlation) the op encloses innermost
    on its thread: computed from the raw events, independently of gpudoctor's links."""
    events = _raw(name)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    out: Counter[str] = Counter()
    for g in events:
        if g.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        call = launches.get(g["args"].get("correlation"))
        if call is None:
            continue
        around = [
            o for o in ops
            if (o["pid"], o["tid"]) == (call["pid"], call["tid"])
            and o["ts"] <= call["ts"] and call["ts"] + call["dur"] <= o["ts"] + o["dur"]
        ]  # fmt: skip
        if around:
            inner = min(around, key=lambda o: (o["dur"], -o["ts"]))
            out[inner["name"]] += 1
    return out


@pytest.mark.parametrize("name", ["alexnet.json.gz", "cuda_event_sync.json.gz"])
def test_op_table_matches_enclosing_launch_attribution(name: str) -> None:
    # GIVEN an older trace whose GPU events carry their correlation id as External id
    assert external_ids_collide(load_trace(HTA / name))
    expected = _enclosing_attribution(name)
    assert sum(expected.values()) > 0
    # THEN every op is charged exactly the activities whose launch it encloses
    got = {op: kernels for op, (kernels, _, _) in _ops_of_every_step(name).items() if kernels}
    assert got == dict(expected)


def test_alexnet_copies_and_kernels_land_on_the_right_ops() -> None:
    ops = _ops_of_every_step("alexnet.json.gz")
    assert ops["aten::view"][:2] == (0, 0.0)
    assert ops["aten::empty_strided"][0] == 0
    assert ops["aten::copy_"][0] == 16  # the 16 HtoD copies
    assert ops["aten::conv2d"][2] > 0 and ops["aten::cudnn_convolution"][0] > 0
    assert ops["aten::addmm"][0] > 0


def test_recent_traces_keep_external_id_links(trace_paths: dict[str, Path]) -> None:
    assert not external_ids_collide(load_trace(trace_paths["sync_every_step"]))
    assert not external_ids_collide(load_trace(HTA / "amd_mi250.json.gz"))


# --- AMD MI250 -------------------------------------------------------------------------------------


def test_amd_trace_names_vendor_and_architecture() -> None:
    a = _analysis("amd_mi250.json.gz")
    assert a.trace.accelerator is not None
    assert (a.trace.accelerator.vendor, a.trace.accelerator.arch) == ("AMD", "gfx90a")

    console = Console(record=True, width=160)
    render_header(a, console)
    header = console.export_text().splitlines()[1]
    assert "gfx90a" in header and "sm_90" not in header and "104 CUs" in header


def test_amd_tensile_gemms_are_matmul_on_matrix_cores() -> None:
    a = _analysis("amd_mi250.json.gz")
    gemms = [k for k in a.kernels.top if k.name.startswith("Cijk_")]
    assert len(gemms) == 2
    assert all(k.category == "matmul" and k.tensor_cores for k in gemms)
    total = sum(a.kernels.time_by_category_us.values())
    assert a.kernels.time_by_category_us["matmul"] / total == pytest.approx(
        sum(k.total_us for k in gemms) / total
    )
    assert a.kernels.matmul_us > 0


# --- trace_compare: sparse excerpts -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace_compare_base.json.gz", "trace_compare_test.json.gz"])
def test_step_times_are_the_profiler_step_annotations(name: str) -> None:
    marked = {
        int(e["name"].split("#")[1]): e["dur"]
        for e in _raw(name)
        if re.match(r"ProfilerStep#\d+$", e["name"])
    }
    a = _analysis(name)
    assert {s.number: s.duration_us for s in a.steps} == pytest.approx(marked)


@pytest.mark.parametrize("name", ["trace_compare_base.json.gz", "trace_compare_test.json.gz"])
def test_headline_names_the_largest_idle_cause(name: str) -> None:
    a = _analysis(name)
    idle = a.window.idle_by_cause_us  # type: ignore[union-attr]
    assert max(idle, key=lambda c: idle[c]) == "other"
    bound = diagnose(a).bound
    assert "launch the trace does not record" in bound and "launch gaps" not in bound
