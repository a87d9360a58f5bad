"""`gpudoctor fix`'s diagnosis is the doctor's (`run_and_diagnose`) in a process of its own through the
runner's child protocol — `python -m gpudoctor.doctor.diagnosis_process`, never the command line — read back as the
findings and the script's command line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpudoctor.fixes import diagnose as fix_diagnose
from gpudoctor.runner import child

TRAIN = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(300):
    model(torch.randn(8, 32)).sum().backward()
    opt.step(); opt.zero_grad()
    if i % 10 == 0:
        print("loss", float(model(torch.randn(8, 32)).sum()))
"""


def test_the_diagnosis_runs_the_doctor_in_a_child_never_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    started: list[str] = []
    real = child.run_child

    def spy(module: str, argv: list[str], **kw: object) -> child.ChildRun:
        started.append(module)
        return real(module, argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fix_diagnose, "run_child", spy)
    out = tmp_path / "fix" / "run"
    inputs = fix_diagnose.diagnose_script(
        str(script), ["--x"], module=False, out=out, warmup=2, light_steps=5, steps=2, timeout_s=300
    )
    assert started == ["gpudoctor.doctor.diagnosis_process"]
    assert inputs.note is None and inputs.diagnosis is not None, inputs.note
    assert inputs.argv == (str(script), "--x")
    # the diagnosis run left a run directory the fix can be started from again, and its log beside it
    assert (out / "record.json").is_file() and (out / "analysis.json").is_file()
    assert "loss" in (tmp_path / "fix" / "run.log").read_text()
    again = fix_diagnose.load_run(out)
    assert again.diagnosis == inputs.diagnosis and again.argv == inputs.argv


def test_a_script_that_fails_gives_a_note_not_an_exception(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('no data here')\n")
    inputs = fix_diagnose.diagnose_script(
        str(script), [], module=False, out=tmp_path / "run", warmup=1, light_steps=2, steps=1, timeout_s=120
    )
    assert inputs.diagnosis is None and inputs.note
    # the script's own failure is carried as such: its exit status, after how many steps, what it said
    assert inputs.script_error == "it exited with status 1 after 0 steps: no data here"
    assert inputs.log is not None and "no data here" in inputs.log.read_text()
