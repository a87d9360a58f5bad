"""The proof's stopwatch (`fixes.stopwatch`), the one piece of gpudoctor inside a plain process: it
imports nothing from gpudoctor; it warms up (steps, seconds, a DataLoader's batches in flight), times
windows synchronized at their ends, sets aside a window in which torch.compile compiled, counts the
step the harness counted (the lead optimizer's steps, calls of the named top-level module, batches), and
as `sitecustomize.py` first on PYTHONPATH it hooks torch only once the script imports it, hands the
script back its own path and chain-loads the sitecustomize it hid."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from compiled_scripts import COMPILED_INFERENCE
from gpudoctor.fixes import stopwatch
from gpudoctor.fixes.stopwatch import AfterImport, RootCalls, Stopwatch, hook_torch


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch(clock: Ticks, tmp_path: Path, **config: Any) -> Stopwatch:
    base = {"out": str(tmp_path / "r.json"), "source": "optimizer", "warmup": 3, "warmup_s": 0.5,
            "steps": 4, "steps_s": 1.0, "window_s": 0.5}  # fmt: skip
    return Stopwatch({**base, **config}, clock=clock)


def run_steps(w: Stopwatch, clock: Ticks, n: int, step_s: float) -> None:
    for _ in range(n):
        clock.now += step_s
        if not w.finished:
            w.on_step()


def test_it_imports_nothing_from_gpudoctor() -> None:
    tree = ast.parse(Path(stopwatch.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith("gpudoctor")]


def test_warm_up_then_windows_synchronized_at_their_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, syncs, ended = Ticks(), [], []
    w = watch(clock, tmp_path)
    w.sync = lambda: syncs.append(clock.now)
    w.in_flight = 4  # two workers, prefetch_factor 2
    monkeypatch.setattr(stopwatch.os, "_exit", lambda code: ended.append(code))
    run_steps(w, clock, 200, 0.1)
    # warm-up: 3 steps + 4 in flight, and 0.5 s from the first step; then 1 s timed in 0.5 s windows
    assert w.warmup_steps == 7 and ended == [0]
    # one synchronization at each window's ends, never per step; 8 steps at least (twice those in flight)
    assert [round(s, 6) for s in syncs] == [0.7, 1.2, 1.7]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (
        doc["outcome"] == "timed"
        and doc["steps_seen"] == 17
        and doc["windows"] == [[pytest.approx(0.5), 5]] * 2
    )
    assert doc["mean_step_us"] == pytest.approx(1e5) and doc["error"] is None
    assert not (tmp_path / "r.json.partial").exists()


def test_a_window_in_which_torch_compile_compiled_is_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Ticks()
    w = watch(clock, tmp_path, warmup=1, warmup_s=0.0)
    compiled = [0.0]
    w.compiled_s = lambda: compiled[0]
    monkeypatch.setattr(stopwatch.os, "_exit", lambda code: None)
    run_steps(w, clock, 3, 0.1)
    compiled[0] = 2.0  # a recompilation inside the first window
    run_steps(w, clock, 100, 0.1)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert len(doc["set_aside"]) == 1 and doc["set_aside"][0][2] == 2.0
    assert sum(n for _, n in doc["windows"]) >= 4 and doc["mean_step_us"] == pytest.approx(1e5)


def test_a_script_that_ends_first_says_how_far_it_got(tmp_path: Path) -> None:
    clock = Ticks()
    w = watch(clock, tmp_path)
    run_steps(w, clock, 5, 0.1)
    w.at_exit()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["outcome"] == "ended" and doc["steps_seen"] == 5 and doc["mean_step_us"] is None


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Head(Encoder):
    pass


def test_module_steps_are_calls_of_the_named_top_level_module(tmp_path: Path) -> None:
    clock = Ticks()
    w = watch(clock, tmp_path, source="module", module="Head")
    calls = RootCalls(w, torch).install()
    encoder, head, x = Encoder(), Head(), torch.ones(2, 4)
    try:
        for _ in range(3):
            head(encoder(x))  # two top-level modules called from one function: the named one counts
        assert w.steps_seen == 3 and calls.root is head
        assert not torch.nn.modules.module._global_forward_hooks  # found: the global hooks left
        encoder(x)
        assert w.steps_seen == 3
    finally:
        calls.uninstall()


def test_a_module_the_script_compiles_with_module_compile_is_counted_outside_its_compiled_code(
    tmp_path: Path,
) -> None:
    # `head.compile()` runs head's hooks inside the compiled call (traced, never run): the stopwatch
    # wraps that call instead, and puts Module.compile back when it leaves
    clock = Ticks()
    w = watch(clock, tmp_path, source="module", module="Head")
    before = torch.nn.Module.compile
    calls = RootCalls(w, torch).install()
    encoder, head, x = Encoder(), Head(), torch.ones(2, 4)
    try:
        head.compile(backend="eager")
        for _ in range(3):
            head(encoder(x))
        assert w.steps_seen == 3 and calls.root is head
        assert not torch.nn.modules.module._global_forward_hooks and not head._forward_hooks
        encoder(x)
        assert w.steps_seen == 3
    finally:
        calls.uninstall()
    assert torch.nn.Module.compile is before


def test_dataloader_batches_and_the_batches_in_flight_then_taken_out(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader, dataloader

    clock = Ticks()
    w = watch(clock, tmp_path, source="dataloader")
    before = (dataloader.DataLoader.__iter__, dataloader._BaseDataLoaderIter.__next__)
    undo = hook_torch(w, torch)
    try:
        assert len(list(DataLoader(list(range(6)), batch_size=2))) == 3
        assert w.steps_seen == 3 and w.in_flight == 0  # no workers: nothing in flight
        assert len(list(DataLoader(list(range(6)), batch_size=2, num_workers=1, prefetch_factor=5))) == 3
        assert w.steps_seen == 6 and w.in_flight == 5  # workers × prefetch_factor
    finally:
        undo()
    assert (dataloader.DataLoader.__iter__, dataloader._BaseDataLoaderIter.__next__) == before


def test_a_module_is_hooked_once_it_has_been_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "late_lib.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    finder = AfterImport({"late_lib": lambda m: seen.append(m.VALUE)})
    sys.meta_path.insert(0, finder)
    try:
        import late_lib  # noqa: F401

        assert seen == [42]
        assert "exec_module" not in vars(sys.modules["late_lib"].__spec__.loader)  # the loader as it was
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("late_lib", None)


LOOP = """\
import os, sys
print("site", os.environ.get("USER_SITE_LOADED"), flush=True)
print("path", [p for p in sys.path if "stopwatch" in p], os.environ.get("PYTHONPATH"), flush=True)
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.01)
for step in range(100000):
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    other.step()  # a second optimizer: the first to step leads
raise SystemExit("the stopwatch should have ended the process")
"""


def test_in_a_plain_process_it_times_the_loop_and_ends_it(tmp_path: Path) -> None:
    boot, user = tmp_path / "stopwatch", tmp_path / "user_site"
    boot.mkdir()
    user.mkdir()
    (boot / "sitecustomize.py").write_text(Path(stopwatch.__file__).read_text())
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_LOADED'] = '1'\n")
    (tmp_path / "loop.py").write_text(LOOP)
    config = {"out": str(tmp_path / "r.json"), "source": "optimizer", "warmup": 3, "warmup_s": 0.1,
              "steps": 10, "steps_s": 0.3, "window_s": 0.1}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{boot}{os.pathsep}{user}", stopwatch.ENV: json.dumps(config)}
    out = subprocess.run([sys.executable, "loop.py"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "site 1" in out.stdout  # the user's own sitecustomize ran
    assert f"path [] {user}" in out.stdout  # the script sees its own path and PYTHONPATH
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["outcome"] == "timed" and doc["error"] is None and doc["warmup_steps"] >= 3
    steps = sum(n for _, n in doc["windows"])
    assert steps >= 10 and sum(s for s, _ in doc["windows"]) >= 0.3 and doc["mean_step_us"] > 0
    assert doc["steps_seen"] == doc["warmup_steps"] + steps + sum(n for _, n, _ in doc["set_aside"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_in_a_plain_process_it_counts_calls_of_a_model_compiled_with_cuda_graphs(tmp_path: Path) -> None:
    # the hooks of a module compiled with model.compile() run inside the compiled call and never run:
    # the patched copy of transformer_infer_b1 ran 173 s with 0 steps counted before the stopwatch
    # counted that call from outside
    boot = tmp_path / "stopwatch"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(Path(stopwatch.__file__).read_text())
    (tmp_path / "infer.py").write_text(COMPILED_INFERENCE)
    config = {"out": str(tmp_path / "r.json"), "source": "module", "module": "Net", "warmup": 5, "warmup_s": 0.5,
              "steps": 20, "steps_s": 0.5, "window_s": 0.1}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(boot), stopwatch.ENV: json.dumps(config)}
    out = subprocess.run([sys.executable, "infer.py"], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["outcome"] == "timed" and doc["error"] is None, doc
    assert sum(n for _, n in doc["windows"]) >= 20 and doc["mean_step_us"] > 0
