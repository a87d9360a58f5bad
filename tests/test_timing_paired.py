"""The A/B decision where the unit is a pair of blocks (in one process) or of processes, not a step:
Student's t as scipy has it, blocks scheduled at step boundaries (each pair's order a coin) and timed
between synchronizations by the timing core's host clock, and — with a fake clock whose loop drifts 30% slower
over the run, has bimodal steps and periodic stalls — a false-positive rate under 5% on A/A while real
effects of 10% are found either way (and 5% most of the time). The step as the unit (the old test)
fails the same A/A data."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import numpy as np
import pytest

from gpudoctor.timing.blocks import BlockPlan, BlockSchedule, block_pairs
from gpudoctor.timing.compare import ALPHA, SAME_WITHIN, decide
from gpudoctor.timing.paired import (
    ALPHA_EXTENDED,
    Pair,
    abba,
    false_positive_rate,
    leans_to_a_saving,
    paired_compare,
    pairs_in_order,
    sequential_verdict,
    sides,
    t_quantile,
    t_two_sided_p,
)
from gpudoctor.timing.stats import bootstrap_ratio_ci_grouped, mann_whitney


@pytest.mark.parametrize(("df", "q975"), [(1, 12.7062), (2, 4.3027), (5, 2.5706), (30, 2.0423)])
def test_student_t_quantiles_are_the_tables(df: int, q975: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-3)
    assert t_two_sided_p(q975, df) == pytest.approx(0.05, abs=1e-4)


def test_the_schedule_alternates_the_order_of_each_pair() -> None:
    assert abba(3) == [False, True, True, False, False, True]
    pairs = pairs_in_order([(False, 10.0), (True, 9.0), (True, 8.0), (False, 11.0)])
    assert pairs == [Pair(10.0, 9.0, b_first=False), Pair(11.0, 8.0, b_first=True)]


class DriftingLoop:
    """A training loop on a fake host clock: each step's time drifts `drift` slower over `run_steps`,
    swings with a slow sine (GPU clocks), is bimodal (one step in four 40% longer: a loader refill) and
    stalls 8× every 37 steps (logging, GC). The candidate's configuration scales it by `effect`."""

    def __init__(self, seed: int, effect: float, drift: float = 0.3, run_steps: int = 3000) -> None:
        self.rng = np.random.default_rng(seed)
        self.effect, self.drift, self.run_steps = effect, drift, run_steps
        self.now = 0.0
        self.step = 0
        self.on = True

    def now_us(self) -> float:
        return self.now

    def switch(self, on: bool) -> None:
        self.on = on

    def run_one_step(self) -> None:
        t = self.step / self.run_steps
        base = 1000.0 * (1 + self.drift * t) * (1 + 0.05 * math.sin(7 * t))
        base *= 1.4 if self.rng.random() < 0.25 else 1.0
        base *= 8.0 if self.step % 37 == 36 else 1.0
        base *= 1 + 0.05 * self.rng.standard_normal()
        self.now += base * (self.effect if self.on else 1.0)
        self.step += 1


def run_blocks(loop: DriftingLoop, plan: BlockPlan, seed: int = 0) -> BlockSchedule:
    schedule = BlockSchedule(replace(plan, seed=seed), loop.switch, host=loop)
    while not schedule.boundary():
        loop.run_one_step()
    return schedule


PLAN = BlockPlan(pairs=8, min_steps=3, min_seconds=0.2, settle=1, prewarm=3)


def test_blocks_are_windows_of_the_plan_in_the_schedules_order() -> None:
    loop = DriftingLoop(0, effect=0.8)
    schedule = run_blocks(loop, PLAN)
    layout = schedule.layout
    assert layout is not None and [b.candidate for b in schedule.blocks] == sides(layout.b_first)
    # every block the same steps, at least 3 and 0.2 s at the calibration's pace (the loop's steps of
    # ~1 ms with random slow ones and a stall every 37 have no cycle)
    assert layout.period == 1 and all(b.steps == layout.steps for b in schedule.blocks)
    assert (
        layout.steps >= 3 and layout.steps * sum(layout.calibration_us) / len(layout.calibration_us) >= 0.2e6
    )
    assert all(len(b.step_times_us) == b.steps for b in schedule.blocks)
    # a block's mean step is its window over its steps: the steps' own times add up to it
    assert all(sum(b.step_times_us) == pytest.approx(b.elapsed_us) for b in schedule.blocks)
    assert loop.on and schedule.done  # left as the process started: the candidate's configuration


