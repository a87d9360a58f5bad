"""The A/B decision of `gpudoctor fix`, on injected step times and a fake clock: a fix that switches in a
running process is timed in blocks of one process, the others in fresh processes side by side; a fix is
kept only if it is faster beyond noise (the mean step of each block or process, pairs as the unit) with
the same results — a loader fix on its speed alone; "no significant difference" and "slower" are
reverted, so are fixes that change the losses, fail, or do not apply (those not run at all); the kept
ones are combined and verified; Ctrl-C ends the run with the results so far. The budget, the shared
baseline and fixes tried on top: test_fix_session_plan.py."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fix_fakes import LOSSES, FakeClock, FakeLauncher, session
from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.evidence import WorkTally
from gpudoctor.fixes.result import FixReport
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions, FixSession
from gpudoctor.fixes.verify import check_numerics, decision, noise_floor
from gpudoctor.timing.paired import Pair, PairedComparison, paired_compare


@pytest.fixture
def fused_in_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused optimizer as a fix that cannot switch in a running process (as it was before its flag
    switched): these tests' fresh-process fix."""
    from gpudoctor.fixes.patches.optimizer import FusedOptimizer

    monkeypatch.setattr(FusedOptimizer, "switchable", False)


# -- the statistics: the timing core's paired test (tests/test_timing_paired.py), read as a verdict --
def pairs(rng: np.random.Generator, a: float, b: float, noise: float, n: int = 6) -> list[Pair]:
    """n pairs of mean steps measured side by side, each pair's two units sharing the machine's drift."""
    out = []
    for i in range(n):
        drift = 1 + 0.2 * rng.standard_normal()  # the machine between pairs: 20%
        out.append(
            Pair(
                a * drift * (1 + noise * rng.standard_normal()),
                b * drift * (1 + noise * rng.standard_normal()),
                i % 2 == 1,
            )
        )
    return out


def test_a_fix_faster_beyond_noise_is_kept() -> None:
    t = paired_compare(pairs(np.random.default_rng(0), 100.0, 80.0, 0.01), unit="process pair")
    assert t.verdict == "faster" and t.saving == pytest.approx(0.2, abs=0.02)
    assert t.saving_ci[0] < t.saving < t.saving_ci[1]
    assert decision(t, None, None) == (True, "faster beyond noise")


def test_no_significant_difference_is_reverted() -> None:
    t = paired_compare(pairs(np.random.default_rng(0), 100.0, 100.0, 0.001), unit="block pair")
    assert t.verdict == "same"
    kept, why = decision(t, None, None)
    assert not kept and why.startswith("no significant difference (within ±1%)")


def test_a_small_gain_inside_the_noise_is_reverted() -> None:
    t = paired_compare(pairs(np.random.default_rng(0), 100.0, 97.0, 0.1), unit="process pair")
    assert t.verdict == "ambiguous"
    assert decision(t, None, None)[1].startswith("no significant difference (too noisy to tell: 95% CI")


@pytest.mark.parametrize(
    ("ratio", "lo", "hi", "p", "why"),
    [
        (
            0.995,
            0.990,
            0.998,
            0.01,
            "a saving of +0.5%, CI +0.2% to +1.0%: under the ±1% that counts as drift",
        ),
        (
            0.97,
            0.95,
            0.99,
            0.2,
            "a saving of +3.0%, CI +1.0% to +5.0%: the rank test does not confirm it, p=0.2",
        ),
        (0.99, 0.97, 1.02, 0.03, "too noisy to tell: 95% CI of the saving -2.0% to +3.0%"),
        (  # the test holds (p=0.026), but a 0.9% saving, the interval's near end, is drift
            0.961,
            0.931,
            0.991,
            0.026,
            "a saving of +3.9%, CI +0.9% to +6.9%: p=0.026, but the interval reaches into the ±1% that counts as drift",
        ),
    ],
)
def test_an_ambiguous_comparison_says_why_it_is_no_reason_to_keep(
    ratio: float, lo: float, hi: float, p: float, why: str
) -> None:
    # GIVEN comparisons neither faster nor slower nor the same: the interval holding no change, or
    # excluding it with a change under the drift margin or unconfirmed by the test
    t = PairedComparison(
        ratio, lo, hi, p, "ambiguous", 0.01, 6, "process pair", "paired t-test", 100.0, 100.0 * ratio
    )
    # THEN the reason says which, with the numbers
    assert decision(t, None, None) == (False, f"no significant difference ({why})")


def test_a_slower_fix_is_reverted() -> None:
    t = paired_compare(pairs(np.random.default_rng(0), 100.0, 110.0, 0.01), unit="process pair")
    assert t.verdict == "slower" and decision(t, None, None) == (False, "slower beyond noise")


