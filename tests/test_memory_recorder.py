"""`runner.memory.MemoryRecorder` through the phases of a run, on the CPU: torch.cuda's allocator calls
are replaced by a SYNTHETIC allocator (tests/memory_synthetic.py) so that what the recorder asks
for, when, and what it writes can be checked without a GPU. The real allocator is exercised by
tests/test_memory_gpu.py and the fixtures recorded on the H100."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudoctor.analysis.memory_run import analyze_memory
from gpudoctor.runner.memory import MemoryOptions, MemoryRecorder
from memory_synthetic import MiB, ToyAllocator, forward, user


class FakeCuda:
    """torch.cuda as the recorder uses it, over a toy allocator."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.alloc = ToyAllocator()
        self.history: list[str | None] = []
        self.observers: list[Any] = []
        self.peak = 0
        self.resets = 0
        c = torch.cuda
        monkeypatch.setattr(c, "is_available", lambda: True)
        monkeypatch.setattr(c, "is_initialized", lambda: True)
        monkeypatch.setattr(c, "current_device", lambda: 0)
        monkeypatch.setattr(c, "mem_get_info", lambda *a: (70 << 30, 80 << 30))
        monkeypatch.setattr(c, "memory_reserved", lambda *a: self.reserved())
        monkeypatch.setattr(c, "memory_allocated", lambda *a: self.alloc.allocated())
        monkeypatch.setattr(c, "memory_stats", lambda *a: self.stats())
        monkeypatch.setattr(torch._C, "_cuda_memoryStats", lambda index: self.nested(), raising=False)
        monkeypatch.setattr(c, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(c.memory, "_record_memory_history", self.record)
        monkeypatch.setattr(c.memory, "_snapshot", lambda *a: self.alloc.snapshot())
        monkeypatch.setattr(
            torch._C, "_cuda_attach_out_of_memory_observer", self.observers.append, raising=False
        )
        from gpudoctor.runner import memory

        monkeypatch.setattr(memory, "_OOM_ATTACHED", [False])  # a fresh process's: attached once
        monkeypatch.setattr(memory, "_OOM_TARGET", [None])
        monkeypatch.setattr(c, "Event", FakeEvent)
        monkeypatch.setattr(
            c, "get_device_properties", lambda *a: type("Props", (), {"total_memory": 80 << 30})
        )

    def reserved(self) -> int:
        return sum(s["total_size"] for s in self.alloc.segments)

    def stats(self) -> dict[str, int]:
        now = self.alloc.allocated()
        self.peak = max(self.peak, now)
        return {
            "allocated_bytes.all.current": now,
            "allocated_bytes.all.peak": self.peak,
            "reserved_bytes.all.current": self.reserved(),
            "reserved_bytes.all.peak": self.reserved(),
            "inactive_split_bytes.all.current": 0,
            "num_alloc_retries": 0,
            "num_device_alloc": len(self.alloc.segments),
            "num_device_free": 0,
        }

    def nested(self) -> dict[str, Any]:
        """torch._C._cuda_memoryStats's shape (memory_stats() flattens it)."""
        out: dict[str, Any] = {}
        for key, value in self.stats().items():
            name, _, rest = key.partition(".all.")
            if rest:
                out.setdefault(name, {"all": {}})["all"][rest] = value
            else:
                out[key] = value
        return out

    def reset(self, *a: Any) -> None:
        self.resets += 1
        self.peak = self.alloc.allocated()

    def record(self, enabled: str | None = "all", **kw: Any) -> None:
        self.history.append(enabled)
        self.alloc.recording = enabled is not None
        if enabled == "all" and kw.get("clear_history"):
            self.alloc.start_history()

    def use(self, size: int, frames: list[dict[str, Any]]) -> int:
        address = self.alloc.alloc(size, frames)
        self.stats()  # the allocator's own peak follows every allocation
        return address


class FakeEvent:
    def __init__(self, **kw: Any) -> None:
        pass

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: FakeEvent) -> float:
        return 0.25  # ms


def _step(fake: FakeCuda, model: torch.nn.Module, leak: list[int]) -> None:
    """A training step as the allocator sees it: an input, activations in forward, a transient
    temporary in backward; and, if `leak` is given, a tensor the script keeps every step."""
    x = fake.use(1 * MiB, [user(20)])
    model(torch.ones(2, 4))  # the forward hooks fire (the tensors here are on the CPU)
    acts = [fake.use(8 * MiB, forward(60 + i)) for i in range(3)]
    tmp = fake.use(4 * MiB, [])
    for a in (*acts, tmp, x):
        fake.alloc.free(a)
    leak.append(fake.use(2 * MiB, [user(44, "train_step")]))


