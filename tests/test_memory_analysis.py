"""The memory analysis on SYNTHETIC allocator snapshots (tests/memory_synthetic.py, torch's snapshot
format): a step's peak split into categories, the lines and modules that hold it, what it leaves
alive, a leak's growing line, fragmentation, and what held the memory at an out-of-memory error."""

from __future__ import annotations

from typing import Any

import pytest

from gpudoctor.analysis.memory_breakdown import ModuleMemory, breakdown, compact_names, split_level
from gpudoctor.analysis.memory_frames import category_of_frames, user_site
from gpudoctor.analysis.memory_run import RUN_SCHEMA, MemoryAnalysis, analyze_memory
from gpudoctor.analysis.memory_snapshot import Owners, allocator_state, replay
from gpudoctor.analysis.memory_timeline import SCHEMA as TIMELINE_SCHEMA
from gpudoctor.analysis.memory_timeline import timeline_replay
from gpudoctor.util.errors import MemoryFormatError
from memory_synthetic import MiB, ToyAllocator, forward, training_step, user


def _step(n: int, allocated: int, phase: str = "light", **kw: int) -> dict[str, Any]:
    return {
        "step": n,
        "phase": phase,
        "peak_allocated": kw.get("peak_allocated", allocated + 10 * MiB),
        "peak_reserved": kw.get("peak_reserved", allocated + 12 * MiB),
        "allocated": allocated,
        "reserved": kw.get("reserved", allocated + 12 * MiB),
        "inactive_split_bytes": kw.get("inactive_split_bytes", 0),
        "alloc_retries": kw.get("alloc_retries", 0),
        "device_allocs": kw.get("device_allocs", 0),
        "device_frees": kw.get("device_frees", 0),
    }


def _run(**kw: Any) -> dict[str, Any]:
    return {"schema": RUN_SCHEMA, "device": "cuda:0", "capacity": 80 << 30, "training": True, **kw}


def test_a_training_step_splits_its_peak_into_categories_that_sum_to_it() -> None:
    s = training_step()
    r = replay(s["start"], s["end"], Owners.of(s["census_start"]), Owners.of(s["census_end"]))
    b = breakdown(r, "allocator history", step=8)
    assert b is not None
    assert b.peak == s["peak"] == sum(b.categories.values())
    for category, size in s["expected"].items():
        assert b.categories[category] == size, category
    assert b.categories["other"] == 0 and b.categories["unattributed"] == 0


def test_the_allocators_own_peak_above_the_replay_is_unattributed() -> None:
    s = training_step()
    r = replay(s["start"], s["end"], Owners.of(s["census_start"]), Owners.of(s["census_end"]))
    b = breakdown(r, "allocator history", measured_peak=s["peak"] + 3 * MiB)
    assert b is not None and b.categories["unattributed"] == 3 * MiB and b.peak == s["peak"] + 3 * MiB


def test_the_peak_names_the_lines_that_hold_it_with_the_model_file_inside() -> None:
    s = training_step()
    b = breakdown(replay(s["start"], s["end"], Owners.of(s["census_start"]), Owners.of(s["census_end"])), "h")
    assert b is not None
    top = b.sites[0]
    assert top.site == "me/train.py:30 in train_step" and top.category == "activations"
    assert top.bytes == 40 * MiB and top.blocks == 4 and top.inner == "zoo/block0.py:40 in forward"


def test_what_a_step_leaves_alive_is_the_gradients_and_the_loss_only_the_loss_is_held() -> None:
    s = training_step()
    b = breakdown(replay(s["start"], s["end"], Owners.of(s["census_start"]), Owners.of(s["census_end"])), "h")
    assert b is not None
    assert [(h.site, h.bytes) for h in b.held] == [("me/train.py:31 in train_step", 512)]


def test_the_series_is_stacked_by_category_and_keeps_the_peak() -> None:
    s = training_step()
    b = breakdown(replay(s["start"], s["end"], Owners.of(s["census_start"]), Owners.of(s["census_end"])), "h")
    assert b is not None
    totals = [sum(v[i] for v in b.series.values()) for i in range(len(b.series_t_us))]
    assert max(totals) == b.peak and b.series_t_us[0] == 0.0
    assert list(b.series_t_us) == sorted(b.series_t_us)


def test_a_long_history_is_downsampled_without_losing_its_peak() -> None:
    a = ToyAllocator()
    a.start_history()
    spike_at = 777
    for i in range(2000):
        x = a.alloc((64 if i == spike_at else 1) * MiB, [user(5)])
        a.free(x)
    b = breakdown(replay({"segments": []}, a.snapshot(), Owners(), Owners()), "h")
    assert b is not None and len(b.series_t_us) <= 300 and b.peak == 64 * MiB
    assert max(sum(v[i] for v in b.series.values()) for i in range(len(b.series_t_us))) == 64 * MiB