def test_one_slow_pair_widens_the_interval() -> None:
    # every pair 10% faster but one, where the candidate's process ran 30% slow: a process-level effect
    base = [Pair(100.0, 90.0), Pair(100.0, 90.0, True), Pair(100.0, 130.0), Pair(100.0, 90.0, True)]
    t = paired_compare(base, unit="process pair")
    assert t.ci_high > 1.0 and t.verdict != "faster"


# -- the numerics guard --------------------------------------------------------------------------------
def test_numerics_within_the_fix_tolerance_pass() -> None:
    cand = [(v[0] * 1.0004,) for v in LOSSES]
    n = check_numerics("loss", list(LOSSES), "loss", cand, 1e-3, None, "fused kernels")
    assert n.ok and n.max_rel_diff == pytest.approx(4e-4, rel=1e-3) and n.steps == 5


def test_numerics_beyond_the_tolerance_revert_the_fix() -> None:
    cand = [(v[0] * 1.03,) for v in LOSSES]
    n = check_numerics("loss", list(LOSSES), "loss", cand, 1e-2, None, "TF32")
    kept, why = decision(None, n, None)
    assert not n.ok and not kept and why.startswith("changes results: loss differs by 3%")


def test_nan_fails_whatever_the_tolerance() -> None:
    cand = [(math.nan,)] + [v for v in LOSSES[1:]]
    assert not check_numerics("loss", list(LOSSES), "loss", cand, 0.5, None).ok
    assert not check_numerics("loss", list(LOSSES), "loss", cand, None, None, "batch changed").ok


def test_the_baselines_own_spread_widens_the_tolerance() -> None:
    jitter = [[(v[0] * (1 + 0.002 * k),) for v in LOSSES] for k in (1, 2)]
    floor = noise_floor(list(LOSSES), jitter)
    assert floor == pytest.approx(0.004, rel=1e-3)
    cand = [(v[0] * 1.008,) for v in LOSSES]
    assert check_numerics("loss", list(LOSSES), "loss", cand, 1e-3, floor).ok


def test_outputs_are_compared_against_their_absolute_sum() -> None:
    ref = [(0.001, 50.0)]  # a sum near zero: its difference counts against the magnitude of the output
    assert check_numerics("output", ref, "output", [(0.02, 50.01)], 1e-3, None).ok


# -- the session ---------------------------------------------------------------------------------------
def test_a_switchable_fix_is_timed_in_blocks_of_one_process_the_others_in_process_pairs(
    fused_in_processes: None,
) -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 104.0, "tf32": 80.0})
    report = session(launcher, clock, "tf32,fused_optimizer", stack=False).run()
    labels = [label for label, *_ in launcher.calls]
    # tf32 switches in a running process: one process, A B B A … blocks inside it; the fused optimizer
    # is built once per process: fresh processes, the order turning each pair (A B, B A, A B, B A);
    # with --no-stack each against the script alone
    assert labels == ["baseline-0", "01-tf32-blocks", "02-fused_optimizer-a1", "02-fused_optimizer-b1",
                      "02-fused_optimizer-b2", "02-fused_optimizer-a2", "02-fused_optimizer-a3",
                      "02-fused_optimizer-b3", "02-fused_optimizer-b4", "02-fused_optimizer-a4"]  # fmt: skip
    assert launcher.calls[1][3] == ("tf32",)
    tf32, fused = report.verdicts
    assert tf32.kept and tf32.measured_saving_pct == pytest.approx(20, abs=2)
    assert (tf32.unit, tf32.pairs, tf32.rounds) == ("block pair", 8, 1)
    assert tf32.test is not None and "sign-flip" in tf32.test
    assert (
        not fused.kept
        and fused.reason == "slower beyond noise"
        and (fused.unit, fused.pairs) == ("process pair", 4)
        and not fused.on_top_of
    )
    assert report.final == ("tf32",) and report.combination is None and report.complete


def test_every_fix_in_fresh_processes_with_no_blocks() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0})
    (v,) = session(launcher, clock, "tf32", blocks=0, rounds=3).run().verdicts
    assert v.kept and (v.unit, v.pairs, v.rounds) == ("process pair", 3, 3)
    assert not any(switch for *_, switch in launcher.calls)


