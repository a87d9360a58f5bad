"""The light phase's steady state (`runner.settle`): its unsettled head left out by MSER-5, "settled" when
every quarter of the rest is within 5% of its mean, and — on one process — the phase timed on, up to
twice its plan, until it settles. On the light phases recorded on 2 × H100 and 2 × H200
(tests/fixtures/light_settle.json) and on fake clocks; the warm-up before it keeps its own rule
(tests/test_capture_warmup.py)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpudoctor.runner import settle
from gpudoctor.runner.capture import LiveCapture, LiveOptions, StopRun
from gpudoctor.runner.record import StepTimes
from gpudoctor.timing.stepclock import StepClock

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "light_settle.json").read_text())


def light(source: str, case: str, rank: int = 0) -> list[float]:
    return RECORDED["sources"][source]["cases"][case]["light_us"][rank]


def settled(times: list[float]) -> StepTimes:
    return settle.settled(StepTimes("cuda_events", tuple(times), (0.0, 1.0)), lambda i: 0.5)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_ddp_light_phase_still_settling_is_cut_to_its_steady_steps(rank: int) -> None:
    """On the first 2 × H100 machine the balanced DDP run's first 20 light steps took 26–38 ms, then a
    flat 20.3 ms (the GPU-bound step): the whole phase's mean, 23 ms, was 14% off."""
    times = light("h100_first", "ddp", rank)
    assert statistics.fmean(times) > 1.12 * 20_300
    s = settled(times)
    assert s.settling is not None and s.settling.settled
    assert len(s.settling.dropped_us) == 30 and min(s.settling.dropped_us[:20]) > 24_000
    assert s.mean_us == pytest.approx(20_300, rel=0.01) and s.host_span_s == (0.5, 1.0)
    (note,) = settle.notes(s, agreed=True)
    assert note.startswith("the light phase's first 30 steps (") and "still settling" in note


def test_the_uneven_batch_settles_at_its_flat_steps_too() -> None:
    s = settled(light("h100_first", "uneven"))
    assert s.settling is not None and s.settling.settled and s.mean_us == pytest.approx(28_100, rel=0.01)


@pytest.mark.parametrize("case", ["fsdp", "ddp"])
def test_a_light_phase_that_wanders_on_the_h200_is_said_not_to_have_settled(case: str) -> None:
    """The H200 pair's light phases drift 10–15% between their quarters: no cut makes them steady."""
    s = settled(light("h200", case))
    assert s.settling is not None and not s.settling.settled
    q = s.settling.quarter_means_us
    assert (max(q) - min(q)) / s.mean_us > 0.10
    notes = settle.notes(s, agreed=True)
    assert any("did not settle (its length is agreed among the ranks" in n for n in notes)


def test_a_steady_level_is_kept_whole_whatever_it_is() -> None:
    """FSDP2 on the H100 pair ran its light phase flat at 49 ms (its plain rounds took 38 ms): a level,
    not a transient — nothing to cut, and no note; the rule does not make up a steady state."""
    times = light("h100", "fsdp")
    s = settled(times)
    assert s.settling is not None and s.settling.settled and settle.notes(s, agreed=True) == []
    assert s.mean_us == pytest.approx(statistics.fmean(times), rel=0.01)
    plain = RECORDED["sources"]["h100"]["cases"]["fsdp"]["plain"]["mean_us"]
    assert s.mean_us > 1.25 * plain  # what settling cannot explain: for a run on the GPUs (docs/run.md)


def test_unsettled_head_is_mser_5() -> None:
    rng = np.random.default_rng(0)
    steady = 20_000 * (1 + 0.01 * rng.standard_normal(60))
    ramp = [20_000 * (1 + 0.4 * math.exp(-i / 6)) for i in range(30)]
    assert settle.unsettled_head([*ramp, *steady]) in range(15, 31, 5)
    assert settle.unsettled_head(list(steady)) <= 10  # noise alone: a batch or two at most
    assert settle.unsettled_head([1.0] * 19) == 0  # fewer than four batches: nothing to compare
    # at most half: a late change is not a head
    assert settle.unsettled_head([30.0] * 80 + [20.0] * 20) == 0


@pytest.mark.parametrize(
    ("times", "steady"),
    [
        ([25_000.0, 136_000.0] * 20, True),  # a loader's cycle: every quarter the same mean
        ([20_000.0 * (1 + 0.03 * math.sin(i)) for i in range(40)], True),
        ([20_000.0 + 300.0 * i for i in range(40)], False),  # a drift of 60% over the phase
        ([20_000.0] * 3, False),  # too few to judge
    ],
)
def test_settled_means_every_quarter_within_5pct(times: list[float], steady: bool) -> None:
    assert settle.settle(times)[1].settled is steady


# -- the light phase on a fake clock --------------------------------------------------------------------
class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def perf_counter(self) -> float:
        return self.t

    def perf_counter_ns(self) -> int:
        return int(self.t * 1e9)


def light_phase(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step_s: Callable[[int], float], **options: object
) -> tuple[LiveCapture, float]:
    """A CPU loop whose step i takes step_s(i) seconds of a fake clock, through warm-up and light phase;
    the capture and how long its light phase lasted."""
    clock = FakeTime()
    monkeypatch.setattr("time.perf_counter", clock.perf_counter)
    monkeypatch.setattr("time.perf_counter_ns", clock.perf_counter_ns)
    base = {"warmup": 1, "warmup_seconds": 0.0, "light_steps": 20, "light_seconds": 2.0}
    capture = LiveCapture(tmp_path, LiveOptions(**{**base, **options}, light_only=True, nvml=False,
                                                memory_history="off"))  # fmt: skip
    started = None
    for i in itertools.count():
        if capture.phase == "light" and started is None:
            started = clock.t
        try:
            capture.boundary()
        except StopRun:
            break
        clock.t += step_s(i)
        assert i < 100_000
    assert started is not None
    return capture, clock.t - step_s(i) - started


