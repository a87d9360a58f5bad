"""The HTML and Markdown reports as a reader meets them: findings first, the charts drawn inline, the
file self-contained, and nothing from a trace able to inject markup or script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudoctor.analysis.summary import analyze
from gpudoctor.analysis.timeline_view import MAX_SPANS_PER_LANE, representative_step, step_timeline
from gpudoctor.report.html import json_for_html, render_html
from gpudoctor.report.markdown import md_text, render_markdown
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace
from gpudoctor.trace.steps import find_steps
from report_crafted import KERNEL_NAMES, OP_NAMES, write_crafted_trace

TRACES = Path(__file__).parent / "fixtures" / "traces"
ZOO = Path(__file__).parent / "fixtures" / "zoo"
ALL = sorted(TRACES.glob("*.json.gz")) + sorted(ZOO.glob("*.json.gz"))


def render(path: Path) -> tuple[str, object]:
    trace = load_trace(path)
    analysis = analyze(trace)
    diagnosis = diagnose(analysis)
    return render_html(analysis, diagnosis, step_timeline(trace)), diagnosis


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_every_fixture_renders_a_self_contained_page(path: Path) -> None:
    page, diagnosis = render(path)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Offline: nothing is fetched (the SVG namespace is an identifier, not a request).
    assert not re.search(r"<link|<img|<iframe|\bsrc=|@import|url\(", page)
    assert "https://" not in page and page.count("http://") == page.count(
        'xmlns="http://www.w3.org/2000/svg"'
    )
    for f in diagnosis.findings:
        assert f'<span class="fid">{f.id}</span>' in page
    assert 'class="bound"' in page


def test_findings_come_before_the_charts_with_cost_evidence_and_fix() -> None:
    page, diagnosis = render(TRACES / "sync_every_step.json.gz")
    top = diagnosis.findings[0]
    assert top.id == "tensor_cores_unused"
    at = page.index(f'<span class="fid">{top.id}</span>')
    assert at < page.index("<svg")
    assert f"up to {top.est_saving_pct:g}% of the step" in page
    assert "<pre><code>with torch.autocast(" in page  # the fix's code, escaped but verbatim
    assert page.count('<svg class="chart"') == 2  # step bars and the timeline (no memory events here)
    assert "not available: no GPU memory events" in page


def test_memory_chart_is_drawn_when_the_trace_has_memory_events() -> None:
    page, _ = render(ZOO / "memory_pressure__slow.json.gz")
    assert 'aria-label="GPU memory over time"' in page and "<polyline" in page


def test_a_crafted_trace_cannot_inject_markup_or_script(tmp_path: Path) -> None:
    page, _ = render(write_crafted_trace(tmp_path / "crafted.json.gz"))
    for name in (*KERNEL_NAMES, *OP_NAMES):
        assert name not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown, as text
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    # Exactly the page's own two scripts: the JSON data block and the sort script.
    assert page.count("<script") == 2 and page.count("</script>") == 2
    data = page.split('<script type="application/json" id="gpudoctor-data">')[1].split("</script>")[0]
    assert "<" not in data and ">" not in data
    json.loads(data)


def test_json_for_html_cannot_close_its_script_element() -> None:
    text = json_for_html({"x": "</script><script>alert(1)</script>&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"x": "</script><script>alert(1)</script>&"}


def test_report_of_the_big_trace_stays_small() -> None:
    big = Path(__file__).parent.parent / "benchmarks" / "traces" / "resnet50_10steps.json.gz"
    if not big.exists():
        pytest.skip("benchmark trace not present")
    page, _ = render(big)
    assert len(page.encode()) < 5 * 2**20


def test_timeline_of_the_median_step_is_merged_to_a_bounded_size() -> None:
    trace = load_trace(TRACES / "transformer_train.json.gz")
    steps = find_steps(trace)
    view = step_timeline(trace)
    assert view is not None and view.step == representative_step(steps).number
    durations = sorted(s.duration_us for s in steps)
    assert view.duration_us == pytest.approx(durations[(len(durations) - 1) // 2])
    for lane in view.lanes:
        assert 0 < len(lane.spans) <= MAX_SPANS_PER_LANE
        assert all(0 <= s.start_us <= s.end_us <= view.duration_us + 1e-6 for s in lane.spans)
        assert all(a.end_us <= b.start_us + 1e-6 for a, b in zip(lane.spans, lane.spans[1:], strict=False))


def test_markdown_has_the_findings_table_and_key_figures() -> None:
    analysis = analyze(load_trace(TRACES / "sync_every_step.json.gz"))
    diagnosis = diagnose(analysis)
    md = render_markdown(analysis, diagnosis)
    assert "| severity | finding | up to | id |" in md
    for f in diagnosis.findings:
        assert f"`{f.id}` |" in md and f"{f.est_saving_pct:g}%" in md
    assert "### Key figures" in md and "| GPU busy |" in md
    assert md.count("```python") == len(diagnosis.findings)


def test_markdown_escapes_names_from_the_trace(tmp_path: Path) -> None:
    analysis = analyze(load_trace(write_crafted_trace(tmp_path / "crafted.json.gz")))
    md = render_markdown(analysis, diagnose(analysis))
    assert "<script" not in md and "<img" not in md
    assert md_text("a|b<c>") == "a\\|b&lt;c&gt;"


def test_the_step_without_the_profiler_leads_the_figures_and_the_traced_median_is_named_so() -> None:
    # GIVEN a run's trace with its step measured without the profiler (the traced steps are slower)
    trace = load_trace(TRACES / "sync_every_step.json.gz")
    analysis = analyze(trace, unprofiled_step_us=6_949.0)
    diagnosis = diagnose(analysis)
    page = render_html(analysis, diagnosis, step_timeline(trace))
    markdown = render_markdown(analysis, diagnosis)
    # THEN the HTML and Markdown reports headline the step the loop pays, not the profiled one
    assert "<b>6.95 ms</b><span>step time, no profiler</span>" in page
    assert page.index("step time, no profiler") < page.index("traced step (median)")
    assert "| step time, no profiler | 6.95 ms |" in markdown and "traced step (median)" in markdown
    # AND a bare trace (no unprofiled step known) keeps its one step time
    bare = analyze(trace)
    assert "step time (median)" in render_html(bare, diagnose(bare), step_timeline(trace))


def test_a_compiled_model_is_why_the_trace_has_no_module_view() -> None:
    from gpudoctor.report.modules_view import COMPILED, NO_MODULES, why_no_modules

    compiled = analyze(load_trace(ZOO / "control_cnn.json.gz"))  # torch.compile'd: modules in the graph
    assert compiled.modules is None and why_no_modules(compiled.trace.compiled) == COMPILED
    page, _ = render(ZOO / "control_cnn.json.gz")
    assert "the model runs compiled (torch.compile)" in page
    assert (
        why_no_modules(analyze(load_trace(TRACES / "sync_every_step.json.gz")).trace.compiled) == NO_MODULES
    )


def test_the_profiler_options_read_on_and_off_not_kinetos_ones() -> None:
    # GIVEN a trace recorded with with_stack and profile_memory (Kineto writes them as 1)
    page, _ = render(TRACES / "sync_every_step_stack.json.gz")
    # THEN the environment says they were on
    assert "<th>profiler with_stack</th><td>on</td>" in page
    assert "<th>profiler profile_memory</th><td>on</td>" in page
    assert "<td>1</td>" not in page.split('id="env"')[-1]


def test_the_top_ops_columns_are_in_the_terminals_order_self_then_total() -> None:
    from gpudoctor.report.html import _ops

    analysis = analyze(load_trace(TRACES / "conv_bf16_train.json.gz"))
    section = _ops(analysis)
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", section)
    assert heads[:7] == ["op", "calls", "GPU self", "GPU total", "CPU self", "CPU total", "kernels"]
    # AND each cell holds its column's figure (the first op: CPU self 3.7 ms of its CPU total 7.02 ms)
    top = analysis.ops[0]
    values = [float(v) for v in re.findall(r'data-v="([^"]+)"', section)[:6]]
    assert values[1:5] == pytest.approx(
        [top.gpu_self_us, top.gpu_total_us, top.cpu_self_us, top.cpu_total_us], rel=1e-3
    )