def test_the_verdict_counts_stalls_the_median_hides() -> None:
    # GIVEN a fix that takes away a stall every fifth step: its median step is the baseline's
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 100.0}, noise=0.002)
    plain_steps = launcher.steps

    def stalls(key: str, n: int = 20) -> tuple[float, ...]:
        times = plain_steps(key, n)
        return (
            times if key != "baseline" else tuple(t * (3 if i % 5 == 4 else 1) for i, t in enumerate(times))
        )

    launcher.steps = stalls  # type: ignore[method-assign]
    report = session(launcher, clock, "tf32").run()
    (v,) = report.verdicts
    # THEN the mean step over each window — what the loop pays — finds it; the distribution beside it
    # shows the stalls in the baseline's tail
    assert v.kept and v.measured_saving_pct == pytest.approx(100 * (1 - 100 / 140), abs=2)
    assert v.baseline_steps is not None and v.candidate_steps is not None
    assert v.baseline_steps.median_us == pytest.approx(100, rel=0.02) and v.baseline_steps.max_us > 290
    assert v.candidate_steps.max_us < 110


def test_a_fix_after_a_kept_one_is_tried_on_top_and_the_two_checked_against_the_script() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(
        clock, {"baseline": 100.0, "fused_optimizer": 90.0, "tf32": 85.0, "fused_optimizer+tf32": 75.0}
    )
    report = session(launcher, clock, "fused_optimizer,tf32").run()
    fused, tf32 = report.verdicts
    # THEN TF32 is timed against the fused optimizer (in blocks of one process that has it), not the
    # script: 75 against 90
    assert fused.kept and not fused.on_top_of
    assert tf32.kept and tf32.on_top_of == ("fused_optimizer",) and tf32.unit == "block pair"
    assert tf32.fix == "fused_optimizer+tf32" and tf32.measured_saving_pct == pytest.approx(16.7, abs=2)
    assert tf32.reason.startswith("faster than fused optimizer beyond noise")
    assert tf32.title == "TF32 for float32 matmuls"  # its row names the candidate, the reason its A side
    # AND the two against the script in fresh processes: two pairs when that is decisive
    assert report.combination is not None and report.combination.kept
    assert (report.combination.unit, report.combination.pairs) == ("process pair", 2)
    assert report.final == ("fused_optimizer", "tf32")
    assert report.final_saving_pct == pytest.approx(25, abs=2)
    # AND TF32's finding is calibrated as a share of the script's step: 15 of 100 µs saved
    (entry,) = [e for e in report.calibration if e.fix == "fused_optimizer+tf32"] or [None]
    assert entry is None or entry.measured_pct == pytest.approx(15, abs=2)


def test_kept_fixes_slower_together_than_the_first_alone_are_not_recommended() -> None:
    # GIVEN TF32 faster on top of the fused optimizer in one process, but the two together in fresh
    # processes saving less than the fused optimizer alone
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0, "tf32": 90.0})
    launcher.fresh_step_us["fused_optimizer+tf32"] = 86.0
    report = session(launcher, clock, "fused_optimizer,tf32").run()
    assert report.combination is not None and report.combination.kept
    assert report.final == ("fused_optimizer",) and any("slower than" in n for n in report.notes)
    assert report.final_saving_pct == pytest.approx(20, abs=2)


def test_kept_fixes_not_faster_together_than_the_script_leave_the_first_alone() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0, "tf32": 90.0})
    launcher.fresh_step_us["fused_optimizer+tf32"] = 100.0
    report = session(launcher, clock, "fused_optimizer,tf32").run()
    assert report.combination is not None and not report.combination.kept
    assert report.final == ("fused_optimizer",)
    assert any(n.endswith("fused optimizer alone is recommended") for n in report.notes)


def test_kept_fixes_whose_check_is_undecided_stay_recommended(fused_in_processes: None) -> None:
    # GIVEN fresh processes too noisy to tell in the two pairs the budget leaves: each fix was faster
    # on top of the one before it, so the two stay, with a note
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0, "tf32": 90.0}, noise=0.1)
    launcher.fresh_step_us["fused_optimizer+tf32"] = 78.0
    report = session(launcher, clock, "fused_optimizer,tf32", budget_s=155.0).run()
    combo = report.combination
    assert [v.kept for v in report.verdicts] == [True, True]
    assert combo is not None and combo.verdict == "ambiguous" and combo.pairs == 2 and clock.now == 150.0
    assert report.final == ("fused_optimizer", "tf32")
    assert any("not decisive" in n and "together they are recommended" in n for n in report.notes)
    # AND where the check finds them saving less than the first fix alone, beyond noise, the first stays
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0, "tf32": 90.0}, noise=0.2)
    launcher.fresh_step_us["fused_optimizer+tf32"] = 95.0
    report = session(launcher, clock, "fused_optimizer,tf32", blocks=16).run()
    assert report.combination is not None and not report.combination.kept
    assert report.final == ("fused_optimizer",) and any("slower than" in n for n in report.notes)


