"""`gpudoctor analyze`'s fast path (`cli.fast`) does what the typer command does, or leaves the command
line to typer: for a plain command line both build the same request and print the same output; for
anything typer might read otherwise (help, usage errors, values it refuses) the fast path declines."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.cli import analyze as analyze_cli
from gpudoctor.cli import analyze_run
from gpudoctor.cli.analyze_run import AnalyzeRequest
from gpudoctor.cli.fast import fast_analyze, plain_analyze
from gpudoctor.cli.main import app, main

TRACE = str(Path(__file__).parent / "fixtures" / "traces" / "sync_every_step.json.gz")

PLAIN = [
    ["analyze", TRACE],
    ["analyze", "--json", TRACE],
    [
        "analyze", TRACE, "--step", "3", "--rank", "0", "--top", "4", "--step-time-ms", "12.5",
        "--module-depth", "8", "--max-trace-size", "512M", "--workers", "2", "--engine", "serial",
    ],
    ["analyze", "--top=1", "--step=+2", f"{TRACE}", "--module-depth=1", "--step-time-ms=1e3"],
    ["analyze", TRACE, "--top", "3", "--top", "5"],  # the last one given holds, as in click
    ["analyze", TRACE, "--debug", "--json", "--json"],
]  # fmt: skip

NOT_PLAIN = [
    [],
    ["analyze"],
    ["--debug", "analyze", TRACE],
    ["report", TRACE],
    ["analyze", "--help"],
    ["analyze", TRACE, "-h"],
    ["analyze", TRACE, "--html", "out.html"],
    ["analyze", TRACE, "other.json"],
    ["analyze", "--", TRACE],
    ["analyze", TRACE, "--top", "0"],
    ["analyze", TRACE, "--module-depth", "9"],
    ["analyze", TRACE, "--workers", "0"],
    ["analyze", TRACE, "--step", "-1"],
    ["analyze", TRACE, "--step", "two"],
    ["analyze", TRACE, "--step-time-ms", "fast"],
    ["analyze", TRACE, "--step="],
    ["analyze", TRACE, "--json=yes"],
    ["analyze", TRACE, "--top"],
    ["analyze", TRACE, "--jsn"],
    ["analyze", "-"],
]


def typer_request(args: list[str], monkeypatch: pytest.MonkeyPatch) -> AnalyzeRequest:
    seen: list[AnalyzeRequest] = []
    monkeypatch.setattr(analyze_cli, "run_analyze", seen.append)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def fast_request(args: list[str], monkeypatch: pytest.MonkeyPatch) -> AnalyzeRequest:
    seen: list[AnalyzeRequest] = []
    monkeypatch.setattr(analyze_run, "run_analyze", seen.append)
    assert fast_analyze(args) == 0
    return seen[0]


@pytest.mark.parametrize("args", PLAIN, ids=lambda a: " ".join(a[1:]).replace(TRACE, "T"))
def test_a_plain_command_line_makes_the_request_typer_makes(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert plain_analyze(args) is not None
    assert fast_request(args, monkeypatch) == typer_request(args, monkeypatch)


@pytest.mark.parametrize("args", NOT_PLAIN, ids=lambda a: " ".join(a).replace(TRACE, "T") or "none")
def test_anything_else_is_left_to_typer(args: list[str]) -> None:
    assert plain_analyze(args) is None
    assert fast_analyze(args) is None


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["summary", "json"])
def test_the_fast_path_prints_what_typer_prints(
    extra: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # both laid out for a pipe
    with pytest.raises(SystemExit) as done:
        main(["analyze", TRACE, *extra])
    assert done.value.code == 0
    fast = capsys.readouterr()
    slow = CliRunner(env={"COLUMNS": None}).invoke(app, ["analyze", TRACE, *extra])
    assert slow.exit_code == 0
    assert fast.out == slow.stdout and fast.err == slow.stderr == ""
    assert "Diagnosis" in fast.out or '"findings"' in fast.out


@pytest.mark.parametrize("debug", [False, True])
def test_its_errors_are_the_apps(debug: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["analyze", str(tmp_path / "nope.json"), *(["--debug"] if debug else [])]
    assert fast_analyze(args) == 2
    fast = capsys.readouterr().err
    slow = CliRunner().invoke(app, args)
    assert slow.exit_code == 2
    if debug:
        assert "Traceback" in fast and "Traceback" in slow.stderr
        assert fast.strip().splitlines()[-1] == slow.stderr.strip().splitlines()[-1]
    else:
        assert fast == slow.stderr and fast.startswith("gpudoctor: error: no such file")


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(request: AnalyzeRequest) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(analyze_run, "run_analyze", interrupted)
    assert fast_analyze(["analyze", TRACE]) == 130


def test_in_its_own_process_no_collector_runs_and_the_rest_is_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    seen: list[bool] = []
    monkeypatch.setattr(analyze_run, "run_analyze", lambda request: seen.append(gc.isenabled()))
    try:
        assert fast_analyze(["analyze", TRACE], own_process=True) == 0
        assert seen == [False] and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
    assert fast_analyze(["analyze", TRACE]) == 0  # called in a process that goes on: as it was
    assert seen[-1] is True


def test_the_process_ends_at_once_only_when_nothing_waits_for_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import atexit
    import os
    import sys

    from gpudoctor.cli import main as entry

    ended: list[int] = []
    monkeypatch.setattr(os, "_exit", ended.append)
    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 0)
    monkeypatch.setattr(sys, "gettrace", lambda: None)
    monkeypatch.setattr(sys, "getprofile", lambda: None)
    entry._end_now(3)
    assert ended == [3]
    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 1)  # a handler to run at exit (coverage's, say)
    entry._end_now(4)
    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 0)
    monkeypatch.setattr(sys, "getprofile", lambda: print)  # `python -m cProfile -m gpudoctor ...`
    entry._end_now(5)
    assert ended == [3]
