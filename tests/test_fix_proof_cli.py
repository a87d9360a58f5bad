"""The proof end to end on the CPU (issue 44's acceptance): a loop starved by its loader (2 ms of sleep per
item), whose model is two modules called from one function. One real `gpudoctor fix` with a small budget
(and a proof that may stop at its 3 pairs: ±25%) keeps a worker fix; `fix.diff` applies with `patch`; the patched script runs; the report's headline is
the proof's speedup, and it agrees within ±25% with plain runs of the patched and original scripts that
this test times itself (the script's own clock over a stretch of its steps, nothing of gpudoctor's
inside); `fix.json` carries `proof`."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.cli.main import app
from gpudoctor.fixes.result import FixReport

MODEL = """\
import torch


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())

    def forward(self, x):
        return self.net(x)


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.out(x)
"""
TRAIN = """\
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

from model import Encoder, Head


class Slow(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.002)  # decoding an image, say
        return torch.full((16,), float(i % 7)), i % 4


def forward(encoder, head, x):
    return head(encoder(x))


# the test's own clock: seconds per step over steps FIRST..LAST, then the script ends
FIRST, LAST = (int(s) for s in os.environ.get("TIME_STEPS", "0,0").split(","))
torch.set_num_threads(1)
loader = DataLoader(Slow(), batch_size=8, shuffle=True)
encoder, head = Encoder(), Head()
opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(forward(encoder, head, x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == FIRST:
        t0 = time.perf_counter()
    if LAST and step == LAST:
        print(f"step_s {(time.perf_counter() - t0) / (LAST - FIRST)}")
        break
"""


def step_s(script: Path) -> float:
    """The script run plainly (`python train.py`), timed by its own clock over steps 40..190: past the
    batches a loader's workers make ahead (2 × prefetch_factor 4)."""
    env = {**os.environ, "TIME_STEPS": "40,190"}
    out = subprocess.run([sys.executable, script.name], cwd=script.parent, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split("step_s ")[1])


@pytest.mark.slow
def test_the_headline_is_the_diff_timed_as_you_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "model.py").write_text(MODEL)
    monkeypatch.chdir(project)
    out = tmp_path / "fix"
    result = CliRunner().invoke(
        app,
        ["fix", "--no-diagnose", "--only", "workers:2", "--rounds", "3", "--warmup", "2", "--steps", "6",
         "--warmup-s", "0", "--steps-s", "1", "--budget", "100s", "--proof-half-width", "25", "--out", str(out),
         "train.py"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "fix.json").read_text())
    report = FixReport.from_json(doc)
    proof = report.proof
    assert report.final == ("workers:2",) and proof is not None, result.output
    assert proof.verdict == "faster" and proof.recommended and len(proof.pairs) >= 3, proof.reason
    assert proof.step == "one step of the optimizer (SGD.step)"
    assert doc["proof"]["speedup"] == proof.speedup and doc["headline"]["source"] == "proof"
    assert f"{proof.speedup:.2f}× faster as you run it" in result.output
    assert report.harness_level is not None and report.harness_level.plain_us == proof.script_us
    assert (project / "train.py").read_text() == TRAIN  # the user's script is never edited

    # fix.diff applies with `patch` to a copy of the user's files, and the patched script runs
    patched = tmp_path / "patched"
    shutil.copytree(project, patched, ignore=shutil.ignore_patterns("__pycache__"))
    applied = subprocess.run(["patch", "-p1", "--forward", "-i", str(out / "fix.diff")], cwd=patched,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "num_workers=2" in (patched / "train.py").read_text()
    # timed plainly by the test, A B B A: the headline's figure within ±25%
    times = [step_s(project / "train.py"), step_s(patched / "train.py")]
    times += [step_s(patched / "train.py"), step_s(project / "train.py")]
    measured = statistics.fmean(times[::3]) / statistics.fmean(times[1:3])
    assert report.headline is not None and report.headline.speedup == proof.speedup
    assert abs(proof.speedup / measured - 1) <= 0.25, (proof.speedup, measured, times)
