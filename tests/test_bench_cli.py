"""`gpudoctor bench` and `gpudoctor explore` as a user meets them on a machine without a GPU: a timeit-like
table, comparisons of several statements, JSON on stdout, saving and comparing with a baseline (exit 1
on a regression), one-line errors (exit 2) for bad statements and options; the explorer's table, JSON,
and its crossover rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpudoctor.cli.main import app
from gpudoctor.timing import load_measurements
from gpudoctor.timing.explore import Crossover, ExplorePoint, ExploreResult, crossover, explore

torch = pytest.importorskip("torch")
QUICK = ("--min-time", "0.01", "--timeout", "0.3", "--min-samples", "5")


def run(*args: str | Path) -> Result:
    return CliRunner(env={"COLUMNS": "140"}).invoke(app, [str(a) for a in args])


def assert_one_line_error(result: Result, contains: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error: "), result.stderr
    assert contains in lines[0]
    assert "Traceback" not in result.output


def test_bench_times_a_statement_like_timeit() -> None:
    r = run("bench", "y = x * 2", "--setup", "x = torch.ones(64)", "--device", "cpu", *QUICK)
    assert r.exit_code == 0, r.output
    assert "y = x * 2" in r.stdout
    assert "host clock" in r.stdout and "calls/sample" in r.stdout


def test_several_statements_are_compared_with_the_first() -> None:
    r = run("bench", "sum(range(10))", "sum(range(2000))", "--device", "cpu", *QUICK)
    assert r.exit_code == 0, r.output
    assert "Comparison" in r.stdout
    assert "slower" in r.stdout


def test_json_output_is_only_json(tmp_path: Path) -> None:
    r = run("bench", "x + 1", "-s", "x = 3", "--json", "--device", "cpu", *QUICK)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpudoctor.bench"
    (m,) = doc["measurements"]
    assert m["label"] == "x + 1" and m["samples_us"]
    assert m["environment"]["torch"] == torch.__version__


def test_save_then_compare_passes_and_a_regression_exits_1(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    r = run("bench", "sum(range(100))", "--label", "loop", "--save", base, "--device", "cpu", *QUICK)
    assert r.exit_code == 0, r.output
    assert [m.label for m in load_measurements(base)] == ["loop"]
    # the same work again: no regression
    # CI machines are noisy (the same 1 µs loop once timed 1.75× its saved baseline on a shared 2-core
    # machine): a regression here is over 4×, which twenty times the work still is
    loose = ("--threshold", "3")
    r = run(
        "bench", "sum(range(100))", "--label", "loop", "--compare", base, *loose, "--device", "cpu", *QUICK
    )
    assert r.exit_code == 0, r.output
    assert "Against the baseline" in r.stdout
    # twenty times the work under the same label: a regression, exit 1
    r = run(
        "bench", "sum(range(2000))", "--label", "loop", "--compare", base, *loose, "--device", "cpu", *QUICK
    )
    assert r.exit_code == 1, r.output
    assert "regression" in r.stdout


def test_comparing_with_a_label_the_baseline_lacks_is_an_error(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    run("bench", "1 + 1", "--label", "a", "--save", base, "--device", "cpu", *QUICK)
    assert_one_line_error(run("bench", "1 + 1", "--label", "b", "--compare", base, "--device", "cpu", *QUICK),
                          "no measurement labelled 'b'")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bench",), "give a statement"),
        (("bench", "x +", "--device", "cpu"), "not valid Python"),
        (("bench", "1", "--setup", "import no_such_module_xyz", "--device", "cpu"), "--setup failed"),
        (("bench", "undefined_name_q", "--device", "cpu", *QUICK), "raised NameError"),
        (("bench", "1", "--device", "tpu"), "device must be"),
        (("bench", "1", "--method", "magic", "--device", "cpu"), "method must be"),
        (("bench", "1", "2", "--label", "a", "--device", "cpu"), "1 --label for 2 statements"),
        (("bench", "1", "--compare", "/no/such/file.json"), "no such file"),
        (("explore", "--ops", "fft"), "unknown op"),
        (("explore", "--sizes", "a,b"), "--sizes must be"),
        (("explore", "--dtype", "int8", "--cpu-only"), "floating-point"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    assert_one_line_error(run(*args), message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where there is no GPU")
def test_asking_for_cuda_without_a_gpu_is_one_line() -> None:
    assert_one_line_error(run("bench", "1", "--device", "cuda"), "no CUDA GPU")


# ---- explore ----
def test_explore_on_the_cpu_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "explore.json"
    r = run("explore", "--ops", "add,sort", "--sizes", "1024,4096", "--cpu-only", "--json", out)
    assert r.exit_code == 0, r.output
    assert "add" in r.stdout and "sort" in r.stdout and "4,096" in r.stdout
    result = ExploreResult.from_json(json.loads(out.read_text()))
    assert {(p.op, p.size) for p in result.points} == {
        ("add", 1024),
        ("add", 4096),
        ("sort", 1024),
        ("sort", 4096),
    }
    assert all(p.cpu_us and p.cpu_us > 0 and p.gpu_us is None for p in result.points)


def test_explore_plot_needs_matplotlib_or_says_so(tmp_path: Path) -> None:
    from gpudoctor.report.bench_plot import matplotlib_available

    r = run("explore", "--ops", "add", "--sizes", "1024", "--cpu-only", "--plot", tmp_path / "p.svg")
    if matplotlib_available():
        assert r.exit_code == 0 and (tmp_path / "p.svg").stat().st_size > 0
    else:
        assert_one_line_error(r, "needs matplotlib")


def test_every_op_builds_and_runs_at_a_small_size() -> None:
    result = explore(sizes=[64], gpu=False, point_options={"timeout_s": 0.2, "min_time_s": 0.0})
    assert {p.op for p in result.points} == {"matmul", "add", "sum", "conv2d", "softmax", "sort"}
    assert all(p.nbytes > 0 and p.flops > 0 and p.cpu_us for p in result.points)


def point(size: int, cpu: float, gpu: float) -> ExplorePoint:
    return ExplorePoint("op", size, 0, 0.0, cpu_us=cpu, gpu_us=gpu)


def test_the_crossover_is_where_the_gpu_starts_winning_for_good() -> None:
    pts = [point(10, 1, 10), point(100, 5, 10), point(1000, 50, 10), point(10_000, 500, 20)]
    c = crossover(pts, "gpu")
    assert c.size == 1000
    assert 100 < c.estimate < 1000  # the curves cross between the last CPU win and the first GPU win
    assert c.speedup_at_largest == pytest.approx(25)


def test_a_gpu_win_that_does_not_last_is_not_a_crossover() -> None:
    pts = [point(10, 1, 10), point(100, 50, 10), point(1000, 5, 10)]
    assert crossover(pts, "gpu") == Crossover("op", "gpu", None, None, 0.5)


def test_when_the_gpu_always_wins_the_crossover_is_the_smallest_size() -> None:
    c = crossover([point(10, 100, 1), point(100, 1000, 1)], "gpu")
    assert (c.size, c.estimate) == (10, 10.0)
    assert crossover([], "gpu").size is None


def test_flops_are_judged_against_the_cached_ceiling_of_the_setups_dtype(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudoctor.device import ceilings as dc

    monkeypatch.setenv(dc.CACHE_ENV, str(tmp_path))
    key, name = dc.device_identity("cpu")
    dc.store(
        dc.Ceilings(device_key=key, device_name=name, copy_bytes_per_s=1e10, matmul_flops={"float32": 1e11})
    )
    r = run("bench", "x @ x", "-s", "x = torch.ones(64, 64)", "--flops", str(2 * 64**3), "--json",
            "--device", "cpu", *QUICK)  # fmt: skip
    assert r.exit_code == 0, r.output
    (m,) = json.loads(r.stdout)["measurements"]
    assert m["dtype"] == "float32"
    assert m["ceilings"]["matmul_flops"] == {"float32": 1e11}
    assert m["summary"]["flops_share"] > 0


def test_a_significant_slowdown_under_the_threshold_is_said_not_to_be_a_regression() -> None:
    from io import StringIO

    from rich.console import Console

    from gpudoctor.report.bench_table import render_regressions
    from gpudoctor.timing.compare import Comparison, RegressionCheck, Verdict

    slower = Comparison("base", "loop", 1.011, 1.004, 1.018, 0.001, Verdict.SLOWER, 0.01, 50, 50)
    out = StringIO()
    render_regressions(
        [RegressionCheck(slower, 0.05, False)], Console(file=out, width=120, color_system=None)
    )
    assert (
        "loop: slower by 1.1%, under the 5% that counts as a regression (--threshold): not one"
        in out.getvalue()
    )