def test_a_fix_that_changes_the_losses_is_reverted_after_its_one_process() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "autocast": 50.0})
    launcher.losses["autocast"] = tuple((v[0] * 1.2,) for v in LOSSES)
    report = session(launcher, clock, "autocast").run()
    (v,) = report.verdicts
    assert not v.kept and v.reason.startswith("changes results") and v.rounds == 1
    assert v.numerics is not None and v.numerics.tolerance == 5e-2


@pytest.mark.parametrize("dropout", [True, False])
def test_with_dropout_bf16_is_also_held_to_how_far_other_random_draws_move_the_losses(dropout: bool) -> None:
    # GIVEN bf16 autocast moving the first losses 8% (the allowed 5% past), and the unchanged script moving
    # them 5% where its step draws anew: dropout's masks, which bfloat16 lays out otherwise
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "autocast": 60.0})
    launcher.seen = {"dropout": dropout}
    launcher.losses["autocast"] = tuple((v[0] * 1.08,) for v in LOSSES)
    launcher.losses["reseed"] = tuple((v[0] * 1.05,) for v in LOSSES)
    report = session(launcher, clock, "autocast").run()
    (v,) = report.verdicts
    reseeded = [c for c in launcher.calls if c[1] == ("reseed",)]
    assert v.numerics is not None
    if dropout:
        # THEN one round of the script reseeded sets the yardstick, and bf16 stays within 3 times its move
        assert len(reseeded) == 1 and v.kept and v.numerics.ok
        assert v.numerics.noise_floor == pytest.approx(0.05, rel=1e-3)
    else:
        # without dropout no such round: the 8% is bf16's own, and reverted
        assert not reseeded and not v.kept and v.reason.startswith("changes results")


@pytest.mark.parametrize("samples", [True, False])
def test_a_compile_of_modules_that_sample_is_held_to_how_far_other_random_draws_move_the_losses(
    samples: bool,
) -> None:
    # GIVEN a diffusion step whose VAE encoder samples its latents in its forward (`randn_like`, which
    # compiled code draws otherwise even with fallback_random: the losses 0.5–0.9% apart on the CPU), and
    # the unchanged script moving them 1% where its step draws anew
    from gpudoctor.fixes.evidence import WorkTally

    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "compile": 70.0})
    launcher.work["baseline"] = WorkTally({"float32": 1e9}, random_ops=1, sampling_ops=1 if samples else 0)
    launcher.losses["compile"] = tuple((v[0] * 1.009,) for v in LOSSES)
    launcher.losses["reseed"] = tuple((v[0] * 1.01,) for v in LOSSES)
    report = session(launcher, clock, "compile").run()
    (v,) = report.verdicts
    reseeded = [c for c in launcher.calls if c[1] == ("reseed",)]
    assert v.numerics is not None
    if samples:
        # THEN the script reseeded sets the yardstick once, and the compile stays within 3 times its move
        assert len(reseeded) == 1 and v.kept and v.numerics.ok, v.reason
        assert "it draws other random numbers" in v.numerics.note
    else:
        # a forward that draws only dropout's masks draws them as eager does, compiled: no yardstick
        assert not reseeded and not v.kept and v.reason.startswith("changes results")


@pytest.mark.parametrize(("nudged_move", "kept"), [(5e-4, True), (1e-6, False)])
def test_a_compile_past_its_tolerance_is_held_to_how_far_one_ulp_of_the_weights_moves_the_losses(
    nudged_move: float, kept: bool
) -> None:
    # GIVEN a compiled function moving the first losses 0.11% (the allowed 0.1% past: an actor-critic's
    # rollout on the H200, whose thresholds flip on a last-place difference)
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "compile": 80.0, "tf32": 90.0})
    launcher.losses["compile"] = tuple((v[0] * 1.0011,) for v in LOSSES)
    launcher.losses["nudge"] = tuple((v[0] * (1 + nudged_move),) for v in LOSSES)
    report = session(launcher, clock, "compile,tf32", stack=False).run()
    compiled, tf32 = report.verdicts
    nudged = [c for c in launcher.calls if c[1] == ("nudge",)]
    assert compiled.numerics is not None
    # THEN one round of the script with its weights one ulp off sets the yardstick (once, and not for
    # TF32, within its own tolerance): where that moves the losses 0.05%, the compile's 0.11% is this
    # loop's rounding, within 3 times it; where it moves them 0.0001%, the 0.11% is the compile's own
    assert len(nudged) == 1 and compiled.kept == kept and tf32.kept
    if kept:
        assert compiled.numerics.noise_floor == pytest.approx(nudged_move, rel=1e-3)
        assert "weights one ulp off move this loop's losses 0.05%" in compiled.numerics.note
    else:
        # (the report says how far rounding alone moved them: the compile's own move is 1,000 times that)
        assert compiled.reason.startswith("changes results") and compiled.numerics.noise_floor is None
        assert "weights one ulp off move this loop's losses 0.0001%" in compiled.reason