def test_a_run_records_step_peaks_one_detail_step_and_the_snapshots_it_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeCuda(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    fake.use(16 * MiB, [user(5, "<module>")])  # "parameters" allocated before the run
    recorder = MemoryRecorder(MemoryOptions()).install()
    recorder.root_hint = lambda: model  # the step detector's root module, as under gpudoctor run
    assert fake.history == ["state"] and len(fake.observers) == 1  # at CUDA's start (already started)
    leak: list[int] = []
    phases = ["warmup"] * 2 + ["light"] * 4 + ["traced"] * 4 + ["done"]
    for n, (ended, nxt) in enumerate(itertools.pairwise(phases), start=1):
        _step(fake, model, leak)
        recorder.end_step(ended, n)
        recorder.begin_step(nxt, ended)
        if nxt == "light" and ended == "warmup":
            assert fake.history[-1] is None  # no Python stacks while the light phase is timed
    recorder.uninstall()
    assert fake.history[-1] is None  # history off when the run is over
    run = recorder.result()
    assert run is not None
    assert [s["phase"] for s in run["steps"]] == ["light"] * 4 + ["detail"] + ["traced"] * 3
    assert run["detail_step"] == 7 and set(run["snapshots"]) == {"detail_start", "detail_end", "traced_end"}
    detail = next(s for s in run["steps"] if s["phase"] == "detail")
    assert detail["peak_allocated"] >= 16 * MiB + 25 * MiB
    modules = {m["name"]: m for m in run["modules"]}
    assert {"Sequential", "Sequential.0", "Sequential.1", "Sequential.2"} <= set(modules)
    assert modules["Sequential"]["forward_us"] == 250.0 and modules["Sequential.0"]["type"] == "Linear"
    recorder.write_files(tmp_path)
    loaded = {}
    for name, meta in run["snapshots"].items():
        with gzip.open(tmp_path / meta["file"]) as f:
            loaded[name] = json.load(f)
    memory = analyze_memory(json.loads(json.dumps(run)), loaded)
    assert memory.breakdown is not None and memory.breakdown.categories["activations"] == 24 * MiB
    assert memory.leak is not None and memory.leak.bytes_per_step == pytest.approx(2 * MiB)
    assert memory.leak.sites[0].site == "me/train.py:44 in train_step"


def test_an_out_of_memory_error_leaves_a_snapshot_a_census_and_the_failing_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCuda(monkeypatch)
    recorder = MemoryRecorder(MemoryOptions()).install()
    fake.use(30 * MiB, forward(12))
    fake.observers[0](0, 64 * MiB, 80 << 30, 10 * MiB)  # what the allocator calls before raising
    fake.observers[0](0, 64 * MiB, 80 << 30, 10 * MiB)  # a second OOM (the script caught the first)
    recorder.uninstall()
    fake.observers[0](0, 1, 1, 1)  # torch cannot remove an observer: after uninstall it does nothing
    run = recorder.result()
    assert run is not None and run["oom"]["requested"] == 64 * MiB and run["oom"]["device_free"] == 10 * MiB
    assert run["oom"]["failing_line"].startswith("tests/test_memory_recorder.py:")
    assert set(run["snapshots"]) == {"oom"} and run["capacity"] is not None
    memory = analyze_memory(run, {"oom": recorder.snapshots["oom"][1]})
    assert memory.oom is not None and memory.oom.categories["activations"] == 30 * MiB


def test_history_off_records_steps_but_no_stacks_and_no_detail_step(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda(monkeypatch)
    monkeypatch.delattr(torch._C, "_cuda_memoryStats")  # an older torch: the flattened statistics
    recorder = MemoryRecorder(MemoryOptions(history="off", detail=False)).install()
    for n, (ended, nxt) in enumerate(
        [("warmup", "light"), ("light", "light"), ("light", "traced"), ("traced", "done")], 1
    ):
        fake.use(MiB, [])
        recorder.end_step(ended, n)
        recorder.begin_step(nxt, ended)
    recorder.uninstall()
    run = recorder.result()
    assert run is not None and [s["phase"] for s in run["steps"]] == ["light", "light", "traced"]
    assert run["snapshots"] == {} and run["detail_step"] is None
    assert fake.history == [None]  # never turned on; turned off (a no-op) at the end


def test_a_failure_inside_the_recorder_is_a_note_not_the_scripts_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCuda(monkeypatch)
    recorder = MemoryRecorder(MemoryOptions()).install()

    def broken(*a: Any) -> None:
        raise RuntimeError("allocator gone")

    monkeypatch.setattr(torch.cuda, "memory_stats", broken)
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", broken)
    recorder.end_step("warmup", 1)
    recorder.begin_step("light", "warmup")
    recorder.end_step("light", 2)  # must not raise
    recorder.uninstall()
    assert any("allocator gone" in n for n in recorder.notes) and fake.history


def test_after_the_run_nothing_of_the_script_stays_reachable_from_the_oom_observer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch keeps out-of-memory observers for good; the one gpudoctor attached must not keep the
    script's model alive (a second run in the same process would count its memory)."""
    import gc
    import weakref

    fake = FakeCuda(monkeypatch)

    def a_run() -> weakref.ref[torch.nn.Module]:
        model = torch.nn.Linear(4, 4)
        recorder = MemoryRecorder(MemoryOptions()).install()
        recorder.root_hint = lambda: model  # the step detector's root module
        recorder.end_step("warmup", 1)
        recorder.begin_step("light", "warmup")
        recorder.end_step("light", 2)
        recorder.uninstall()
        return weakref.ref(model)

    alive = a_run()
    gc.collect()
    assert alive() is None
    assert fake.observers  # still attached, and inert
    fake.observers[0](0, 1, 1, 1)