def test_frames_say_what_was_running() -> None:
    assert category_of_frames([]) == "temporaries"  # the autograd engine's thread has no Python frame
    assert category_of_frames(forward(12)) == "activations"
    assert category_of_frames([user(3)]) == "inputs"
    assert category_of_frames([user(3)], after_forward=True) == "temporaries"
    assert user_site([]).startswith("no Python frame")
    assert user_site(forward(12)) == "me/train.py:30 in train_step"


def test_a_frees_of_blocks_the_history_never_saw_mark_it_truncated() -> None:
    a = ToyAllocator()
    kept = a.alloc(1 * MiB, [user(1)])
    start = a.snapshot(with_trace=False)
    a.start_history()
    orphan = a.alloc(2 * MiB, [user(2)])
    a.trace = a.trace[2:]  # the ring buffer dropped the alloc (and its segment)
    a.free(orphan)
    r = replay(start, a.snapshot(), Owners(), Owners())
    assert r.truncated and [x.address for x in r.allocations] == [kept]


def test_modules_split_where_several_share_the_activations() -> None:
    rows = [
        ModuleMemory("GPT", "GPT", 100),
        ModuleMemory("GPT.transformer", "Model", 96),
        *(ModuleMemory(f"GPT.transformer.h.{i}", "Block", 8) for i in range(12)),
        ModuleMemory("GPT.transformer.h.0.attn", "Attention", 5),
    ]
    level = split_level(rows)
    assert {m.name for m in level} == {f"GPT.transformer.h.{i}" for i in range(12)}
    assert (
        compact_names([m.name for m in sorted(level, key=lambda m: int(m.name.rsplit(".", 1)[1]))])
        == "GPT.transformer.h.0–11"
    )
    assert compact_names(["a.x", "a.y"]) == "a.x, a.y"


def test_several_calls_of_one_module_add_up() -> None:
    level = split_level(
        [
            ModuleMemory("M", "M", 10),
            ModuleMemory("M.a", "L", 3, forward_us=1.0),
            ModuleMemory("M.a", "L", 3, forward_us=2.0),
            ModuleMemory("M.b", "L", 4),
        ]
    )
    a = next(m for m in level if m.name == "M.a")
    assert a.activations == 6 and a.calls == 2 and a.forward_us == 3.0


def test_a_leak_is_growth_at_every_boundary_and_its_line_from_two_snapshots() -> None:
    a = ToyAllocator()
    leaked_line = user(44, "train_step")
    for _ in range(3):
        a.alloc(8 * MiB, [leaked_line])
    first = a.snapshot(with_trace=False)
    for _ in range(5):
        a.alloc(8 * MiB, [leaked_line])
    last = a.snapshot(with_trace=False)
    steps = [_step(n, 100 * MiB + 8 * MiB * n) for n in range(4, 24)]
    run = _run(steps=steps, snapshots={"detail_end": {"step": 25}, "traced_end": {"step": 30}})
    m = analyze_memory(run, {"detail_end": first, "traced_end": last})
    assert m.leak is not None
    assert m.leak.bytes_per_step == pytest.approx(8 * MiB)
    assert m.leak.sites[0].site == "me/train.py:44 in train_step" and m.leak.sites[0].bytes == 8 * MiB
    assert m.leak.steps_to_full is not None and m.leak.steps_to_full > 0


def test_a_flat_or_noisy_curve_is_no_leak() -> None:
    flat = [_step(n, 100 * MiB + (MiB if n % 2 else 0)) for n in range(20)]
    assert analyze_memory(_run(steps=flat)).leak is None
    small = [_step(n, 100 * MiB + 1024 * n) for n in range(20)]  # 1 KiB per step: below the floor
    assert analyze_memory(_run(steps=small)).leak is None


def test_fragmentation_figures_come_from_the_timed_steps_and_a_snapshot() -> None:
    a = ToyAllocator()
    keep = [a.alloc(1 * MiB, [user(1)], segment_size=20 * MiB) for _ in range(1)]
    hole = a.alloc(8 * MiB, [user(2)])
    a.alloc(1 * MiB, [user(3)])
    a.free(hole)
    state = allocator_state(a.snapshot())
    assert state.inactive_split_blocks >= 1 and state.inactive_split_bytes >= 8 * MiB and keep
    steps = [
        _step(
            n,
            50 * MiB,
            peak_reserved=900 * MiB,
            inactive_split_bytes=300 * MiB,
            device_allocs=2,
            device_frees=2,
        )
        for n in range(5)
    ]
    steps[2]["alloc_retries"] = 3
    f = analyze_memory(_run(steps=steps), {"traced_end": a.snapshot()}).fragmentation
    assert f is not None
    assert (f.peak_reserved, f.inactive_split_bytes, f.alloc_retries) == (900 * MiB, 300 * MiB, 3)
    assert f.device_allocs_per_step == 2.0 and f.inactive_split_blocks == state.inactive_split_blocks


