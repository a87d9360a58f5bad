"""Where in the model (`analysis.modules`): GPU time forward and backward, host time and kernels per
`nn.Module` per step — on with_stack traces recorded on the GPU (`nn.Module: X_N` frames), and on the
`gpudoctor.module: <dotted.path>` annotations `gpudoctor run` writes (a synthetic trace in that format)."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpudoctor.analysis.modules import ModuleView, module_view
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.cli.main import app
from gpudoctor.report.html import render_html
from gpudoctor.report.terminal import render_analysis
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace
from gpudoctor.trace.iterations import find_iterations
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS

FIXTURES = Path(__file__).parent / "fixtures"
MLP = FIXTURES / "traces" / "sync_every_step_stack.json.gz"  # an MLP: a Sequential of 13 layers
DDP = FIXTURES / "ddp_stack" / "rank0.json.gz"  # a GPT in DistributedDataParallel


@functools.cache
def _analysis(path: Path, depth: int = 2) -> Analysis:
    return analyze(load_trace(path), module_depth=depth)


def _by_path(view: ModuleView) -> dict[str, Any]:
    return {m.path: m for m in view.modules}


def test_the_mlp_step_is_put_on_its_layers_forward_and_backward() -> None:
    # GIVEN a with_stack trace of an MLP training step (Sequential of Linear, LayerNorm, GELU)
    view = _analysis(MLP).modules
    assert view is not None and view.per == "step" and view.backward
    root, *children = view.modules
    # THEN the root is the Sequential, called once per step, and its children are its 13 layers, in order
    assert root.path == "Sequential_0" and root.depth == 0 and root.calls == 1
    assert [c.path.split(".")[-1] for c in children][:3] == ["Linear_0", "LayerNorm_0", "GELU_0"]
    assert len(children) == 13 and all(c.depth == 1 and c.calls == 1 for c in children)
    # AND the layers' GPU time adds up to the root's (the Sequential runs nothing itself), forward and back
    assert sum(c.gpu_forward_us for c in children) == pytest.approx(root.gpu_forward_us)
    assert sum(c.gpu_backward_us for c in children) == pytest.approx(root.gpu_backward_us)
    assert sum(c.kernels for c in children) == pytest.approx(root.kernels)
    # AND a big Linear's backward (two matmuls of its size) takes about twice its forward (one)
    for name in ("Linear_1", "Linear_2", "Linear_3"):
        layer = _by_path(view)[f"Sequential_0.{name}"]
        assert 1.8 < layer.gpu_backward_us / layer.gpu_forward_us < 2.2
    # AND what no module ran (the optimizer, the loss) is the rest of the step's GPU time
    assert 0 < view.unattributed_gpu_us < 0.2 * view.gpu_us
    assert root.gpu_us + view.unattributed_gpu_us == pytest.approx(view.gpu_us)


def test_the_module_view_is_per_step() -> None:
    # GIVEN the same trace, its three steps THEN each figure is one step's: the GPU time of all modules
    # and the rest is the GPU activity of the three steps over three
    trace = load_trace(MLP)
    steps = find_iterations(trace).steps
    view = module_view(trace, steps)
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    assert view is not None and len(steps) == 3
    assert view.gpu_us == pytest.approx(float(trace.dur[gpu].sum()) / 3, rel=0.02)
    one = module_view(trace, steps[1:2])
    assert one is not None and one.modules[0].calls == 1


def test_a_wrapper_root_is_looked_through() -> None:
    # GIVEN a GPT wrapped in DistributedDataParallel THEN the view starts at the GPT, its blocks below
    view = _analysis(DDP, 1).modules
    assert view is not None and view.depth == 1
    root = view.modules[0]
    assert root.path == "DistributedDataParallel_0.GPT_0" and root.depth == 0
    names = [m.path.rsplit(".", 1)[-1] for m in view.modules[1:]]
    assert names == [
        "Embedding_0",
        "Embedding_1",
        "Block_0",
        "Block_1",
        "Block_2",
        "Block_3",
        "LayerNorm_8",
        "Linear_16",
    ]
    assert all(m.depth == 1 for m in view.modules[1:])


def test_the_depth_is_chosen() -> None:
    shallow, deep = _analysis(DDP, 1).modules, _analysis(DDP, 3).modules
    assert shallow is not None and deep is not None
    assert max(m.depth for m in shallow.modules) == 1 and max(m.depth for m in deep.modules) == 3
    assert len(deep.modules) > len(_analysis(DDP, 2).modules.modules) > len(shallow.modules)  # type: ignore[union-attr]
    # the figures of a module do not depend on how deep the view goes
    assert _by_path(deep)[shallow.modules[3].path] == shallow.modules[3]


def test_traces_without_module_calls_say_so() -> None:
    a = _analysis(FIXTURES / "traces" / "sync_every_step.json.gz")
    assert a.modules is None
    out = io.StringIO()
    render_analysis(a, Console(file=out, width=120), diagnosis=diagnose(a))
    assert "Where in the model" in out.getvalue() and "record with with_stack=True" in out.getvalue()


# ---- the gpudoctor.module annotations gpudoctor run writes -------------------------------------


def _annotated_trace() -> dict[str, Any]:
    """One training step of TinyNet(encoder=Sequential(Linear), head=Linear) as gpudoctor run records it:
    `gpudoctor.module:` annotations around each forward on the main thread (tid 1), the backward on
    autograd's thread (tid 2), and an optimizer kernel outside any module."""
    events: list[dict[str, Any]] = []

    def x(cat: str, name: str, tid: int, ts: float, dur: float, **args: Any) -> None:
        events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    def launch(op: str, tid: int, ts: float, corr: int, kernel_us: float, **seq: Any) -> None:
        x("cpu_op", op, tid, ts, 10.0, **{"External id": corr, **seq})
        x("cuda_runtime", "cudaLaunchKernel", tid, ts + 2, 5.0, correlation=corr, **{"External id": corr})
        events.append({"ph": "X", "cat": "kernel", "name": f"kernel_{op}", "pid": 0, "tid": 7, "ts": ts + 200,
                       "dur": kernel_us, "args": {"correlation": corr, "External id": corr, "device": 0, "stream": 7}})  # fmt: skip

    x("user_annotation", "gpudoctor.module: TinyNet", 1, 0.0, 100.0)
    x("user_annotation", "gpudoctor.module: encoder", 1, 5.0, 55.0)
    x("user_annotation", "gpudoctor.module: encoder.0", 1, 10.0, 30.0)
    launch("aten::addmm", 1, 15.0, 1, 40.0, **{"Sequence number": 7, "Fwd thread id": 0})
    x("user_annotation", "gpudoctor.module: head", 1, 65.0, 30.0)
    launch("aten::mm", 1, 70.0, 2, 20.0, **{"Sequence number": 8, "Fwd thread id": 0})
    x("cpu_op", "MmBackward0", 2, 150.0, 30.0, **{"Sequence number": 8, "Fwd thread id": 1})
    launch("aten::mm", 2, 155.0, 3, 45.0)
    x("cpu_op", "AddmmBackward0", 2, 190.0, 30.0, **{"Sequence number": 7, "Fwd thread id": 1})
    launch("aten::mm", 2, 195.0, 4, 80.0)
    x("user_annotation", "Optimizer.step#SGD.step", 1, 300.0, 50.0)
    launch("aten::add_", 1, 310.0, 5, 5.0)
    return {"traceEvents": events}


