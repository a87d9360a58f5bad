"""`gpudoctor run` end to end on the CPU: small training scripts written into tmp_path run in this
process as `python script.py` would, and leave a run directory and nothing else behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gpudoctor.analysis.summary import Analysis
from gpudoctor.cli.main import app
from gpudoctor.runner import capture as live
from gpudoctor.runner.record import RunRecord
from run_options import FAST, traced_steps

TRAIN = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for i in range(args.steps):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    {after_step}
print("finished", args.steps, args.lr, __name__)
"""


def script(tmp_path: Path, after_step: str = "pass", name: str = "train.py", body: str = TRAIN) -> Path:
    path = tmp_path / name
    path.write_text(body.replace("{after_step}", after_step))
    return path


def run(*args: str) -> object:
    return CliRunner().invoke(app, ["run", *args], catch_exceptions=False)


def record_of(out: Path) -> RunRecord:
    return RunRecord.from_json(json.loads((out / "record.json").read_text()))


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """After every run: no optimizer hook, no profiler, no active capture, sys.argv and sys.path as before."""
    from torch.optim.optimizer import _global_optimizer_post_hooks
    from torch.utils.data import dataloader

    hooks, argv, path = dict(_global_optimizer_post_hooks), sys.argv[:], sys.path[:]
    loader_next = dataloader._BaseDataLoaderIter.__next__
    yield
    assert dict(_global_optimizer_post_hooks) == hooks
    assert dataloader._BaseDataLoaderIter.__next__ is loader_next
    assert not torch.autograd.profiler._is_profiler_enabled
    assert live._ACTIVE is None
    assert sys.argv == argv and sys.path == path


def test_a_training_script_gets_a_record_findings_and_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run("--out", str(out), *FAST, str(script(tmp_path)))
    assert result.exit_code == 0, result.output
    record = record_of(out)
    assert record.outcome == "stopped" and record.exit_code == 0
    assert (
        record.light is not None and len(record.light.times_us) >= 3 and record.light.clock == "perf_counter"
    )
    assert record.traced is not None and len(record.traced.times_us) == 2
    assert record.profiler_overhead is not None
    assert record.trace_files == ("trace.json.gz",) and (out / "trace.json.gz").exists()
    assert record.environment is not None and record.environment.torch == torch.__version__
    assert record.nvml_missing == "no CUDA device in use" and record.memory is None
    doc = json.loads((out / "analysis.json").read_text())
    analysis = Analysis.from_json(doc["analysis"])
    assert traced_steps(analysis) == 2
    assert analysis.unprofiled_step_us == pytest.approx(record.light.mean_us)  # the phase over its steps
    # the step count said once: how many steps, of which how many timed and traced
    assert "3 timed without the profiler, 2 traced" in result.output and "Step time" in result.output


def test_options_after_the_script_name_are_the_scripts(tmp_path: Path) -> None:
    # --steps is also an option of gpudoctor run: after the script name it goes to the script
    out = tmp_path / "run"
    result = run(
        "--out", str(out), "--light", "--run-to-end", str(script(tmp_path)), "--steps", "7", "--lr", "0.5"
    )
    assert result.exit_code == 0, result.output
    assert "finished 7 0.5 __main__" in result.output
    record = record_of(out)
    assert record.argv[1:] == ("--steps", "7", "--lr", "0.5") and record.outcome == "completed"
    assert record.steps_seen == 7