def test_a_drifting_loop_gives_under_5pct_false_verdicts_on_a_a_and_finds_5pct_effects() -> None:
    """The acceptance of the decision: 300 A/A runs of a loop that drifts 30% over the run, and runs
    with a real effect: 5% and 10% faster, 10% slower."""
    false = sum(
        paired_compare(block_pairs(run_blocks(DriftingLoop(s, 1.0), PLAN, s).blocks)).verdict
        in ("faster", "slower")
        for s in range(300)
    )
    assert false / 300 <= 0.05
    # measured over 300 seeds: no false verdict; 5% faster found in 70%, 10% faster in 100%, 10% slower
    # in 100% (under the old schedule — A B B A, blocks ending on time, no untimed step where nothing
    # switched —: 0%, 65%, 100%, 98%; the minimum-effect rule asks the whole interval past ±1%: a 5%
    # effect under 30% drift and stalls is at the edge of what 8 block pairs resolve)
    for effect, expected, least in ((0.95, "faster", 60), (0.90, "faster", 95), (1.10, "slower", 95)):
        found = sum(
            paired_compare(block_pairs(run_blocks(DriftingLoop(s, effect), PLAN, s).blocks)).verdict
            == expected
            for s in range(100)
        )
        assert found >= least, (effect, found)


def test_the_saving_is_estimated_within_its_interval() -> None:
    c = paired_compare(block_pairs(run_blocks(DriftingLoop(3, 0.9), PLAN).blocks))
    assert c.verdict == "faster" and c.saving == pytest.approx(0.10, abs=0.03)
    assert c.saving_ci[0] < 0.10 < c.saving_ci[1] and c.pairs == 8 and "order of each pair" in c.test


def process_means(rng: np.random.Generator, n: int, effect_of: list[bool], effect: float) -> list[float]:
    """Mean steps of n fresh processes in a row: 20% apart from one another (a lognormal process
    effect: clocks, placement), drifting 30% slower over the session."""
    return [
        20.0 * (1 + 0.3 * k / n) * math.exp(0.2 * rng.standard_normal()) * (effect if b else 1.0)
        for k, b in zip(range(n), effect_of, strict=True)
    ]


def test_processes_as_the_unit_hold_the_nominal_5pct_on_a_a_and_find_a_loader_fix_in_four_pairs() -> None:
    """Four pairs of fresh processes (A B B A A B B A: the session's default), 20% apart and drifting:
    Student's t is exact here, so the A/A rate is the nominal 5% within its sampling error."""
    rng = np.random.default_rng(0)
    order = abba(4)
    runs = 2000
    false = 0
    for _ in range(runs):
        pairs = pairs_in_order(list(zip(order, process_means(rng, 8, order, 1.0), strict=True)))
        false += paired_compare(pairs, unit="process pair").verdict in ("faster", "slower")
    assert false / runs <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / runs)
    found = sum(
        paired_compare(
            pairs_in_order(list(zip(order, process_means(rng, 8, order, 0.4), strict=True))),
            unit="process pair",
        ).verdict
        == "faster"
        for _ in range(100)
    )
    assert found >= 90


def per_step_verdict(baseline: list[list[float]], candidate: list[list[float]]) -> str:
    """The verdict as gpudoctor fix gave it before the pair became the unit: every step a sample (median
    ratio, the processes' steps bootstrapped by process, Mann-Whitney on all steps)."""
    a = [t for r in baseline for t in r]
    b = [t for r in candidate for t in r]
    ratio = statistics.median(b) / statistics.median(a)
    lo, hi = bootstrap_ratio_ci_grouped(baseline, candidate, seed=0)
    return decide(ratio, lo, hi, mann_whitney(a, b)[1], SAME_WITHIN, ALPHA).value


def test_steps_as_the_unit_call_a_a_processes_different() -> None:
    """Why the unit changed: the same A/A processes, judged on their steps (every step a sample, as
    before), are called faster or slower far more often than 5%."""
    rng = np.random.default_rng(1)
    false = 0
    for _ in range(300):
        means = process_means(rng, 6, [False] * 6, 1.0)
        steps = [list(m * (1 + 0.02 * rng.standard_normal(20))) for m in means]
        false += per_step_verdict(steps[0::2], steps[1::2]) in ("faster", "slower")
    assert false / 300 > 0.075  # 9.3%: the grouped bootstrap resamples 3 processes a side