def test_a_loop_still_settling_is_timed_on_until_it_has_settled(monkeypatch, tmp_path) -> None:
    """As the DDP run recorded on the first H100 pair: ~30 steps 40% slow, then 20 ms (± 1%). The planned
    2 s end with those 30 steps in them; the phase runs on until 2 s of settled steps follow them."""
    rng = np.random.default_rng(1)
    noise = 1 + 0.01 * rng.standard_normal(10_000)
    capture, lasted = light_phase(monkeypatch, tmp_path, lambda i: 0.02 * (1.4 if i < 32 else 1.0) * noise[i])
    s = capture.light
    assert s is not None and s.settling is not None and s.settling.settled
    assert s.mean_us == pytest.approx(20_000, rel=0.01) and len(s.settling.dropped_us) >= 25
    assert (
        sum(s.times_us) >= 2e6
        and 2.8 < lasted < 3.2
        and s.settling.extended_s == pytest.approx(lasted - 2, abs=0.05)
    )
    assert any("were still settling" in n for n in capture.notes)


def test_a_slow_transient_is_cut_within_the_cap(monkeypatch, tmp_path) -> None:
    """Steps 40% slow at first, the excess halving every ~0.7 s: at twice the plan the kept steps are
    within the rule's 5% of the steady 20 ms, and nearer to it than the whole phase."""
    rng = np.random.default_rng(1)
    noise = 1 + 0.01 * rng.standard_normal(10_000)
    capture, lasted = light_phase(
        monkeypatch, tmp_path, lambda i: 0.02 * (1 + 0.4 * math.exp(-i / 50)) * noise[i]
    )
    s = capture.light
    assert s is not None and s.settling is not None and s.settling.settled and lasted <= 4.05
    whole = statistics.fmean([*s.settling.dropped_us, *s.times_us])
    assert s.mean_us == pytest.approx(20_000, rel=0.05) and s.mean_us < whole and len(s.times_us) >= 20


def test_a_loop_that_never_settles_stops_at_twice_its_plan_and_says_so(monkeypatch, tmp_path) -> None:
    capture, lasted = light_phase(monkeypatch, tmp_path, lambda i: 0.02 * (1 + 0.2 * math.sin(i / 25)))
    s = capture.light
    assert s is not None and s.settling is not None and not s.settling.settled
    assert lasted == pytest.approx(4.0, abs=0.05) and s.settling.extended_s == pytest.approx(2.0, abs=0.05)
    assert any(
        n.startswith("the light phase did not settle (after 2.0 s more than planned)") for n in capture.notes
    )


def test_a_steady_loop_costs_nothing_more(monkeypatch, tmp_path) -> None:
    rng = np.random.default_rng(2)
    noise = 1 + 0.02 * rng.standard_normal(10_000)
    capture, lasted = light_phase(monkeypatch, tmp_path, lambda i: 0.02 * noise[i])
    s = capture.light
    assert s is not None and s.settling is not None and s.settling.settled and s.settling.extended_s == 0
    assert lasted == pytest.approx(2.0, abs=0.03) and capture.notes == []


def test_no_floor_of_seconds_times_exactly_the_light_steps(monkeypatch, tmp_path) -> None:
    capture, _ = light_phase(
        monkeypatch, tmp_path, lambda i: 0.02 * (1 + 0.2 * math.sin(i / 5)), light_seconds=0.0
    )
    assert capture.light is not None and len(capture.light.times_us) == 20


def test_ranks_plan_the_warm_up_seconds_into_their_light_phase(tmp_path) -> None:
    """With ranks the warm-up goes by --warmup steps alone: the light phase rank 0 plans covers
    --warmup-seconds too, its unsettled head left out afterwards (it is never extended)."""
    capture = LiveCapture(tmp_path, LiveOptions(warmup_seconds=1.0, light_seconds=2.0, light_steps=20))
    capture.warmup.boundaries = [0.0, 0.02, 0.04, 0.06]
    assert capture.light_plan() == 150
    capture = LiveCapture(tmp_path, LiveOptions(warmup_seconds=1.0, light_seconds=0.0, light_steps=20))
    capture.warmup.boundaries = [0.0, 0.02, 0.04, 0.06]
    assert capture.light_plan() == 20


class FakeEvent:
    """A CUDA event the GPU has (`done`) or has not passed yet, recorded at `t_ms` of the stream."""

    def __init__(self, t_ms: float, done: bool) -> None:
        self.t_ms, self.done = t_ms, done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done, "elapsed_time waits for events the GPU has not passed"
        return end.t_ms - self.t_ms


def test_the_light_phase_reads_its_steps_without_waiting_for_the_gpu() -> None:
    """Past its plan the phase looks at the steps the GPU has finished (a sync would drain the queue of
    a loop the GPU bounds and time its refill): marks complete in order, the last one passed found by
    bisection, the spans read once."""
    clock = StepClock(cuda=True)
    clock.marks = [FakeEvent(20.0 * i, done=i <= 37) for i in range(60)]
    assert clock.ready_times() == (20_000.0,) * 37
    assert sum(e.queries for e in clock.marks) <= 8  # log2(60) and one, not 60
    for e in clock.marks[:50]:
        e.done = True
    assert clock.ready_times() == (20_000.0,) * 49
    assert StepClock(cuda=True).ready_times() == ()