def test_light_mode_runs_no_profiler(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run("--out", str(out), "--light", *FAST, str(script(tmp_path)))
    assert result.exit_code == 0, result.output
    record = record_of(out)
    assert record.light is not None and len(record.light.times_us) >= 3
    assert record.traced is None and record.trace_files == ()
    assert not (out / "analysis.json").exists() and not list(out.glob("*.gz"))


def test_an_exception_keeps_the_capture_prints_the_traceback_and_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "run"
    path = script(tmp_path, after_step='if i == 5: raise ValueError("bad batch")')
    result = run(
        "--out",
        str(out),
        "--warmup",
        "1",
        "--light-steps",
        "10",
        "--light-seconds",
        "0",
        "--warmup-seconds",
        "0",
        str(path),
    )
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "ValueError: bad batch" in result.stderr
    assert str(path) in result.stderr and "runpy" not in result.stderr
    record = record_of(out)
    assert record.outcome == "exception" and record.error == "ValueError: bad batch"
    # the light phase so far: the steps after warm-up (at least --warmup 1, more while step times fell)
    assert record.light is not None and 3 <= len(record.light.times_us) <= 5


def test_an_exception_while_tracing_still_writes_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "run"
    path = script(tmp_path, after_step='if i == 6: raise RuntimeError("late")')
    result = run(
        "--out",
        str(out),
        "--warmup",
        "1",
        "--light-steps",
        "2",
        "--light-seconds",
        "0",
        "--warmup-seconds",
        "0",
        "--steps",
        "10",
        str(path),
    )
    assert result.exit_code == 1
    record = record_of(out)
    assert record.trace_files == ("trace.json.gz",) and record.traced is not None
    assert (out / "analysis.json").exists()


def test_sys_exit_3_is_the_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run("--out", str(out), *FAST, str(script(tmp_path, after_step="if i == 2: raise SystemExit(3)")))
    assert result.exit_code == 3
    record = record_of(out)
    assert record.outcome == "exit" and record.exit_code == 3 and record.steps_seen == 3


def test_ctrl_c_in_the_script_exits_130_after_saving(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run(
        "--out", str(out), *FAST, str(script(tmp_path, after_step="if i == 3: raise KeyboardInterrupt"))
    )
    assert result.exit_code == 130
    assert record_of(out).outcome == "interrupted" and "KeyboardInterrupt" in result.stderr


DATALOADER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

def main():
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=16, num_workers=2)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("epoch done")

if __name__ == "__main__":
    main()
"""


def test_dataloader_workers_work(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run("--out", str(out), "--run-to-end", *FAST, str(script(tmp_path, body=DATALOADER)))
    assert result.exit_code == 0, result.output
    assert "epoch done" in result.output
    record = record_of(out)
    assert record.outcome == "completed" and record.steps_seen == 16 and record.trace_files


NO_OPTIMIZER = """\
import torch
import gpudoctor

model = torch.nn.Linear(16, 4)
with torch.no_grad():
    for _ in range(20):
        model(torch.randn(64, 16)).sum().item()
        gpudoctor.step()
with gpudoctor.session() as s:
    for _ in range(3):
        s.step()
print("inference done", s.active)
"""


def test_a_loop_without_an_optimizer_marks_steps_with_gpudoctor_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run("--out", str(out), "--run-to-end", *FAST, str(script(tmp_path, body=NO_OPTIMIZER)))
    assert result.exit_code == 0, result.output
    assert "inference done True" in result.output
    record = record_of(out)
    assert record.steps_seen == 20 + 3  # counted to the end; captured: 1 warm-up, 3 light, 1 + 2 traced
    assert record.traced is not None and len(record.traced.times_us) == 2


DATALOADER_INFERENCE = """\
import torch

data = torch.utils.data.TensorDataset(torch.randn(160, 16))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model = torch.nn.Linear(16, 4)
with torch.no_grad():
    for (x,) in loader:
        model(x).sum()
print("inference done")
"""


def test_a_loop_over_a_dataloader_needs_no_marks(tmp_path: Path) -> None:
    # No optimizer and no gpudoctor.step(): the model's calls are the steps (test_run_steps.py: the rest).
    out = tmp_path / "run"
    result = run("--out", str(out), "--run-to-end", *FAST, str(script(tmp_path, body=DATALOADER_INFERENCE)))
    assert result.exit_code == 0, result.output
    assert "inference done" in result.output and "step = one call of Linear.forward" in result.output
    record = record_of(out)
    assert record.steps_seen < 20  # 20 batches: the first few go to finding the step
    assert record.light is not None and len(record.light.times_us) >= 3
    assert record.traced is not None and len(record.traced.times_us) == 2


def test_gpudoctor_step_and_session_do_nothing_outside_a_run() -> None:
    import gpudoctor

    gpudoctor.step()
    with gpudoctor.session() as s:
        s.step()
    assert not s.active


def test_a_module_runs_with_dash_m(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    script(package, name="trainer.py")
    monkeypatch.chdir(tmp_path)
    result = run(
        "--out", str(tmp_path / "run"), "--light", *FAST, "--run-to-end", "-m", "pkg.trainer", "--steps", "6"
    )
    assert result.exit_code == 0, result.output
    assert "finished 6 0.1 __main__" in result.output


def test_a_missing_script_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "r"), str(tmp_path / "nope.py")])
    assert result.exit_code == 2 and "no such script" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_the_record_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run("--out", str(out), "--light", *FAST, str(script(tmp_path)))
    record = record_of(out)
    assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_built_in_workload_runs_under_gpudoctor_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fast = [
        "--warmup",
        "1",
        "--light-steps",
        "2",
        "--light-seconds",
        "0",
        "--warmup-seconds",
        "0",
        "--steps",
        "1",
    ]
    result = run("--out", str(out), *fast, "-m", "gpudoctor.workloads.drive", "sync_every_step", "--cpu")
    assert result.exit_code == 0, result.output
    record = record_of(out)
    assert record.outcome == "stopped" and record.steps_seen >= 5 and (out / "analysis.json").exists()
    assert record.step is not None and record.step.source == "explicit"


def test_a_reader_that_stops_reading_does_not_cost_the_run_its_report(tmp_path: Path) -> None:
    # GIVEN `gpudoctor run train.py | head -3`: the pipe closes after three lines
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(32, 32)\nopt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for i in range(3000):\n    model(torch.randn(16, 32)).sum().backward()\n    opt.step()\n"
    )
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudoctor", "run", "--out", str(out), str(script)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    # THEN the run directory is whole, report.html included, and no traceback is shown
    assert (out / "report.html").is_file() and (out / "analysis.json").is_file()
    assert b"Traceback" not in err, err.decode()