@pytest.fixture
def annotated(tmp_path: Path) -> Path:
    path = tmp_path / "annotated.json"
    path.write_text(json.dumps(_annotated_trace()))
    return path


def test_gpudoctor_module_annotations_give_dotted_paths_and_backward_through_sequence_numbers(
    annotated: Path,
) -> None:
    a = analyze(load_trace(annotated))
    view = a.modules
    assert view is not None and view.source == "gpudoctor.module annotations"
    # THEN the root is named by its class, the rest by their dotted paths, in tree order
    assert [(m.path, m.depth) for m in view.modules] == [
        ("TinyNet", 0),
        ("encoder", 1),
        ("encoder.0", 2),
        ("head", 1),
    ]
    m = _by_path(view)
    # AND each forward kernel is its module's, each backward kernel the module whose forward ran its op
    assert (m["encoder.0"].gpu_forward_us, m["encoder.0"].gpu_backward_us) == (40.0, 80.0)
    assert (m["encoder"].gpu_forward_us, m["encoder"].gpu_backward_us) == (40.0, 80.0)
    assert (m["head"].gpu_forward_us, m["head"].gpu_backward_us) == (20.0, 45.0)
    assert (m["TinyNet"].gpu_us, m["TinyNet"].kernels) == (185.0, 4)
    assert m["TinyNet"].host_us == 100.0 and m["encoder.0"].host_us == 30.0
    # AND the optimizer's kernel is no module's
    assert view.unattributed_gpu_us == 5.0


def test_the_module_view_is_rendered_and_serialized(annotated: Path) -> None:
    a = analyze(load_trace(annotated))
    d = diagnose(a)
    out = io.StringIO()
    render_analysis(a, Console(file=out, width=120), diagnosis=d)
    text = out.getvalue()
    assert "Where in the model" in text
    lines = text.splitlines()
    # indented by depth, each row its module's own name
    for start in ("TinyNet ", "  encoder ", "    0 ", "  head "):
        assert any(line.startswith(start) for line in lines), start
    html = render_html(a, d)
    assert 'table class="sortable modules"' in html and 'title="encoder.0"' in html
    doc = json.loads(json.dumps(a.to_json()))
    assert [m["path"] for m in doc["modules"]["modules"]] == ["TinyNet", "encoder", "encoder.0", "head"]
    assert Analysis.from_json(doc).modules == a.modules


def test_module_names_from_the_trace_are_escaped_in_html(tmp_path: Path) -> None:
    doc = _annotated_trace()
    for e in doc["traceEvents"]:
        if e["name"] == "gpudoctor.module: head":
            e["name"] = "gpudoctor.module: <script>alert(1)</script>"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(doc))
    a = analyze(load_trace(path))
    html = render_html(a, diagnose(a))
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html


def test_analyze_takes_the_module_depth() -> None:
    result = CliRunner().invoke(app, ["analyze", str(DDP), "--json", "--module-depth", "3"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    modules = doc["ranks"][0]["analysis"]["modules"] if "ranks" in doc else doc["analysis"]["modules"]
    assert modules["depth"] == 3 and max(m["depth"] for m in modules["modules"]) == 3
    bad = CliRunner().invoke(app, ["analyze", str(DDP), "--module-depth", "0"])
    assert bad.exit_code == 2
