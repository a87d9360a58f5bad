"""`gpudoctor analyze` as a user meets it: every recorded fixture gives a full summary or valid JSON; a
bad input is one line on stderr and exit 2, never a traceback (unless --debug); a CPU-only trace
prints "not available" for the GPU parts; several rank files give an overview and one rank's detail."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from gpudoctor.analysis.summary import SCHEMA, analyze
from gpudoctor.cli.main import app, main
from gpudoctor.doctor.document import RANKS_SCHEMA, report_json, reports_from_json
from gpudoctor.report.terminal import render_analysis
from gpudoctor.rules import SCHEMA as FINDINGS_SCHEMA
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_traces
from gpudoctor.util.names import short_kernel_name
from gpudoctor.util.units import fmt_us

TRACES = Path(__file__).parent / "fixtures" / "traces"
MANIFEST = json.loads((TRACES / "manifest.json").read_text())["fixtures"]
FIXTURES = sorted(MANIFEST)
SECTIONS = ("Step time", "GPU time", "Top kernels", "Roofline", "Launches", "Transfers",
            "Host synchronizations", "Top ops", "Memory")  # fmt: skip


def run(*args: str | Path) -> Result:
    runner = CliRunner(env={"COLUMNS": None})
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result: Result, *, contains: str = "") -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpudoctor: error: ")
    assert contains in lines[0]
    assert "Traceback" not in result.output


def fixture(name: str) -> Path:
    return TRACES / f"{name}.json.gz"


# --- every fixture -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_analyze_prints_every_section(name: str) -> None:
    # GIVEN a real GPU trace WHEN analyzed THEN the summary has every section and nothing on stderr
    result = run("analyze", fixture(name))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    for title in SECTIONS:
        assert title in result.stdout, title
    assert f"{name}.json.gz" in result.stdout
    assert MANIFEST[name]["environment"]["device_name"] in result.stdout  # the GPU it was recorded on


@pytest.mark.parametrize("name", FIXTURES)
def test_json_is_the_diagnosis_with_the_analysis_and_round_trips(name: str) -> None:
    result = run("analyze", fixture(name), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert doc["schema"] == FINDINGS_SCHEMA and isinstance(doc["bound"], str)
    savings = [f["est_saving_pct"] for f in doc["findings"]]
    assert savings == sorted(savings, reverse=True)
    for f in doc["findings"]:
        assert {"id", "severity", "title", "est_saving_pct", "evidence", "fix"} <= set(f)
    assert doc["analysis"]["schema"] == SCHEMA
    analysis, diagnosis = reports_from_json(doc)[0]
    assert analysis.to_json() == doc["analysis"]
    assert report_json([(analysis, diagnosis)]) == doc
    assert analysis.trace.path.endswith(f"{name}.json.gz")


def test_memory_section_shows_peak_when_recorded() -> None:
    result = run("analyze", fixture("sync_every_step_stack"))
    assert "peak allocated" in result.stdout
    assert "allocations per step" in result.stdout
    assert "sync_every_step.py(26): run" in result.stdout  # the user's source line of the .item() sync


# --- --step and --top --------------------------------------------------------------------------


def test_step_selects_one_step() -> None:
    result = run("analyze", fixture("inference"), "--json", "--step", "4")
    doc = json.loads(result.stdout)["analysis"]
    assert doc["selected_step"] == 4
    assert [s["number"] for s in doc["steps"]] == [4]
    text = run("analyze", fixture("inference"), "--step", "4").stdout
    assert "step 4 only" in text


def test_missing_step_is_a_one_line_error() -> None:
    assert_one_line_error(run("analyze", fixture("inference"), "--step", "99"), contains="no step 99")


def test_top_limits_the_kernel_rows() -> None:
    result = run("analyze", fixture("transformer_train"), "--top", "3")
    assert "showing 3 of" in result.stdout


# --- bad input ---------------------------------------------------------------------------------


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    good = fixture("dataloader_bound").read_bytes()
    (tmp / "no_traces").mkdir()
    (tmp / "no_traces" / "notes.txt").write_text("hello")
    files = {
        "empty.json": b"",
        "truncated.json.gz": good[: len(good) // 2],
        "random.json": bytes(range(256)) * 4,
        "not_a_trace.json": b'{"a": 1}',
        "cut_json.json": gzip.decompress(good)[:5000],
    }
    for file_name, data in files.items():
        (tmp / file_name).write_bytes(data)
    return {"missing": tmp / "does_not_exist.json", "no_traces": tmp / "no_traces"} | {
        n: tmp / n for n in files
    }


@pytest.mark.parametrize(
    "case", ["missing", "empty.json", "truncated.json.gz", "random.json", "not_a_trace.json", "cut_json.json",
             "no_traces"],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    path = _bad_inputs(tmp_path)[case]
    assert_one_line_error(run("analyze", path), contains=path.name)


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    path = _bad_inputs(tmp_path)["not_a_trace.json"]
    for args in (("--debug", "analyze", path), ("analyze", path, "--debug")):
        result = run(*args)
        assert result.exit_code == 2
        assert "Traceback" in result.stderr
        assert "NotATraceError" in result.stderr  # a TraceFormatError: JSON of another kind


@pytest.mark.parametrize("args", [("analyze",), ("analyze", "x.json", "--top", "0"), ("analyse", "x.json")])
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_ctrl_c_exits_130_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(path: object, *_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("gpudoctor.doctor.diagnose.load_traces", interrupted)
    result = run("analyze", fixture("inference"))
    assert result.exit_code == 130
    assert "Traceback" not in result.output


def test_main_entry_point_maps_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", str(tmp_path / "nope.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpudoctor: error: no such file")


def test_python_dash_m_runs_the_cli() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "analyze" in done.stdout


# --- a CPU-only trace --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trace recorded here with torch.profiler on the CPU alone, with two profiled steps."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    path = tmp_path_factory.mktemp("cpu") / "cpu_only.json"
    x = torch.randn(32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that each profiler cycle clears its events
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=2),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        ) as prof:
            for _ in range(3):
                (x @ x).relu().sum()
                prof.step()
    return path


def test_cpu_only_trace_says_once_what_is_missing_and_leaves_the_gpu_sections_out(cpu_trace: Path) -> None:
    result = run("analyze", cpu_trace)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("no GPU activity") == 1  # the header says it once, and names what is left out
    assert "left out below, for want of GPU activity: GPU time, top kernels, roofline" in out
    for section in (
        "GPU time ─",
        "Top kernels",
        "Roofline",
        "Launches",
        "Transfers",
        "Host synchronizations",
    ):
        assert section not in out
    assert "not available: no GPU activity" not in out
    assert "aten::mm" in out  # the CPU side is still there
    doc = json.loads(run("analyze", cpu_trace, "--json").stdout)
    assert doc["findings"] == [] and "No GPU activity" in doc["bound"]
    assert doc["analysis"]["timeline"]["gpu_window"] is None
    assert doc["analysis"]["kernels"]["count"] == 0


# --- several ranks -----------------------------------------------------------------------------


@pytest.fixture
def rank_dir(tmp_path: Path) -> Path:
    for rank, name in enumerate(("sync_every_step", "dataloader_bound")):
        (tmp_path / f"run_rank{rank}.json.gz").write_bytes(fixture(name).read_bytes())
    return tmp_path


def test_ranks_overview_then_detail(rank_dir: Path) -> None:
    result = run("analyze", rank_dir, "--rank", "1")
    assert result.exit_code == 0, result.output
    overview, _, detail = result.stdout.partition("below: rank 1 in detail")
    assert "2 ranks" in overview and "run_rank0.json.gz" in overview and "run_rank1.json.gz" in overview
    assert "gpudoctor run_rank1.json.gz" in detail


def test_ranks_json(rank_dir: Path) -> None:
    doc = json.loads(run("analyze", rank_dir, "--json").stdout)
    assert doc["schema"] == RANKS_SCHEMA
    assert [a.trace.rank for a, _ in reports_from_json(doc)] == [0, 1]
    one = json.loads(run("analyze", rank_dir, "--json", "--rank", "1").stdout)
    assert one["schema"] == FINDINGS_SCHEMA and one["analysis"]["trace"]["rank"] == 1


def test_unknown_rank_is_a_one_line_error(rank_dir: Path) -> None:
    assert_one_line_error(run("analyze", rank_dir, "--rank", "7"), contains="no rank 7")


@pytest.mark.parametrize(
    "args",
    [("analyze", "FILE"), ("analyze", "DIR", "--step", "1"), ("report", "FILE", "-o", "OUT")],
    ids=["analyze-file", "analyze-dir-step", "report-file"],
)
def test_an_unknown_engine_is_a_one_line_error_whatever_the_path(
    rank_dir: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    # GIVEN a single trace file (or a directory read whole for --step), which no engine is used for
    where = {"FILE": rank_dir / "run_rank0.json.gz", "DIR": rank_dir, "OUT": tmp_path / "r.html"}
    # WHEN --engine names none of the engines
    result = run(args[0], "--engine", "bogus", *(where.get(a, a) for a in args[1:]))
    # THEN it is refused as it is for a directory of ranks: one line, exit 2, nothing written
    assert_one_line_error(result, contains="unknown engine 'bogus' (one of auto, serial, processes")
    assert not (tmp_path / "r.html").exists()


def test_report_json_shapes() -> None:
    a = analyze(load_traces(fixture("inference"))[0])
    d = diagnose(a)
    assert report_json([(a, d)]) == {**d.to_json(), "analysis": a.to_json()}
    both = report_json([(a, d), (a, d)])
    assert both["schema"] == RANKS_SCHEMA and len(both["ranks"]) == 2


# --- the rendering itself ----------------------------------------------------------------------


def test_rendering_names_the_top_kernel_and_idle_causes() -> None:
    # A snapshot of the facts rather than of the bytes: the conv trace's top kernel, shortened, and
    # each idle cause of its profiled-steps window with its time as the analysis gives it.
    a = analyze(load_traces(fixture("conv_bf16_train"))[0])
    console = Console(record=True, width=140, color_system=None)
    render_analysis(a, console)
    text = console.export_text()
    assert (
        short_kernel_name(a.kernels.top[0].name) == "batch_norm_backward_kernel<BFloat16, float, float, int>"
    )
    assert "batch_norm_backward_kernel<BFloat16, float, float, int>" in text
    window = a.timeline.profiled_steps
    assert window is not None
    rows = {line.split()[0] + line.split()[1]: line for line in text.splitlines() if line.startswith("  ")}
    assert fmt_us(window.idle_by_cause_us["host_wait"]) in rows["hostwait"]
    assert fmt_us(window.idle_by_cause_us["launch_gap"]) in rows["launchgap"]


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
         "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::"
         "operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
         "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
         "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
         "{lambda(float)#1}, std::array<char*, 2ul>)",
         "vectorized_elementwise_kernel<4, launch_clamp_scalar>"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
         "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
         "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
         "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
         "unsigned int, float, 4, 4>)",
         "reduce_kernel<512, 1, sum_functor>"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ],
)  # fmt: skip
def test_short_kernel_names(name: str, short: str) -> None:
    assert short_kernel_name(name) == short


def test_short_kernel_name_respects_the_length() -> None:
    assert len(short_kernel_name("x" * 500, max_len=40)) == 40


def test_the_roofline_table_lists_the_top_kernels_against_the_ceilings() -> None:
    # GIVEN a trace recorded with record_shapes on an H100 WHEN analyzed
    result = run("analyze", fixture("transformer_shapes"))
    section = result.stdout.split("Roofline")[1].split("Launches")[0]
    # THEN bf16 matmuls are compute-bound near the measured ceiling, named with their op and the source
    mm = [row for row in section.splitlines() if " mm " in row and "bfloat16" in row]
    assert mm and all("compute" in row for row in mm)
    assert "measured by gpudoctor on an NVIDIA H100" in " ".join(section.split())


def test_without_shapes_the_roofline_says_how_to_get_it() -> None:
    result = run("analyze", fixture("inference"))
    section = " ".join(result.stdout.split("Roofline")[1].split("Launches")[0].split())
    assert "record_shapes=True" in section


def test_ops_of_a_cpu_only_trace_are_ranked_by_cpu_time_without_empty_gpu_columns() -> None:
    from io import StringIO

    from gpudoctor.analysis.cpu import OpStat
    from gpudoctor.report.tables import render_ops

    def shown(ops: tuple[OpStat, ...]) -> str:
        out = StringIO()
        render_ops(ops, Console(file=out, width=120, force_terminal=False, color_system=None), top=5)
        return out.getvalue()

    cpu = shown(
        (
            OpStat("aten::gru", 10, 9_000.0, 2_000.0, 0.0, 0.0, 0),
            OpStat("aten::mm", 40, 3_000.0, 3_000.0, 0.0, 0.0, 0),
        )
    )
    assert "Top ops (by CPU time: no GPU work)" in cpu and "GPU self" not in cpu and "kernels" not in cpu
    gpu = shown((OpStat("aten::mm", 40, 3_000.0, 3_000.0, 2_500.0, 2_500.0, 40),))
    assert "Top ops (by GPU time)" in gpu and "GPU self" in gpu and "kernels" in gpu
