"""benchmarks/fix_workloads/plain_timer.py, the benchmark's plain timing of a workload: it times the
script's own steps, never the 100 ms windows that step discovery falls back to while nothing repeats (a
first step still compiling), and counts anew when a real source of steps takes over."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gpudoctor.runner import discovery

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location(
    "plain_timer", ROOT / "benchmarks" / "fix_workloads" / "plain_timer.py"
)
assert spec is not None and spec.loader is not None
plain_timer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plain_timer)

SLOW_FIRST_STEP = """\
import time
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(2000):
    if i == 0:
        time.sleep(1.0)  # a first step that compiles for longer than discovery waits
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.003)
"""


def test_a_first_step_longer_than_discovery_waits_is_timed_by_its_real_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN discovery that falls back to 100 ms windows after 0.3 s, and a first step of a second
    monkeypatch.setattr(discovery, "WINDOW_AFTER_S", 0.3)
    script, out = tmp_path / "train.py", tmp_path / "t.json"
    script.write_text(SLOW_FIRST_STEP)
    monkeypatch.setattr(sys, "argv", ["plain_timer.py", "--out", str(out), "--warmup", "3", "--window-s", "0.2",
                                      "--windows", "2", "--", str(script)])  # fmt: skip
    # WHEN the plain timer times it
    assert plain_timer.main() == 0
    # THEN the windows hold the optimizer's steps (about 3 ms each), not the fallback's 100 ms ticks
    result = json.loads(out.read_text())
    assert len(result["windows"]) == 2 and all(n >= 20 for _, n in result["windows"])
    assert 0.003 <= result["step_s"] < 0.02


RECOMPILES = """\
import torch

torch._dynamo.config.automatic_dynamic_shapes = False  # a new shape compiles anew
model = torch.compile(torch.nn.Linear(4, 1), backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(100_000):
    rows = 7 if i == 60 else 8  # an epoch's last, smaller batch
    loss = model(torch.randn(rows, 4)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_window_in_which_the_script_recompiled_is_set_aside_and_timed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a compiled model that meets a smaller batch once, mid-run (Lightning's expert recompiled
    # for 19.6 s in a window of 1 s on the H200, and read 0.61× the script)
    script, out = tmp_path / "train.py", tmp_path / "t.json"
    script.write_text(RECOMPILES)
    monkeypatch.setattr(sys, "argv", ["plain_timer.py", "--out", str(out), "--warmup", "5", "--window-s", "0.0",
                                      "--windows", "80", "--", str(script)])  # fmt: skip
    assert plain_timer.main() == 0
    # THEN the window with the recompilation is set aside, 80 others are timed, and none compiled
    result = json.loads(out.read_text())
    assert len(result["recompiled"]) == 1 and result["recompiled"][0][2] > 0
    assert len(result["windows"]) == 80
    assert not (tmp_path / "t.json.partial").exists()


LOADER_WITH_WORKERS = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        time.sleep(0.004)  # each worker makes a batch of 2 in about 8 ms
        return torch.randn(4)


model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Items(), batch_size=2, num_workers=2, prefetch_factor=3)
for step, batch in enumerate(loader):
    if step == 0:
        time.sleep(0.5)  # a first step that compiles: the workers fill their queue meanwhile
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.parametrize("drain", [True, False])
def test_the_warm_up_spends_the_batches_a_loaders_workers_hold_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drain: bool
) -> None:
    # GIVEN a loop paced by 2 workers × prefetch_factor 3, whose queue fills while its first step compiles
    script, out = tmp_path / "train.py", tmp_path / "t.json"
    script.write_text(LOADER_WITH_WORKERS)
    argv = ["plain_timer.py", "--out", str(out), "--warmup", "3", "--window-s", "0.1", "--windows", "2",
            *([] if drain else ["--no-drain"]), "--", str(script)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    assert plain_timer.main() == 0
    # THEN the warm-up adds the 6 batches in flight (or keeps its 3 with --no-drain), and timing goes on
    result = json.loads(out.read_text())
    assert result["warmup_steps"] == (3 + 2 * 3 if drain else 3)
    assert len(result["windows"]) == 2 and result["step_s"] > 0
    from torch.utils.data import DataLoader

    assert DataLoader.__iter__.__name__ == "__iter__"  # the timer's hook is gone