@pytest.mark.parametrize(("cudnn_tf32", "kept"), [(True, True), (False, False)])
def test_a_conv_fix_is_held_to_tf32_rounding_where_the_script_convolves_in_tf32(
    cudnn_tf32: bool, kept: bool
) -> None:
    # GIVEN a conv net whose losses move by 0.67% under channels_last (measured on the H100: ResNet-50,
    # float32, cuDNN's TF32 on by default), which is 14% faster
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "channels_last": 86.0})
    launcher.seen = {"conv2d": True, "cudnn_tf32": cudnn_tf32}
    launcher.losses["channels_last"] = tuple((v[0] * 1.0067,) for v in LOSSES)
    # WHEN it is tried
    (v,) = session(launcher, clock, "channels_last").run().verdicts
    # THEN other convolution algorithms are allowed TF32's rounding only where the convolutions use it
    assert v.kept is kept and v.numerics is not None
    assert v.numerics.tolerance == (1e-2 if cudnn_tf32 else 1e-3)
    # (the tolerance's note, then how far weights one ulp off moved the losses)
    assert kept or "allowed 0.1%: other convolution algorithms;" in v.reason


def test_a_fix_that_raises_or_does_not_apply_when_run_is_reverted_with_the_reason() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0})
    launcher.failures["tf32"] = "OutOfMemoryError: CUDA out of memory"
    launcher.not_applicable.add("fused_optimizer")
    report = session(launcher, clock, "tf32,fused_optimizer").run()
    tf32, fused = report.verdicts
    # tf32's one process failed: as switching itself may have broken it, a fresh pair tells — it fails too
    assert not tf32.kept and "out of memory" in tf32.reason and tf32.unit is None
    assert any(n.startswith("tf32: its A/B in one process failed") for n in report.notes)
    assert [fixes for _, fixes, *_ in launcher.calls].count(("tf32",)) == 2
    assert not fused.kept and fused.reason == "does not apply: no optimizer"


def test_a_fix_that_failed_in_one_process_before_any_switch_is_not_run_again_in_fresh_processes() -> None:
    # GIVEN CUDA graphs over three modules that fail in their third step, every fix on (the UNet's
    # "output of CUDAGraphs overwritten by a subsequent run"), and TF32 whose process fails after switching
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0})
    launcher.failures["compile:reduce-overhead"] = "RuntimeError: accessing tensor output of CUDAGraphs"
    launcher.fail_all_on.add("compile:reduce-overhead")
    launcher.failures["tf32"] = "RuntimeError: failed beside eager steps"
    report = session(launcher, clock, "compile:reduce-overhead,tf32").run()
    graphs, tf32 = report.verdicts
    # THEN the one that failed before any switch failed as a fresh process would: it is not run again
    ran = [fixes for _, fixes, *_ in launcher.calls]
    assert ran.count(("compile:reduce-overhead",)) == 1
    assert not graphs.kept and "before any switch" in graphs.reason and "CUDAGraphs" in graphs.reason
    assert not any(n.startswith("compile:reduce-overhead: its A/B") for n in report.notes)
    # the one that failed after switching may have failed for it: fresh processes tell
    assert ran.count(("tf32",)) == 2 and not tf32.kept


def test_a_process_that_crashed_in_its_ab_in_one_process_is_tried_again_in_fresh_ones() -> None:
    # a crash (a segfault, a timeout) writes no count of the switches: switching may be what broke it
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0})
    launcher.failures["tf32"] = "SIGSEGV"
    launcher.fail_all_on.add("tf32")
    launcher.crash.add("tf32")
    (v,) = session(launcher, clock, "tf32").run().verdicts
    assert [fixes for _, fixes, *_ in launcher.calls].count(("tf32",)) == 2 and not v.kept


def test_where_cuda_graphs_fail_plain_compile_is_tried_next() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "compile": 80.0, "tf32": 99.0})
    launcher.failures["compile:reduce-overhead"] = "RuntimeError: accessing tensor output of CUDAGraphs"
    launcher.fail_all_on.add("compile:reduce-overhead")
    report = session(launcher, clock, "compile:reduce-overhead,tf32,compile").run()
    ran = list(dict.fromkeys(fixes for _, fixes, *_ in launcher.calls if fixes))
    # the group's alternative takes its place, ahead of the other groups
    assert ran[:3] == [("compile:reduce-overhead",), ("compile",), ("compile", "tf32")]
    assert report.final == ("compile",)


