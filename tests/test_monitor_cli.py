"""`gpudoctor monitor` as a user meets it, on the fake backend replaying samples recorded on the GPU
machine: no NVML is one line and exit 2; `--once` prints every GPU (or JSON); `--log` writes CSV or JSON
lines; `-- CMD` follows a command, keeps its exit status and summarizes on stderr; `--replay` re-reads a
log; the live view stops after `--duration`."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import gpudoctor.cli.monitor as cli_monitor
from gpudoctor.cli.main import app
from gpudoctor.monitor import MonitorRecord, MonitorSummary, NvmlUnavailable, ReplayBackend

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


def run(*args: str | Path) -> Result:
    return CliRunner(env={"COLUMNS": "150"}).invoke(app, [str(a) for a in args])


@pytest.fixture
def replaying(monkeypatch: pytest.MonkeyPatch):
    """Make `monitor` read a recorded fixture instead of NVML; yields a function to choose which."""
    chosen: dict[str, ReplayBackend] = {}

    def use(name: str) -> ReplayBackend:
        chosen["backend"] = ReplayBackend(MonitorRecord.read_jsonl(FIXTURES / f"{name}.jsonl.gz"))
        return chosen["backend"]

    monkeypatch.setattr(cli_monitor, "open_backend", lambda **_: chosen["backend"])
    return use


def test_no_nvml_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(**_: object) -> None:
        raise NvmlUnavailable("NVML is not available: libnvidia-ml.so.1 not found: no NVIDIA driver here")

    monkeypatch.setattr(cli_monitor, "open_backend", unavailable)
    for args in (["monitor", "--once"], ["monitor"], ["monitor", "--", "true"]):
        result = run(*args)
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.splitlines() == ["gpudoctor: error: NVML is not available: libnvidia-ml.so.1 not found: "
                                              "no NVIDIA driver here"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--once", "--", "true"], "--once takes no command"),
        (["--log", "x.txt"], "name it .csv or .jsonl"),
        (["--json"], "--json goes with --once or --replay"),
        (["--replay", "x.jsonl", "--once"], "--replay reads a log"),
        (["--duration", "1", "--", "true"], "--duration is for the live view"),
    ],
)
def test_bad_options_are_one_line(args: list[str], message: str) -> None:
    result = run("monitor", *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_once_shows_the_burn(replaying) -> None:
    replaying("burn")
    result = run("monitor", "--once")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "GPU 0: NVIDIA" in out and "busy" in out and "tensor" in out and "python3" in out


def test_once_json_has_samples_and_alerts(replaying, tmp_path: Path) -> None:
    replaying("contention")
    result = run("monitor", "--once", "--json", "--log", tmp_path / "s.csv")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "gpudoctor.monitor-snapshot/1" and len(doc["latest"]) == 1
    assert [a["kind"] for a in doc["alerts"]].count("contention") == 1
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert len(rows) == 1 and int(rows[0]["process_count"]) >= 2


def test_following_a_command_keeps_its_exit_status_and_summarizes(replaying, tmp_path: Path) -> None:
    replaying("contention")
    log, summary_path = tmp_path / "run.jsonl", tmp_path / "summary.json"
    result = run("monitor", "-i", "20", "--log", log, "--summary", summary_path, "--",
                 sys.executable, "-c", "import time; time.sleep(0.6); raise SystemExit(3)")  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "Run summary" in result.stderr and "exit status 3" in result.stderr
    assert "gpudoctor: warning: contention:" in result.stderr  # raised while the command ran
    summary = MonitorSummary.from_json(json.loads(summary_path.read_text()))
    assert summary.exit_code == 3 and summary.command and summary.command[0] == sys.executable
    assert summary.devices[0].samples >= 10
    assert len(MonitorRecord.read_jsonl(log).samples) == summary.devices[0].samples


def test_quiet_prints_no_alerts_while_the_command_runs(replaying) -> None:
    replaying("contention")
    result = run("monitor", "-q", "-i", "20", "--", sys.executable, "-c", "import time; time.sleep(0.3)")
    assert (
        result.exit_code == 0 and "gpudoctor: warning" not in result.stderr and "Run summary" in result.stderr
    )


def test_a_command_that_does_not_exist_is_127(replaying) -> None:
    replaying("idle")
    result = run("monitor", "--", "no-such-command-for-gpudoctor")
    assert result.exit_code == 127
    assert result.stderr.strip() == "gpudoctor: error: command not found: no-such-command-for-gpudoctor"


def test_a_command_killed_by_a_signal_exits_128_plus_the_signal(replaying) -> None:
    replaying("idle")
    result = run(
        "monitor", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    )
    assert result.exit_code == 128 + 15


def test_the_live_view_stops_after_its_duration(replaying, tmp_path: Path) -> None:
    backend = replaying("burn")
    result = run("monitor", "-d", "0.5", "-i", "50", "--log", tmp_path / "live.csv")
    assert result.exit_code == 0, result.output
    assert "Monitor summary" in result.stdout and "tensor cores" in result.stdout
    assert backend.reads >= 5
    assert len((tmp_path / "live.csv").read_text().splitlines()) == backend.reads + 1


def test_replay_summarizes_a_log(tmp_path: Path) -> None:
    result = run("monitor", "--replay", FIXTURES / "starved.jsonl.gz")
    assert result.exit_code == 0, result.output
    assert "GPU starved" in result.stdout and "input pipeline" in result.stdout
    as_json = run("monitor", "--replay", FIXTURES / "starved.jsonl.gz", "--json")
    doc = json.loads(as_json.stdout)
    assert doc["schema"] == "gpudoctor.monitor-summary/1"
    assert "low_utilization" in {e["kind"] for e in doc["episodes"]}


def test_replay_of_a_missing_file_is_one_line() -> None:
    result = run("monitor", "--replay", "/nonexistent/x.jsonl")
    assert result.exit_code == 2 and result.stderr.startswith(
        "gpudoctor: error: cannot read /nonexistent/x.jsonl"
    )


def test_gpu_selection_by_index_and_unknown_gpu(replaying) -> None:
    replaying("idle")
    assert run("monitor", "--once", "-g", "0").exit_code == 0
    replaying("idle")
    result = run("monitor", "--once", "-g", "3")
    assert result.exit_code == 2 and "no GPU 3" in result.stderr


def test_without_nvidia_ml_py_a_machine_with_no_nvidia_driver_is_told_so_first(tmp_path: Path) -> None:
    from gpudoctor.monitor.nvml import missing_pynvml

    assert missing_pynvml(tmp_path / "no-driver").startswith(
        "no NVIDIA driver on this machine (no GPU to watch)"
    )
    (tmp_path / "driver").mkdir()
    assert (
        missing_pynvml(tmp_path / "driver") == "nvidia-ml-py is not installed (pip install 'gpudoctor[nvml]')"
    )
