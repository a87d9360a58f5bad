"""The A/B decision of `gpudoctor fix`, on injected step times and a fake clock: a fix is kept only if
it is faster beyond noise with the same results; "no significant difference" and "slower" are reverted,
so are fixes that change the losses, fail or do not apply; the kept ones are combined and verified; the
time budget and Ctrl-C end the run with the results so far."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.observe import LoaderInfo, Observations, OptimizerInfo, RootInfo
from gpudoctor.fixes.patches.base import PatchOutcome
from gpudoctor.fixes.result import FixReport
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions, FixSession
from gpudoctor.fixes.verify import TimingComparison, check_numerics, compare_rounds, decision, noise_floor
from gpudoctor.runner.hooks import CallSite

LOSSES = ((2.30,), (2.25,), (2.21,), (2.18,), (2.12,))


def observations(
    *, dropout: bool = False, batch: int = 16, conv2d: bool = False, cudnn_tf32: bool = False
) -> Observations:
    site = CallSite("train.py", 10, "<module>")
    root = RootInfo(
        "Net", 1000, "float32", "cuda", True, conv2d, dropout, None, ("model",), site, (((16, 8),),) * 3
    )
    loader = LoaderInfo(site, batch, 0, False, False, None, False, True)
    return Observations(root, (loader,), (OptimizerInfo(site, "AdamW", False, None, 4),), (), (), (),
                        "highest", False, True, True, 8, cudnn_tf32)  # fmt: skip


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeLauncher:
    """Rounds whose step times are drawn around a configured median per configuration."""

    def __init__(
        self, clock: FakeClock, step_us: dict[str, float], *, noise: float = 0.01, round_s: float = 10.0
    ):
        self.clock, self.step_us, self.noise, self.round_s = clock, step_us, noise, round_s
        self.rng = np.random.default_rng(1)
        self.calls: list[tuple[str, tuple[str, ...], bool]] = []
        self.losses: dict[str, tuple[tuple[float, ...], ...]] = {}
        self.failures: dict[str, str] = {}
        self.not_applicable: set[str] = set()
        self.interrupt_at: int | None = None
        self.batch: dict[str, int] = {}
        self.edits: dict[str, tuple[Edit, ...]] = {}
        self.seen: dict[str, bool] = {}  # what every round observes of the script (conv2d, cudnn_tf32)
        self.round_by: dict[str, float] = {}  # a configuration's round length where not round_s

    def __call__(self, label: str, fixes: tuple[str, ...], exact_random: bool) -> RoundResult:
        self.calls.append((label, fixes, exact_random))
        if self.interrupt_at is not None and len(self.calls) >= self.interrupt_at:
            raise KeyboardInterrupt
        self.clock.now += self.round_by.get("+".join(fixes), self.round_s)
        key = "+".join(fixes) or "baseline"
        median = self.step_us.get(key, self.step_us["baseline"])
        times = tuple(median * (1 + self.noise * self.rng.standard_normal(20)))
        patches = {f: PatchOutcome(f not in self.not_applicable, None if f not in self.not_applicable else "no optimizer",
                                   (f"{f} applied",), self.edits.get(f, ())) for f in fixes}  # fmt: skip
        obs = observations(batch=self.batch.get(key, 16), **self.seen)
        outcome = "exception" if key in self.failures else "stopped"
        return RoundResult(fixes, outcome, 0, "cuda_events", times, 25, "loss", self.losses.get(key, LOSSES),
                           compile_s=30.0 if "compile" in key else 0.0, patches=patches, observations=obs,
                           error=self.failures.get(key), device="NVIDIA H100 80GB HBM3")  # fmt: skip


def session(launcher: FakeLauncher, clock: FakeClock, only: str, **options: object) -> FixSession:
    opts = FixOptions(only=tuple(only.split(",")), **options)  # type: ignore[arg-type]
    return FixSession(launcher, opts, None, argv=("train.py",), started_at="now", clock=clock)


# -- the statistics ------------------------------------------------------------------------------------
def rounds(rng: np.random.Generator, median: float, noise: float, n: int = 3) -> list[list[float]]:
    return [list(median * (1 + noise * rng.standard_normal(20))) for _ in range(n)]


def test_a_fix_faster_beyond_noise_is_kept() -> None:
    rng = np.random.default_rng(0)
    t = compare_rounds(rounds(rng, 100.0, 0.02), rounds(rng, 80.0, 0.02))
    assert t.verdict == "faster" and t.saving == pytest.approx(0.2, abs=0.02)
    assert t.saving_ci[0] < t.saving < t.saving_ci[1]
    assert decision(t, None, None) == (True, "faster beyond noise")


def test_no_significant_difference_is_reverted() -> None:
    rng = np.random.default_rng(0)
    t = compare_rounds(rounds(rng, 100.0, 0.005), rounds(rng, 100.0, 0.005))
    assert t.verdict == "same"
    kept, why = decision(t, None, None)
    assert not kept and why.startswith("no significant difference (within ±1%)")


def test_a_small_gain_inside_the_noise_is_reverted() -> None:
    rng = np.random.default_rng(0)
    t = compare_rounds(rounds(rng, 100.0, 0.3), rounds(rng, 97.0, 0.3))
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
    ],
)
def test_an_ambiguous_comparison_says_why_it_is_no_reason_to_keep(
    ratio: float, lo: float, hi: float, p: float, why: str
) -> None:
    # GIVEN comparisons neither faster nor slower nor the same: the interval holding no change, or
    # excluding it with a change under the drift margin or unconfirmed by the test
    t = TimingComparison(ratio, lo, hi, p, "ambiguous", 0.01, 100.0, 100.0 * ratio, 3, 3)
    # THEN the reason says which, with the numbers
    assert decision(t, None, None) == (False, f"no significant difference ({why})")


def test_a_slower_fix_is_reverted() -> None:
    rng = np.random.default_rng(0)
    t = compare_rounds(rounds(rng, 100.0, 0.02), rounds(rng, 110.0, 0.02))
    assert t.verdict == "slower" and decision(t, None, None) == (False, "slower beyond noise")


def test_one_slow_process_widens_the_interval() -> None:
    # every step of the candidate's third process is slow: a process-level effect, not per-step noise
    base = [[100.0 + i % 3 for i in range(20)] for _ in range(3)]
    cand = [
        [90.0 + i % 3 for i in range(20)],
        [90.0 + i % 3 for i in range(20)],
        [130.0 + i % 3 for i in range(20)],
    ]
    t = compare_rounds(base, cand)
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
def test_rounds_alternate_and_a_fast_fix_is_kept_a_slow_one_reverted() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0, "tf32": 104.0})
    report = session(launcher, clock, "fused_optimizer,tf32", stack=False).run()
    sides = [label.rsplit("-", 1)[-1] for label, _, _ in launcher.calls]
    assert sides == ["0", "a1", "b1", "a2", "b2", "a3", "b3", "a1", "b1", "a2", "b2", "a3", "b3"]
    fused, tf32 = report.verdicts
    assert fused.kept and fused.measured_saving_pct == pytest.approx(20, abs=2) and fused.rounds == 3
    assert not tf32.kept and tf32.reason == "slower beyond noise"
    assert report.final == ("fused_optimizer",) and report.combination is None and report.complete


def test_two_kept_fixes_are_combined_and_the_combination_verified() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(
        clock, {"baseline": 100.0, "fused_optimizer": 90.0, "tf32": 85.0, "tf32+fused_optimizer": 75.0}
    )
    report = session(launcher, clock, "fused_optimizer,tf32").run()
    assert report.combination is not None and report.combination.kept
    assert report.final == ("tf32", "fused_optimizer")  # best first
    assert report.final_saving_pct == pytest.approx(25, abs=2)


def test_a_combination_slower_than_its_best_member_is_not_recommended() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(
        clock, {"baseline": 100.0, "fused_optimizer": 90.0, "tf32": 80.0, "tf32+fused_optimizer": 86.0}
    )
    report = session(launcher, clock, "fused_optimizer,tf32").run()
    assert report.combination is not None and report.combination.kept
    assert report.final == ("tf32",) and any("slower than" in n for n in report.notes)


def test_a_fix_that_changes_the_losses_is_reverted_after_one_round() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "autocast": 50.0})
    launcher.losses["autocast"] = tuple((v[0] * 1.2,) for v in LOSSES)
    report = session(launcher, clock, "autocast").run()
    (v,) = report.verdicts
    assert not v.kept and v.reason.startswith("changes results") and v.rounds == 1
    assert v.numerics is not None and v.numerics.tolerance == 5e-2


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
    assert kept or "allowed 0.1%: other convolution algorithms)" in v.reason


def test_a_fix_that_raises_or_does_not_apply_is_reverted_with_the_reason() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0})
    launcher.failures["tf32"] = "OutOfMemoryError: CUDA out of memory"
    launcher.not_applicable.add("fused_optimizer")
    report = session(launcher, clock, "tf32,fused_optimizer").run()
    tf32, fused = report.verdicts
    assert not tf32.kept and "out of memory" in tf32.reason
    assert not fused.kept and fused.reason == "not applicable: no optimizer"


def test_compile_with_dropout_draws_random_numbers_as_eager_in_its_rounds() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "compile": 60.0})
    original = launcher.__call__

    def with_dropout(label: str, fixes: tuple[str, ...], exact_random: bool) -> RoundResult:
        r = original(label, fixes, exact_random)
        return replace(r, observations=observations(dropout=True))

    s = FixSession(
        with_dropout, FixOptions(only=("compile",)), None, argv=("t.py",), started_at="now", clock=clock
    )
    report = s.run()
    assert [c for c in launcher.calls if c[1]] == [
        (f"01-compile-b{k}", ("compile",), True) for k in (1, 2, 3)
    ]
    (v,) = report.verdicts
    assert v.kept and v.rounds == 3 and v.compile_s == 30.0
    assert v.payback_steps == pytest.approx(30e6 / 40.0, rel=0.1)


def test_a_larger_batch_is_judged_per_sample() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "batch:x2": 150.0})
    launcher.batch["batch:x2"] = 32
    report = session(launcher, clock, "batch:x2").run()
    (v,) = report.verdicts
    assert v.per_sample and v.kept and v.measured_saving_pct == pytest.approx(25, abs=2)
    assert v.numerics is not None and v.numerics.tolerance is None and v.numerics.ok


def test_the_budget_starts_no_fix_whose_rounds_would_not_fit() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0, "fused_optimizer": 80.0})
    report = session(launcher, clock, "tf32,fused_optimizer", budget_s=95.0).run()
    tf32, fused = report.verdicts
    assert tf32.kept and tf32.rounds == 3  # 7 rounds of 10 s
    # fused_optimizer's 6 rounds would end at 130 s: not one of them is started
    assert not fused.kept and fused.reason == "the time budget ran out after 0 of 3 rounds"
    assert not any(fixes == ("fused_optimizer",) for _, fixes, _ in launcher.calls) and clock.now == 70.0
    # and the report says how long a budget would have verified it: its 6 rounds and the combination's
    # 6 after the 70 s spent (190 s)
    assert (
        "the time budget (95 s) ran out before 1 of the 2 fixes finished their 3 rounds (a fix is kept "
        "only when timed in all of them): about 4 min would let them finish (--budget 4m)"
    ) in report.notes


STEP_US = {"baseline": 100.0, "tf32": 80.0, "fused_optimizer": 80.0, "no_empty_cache": 90.0,
           "tf32+fused_optimizer": 65.0}  # fmt: skip


def test_the_budget_keeps_back_the_time_to_verify_the_kept_fixes_together() -> None:
    # GIVEN three fixes of other groups tried alone (6 rounds of 10 s each after the reference) and a
    # budget that holds all three or two and their combination (6 rounds), not all four
    clock = FakeClock()
    launcher = FakeLauncher(clock, STEP_US)
    report = session(launcher, clock, "tf32,fused_optimizer,no_empty_cache", budget_s=200.0).run()
    by_fix = {v.fix: v for v in report.verdicts}
    # THEN the least promising gives way to the combination of the two kept before it
    assert by_fix["tf32"].kept and by_fix["fused_optimizer"].kept
    assert by_fix["no_empty_cache"].reason == (
        "the time budget ran out after 0 of 3 rounds (the rest is kept to verify the faster fixes together)"
    )
    assert report.combination is not None and report.combination.kept and report.combination.rounds == 3
    assert report.final == ("tf32", "fused_optimizer") and clock.now == 190.0


def test_ctrl_c_keeps_the_results_so_far() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0, "fused_optimizer": 80.0})
    launcher.interrupt_at = 10  # during fused_optimizer's second round
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


# -- one baseline per round for all fixes (--shared-baseline) -------------------------------------------
def test_shared_baseline_rounds_turn_the_order_and_judge_each_fix_against_them() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(
        clock, {"baseline": 100.0, "fused_optimizer": 80.0, "tf32": 104.0, "autocast": 99.5}
    )
    report = session(
        launcher, clock, "fused_optimizer,tf32,autocast", shared_baseline=True, stack=False
    ).run()
    labels = [label for label, _, _ in launcher.calls]
    assert labels == [
        "baseline-0",
        "base-a1", "01-fused_optimizer-b1", "02-tf32-b1", "03-autocast-b1",
        "base-a2", "02-tf32-b2", "03-autocast-b2", "01-fused_optimizer-b2",
        "base-a3", "03-autocast-b3", "01-fused_optimizer-b3", "02-tf32-b3",
    ]  # fmt: skip
    fused, tf32, autocast = report.verdicts
    assert fused.kept and fused.rounds == 3 and fused.measured_saving_pct == pytest.approx(20, abs=2)
    assert not tf32.kept and tf32.reason == "slower beyond noise"
    assert not autocast.kept and autocast.reason.startswith("no significant difference")
    assert report.final == ("fused_optimizer",) and report.complete
    # 13 processes where A B A B per fix takes 19
    paired = FakeLauncher(FakeClock(), launcher.step_us)
    session(paired, paired.clock, "fused_optimizer,tf32,autocast", stack=False).run()
    assert len(paired.calls) == 19


def test_shared_baseline_drops_a_fix_that_fails_and_keeps_the_others_going() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "fused_optimizer": 80.0, "autocast": 50.0})
    launcher.losses["autocast"] = tuple((v[0] * 1.2,) for v in LOSSES)
    report = session(launcher, clock, "autocast,fused_optimizer", shared_baseline=True).run()
    autocast, fused = report.verdicts
    assert not autocast.kept and autocast.reason.startswith("changes results") and autocast.rounds == 1
    assert fused.kept and fused.rounds == 3
    assert sum(1 for _, fixes, _ in launcher.calls if fixes == ("autocast",)) == 1


def test_shared_baseline_budget_lets_the_least_promising_fixes_go_first() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0, "fused_optimizer": 80.0})
    # the reference round, then 3 rounds of 3 processes of 10 s would end at 100 s: over 90 s, the
    # baseline with the most promising fix alone fits
    report = session(launcher, clock, "tf32,fused_optimizer", shared_baseline=True, budget_s=90.0).run()
    tf32, fused = report.verdicts
    assert tf32.rounds == 3 and tf32.kept
    assert fused.rounds == 0 and fused.reason == "the time budget ran out after 0 of 3 rounds"
    assert clock.now == 70.0
    assert any(n.startswith("the time budget (90 s) ran out before 1 of the 2 fixes") for n in report.notes)


def test_a_budget_spent_in_the_first_round_names_the_budget_that_would_do() -> None:
    # GIVEN rounds of torch.compile far longer than the reference round the plan was made with (a
    # ResNet-50 on the H100 with a 2-minute budget: 42 s of compiling a round): planned with 10 s
    # rounds, both fixes and their combination fit 160 s
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0, "compile": 60.0})
    launcher.round_by = {"compile": 100.0}
    report = session(launcher, clock, "tf32,compile", shared_baseline=True, budget_s=160.0).run()
    # THEN after one round of each (130 s) not even one fix's two rounds left fit, nothing is kept,
    # and the note names a budget that holds the rounds left of each beside the baseline's, and
    # their combination's: 130 + 2 × 10 + 2 × 100 + 2 × 10 + 3 × (10 + 100) = 700 s
    assert [v.rounds for v in report.verdicts] == [1, 1] and not report.final and clock.now == 130.0
    assert all(v.reason == "the time budget ran out after 1 of 3 rounds" for v in report.verdicts)
    note = next(n for n in report.notes if n.startswith("the time budget (160 s)"))
    assert note.endswith("about 12 min would let them finish (--budget 12m)")


def test_shared_baseline_budget_keeps_back_the_time_to_verify_the_fixes_together() -> None:
    # GIVEN three fixes of other groups: 3 rounds of 4 processes (10 s each) and the combination's
    # 6 rounds would end at 190 s, 3 rounds of 3 processes and the combination at 160 s
    clock = FakeClock()
    launcher = FakeLauncher(clock, STEP_US)
    report = session(launcher, clock, "tf32,fused_optimizer,no_empty_cache", shared_baseline=True,
                     budget_s=170.0).run()  # fmt: skip
    by_fix = {v.fix: v for v in report.verdicts}
    # THEN the least promising gives way from the start, and the two faster ones are verified together
    assert by_fix["no_empty_cache"].rounds == 0 and by_fix["no_empty_cache"].reason.endswith(
        "(the rest is kept to verify the faster fixes together)"
    )
    assert by_fix["tf32"].kept and by_fix["fused_optimizer"].kept and by_fix["tf32"].rounds == 3
    assert report.combination is not None and report.combination.kept
    assert report.final == ("tf32", "fused_optimizer") and clock.now == 160.0


def test_shared_baseline_ctrl_c_keeps_every_fix_as_it_stands() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0, "fused_optimizer": 80.0})
    launcher.interrupt_at = 8  # the third round's baseline
    updates: list[FixReport] = []
    s = session(launcher, clock, "tf32,fused_optimizer", shared_baseline=True)
    s.on_update = updates.append
    report = s.run()
    assert report.interrupted and not report.complete
    assert [(v.fix, v.rounds, v.kept) for v in report.verdicts] == [
        ("tf32", 2, False),
        ("fused_optimizer", 2, False),
    ]
    assert all(v.reason == "interrupted (Ctrl-C) after 2 rounds" for v in report.verdicts)
    assert len(updates[0].verdicts) == 2  # the report after each round shows them as they stand


def test_baseline_processes_far_apart_are_reported_with_the_spread() -> None:
    # GIVEN baseline processes whose medians alternate between 100 and 120 µs (a host-bound loop
    # that runs slower on some cores, say), and a fix of 5%
    from dataclasses import replace as swap

    from gpudoctor.report.fix_view import headline

    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0, "tf32": 95.0}, noise=0.002)
    plain = FakeLauncher.__call__
    count = {"baselines": 0}

    def slow_every_other(self: FakeLauncher, label: str, fixes: tuple[str, ...], exact: bool) -> RoundResult:
        r = plain(self, label, fixes, exact)
        if fixes:
            return r
        count["baselines"] += 1
        scale = 1.2 if count["baselines"] % 2 == 0 else 1.0
        return swap(r, step_times_us=tuple(t * scale for t in r.step_times_us))

    report = FixSession(slow_every_other.__get__(launcher), FixOptions(only=("tf32",)), None,  # type: ignore[attr-defined]
                        argv=("train.py",), started_at="now", clock=clock).run()  # fmt: skip
    # THEN the report gives the spread — 20 µs over the median process's 110 — and what it means
    assert report.baseline_spread_pct == pytest.approx(100 * 20 / 110, abs=1)
    assert "over 4 processes (up to 18.2% apart)" in headline(report)
    assert any(n.startswith("the baseline's own processes differ by up to 18%") for n in report.notes)


def test_baseline_processes_close_together_leave_no_note() -> None:
    clock = FakeClock()
    report = session(FakeLauncher(clock, {"baseline": 100.0, "tf32": 80.0}), clock, "tf32").run()
    assert report.baseline_spread_pct is not None and report.baseline_spread_pct < 3
    assert not any("differ by up to" in n for n in report.notes)


# -- fixes that pay only beside another ------------------------------------------------------------------
def test_a_fix_slower_alone_is_tried_on_top_of_the_recommendation_and_kept_when_it_pays_there() -> None:
    # GIVEN channels_last slower alone (float32 convolutions), autocast faster, and both together
    # much faster (bfloat16 tensor cores want NHWC)
    clock = FakeClock()
    step = {"baseline": 100.0, "autocast": 70.0, "channels_last": 105.0, "autocast+channels_last": 50.0}
    launcher = FakeLauncher(clock, step)
    report = session(launcher, clock, "autocast,channels_last").run()
    autocast, channels_last = report.verdicts
    assert autocast.kept and not channels_last.kept and channels_last.reason == "slower beyond noise"
    # THEN it is tried on top of autocast, against a baseline of its own, and kept
    (stacked,) = report.stacked
    assert stacked.fix == "autocast+channels_last" and stacked.kept and stacked.rounds == 3
    assert stacked.reason.startswith("faster than bfloat16 autocast alone beyond noise (28.")
    assert stacked.why_tried.startswith("channels_last memory format on top of bfloat16 autocast")
    assert report.final == ("autocast", "channels_last")
    assert report.final_saving_pct == pytest.approx(50, abs=2)
    # AND the HTML report says under each fix why it was tried
    from gpudoctor.report.fix_view import render_fix_html

    page = render_fix_html(report)
    assert (
        "channels_last memory format on top of bfloat16 autocast: no gain alone, it may pay beside it" in page
    )
    assert "asked for (--only)" in page


def test_a_fix_that_does_not_pay_on_top_either_leaves_the_recommendation_as_it_was() -> None:
    clock = FakeClock()
    step = {"baseline": 100.0, "autocast": 70.0, "channels_last": 100.0, "autocast+channels_last": 70.0}
    launcher = FakeLauncher(clock, step)
    report = session(launcher, clock, "autocast,channels_last").run()
    (stacked,) = report.stacked
    assert not stacked.kept and stacked.reason.startswith("not faster than bfloat16 autocast alone")
    assert report.final == ("autocast",) and report.final_saving_pct == pytest.approx(30, abs=2)


def test_only_fixes_measured_without_harm_are_stacked_one_per_group() -> None:
    # GIVEN a kept fix, a fix that changes the results, and two worker counts, neither faster
    clock = FakeClock()
    step = {
        "baseline": 100.0,
        "fused_optimizer": 80.0,
        "autocast": 60.0,
        "workers:2": 101.0,
        "workers:4": 100.5,
    }
    launcher = FakeLauncher(clock, step)
    launcher.losses["autocast"] = tuple((v[0] * 1.2,) for v in LOSSES)
    report = session(launcher, clock, "fused_optimizer,autocast,workers:2,workers:4").run()
    # THEN only one worker count is tried on top, the group's first in the order tried (the middle
    # count: the other is the same kind of change), and never the fix that changed the results
    assert [v.fix for v in report.stacked] == ["fused_optimizer+workers:4"]
    assert not any("autocast" in fixes for _, fixes, _ in launcher.calls[-6:])


def test_what_the_budget_leaves_untried_on_top_is_named() -> None:
    # GIVEN rounds of 10 s: the reference and the three fixes end at 190 s (each fix keeping back time
    # to be verified beside autocast), one fix on top at 250 s
    clock = FakeClock()
    step = {"baseline": 100.0, "autocast": 70.0, "channels_last": 105.0, "cudnn_benchmark": 104.0}
    report = session(FakeLauncher(clock, step), clock, "autocast,channels_last,cudnn_benchmark",
                     budget_s=250.0).run()  # fmt: skip
    assert [v.fix for v in report.stacked] == ["autocast+channels_last"] and clock.now == 250.0
    assert "not tried on top of autocast, the time budget spent: cudnn_benchmark" in report.notes


def test_no_stack_tries_nothing_on_top() -> None:
    clock = FakeClock()
    step = {"baseline": 100.0, "autocast": 70.0, "channels_last": 105.0, "autocast+channels_last": 50.0}
    report = session(FakeLauncher(clock, step), clock, "autocast,channels_last", stack=False).run()
    assert report.stacked == () and report.final == ("autocast",)