@pytest.mark.parametrize("calls", [0, 1])
def test_a_fix_whose_call_site_the_loop_never_reaches_does_not_apply_and_is_not_run(calls: int) -> None:
    # GIVEN a script that calls empty_cache() never, or once (at the end of training, say), in 25 steps
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "no_empty_cache": 75.0})
    launcher.seen = {"empty_cache": calls}
    report = session(launcher, clock, "no_empty_cache").run()
    (v,) = report.verdicts
    # THEN no_empty_cache is reported as not applying, untimed: no false verdict can come of it
    assert (
        not v.kept
        and v.reason
        == f"does not apply: torch.cuda.empty_cache() is not called in the loop ({calls} call{'s' * (calls != 1)} "
        "in 25 steps)"
    )
    assert v.rounds == 0 and v.verdict is None and [label for label, *_ in launcher.calls] == ["baseline-0"]
    # AND where the loop calls it every step, it is run
    launcher.seen = {"empty_cache": 25}
    (v,) = session(launcher, clock, "no_empty_cache").run().verdicts
    assert v.kept and v.unit == "block pair"


def test_a_fix_that_cannot_switch_in_the_process_is_timed_in_fresh_processes() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "autocast": 70.0})
    launcher.cannot_switch.add("autocast")
    report = session(launcher, clock, "autocast").run()
    (v,) = report.verdicts
    assert v.kept and v.unit == "process pair" and v.pairs == 4
    assert any("cannot be switched; its A/B ran in fresh processes" in n for n in report.notes)


def test_compile_with_dropout_draws_random_numbers_as_eager_in_its_rounds() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "compile": 60.0})
    launcher.seen = {"dropout": True}
    report = session(launcher, clock, "compile").run()
    assert [c for c in launcher.calls if c[1]] == [("01-compile-blocks", ("compile",), True, ("compile",))]
    (v,) = report.verdicts
    assert v.kept and v.rounds == 1 and v.compile_s == 30.0
    assert v.payback_steps == pytest.approx(30e6 / 40.0, rel=0.1)


def test_a_larger_batch_is_judged_per_sample() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "batch:x2": 150.0})
    launcher.batch["batch:x2"] = 32
    report = session(launcher, clock, "batch:x2").run()
    (v,) = report.verdicts
    assert v.per_sample and v.kept and v.measured_saving_pct == pytest.approx(25, abs=2)
    assert v.numerics is not None and v.numerics.tolerance is None and v.numerics.ok


def test_a_loader_fix_is_judged_on_speed_when_its_batches_draw_other_random_numbers() -> None:
    # GIVEN workers whose batches draw other random numbers (torchvision's random transforms): the
    # losses differ by 4.8%, as on the CPU before, where it was reverted for it
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "workers:4": 40.0})
    launcher.losses["workers:4"] = tuple((v[0] * 1.048,) for v in LOSSES)
    (v,) = session(launcher, clock, "workers:4").run().verdicts
    # THEN it is kept on its speed; the difference is reported, not held against it
    assert v.kept and v.numerics is not None and v.numerics.ok and v.numerics.tolerance is None
    assert v.numerics.max_rel_diff == pytest.approx(0.048, rel=1e-3) and "judged on speed" in v.numerics.note


def test_a_fix_beside_a_loader_fix_keeps_its_guard_against_the_loader_fix_alone() -> None:
    # GIVEN workers (other batches: losses 4.8% off) and TF32 (moves the losses 0.2% more)
    clock = FakeClock()
    launcher = FakeLauncher(
        clock, {"baseline": 100.0, "workers:4": 40.0, "tf32": 90.0, "workers:4+tf32": 36.0}
    )
    launcher.losses["workers:4"] = tuple((v[0] * 1.048,) for v in LOSSES)
    launcher.losses["workers:4+tf32"] = tuple((v[0] * 1.048 * 1.002,) for v in LOSSES)
    report = session(launcher, clock, "workers:4,tf32").run()
    combo = report.combination
    # THEN the combination's losses are compared with the loader fix's own rounds (the same batches):
    # TF32's 1% holds, the data's 4.8% does not count
    assert combo is not None and combo.kept and combo.numerics is not None and combo.numerics.ok
    assert combo.numerics.max_rel_diff == pytest.approx(0.002, rel=0.01) and combo.numerics.tolerance == 1e-2
    assert "against workers:4 alone (the same batches)" in combo.numerics.note
    # AND a TF32 that moved them 3% beside the workers is caught where it is tried, on top of them
    launcher.losses["workers:4+tf32"] = tuple((v[0] * 1.048 * 1.03,) for v in LOSSES)
    report = session(launcher, clock, "workers:4,tf32").run()
    tf32 = report.verdicts[1]
    assert tf32.on_top_of == ("workers:4",) and not tf32.kept
    assert tf32.reason.startswith("on top of DataLoader workers (4): changes results")
    assert report.final == ("workers:4",) and report.combination is None


