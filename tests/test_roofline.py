"""The roofline of the top kernels: each op's FLOPs as torch's flop counter counts them, each kernel
mapped to the op that launched it, ceilings found by the trace's GPU name, the result saved and
re-read as JSON, and the chart drawn inside its axes with every name escaped."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from gpudoctor.analysis.opwork import op_work
from gpudoctor.analysis.roofline import roofline
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.device.ceilings import Ceilings, ceilings_for_device, reference_ceilings, store
from gpudoctor.report.html import render_html
from gpudoctor.report.markdown import render_markdown
from gpudoctor.report.svg import roofline as roofline_svg
from gpudoctor.rules import diagnose
from gpudoctor.trace import Kind, load_trace
from gpudoctor.trace.columns import _json_tuple
from gpudoctor.trace.model import SHAPED_OPS, OpInputs

ROOT = Path(__file__).parent.parent
ZOO_CNN = ROOT / "tests/fixtures/zoo/profiler_distortion__slow.json.gz"  # record_shapes, bf16 CNN, H200
TRANSFORMER = ROOT / "tests/fixtures/traces/transformer_shapes.json.gz"  # record_shapes, H100
NO_SHAPES = ROOT / "tests/fixtures/traces/transformer_train.json.gz"
BIG = ROOT / "benchmarks/traces/resnet50_10steps.json.gz"
KINETO_TYPES = {torch.bfloat16: "c10::BFloat16", torch.float16: "c10::Half", torch.float32: "float"}


def recorded(*args: Any) -> OpInputs:
    """What record_shapes writes for a call with these arguments."""
    dims, types, concrete = [], [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            dims.append(tuple(a.shape))
            types.append(KINETO_TYPES[a.dtype])
            concrete.append("")
        else:
            dims.append(())
            types.append("ScalarList" if isinstance(a, list) else "" if a is None else "Scalar")
            concrete.append("" if a is None else str(a))
    return OpInputs(tuple(dims), tuple(types), tuple(concrete))


def torch_flops(fn: Any) -> dict[str, int]:
    with FlopCounterMode(display=False) as counter:
        fn()
    return {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}


def t(*shape: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


# ---- FLOPs and bytes of one op -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("mm", (t(64, 32), t(32, 48))),
        ("addmm", (t(48), t(64, 32), t(32, 48))),
        ("bmm", (t(3, 64, 32), t(3, 32, 48))),
        ("baddbmm", (t(3, 64, 48), t(3, 64, 32), t(3, 32, 48))),
    ],
)
def test_matmul_flops_are_torchs(name: str, args: tuple[torch.Tensor, ...]) -> None:
    expected = torch_flops(lambda: getattr(torch, name)(*args))[name]
    work = op_work(f"aten::{name}", recorded(*args))
    assert work is not None and work.flops == expected and work.family == "matmul"
    out = getattr(torch, name)(*args)
    assert work.bytes == sum(a.nbytes for a in args) + out.nbytes


def test_linear_and_matmul_count_the_matmul_they_run() -> None:
    x, w, b = t(8, 16, 32), t(48, 32), t(48)
    assert op_work("aten::linear", recorded(x, w, b)).flops == torch_flops(lambda: F.linear(x, w, b))["addmm"]
    a, c = t(2, 1, 64, 32), t(5, 32, 16)  # broadcast batch
    assert op_work("aten::matmul", recorded(a, c)).flops == sum(
        torch_flops(lambda: torch.matmul(a, c)).values()
    )
    assert op_work("aten::mm", recorded(t(4, 3), t(5, 6))) is None  # shapes that do not multiply


@pytest.mark.parametrize(
    ("x", "w", "stride", "padding", "dilation", "groups"),
    [
        ((4, 3, 32, 32), (16, 3, 7, 7), 2, 3, 1, 1),
        ((2, 16, 17, 15), (32, 16, 3, 3), 1, 1, 2, 1),
        ((2, 16, 16, 16), (16, 1, 3, 3), 1, 1, 1, 16),  # depthwise
        ((2, 8, 20), (4, 8, 5), 3, 0, 1, 1),  # conv1d
    ],
)
def test_convolution_flops_and_output_are_torchs(
    x: tuple[int, ...], w: tuple[int, ...], stride: int, padding: int, dilation: int, groups: int
) -> None:
    inp, weight, bias = t(*x), t(*w), t(w[0])
    spatial = len(x) - 2
    lists = [[v] * spatial for v in (stride, padding, dilation)]
    conv = F.conv2d if spatial == 2 else F.conv1d
    out = conv(inp, weight, bias, stride, padding, dilation, groups)
    expected = torch_flops(lambda: conv(inp, weight, bias, stride, padding, dilation, groups))["convolution"]
    as_called = {
        "aten::conv2d" if spatial == 2 else "aten::conv1d": recorded(inp, weight, bias, *lists, groups),
        "aten::convolution": recorded(inp, weight, bias, *lists, False, [0] * spatial, groups),
        "aten::cudnn_convolution": recorded(
            inp, weight, lists[1], lists[0], lists[2], groups, True, False, True
        ),
    }
    for name, inputs in as_called.items():
        work = op_work(name, inputs)
        assert work is not None and work.flops == expected, name
        with_bias = bias.nbytes if "cudnn" not in name else 0
        assert work.bytes == inp.nbytes + weight.nbytes + with_bias + out.nbytes, name


def test_convolution_backward_counts_each_gradient_as_one_forward() -> None:
    inp, weight = t(4, 16, 12, 12, grad=True), t(32, 16, 3, 3, grad=True)
    out = F.conv2d(inp, weight, None, 2, 1)
    grad = torch.ones_like(out)
    expected = torch_flops(lambda: out.backward(grad))["convolution_backward"]
    for mask, share in (([True, True, False], 1.0), ([False, True, False], 0.5)):
        inputs = recorded(grad, inp, weight, [0], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, mask)
        work = op_work("aten::convolution_backward", inputs)
        assert work is not None and work.flops == expected * share
    # grad_out read, then grad_input and grad_weight written, with the operands each needs
    both = op_work(
        "aten::convolution_backward",
        recorded(grad, inp, weight, [0], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]),
    )
    assert both.bytes == grad.nbytes + 2 * (inp.nbytes + weight.nbytes)


@pytest.mark.parametrize("heads_kv", [8, 2])  # multi-head and grouped-query
def test_attention_flops_are_torchs(heads_kv: int) -> None:
    q, k, v = (
        t(2, 8, 128, 64, dtype=torch.bfloat16),
        t(2, heads_kv, 256, 64, dtype=torch.bfloat16),
        t(2, heads_kv, 256, 64, dtype=torch.bfloat16),
    )
    fwd = op_work("aten::_scaled_dot_product_flash_attention", recorded(q, k, v, 0.0, False))
    assert fwd.flops == sdpa_flop_count(q.shape, k.shape, v.shape) and fwd.dtype == "bfloat16"
    assert fwd.bytes == q.nbytes + k.nbytes + v.nbytes + q.nbytes  # the output is q's shape here
    grad_out = torch.empty_like(q)
    bwd = op_work("aten::_scaled_dot_product_efficient_attention_backward", recorded(grad_out, q, k, v))
    assert bwd.flops == sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)
    assert bwd.flops == 2.5 * fwd.flops


def test_elementwise_ops_count_one_flop_per_output_element_of_the_broadcast_shape() -> None:
    a, b = t(8, 1, 32, dtype=torch.bfloat16), t(4, 32, dtype=torch.bfloat16)
    work = op_work("aten::add", recorded(a, b, 1))
    assert work.flops == 8 * 4 * 32 and work.bytes == a.nbytes + b.nbytes + 8 * 4 * 32 * 2
    inplace = op_work("aten::add_", recorded(t(8, 4, 32), b, 1))  # writes its first argument
    assert inplace.flops == 8 * 4 * 32 and inplace.bytes == 2 * 8 * 4 * 32 * 4 + b.nbytes
    assert op_work("aten::add_", recorded(b, t(8, 4, 32), 1)) is None  # in place cannot grow
    assert op_work("aten::native_batch_norm", recorded(a)) is None  # no formula: never guessed


def test_unknown_or_damaged_arguments_give_nothing() -> None:
    assert op_work("aten::mm", OpInputs(((64, 32), (32, 48)), ("c10::Weird", "float"), ("", ""))) is None
    assert op_work("aten::mm", OpInputs(((64, 32),), ("float",), ("",))) is None
    assert (
        op_work("aten::conv2d", OpInputs(((1, 3, 8, 8), (4, 3, 3, 3)), ("float", "float"), ("", ""))) is None
    )


# ---- kernels mapped to ops -----------------------------------------------------------------------
def test_the_zoo_cnns_kernels_carry_their_convolutions_flops_once() -> None:
    trace = load_trace(ZOO_CNN)
    r = roofline(trace, reference_ceilings("NVIDIA H200"), top=10_000)
    ops = {p.op for p in r.points}
    assert {"aten::cudnn_convolution", "aten::convolution_backward"} <= ops
    assert not ops & {"aten::conv2d", "aten::convolution", "aten::_convolution"}  # inner op counts
    assert not any(re.search(r"nchwToNhwc|nhwcToNchw|AddPadding", p.kernel) for p in r.points)
    # conservation: every convolution's FLOPs land on its kernels, split but not lost or doubled
    cpu = trace.rows(Kind.CPU_OP)
    launched = set(trace.external_id[trace.rows(Kind.KERNEL)].tolist())
    expected = 0.0
    for row in cpu.tolist():
        name = trace.name_of(row)
        if (
            name in ("aten::cudnn_convolution", "aten::convolution_backward")
            and trace.external_id[row] in launched
        ):
            expected += op_work(name, trace.inputs_of(row)).flops
    got = sum(p.flops for p in r.points if p.family == "convolution")
    assert got == pytest.approx(expected, rel=1e-9)
    assert 0 < r.covered_us <= r.kernel_us and r.shown_us == pytest.approx(r.covered_us)


def test_the_transformers_linears_count_as_their_addmm_and_attention_is_on_the_roofline() -> None:
    if not TRANSFORMER.exists():
        pytest.skip("transformer_shapes fixture not present")
    trace = load_trace(TRANSFORMER)
    r = roofline(trace, ceilings_for_device(trace.device_info.name, Path("/nonexistent")))
    assert r.ceilings is not None and "H100" in r.ceilings.source
    ops = {p.op for p in r.points}
    assert "aten::linear" not in ops and {"aten::mm", "aten::addmm"} <= ops
    assert any(p.family == "attention" for p in r.points)
    top = r.points[0]
    assert top.family == "matmul" and top.bound == "compute" and 0.5 < top.ceiling_share < 1.3
    elementwise = [p for p in r.points if p.family == "elementwise"]
    assert elementwise and all(p.bound == "memory" and p.intensity < 1 for p in elementwise)


def test_the_50_mb_resnet_trace_maps_its_convolutions_fast() -> None:
    if not BIG.exists():
        pytest.skip("benchmark trace not present")
    trace = load_trace(BIG)
    r = roofline(trace, reference_ceilings(trace.device_info.name))
    assert r.coverage > 0.2 and len(r.points) == 20
    assert {p.family for p in r.points} <= {"convolution", "elementwise"}
    assert all(p.ceiling_share is not None and p.ceiling_share < 1.5 for p in r.points)


def test_a_trace_without_shapes_says_how_to_record_them() -> None:
    r = analyze(load_trace(NO_SHAPES)).roofline
    assert r is not None and not r.points and r.kernel_us > 0
    assert "record_shapes=True" in r.note and "--record-shapes" in r.note


def test_the_loader_keeps_the_shapes_of_shaped_ops_only() -> None:
    trace = load_trace(ZOO_CNN)
    cpu = trace.rows(Kind.CPU_OP)
    names = np.array([trace.name_of(r) for r in cpu.tolist()])
    conv = cpu[names == "aten::cudnn_convolution"][0]
    inputs = trace.inputs_of(int(conv))
    assert inputs.types[:2] == ("c10::BFloat16", "c10::BFloat16") and len(inputs.dims[0]) == 4
    assert inputs.concrete[2].startswith("[")  # padding, as text
    assert (trace.inputs[cpu[names == "aten::empty"]] == -1).all()


def test_shapes_survive_the_repair_of_a_damaged_event(trace_doc: Any, write_trace: Any) -> None:
    doc = trace_doc("conv_bf16_train")
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::cudnn_convolution":
            e["args"]["Input Dims"] = [[160, 3, 224, 224], [64, 3, 7, 7]]
            e["args"]["External id"] = "not a number"  # forces the event-by-event repair
    trace = load_trace(write_trace(doc))
    assert trace.skipped.get("event args of unexpected types (those args dropped)", 0) > 0
    rows = [r for r in trace.rows(Kind.CPU_OP).tolist() if trace.name_of(r) == "aten::cudnn_convolution"]
    assert rows and all(trace.inputs_of(r).dims[1] == (64, 3, 7, 7) for r in rows)


# ---- ceilings by device name ---------------------------------------------------------------------
def test_ceilings_come_from_this_machines_cache_then_the_measured_table(tmp_path: Path) -> None:
    h200 = ceilings_for_device("NVIDIA H200", tmp_path)
    assert h200 is not None and h200.copy_bytes_per_s > 4e12 and "measured" in h200.source
    assert ceilings_for_device("NVIDIA A100-SXM4-80GB", tmp_path) is None
    mine = Ceilings(
        "cuda|NVIDIA H200|x|torch 9", "NVIDIA H200", 3e12, {"bfloat16": 7e14}, measured_at="2030-01-01"
    )
    store(mine, tmp_path)
    cached = ceilings_for_device("NVIDIA H200", tmp_path)
    assert cached.copy_bytes_per_s == 3e12 and "this machine" in cached.source


def test_without_ceilings_the_points_stay_and_say_so() -> None:
    r = roofline(load_trace(ZOO_CNN), None)
    assert r.points and r.ceilings is None and all(p.bound is None for p in r.points)
    assert "gpudoctor bench --ceilings" in r.note
    chart, _ = roofline_svg(r)
    assert chart.count("<circle") == len(r.points) and "<line x1" in chart  # grid, no roofs


# ---- saved and rendered --------------------------------------------------------------------------
def test_the_roofline_round_trips_through_json_and_old_analyses_still_load() -> None:
    analysis = analyze(load_trace(ZOO_CNN))
    doc = json.loads(json.dumps(analysis.to_json(), allow_nan=False))
    again = Analysis.from_json(doc)
    assert again.roofline == analysis.roofline and again.roofline.points
    del doc["roofline"]
    assert Analysis.from_json(doc).roofline is None


def test_the_chart_draws_every_point_inside_its_axes_and_escapes_names() -> None:
    analysis = analyze(load_trace(ZOO_CNN))
    r = analysis.roofline
    crafted = [dataclasses.replace(p, kernel=f"<script>alert({i})</script>") for i, p in enumerate(r.points)]
    r = dataclasses.replace(r, points=tuple(crafted))
    chart, families = roofline_svg(r)
    view = re.search(r'viewBox="0 0 (\d+) (\d+)"', chart)
    width, height = int(view.group(1)), int(view.group(2))
    circles = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', chart)
    assert len(circles) == len(r.points) and families
    for cx, cy in circles:
        assert 72 <= float(cx) <= width - 150 and 10 <= float(cy) <= height - 40
    assert "<script" not in chart and "&lt;script&gt;alert(0)&lt;/script&gt;" in chart
    page = render_html(dataclasses.replace(analysis, roofline=r), diagnose(analysis))
    assert page.count("<script") == 2 and 'id="roofline"' in page
    assert page.index('id="kernels"') < page.index('id="roofline"')
    md = render_markdown(dataclasses.replace(analysis, roofline=r), diagnose(analysis))
    assert "### Roofline of the top kernels" in md and "<script" not in md


def test_a_report_without_shapes_says_so_in_one_sentence() -> None:
    analysis = analyze(load_trace(NO_SHAPES))
    page = render_html(analysis, diagnose(analysis))
    section = page.split("<section><h2>Roofline of the top kernels</h2>")[1].split("</section>")[0]
    assert "record_shapes=True" in section and "<svg" not in section


# ---- damaged shapes: never a crash ---------------------------------------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=12,
)
_OPS = sorted(SHAPED_OPS)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_OPS), _JSON, _JSON, _JSON)
def test_any_recorded_arguments_give_work_or_nothing_never_an_error(
    name: str, dims: Any, types: Any, concrete: Any
) -> None:
    # GIVEN whatever JSON a damaged or foreign trace holds in Input Dims / Input type / Concrete Inputs
    raw = [json.dumps(v, allow_nan=True).encode() for v in (dims, types, concrete)]
    inputs = OpInputs(
        _json_tuple(raw[0]), tuple(map(str, _json_tuple(raw[1]))), tuple(map(str, _json_tuple(raw[2])))
    )
    # WHEN its work is derived THEN it is None or finite and non-negative
    work = op_work(name, inputs)
    if work is not None:
        assert np.isfinite(work.flops) and work.flops >= 0
        assert np.isfinite(work.bytes) and work.bytes >= 0


def test_a_trace_with_damaged_shapes_analyzes_and_reports(write_trace: Any) -> None:
    # GIVEN the zoo CNN with every convolution's shapes damaged in a different way
    with gzip.open(ZOO_CNN, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    junk = [
        [[-1, 3, 224, 224], [64, 3, 7, 7]],
        "nope",
        [[1e300, 2], [3]],
        [[2**62, 2**62], [2**62, 2**62]],
        None,
    ]
    convs = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and "conv" in str(e.get("name"))]
    assert convs
    for i, e in enumerate(convs):
        e["args"]["Input Dims"] = junk[i % len(junk)]
    # WHEN loaded, analyzed, diagnosed and rendered THEN no error, and every point is finite
    a = analyze(load_trace(write_trace(doc)))
    diagnose(a)
    render_html(a, diagnose(a))
    assert a.roofline is not None
    for p in a.roofline.points:
        assert all(np.isfinite(x) for x in (p.flops, p.bytes, p.flops_per_s, p.bytes_per_s, p.intensity))


# --- shares over 100% say why ------------------------------------------------------------------------


def test_no_share_over_100_percent_goes_unexplained() -> None:
    # GIVEN the H100 transformer fixture, where a matmul and an in-place add beat their measured ceilings
    a = analyze(load_trace(TRANSFORMER))
    assert a.roofline is not None
    over = [p for p in a.roofline.points if p.ceiling_share is not None and p.ceiling_share > 1]
    assert {p.bound for p in over} == {"compute", "memory"}
    # THEN each says why, and only those do
    for p in a.roofline.points:
        assert (p.beyond_ceiling is not None) == (p in over)
    compute = next(p for p in over if p.bound == "compute")
    memory = next(p for p in over if p.bound == "memory")
    assert "8192³ matmul" in (compute.beyond_ceiling or "")
    assert "L2 cache" in (memory.beyond_ceiling or "") and "device-to-device copy" in (
        memory.beyond_ceiling or ""
    )
    # AND every renderer marks the share and prints the reason
    md = "\n".join(render_markdown(a, diagnose(a)).splitlines())
    assert "103.4%\\*" in md and "cuBLAS runs this shape faster" in md  # markdown shows the top 5
    html = render_html(a, diagnose(a))
    assert "114.0%*" in html and "faster than the" in html


def test_operands_that_fit_in_l2_are_named_as_the_reason() -> None:
    a = analyze(load_trace(TRANSFORMER))
    assert a.roofline is not None and a.roofline.ceilings is not None
    from gpudoctor.analysis.roofline import _beyond

    limits = dataclasses.replace(a.roofline.ceilings, l2_cache_bytes=50 * 2**20)
    said = _beyond(1.2, "memory", "float32", 8 * 2**20, limits)
    assert said is not None and "8 MiB per call" in said and "50 MiB L2 cache" in said
    assert _beyond(0.97, "memory", "float32", 8 * 2**20, limits) is None