def test_the_false_positive_rate_of_recorded_a_a_units_is_measured_by_resampling() -> None:
    loop = DriftingLoop(5, 1.0)
    plan = BlockPlan(pairs=24, min_steps=3, min_seconds=0.05, settle=1, prewarm=3)
    means = [b.mean_us for b in run_blocks(loop, plan).blocks]
    rate, n = false_positive_rate(means, 8, comparisons=300, seed=0)
    assert n == 300 and rate <= 0.05
    trend = [100.0 * (1 + 0.02 * k) for k in range(48)]  # a steep drift with no noise at all
    assert false_positive_rate(trend, 8, comparisons=200)[0] <= 0.05


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="two pairs"):
        paired_compare([Pair(1.0, 1.0)])
    with pytest.raises(ValueError, match="positive"):
        paired_compare([Pair(1.0, 0.0), Pair(1.0, 1.0)])
    with pytest.raises(ValueError, match="block plan"):
        BlockPlan(pairs=1)


def test_recorded_processes_are_resampled_as_any_pairing_of_them() -> None:
    rng = np.random.default_rng(2)
    means = list(20.0 * np.exp(0.1 * rng.standard_normal(40)))  # 40 processes of one configuration
    rate, n = false_positive_rate(means, 4, unit="process pair", pairing=True, comparisons=2000)
    assert n == 2000 and rate <= 0.05
    # a difference between the first and second half is drift to a stretch, not to a pairing's labels
    shifted = means[:20] + [m * 1.5 for m in means[20:]]
    assert false_positive_rate(shifted, 4, pairing=True, comparisons=2000)[0] <= 0.05


@pytest.mark.parametrize("noise", [0.05, 0.09, 0.2])
def test_two_looks_hold_the_one_looks_false_positive_rate_and_find_more(noise: float) -> None:
    # GIVEN block means whose pairs are `noise` apart (5%: a quiet loop; 9%: timm's ConvNeXt beside
    # another job on the H100, session 36; 20%: a stalling loader), judged as an extending schedule
    # is: 8 planned pairs, 16 more where those lean to a 2% saving undecided, then at α 3%
    rng = np.random.default_rng(7)
    units = (100.0 * np.exp(noise * rng.standard_normal(4000))).tolist()
    fixed, _ = false_positive_rate(units, 8, comparisons=600, seed=1)
    two, n = false_positive_rate(units, 8, extend=16, comparisons=600, seed=1)
    # THEN no-op comparisons are called faster or slower no more often than the nominal 5%
    assert n == 600 and two <= 0.05 and fixed <= 0.05

    # AND a true 5% saving is found more often than by the planned pairs alone
    def found(extend: int) -> int:
        hits = 0
        for k in range(200):
            d = noise * rng.standard_normal(24) - 0.05
            pairs = [Pair(100.0, 100.0 * math.exp(x), bool(k % 2)) for x in d]
            verdict = sequential_verdict(pairs, 8) if extend else paired_compare(pairs[:8]).verdict
            hits += verdict == "faster"
        return hits

    assert found(16) > found(0)


def test_an_extending_schedule_judges_its_first_pairs_alone_unless_they_lean_to_a_saving() -> None:
    swing = [1, 1, -1, -1, 1, -1, -1, 1]  # not the pairs' orders (those would explain it away)
    even = [Pair(100.0, 100.0 * (1 + 0.05 * s), k % 2 == 0) for k, s in enumerate(swing)]  # no lean
    leaning = [Pair(100.0, 100.0 * (0.96 + 0.06 * s), k % 2 == 0) for k, s in enumerate(swing)]
    assert not leans_to_a_saving(even) and leans_to_a_saving(leaning)
    clear = [Pair(100.0, 95.0 + 0.1 * k, k % 2 == 0) for k in range(16)]
    # pairs past the plan are ignored where the planned ones do not lean …
    assert sequential_verdict([*even, *clear], 8) == paired_compare(even).verdict == "ambiguous"
    # … and counted, at ALPHA_EXTENDED, where they do
    assert (
        sequential_verdict([*leaning, *clear], 8)
        == paired_compare([*leaning, *clear], alpha=ALPHA_EXTENDED).verdict
        == "faster"
    )
    with pytest.raises(ValueError, match="sequential"):
        false_positive_rate([1.0] * 48, 8, extend=16, decide_fn=lambda ps: "same")