def test_an_oom_report_says_what_held_the_memory_and_where() -> None:
    a = ToyAllocator()
    p = a.alloc(4 * MiB, [user(10, "<module>")])
    for i in range(3):
        a.alloc(20 * MiB, forward(50 + i))
    oom = {
        "step": 1,
        "requested": 64 * MiB,
        "device_free": 10 * MiB,
        "failing_line": "train.py:30 in train_step",
        "census": {"parameters_storages": [[p, 4 * MiB]]},
    }
    m = analyze_memory(_run(oom=oom), {"oom": a.snapshot(with_trace=False)})
    assert m.oom is not None
    assert m.oom.categories["activations"] == 60 * MiB and m.oom.categories["parameters"] == 4 * MiB
    assert m.oom.sites[0].category == "activations" and m.oom.requested == 64 * MiB
    assert m.oom.allocated == 64 * MiB and m.oom.failing_line == "train.py:30 in train_step"


def test_the_profilers_timeline_replays_with_torchs_categories() -> None:
    doc = {
        "schema": TIMELINE_SCHEMA,
        "device": "cpu",
        "sites": ["train.py:30 in step"],
        "modules": ["Net.fc1"],
        "events": [
            [-1, "preexisting", 1, 4096, "PARAMETER", -1, -1],
            [10, "create", 2, 8192, "ACTIVATION", 0, 0],
            [20, "create", 3, 100, None, -1, -1],
            [30, "destroy", 2, 8192, "ACTIVATION", 0, 0],
        ],
    }
    r = timeline_replay(doc)
    b = breakdown(r, "profiler memory timeline")
    assert b is not None and b.peak == 4096 + 8192 + 100
    assert b.categories["activations"] == 8192 and b.categories["unattributed"] == 100
    assert [m.name for m in b.modules] == ["Net", "Net.fc1"] and b.sites[0].site == "train.py:30 in step"


def test_the_analysis_round_trips_through_json() -> None:
    s = training_step()
    run = _run(
        steps=[_step(n, 30 * MiB) for n in range(4, 9)]
        + [_step(9, 32 * MiB, "detail", peak_allocated=s["peak"])],
        detail_step=9,
        census_start=s["census_start"],
        census=s["census_end"],
        modules=[
            {
                "name": "Net",
                "type": "Net",
                "activations": 40 * MiB,
                "inputs": MiB,
                "forward_us": 100.0,
                "calls": 1,
            }
        ],
    )
    m = analyze_memory(run, {"detail_start": s["start"], "detail_end": s["end"]}, step_us=5000.0)
    assert m.breakdown is not None and m.breakdown.peak == s["peak"]
    assert MemoryAnalysis.from_json(m.to_json()) == m


def test_damaged_input_is_a_memory_format_error() -> None:
    with pytest.raises(MemoryFormatError):
        analyze_memory({"schema": "other"})
    with pytest.raises(MemoryFormatError):
        analyze_memory(_run(steps=[{"phase": "light"}]))
    with pytest.raises(MemoryFormatError):
        timeline_replay({"schema": TIMELINE_SCHEMA, "events": [[1, 2]]})
    with pytest.raises(MemoryFormatError):
        allocator_state({"segments": [{"total_size": "big"}]})


def test_a_leak_is_named_by_the_scripts_line_with_the_model_line_inside() -> None:
    a = ToyAllocator()
    frames = [user(23, "forward", "/home/me/lm.py"), user(28, "<module>", "/home/me/leak.py")]
    a.alloc(4 * MiB, frames)
    first = a.snapshot(with_trace=False)
    for _ in range(4):
        a.alloc(4 * MiB, frames)
    run = _run(
        steps=[_step(n, 100 * MiB + 4 * MiB * n) for n in range(10)],
        snapshots={"detail_end": {"step": 10}, "traced_end": {"step": 14}},
        script="/home/me/leak.py",
    )
    leak = analyze_memory(run, {"detail_end": first, "traced_end": a.snapshot(with_trace=False)}).leak
    assert leak is not None
    (site,) = leak.sites
    assert (site.site, site.inner, site.bytes) == (
        "me/leak.py:28 in <module>",
        "me/lm.py:23 in forward",
        4 * MiB,
    )