def test_an_a_a_no_op_gets_no_verdict() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0}, noise=0.05)
    (v,) = session(launcher, clock, "noop").run().verdicts
    assert not v.kept and v.verdict in ("same", "ambiguous") and v.unit == "block pair"


def test_ctrl_c_keeps_the_results_so_far(fused_in_processes: None) -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0, "fused_optimizer": 80.0})
    launcher.interrupt_at = 5  # during fused_optimizer's second pair
    updates: list[FixReport] = []
    s = session(launcher, clock, "tf32,fused_optimizer")
    s.on_update = updates.append
    report = s.run()
    assert report.interrupted and not report.complete
    tf32, fused = report.verdicts
    assert tf32.kept
    assert not fused.kept and fused.reason.startswith("interrupted (Ctrl-C) after 1 rounds")
    assert updates[-1] == report


def test_the_report_has_a_diff_a_calibration_and_survives_json(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nopt = torch.optim.AdamW(params, foreach=False)\n")
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0})
    launcher.edits["fused_optimizer"] = (
        Edit("set_kwargs", str(script), 2, call="AdamW", kwargs={"fused": "True"}, drop=("foreach",)),
    )
    from gpudoctor.rules.finding import SCHEMA, Diagnosis, Finding, Fix, Severity

    finding = Finding("optimizer_unfused", Severity.MAJOR, "unfused", 12.0, (), Fix("", ""), {})
    s = FixSession(launcher, FixOptions(only=("fused_optimizer",)), Diagnosis(SCHEMA, (finding,), "", {}),
                   argv=("train.py",), started_at="now", clock=clock)  # fmt: skip
    report = s.run()
    assert "+opt = torch.optim.AdamW(params, fused=True)" in report.diff
    (entry,) = report.calibration
    assert (entry.rule, entry.fix, entry.predicted_pct, entry.kept) == (
        "optimizer_unfused",
        "fused_optimizer",
        12.0,
        True,
    )
    assert entry.measured_pct == pytest.approx(20, abs=2)
    assert FixReport.from_json(report.to_json()) == report
    assert report.calibration_json()["entries"][0]["rule"] == "optimizer_unfused"


def test_each_rule_is_calibrated_against_its_own_estimate() -> None:
    # GIVEN torch.compile, which answers two findings that promised different savings
    from gpudoctor.rules.finding import SCHEMA, Diagnosis, Finding, Fix, Severity

    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "compile": 63.0})
    found = tuple(
        Finding(rule, Severity.MAJOR, rule, pct, (), Fix("", ""), {})
        for rule, pct in (("unfused_elementwise", 21.0), ("host_python", 6.0))
    )
    s = FixSession(launcher, FixOptions(only=("compile",)), Diagnosis(SCHEMA, found, "", {}),
                   argv=("train.py",), started_at="now", clock=clock)  # fmt: skip
    # WHEN it is measured
    report = s.run()
    # THEN the fix is predicted the larger, and each rule's entry holds that rule's own estimate
    assert report.verdicts[0].predicted_saving_pct == 21.0
    assert {e.rule: e.predicted_pct for e in report.calibration} == {
        "unfused_elementwise": 21.0,
        "host_python": 6.0,
    }


def test_baseline_processes_far_apart_are_reported_with_the_spread(fused_in_processes: None) -> None:
    # GIVEN baseline processes whose means alternate between 100 and 120 µs (a host-bound loop that
    # runs slower on some cores, say)
    from gpudoctor.report.fix_view import headline

    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 95.0}, noise=0.002)
    plain = launcher.__call__
    count = {"baselines": 0}

    def slow_every_other(
        label: str, fixes: tuple[str, ...], exact: bool, switch: tuple[str, ...] = ()
    ) -> RoundResult:
        r = plain(label, fixes, exact, switch)
        if fixes:
            return r
        count["baselines"] += 1
        scale = 1.2 if count["baselines"] % 2 == 0 else 1.0
        return replace(r, step_times_us=tuple(t * scale for t in r.step_times_us))

    report = FixSession(slow_every_other, FixOptions(only=("fused_optimizer",)), None,
                        argv=("train.py",), started_at="now", clock=clock).run()  # fmt: skip
    # THEN the report gives the spread — 20 µs over the median process's 100 — and what it means
    assert report.baseline_spread_pct == pytest.approx(20, abs=1)
    assert "over 5 processes (up to 20.0% apart)" in headline(report)
    assert any(n.startswith("the baseline's own processes differ by up to 20%") for n in report.notes)


def test_baseline_processes_close_together_leave_no_note(fused_in_processes: None) -> None:
    clock = FakeClock()
    report = session(
        FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0}), clock, "fused_optimizer"
    ).run()
    assert report.baseline_spread_pct is not None and report.baseline_spread_pct < 3
    assert not any("differ by up to" in n for n in report.notes)


def test_the_harness_spread_is_set_beside_the_plain_one_at_equal_counts() -> None:
    from gpudoctor.fixes.attempt import spread_ratio
    from gpudoctor.fixes.proof import spread_pct

    # GIVEN 8 harness processes and 4 plain ones drawn from one distribution (seeded normal, 10% σ)
    rng = random.Random(7)
    ratios = []
    for _ in range(300):
        harness = [rng.gauss(100, 10) for _ in range(8)]
        plain = [rng.gauss(100, 10) for _ in range(4)]
        ratios.append(spread_ratio(harness, plain))
    raw = []
    for _ in range(300):
        harness = [rng.gauss(100, 10) for _ in range(8)]
        plain = [rng.gauss(100, 10) for _ in range(4)]
        raw.append(spread_pct(harness) / spread_pct(plain))
    # THEN at equal counts the harness is as far apart as the plain processes (median ratio near 1),
    # where the raw ranges put it ~1.4× as far apart (E[range] 2.85 σ at 8 against 2.06 σ at 4)
    assert 0.85 < statistics.median(ratios) < 1.15
    assert statistics.median(raw) > 1.25
    # AND equal counts are compared as they are
    assert spread_ratio([1.0, 2.0], [1.0, 2.0]) == pytest.approx(1.0)
    assert spread_ratio([1.0], [1.0, 2.0]) is None


def test_an_undecided_lean_in_blocks_times_more_pairs_where_the_budget_has_room() -> None:
    # GIVEN tf32 3% faster on a loop whose block means are ~5% apart: 8 pairs leave that undecided
    for seed in range(10):
        clock = FakeClock()
        launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 97.0}, noise=0.15)
        launcher.rng = np.random.default_rng(seed)
        (v,) = session(launcher, clock, "tf32").run().verdicts
        # THEN the session lets the round add 16 pairs; where it did, all 24 are judged at α 3%
        assert launcher.extends == [0, 16]
        if v.pairs == 24:
            assert v.test is not None and "16 pairs added" in v.test and "α 0.03" in v.test
            break
    else:
        raise AssertionError("no seed leaned to a saving undecided")
    # AND where the budget holds the round but not its added pairs, none are asked for
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 97.0}, noise=0.15)
    (v,) = session(launcher, clock, "tf32", budget_s=45.0).run().verdicts
    assert launcher.extends == [0, 0] and v.pairs == 8
    # AND --extend-blocks 0 never extends
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 97.0}, noise=0.15)
    session(launcher, clock, "tf32", extend_blocks=0).run()
    assert launcher.extends == [0, 0]


def test_added_pairs_cost_at_most_what_their_round_does() -> None:
    # GIVEN pinned batches tried on top of 16 kept workers at 55 ms a step: before every block the
    # batches in flight settle (16 × 4 + 1 = 65 steps, 3.6 s), so a block pair costs ~8 s, not ~1 s
    clock = FakeClock()
    step = {"baseline": 400_000.0, "workers:16": 55_000.0, "workers:16+pin_memory": 53_000.0}
    launcher = FakeLauncher(clock, step, noise=0.15)
    session(launcher, clock, "workers:16,pin_memory").run()
    labels = [label for label, *_ in launcher.calls]
    (k,) = [i for i, label in enumerate(labels) if label.endswith("pin_memory-blocks")]
    # THEN it may add fewer pairs than 16: no more than its own round's cost (~84 s) buys
    assert 2 <= launcher.extends[k] < 16


def test_a_fix_that_did_not_take_effect_is_said_so_not_no_difference() -> None:
    # GIVEN bfloat16 autocast whose rounds ran the forward's matmuls in float32 all the same (a fake
    # model whose work the patch cannot reach), and times that do not move
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "autocast": 100.0})
    launcher.work["autocast"] = WorkTally({"float32": 4.0e9}, ops=12)
    report = session(launcher, clock, "autocast").run()
    (v,) = report.verdicts
    # THEN it is reverted as "did not take effect", with the share it reached, never "no difference"
    assert not v.kept and v.reason.startswith("bfloat16 autocast did not take effect: 0% of the forward's")
    assert "no significant difference" not in v.reason


def test_a_fix_that_took_effect_says_how_far_beside_its_verdict() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "autocast": 70.0})
    launcher.work["autocast"] = WorkTally({"bfloat16": 3.9e9, "float32": 0.1e9}, ops=12)
    (v,) = session(launcher, clock, "autocast").run().verdicts
    assert v.kept and v.evidence == (
        "bfloat16 autocast: 98% of the forward's matmul/convolution work in reduced precision",
    )
