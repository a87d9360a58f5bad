"""The proof of `gpudoctor fix`'s recommendation (`fixes.prove`, `fixes.proof`), on faked plain processes:
`fix.diff` applied to a copy, the patched copy against the script as written in A B, B A, … pairs until
the speedup's interval is within ±5% (3 pairs at least, 10 at most, fewer where the budget ends); a diff
that does not apply, a patched script that does not run or is not faster is not recommended; where no
proof can be made (no diff, a module, a step the stopwatch cannot count, the script failing plainly)
it says why. The session keeps the proof's time back and puts its figure at the head of the report,
the harness's level and figure beside it."""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fix_fakes import FakeClock, FakeLauncher, session
from gpudoctor.fixes import prove, stopwatch
from gpudoctor.fixes.options import FixOptions
from gpudoctor.fixes.proof import (
    MAX_PAIRS,
    MIN_PAIRS,
    PlainProcess,
    ProcessClocks,
    Proof,
    ProofRequest,
    clocks_note,
    disagreement,
    harness_level,
    headline_of,
    script_means,
)
from gpudoctor.fixes.prove import PlainProver, Target
from gpudoctor.fixes.result import FixReport
from gpudoctor.fixes.session import FixSession
from gpudoctor.runner.child import ChildRun
from gpudoctor.runner.record import StepFound

TRAIN = "import torch\nloader = make(batch_size=8)\nfor x in loader:\n    step(x)\n"
DIFF = (
    "--- a/train.py\n+++ b/train.py\n@@ -1,3 +1,3 @@\n import torch\n-loader = make(batch_size=8)\n"
    "+loader = make(batch_size=8, num_workers=2)\n for x in loader:\n"
)
OPTIMIZER = StepFound("optimizer", "one step of the optimizer (SGD.step)")


class Plain:
    """Faked plain processes: each side's mean step drawn around its own, in the order they run."""

    def __init__(
        self, script_us: float, patched_us: float, noise: float = 0.005, wall_s: float = 4.0
    ) -> None:
        self.means = {"script": script_us, "patched": patched_us}
        self.noise, self.wall_s = noise, wall_s
        self.rng = np.random.default_rng(0)
        self.runs: list[tuple[str, tuple[str, ...], dict[str, str], str]] = []
        self.fail: dict[str, tuple[int | None, dict[str, object] | None, str]] = {}
        self.clock = FakeClock()  # the prover's: each process takes its wall time
        self.limits: list[float] = []

    def __call__(self, argv, *, env, cwd, result, log, timeout_s):  # type: ignore[no-untyped-def]
        side = "patched" if "proof" in argv[1] else "script"
        self.clock.now += self.wall_s
        self.runs.append((side, tuple(argv), env, cwd))
        self.limits.append(timeout_s)
        if side in self.fail:
            code, doc, tail = self.fail[side]
            return ChildRun(
                code, doc, None if doc else f"exit status {code}, no result written", tail, 0, 1.0
            )
        mean = self.means[side] * (1 + self.noise * self.rng.standard_normal())
        doc = {"outcome": "timed", "mean_step_us": mean, "windows": [[1.0, 50]] * 2, "set_aside": [],
               "warmup_steps": 7, "steps_seen": 107, "error": None}  # fmt: skip
        return ChildRun(0, doc, None, "", 2, self.wall_s)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def prover(project: Path, plain: Plain, monkeypatch: pytest.MonkeyPatch, **target: object) -> PlainProver:
    monkeypatch.setattr(prove, "run_plain", plain)
    options = FixOptions(warmup=3, warmup_s=0.5, steps=10, steps_s=1.0)
    t = Target(str(target.get("script", "train.py")), ("--epochs", "1"), bool(target.get("module", False)))
    env = {"PYTHONPATH": "/user/lib", "HOME": "/home/u"}
    return PlainProver(t, options, project / "fix", env=env, clock=plain.clock)


def request(diff: str = DIFF, step: StepFound | None = OPTIMIZER, left: float | None = None) -> ProofRequest:
    return ProofRequest(("workers:2",), diff, (), step, left)


def test_the_patched_copy_is_timed_against_the_script_in_alternating_pairs(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Plain(20_000.0, 10_000.0)
    proof = prover(project, plain, monkeypatch)(request())
    # tight at once: the minimum of pairs, A B, B A, A B
    assert [side for side, *_ in plain.runs] == [
        "script",
        "patched",
        "patched",
        "script",
        "script",
        "patched",
    ]
    assert len(proof.pairs) == MIN_PAIRS and [p.patched_first for p in proof.pairs] == [False, True, False]
    # each side's first process gets the rounds' time limit (a patched copy may compile), the next 60 s
    assert plain.limits == [600.0, 600.0, 60.0, 60.0, 60.0, 60.0]
    assert proof.verdict == "faster" and proof.recommended is True
    assert (
        proof.speedup == pytest.approx(2.0, rel=0.02)
        and proof.speedup_low < proof.speedup < proof.speedup_high
    )
    assert proof.half_width_pct is not None and proof.half_width_pct <= 5.0
    assert proof.reason.startswith("the patched copy ran faster as you run it: 2.0")
    # plain processes: the user's interpreter, script, arguments, folder and environment
    copy = project / "fix" / "proof" / "copy"
    assert proof.script_command == (sys.executable, "train.py", "--epochs", "1")
    assert proof.patched_command == (sys.executable, str(copy.resolve() / "train.py"), "--epochs", "1")
    assert (copy / "train.py").read_text() == TRAIN.replace("batch_size=8)", "batch_size=8, num_workers=2)")
    assert (project / "train.py").read_text() == TRAIN
    _, _, env, cwd = plain.runs[1]
    boot = (project / "fix" / "proof" / "stopwatch").resolve()
    assert (
        cwd == str(project)
        and env["HOME"] == "/home/u"
        and env["PYTHONPATH"] == f"{boot}{os.pathsep}/user/lib"
    )
    assert (boot / "sitecustomize.py").read_text() == Path(stopwatch.__file__).read_text()
    settings = json.loads(env[stopwatch.ENV])
    assert settings["source"] == "optimizer" and settings["warmup"] == 3 and settings["steps_s"] == 1.0
    assert settings["out"] == str((project / "fix" / "proof" / "patched-1.json").resolve())
    assert proof.env["PYTHONPATH"] == env["PYTHONPATH"] and "out" not in json.loads(proof.env[stopwatch.ENV])
    assert proof.step == OPTIMIZER.description and proof.copy == str(copy.resolve())


def test_noisy_pairs_go_on_to_the_most_the_budget_allows(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Plain(20_000.0, 12_000.0, noise=0.15)
    proof = prover(project, plain, monkeypatch)(request())
    assert len(proof.pairs) == MAX_PAIRS and proof.half_width_pct is not None and proof.half_width_pct > 5
    plain = Plain(20_000.0, 12_000.0, noise=0.15, wall_s=4.0)
    proof = prover(project, plain, monkeypatch)(
        request(left=30.0)
    )  # three pairs of 4 s processes, then no room
    assert len(proof.pairs) == MIN_PAIRS


def test_a_patched_copy_no_faster_is_not_recommended(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proof = prover(project, Plain(20_000.0, 20_050.0), monkeypatch)(request())
    assert proof.recommended is False and proof.verdict in ("same", "ambiguous")
    assert "no faster as you run it" in proof.reason or "not faster beyond noise" in proof.reason


def test_a_patched_script_that_does_not_run_is_not_recommended(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Plain(20_000.0, 10_000.0)
    plain.fail["patched"] = (1, None, "Traceback ...\nNameError: name 'num_workers' is not defined\n")
    proof = prover(project, plain, monkeypatch)(request())
    assert proof.verdict == "does not run" and proof.recommended is False and len(plain.runs) == 2
    assert (
        "the patched script did not run as you run it: exit status 1, no result written: NameError"
        in proof.reason
    )
    assert proof.script_us == pytest.approx(20_000.0, rel=0.02) and proof.speedup is None


def test_a_patched_script_that_ends_before_it_is_timed_says_how_far_it_got(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Plain(20_000.0, 10_000.0)
    plain.fail["patched"] = (
        0,
        {"outcome": "ended", "steps_seen": 4, "mean_step_us": None, "error": None},
        "",
    )
    proof = prover(project, plain, monkeypatch)(request())
    assert proof.verdict == "does not run"
    assert "the script ended (exit status 0) after 4 steps, before its steps were timed" in proof.reason


def test_a_script_that_fails_plainly_makes_no_proof(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Plain(20_000.0, 10_000.0)
    plain.fail["script"] = (None, None, "")
    proof = prover(project, plain, monkeypatch)(request())
    assert proof.verdict == "not made" and proof.recommended is None
    assert proof.reason.startswith("the script as written did not run as a plain process")


def test_a_diff_that_does_not_apply_is_not_recommended_and_nothing_runs(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "train.py").write_text(TRAIN.replace("batch_size=8", "batch_size=16"))
    plain = Plain(20_000.0, 10_000.0)
    proof = prover(project, plain, monkeypatch)(request())
    assert proof.verdict == "does not apply" and proof.recommended is False and not plain.runs
    assert proof.reason.startswith(
        "fix.diff does not apply to your files: train.py: hunk 1 (@@ -1,3) does not match line 2"
    )


@pytest.mark.parametrize(
    ("req", "target", "why"),
    [
        (request(diff=""), {}, "the kept change has no call site in your files"),
        (
            request(step=StepFound("loop", "one iteration of the loop at train.py:3")),
            {},
            "the step is one iteration",
        ),
        (request(step=None), {}, "no step was found: a plain process counts optimizer steps"),
        (request(), {"module": True, "script": "pkg.train"}, "the script runs as a module (-m)"),
    ],
)
def test_where_no_proof_can_be_made_it_says_why(
    project: Path, monkeypatch: pytest.MonkeyPatch, req: ProofRequest, target: dict[str, object], why: str
) -> None:
    plain = Plain(20_000.0, 10_000.0)
    proof = prover(project, plain, monkeypatch, **target)(req)
    assert proof.verdict == "not made" and proof.recommended is None and proof.reason.startswith(why)
    assert not plain.runs


def test_the_script_alone_is_timed_for_the_harnesss_level_where_nothing_was_proven(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Plain(20_000.0, 10_000.0)
    p = prover(project, plain, monkeypatch)
    alone = p.script_alone(request(diff=""), 3)
    assert [side for side, *_ in plain.runs] == ["script"] * 3 and len(alone) == 3
    assert all(a.side == "script" and a.mean_step_us == pytest.approx(20_000.0, rel=0.05) for a in alone)
    _, argv, env, _ = plain.runs[0]
    assert argv == (sys.executable, "train.py", "--epochs", "1") and "stopwatch" in env["PYTHONPATH"]
    assert (project / "train.py").read_text() == TRAIN  # nothing copied, nothing changed
    # a step a plain process cannot count, or a module: none
    plain.runs.clear()
    assert p.script_alone(request(step=None), 3) == () and not plain.runs
    # the first failure ends them
    failing = Plain(20_000.0, 10_000.0)
    failing.fail["script"] = (1, None, "Traceback ...\nRuntimeError: boom")
    alone = prover(project, failing, monkeypatch).script_alone(request(), 3)
    assert len(alone) == 1 and alone[0].failure is not None and "boom" in alone[0].failure


# -- the harness beside the proof ------------------------------------------------------------------------
def a_proof(
    speedup: float, low: float, high: float, script_us: float = 20_000.0, recommended: bool = True
) -> Proof:
    script = (PlainProcess("script", script_us, 20, 0, 5, 10.0, 0, None, "script.log"),)
    return Proof("faster" if recommended else "same", recommended, "the patched copy ran faster", speedup, low, high,
                 0.001, script_us, script_us / speedup, (), script, "t-test", 4.0, 5.0, "one step",
                 ("python", "train.py"), ("python", "copy/train.py"), "/work", {}, "fix/proof/copy", (0, 1),
                 30.0)  # fmt: skip


def test_the_harness_baseline_beside_plain_processes_warns_past_ten_percent() -> None:
    proof = a_proof(2.0, 1.9, 2.1)
    assert script_means(proof) == [20_000.0] and script_means(None) == []
    assert harness_level(21_000.0, script_means(proof)).warning is None  # 5%
    level = harness_level(36_400.0, script_means(proof))
    assert level is not None and level.ratio == pytest.approx(1.82)
    assert level.warning is not None and level.warning.startswith(
        "the harness's baseline ran 82% slower than"
    )
    assert level.warning.endswith("the proof's figure is the one you get")
    # nothing proven (the script alone timed for the level): its verdicts stand on that level
    alone = harness_level(36_400.0, [20_000.0], proven=False)
    assert alone is not None and "no proof timed a change as you run it" in (alone.warning or "")
    assert harness_level(None, [20_000.0]) is None and harness_level(20_000.0, []) is None


def with_script_processes(proof: Proof, means: list[float]) -> Proof:
    processes = tuple(PlainProcess("script", m, 20, 0, 5, 10.0, 0, None, "script.log") for m in means)
    return replace(proof, processes=processes, script_us=statistics.fmean(means))


def test_a_harness_level_off_by_more_than_its_processes_can_tell_says_so() -> None:
    # the DCGAN at 10 minutes on an H200: four baseline rounds 34-48 ms, four plain processes 31-34 ms
    proof = with_script_processes(a_proof(1.34, 1.15, 1.56), [32_957.0, 31_178.0, 33_073.0, 34_471.0])
    harness = [33_600.0, 48_200.0, 41_300.0, 36_200.0]
    level = harness_level(statistics.fmean(harness), script_means(proof), harness_processes=harness)
    assert level is not None and level.ratio == pytest.approx(1.21, abs=0.01)
    assert level.ratio_low is not None and level.ratio_low < 1 < (level.ratio_high or 0)
    assert level.warning is not None and "not told from the noise of so few processes" in level.warning
    assert "the harness's 4 up to 38% apart, the script's 4 up to 10%" in level.warning
    # processes close together: the same gap is told, with its interval
    tight = [36_000.0, 36_400.0, 36_200.0, 36_600.0]
    level = harness_level(statistics.fmean(tight), script_means(proof), harness_processes=tight)
    assert level is not None and level.ratio_low is not None and level.ratio_low > 1
    assert level.warning is not None and "its savings were measured against that level" in level.warning
    assert "95% CI of the ratio" in level.warning
    # one process a side: no interval, the plain warning
    level = harness_level(36_400.0, [20_000.0], harness_processes=[36_400.0])
    assert (
        level is not None
        and level.ratio_low is None
        and "measured against that level" in (level.warning or "")
    )


def test_a_harness_figure_beyond_the_proofs_interval_is_said_with_how_far() -> None:
    # the torchvision loop of issue 44: the harness said 9.29×, the user's script got 5.6×
    note = disagreement(a_proof(5.6, 5.3, 5.9), 100 * (1 - 1 / 9.29), None, None)
    assert (
        note is not None and "the harness measured 9.29× and the proof 5.60×" in note and "66% above" in note
    )
    assert disagreement(a_proof(2.0, 1.9, 2.1), 50.0, 45.0, 55.0) is None  # 2.0×, CI 1.82–2.22×: they overlap
    assert disagreement(None, 50.0, None, None) is None


def test_the_headline_is_the_proofs_where_it_timed_pairs_else_the_harnesss() -> None:
    h = headline_of(a_proof(1.9, 1.8, 2.0), ("workers:2",), 50.0)
    assert h is not None and (h.source, h.recommended, h.speedup, h.harness_speedup) == (
        "proof",
        True,
        1.9,
        2.0,
    )
    refuted = headline_of(a_proof(1.0, 0.98, 1.02, recommended=False), ("workers:2",), 50.0)
    assert refuted is not None and (refuted.source, refuted.recommended) == ("proof", False)
    not_made = Proof(
        "not made", None, "no diff", *[None] * 6, (), (), None, None, 5.0, None, (), (), "", {}, None, (), 0.0
    )
    h = headline_of(not_made, ("workers:2",), 50.0)
    assert h is not None and (h.source, h.recommended, h.speedup) == ("harness", True, 2.0)
    assert headline_of(None, (), None) is None


# -- in the session ---------------------------------------------------------------------------------------
class FakeProver:
    def __init__(self, proof: Proof) -> None:
        self.proof = proof
        self.requests: list[ProofRequest] = []
        self.round_s: list[float] = []
        self.alone: list[int] = []
        self.plain = [21_000.0, 20_000.0, 22_000.0]  # the script alone, as plain processes

    def reserve_s(self, round_s: float) -> float:
        self.round_s.append(round_s)
        return 6 * round_s

    def __call__(self, request: ProofRequest) -> Proof:
        self.requests.append(request)
        return self.proof

    def script_alone(self, request: ProofRequest, count: int) -> tuple[PlainProcess, ...]:
        self.alone.append(count)
        return tuple(PlainProcess("script", m, 20, 0, 5, 10.0, 0, None, "s.log") for m in self.plain[:count])


def test_the_session_keeps_the_proofs_time_back_and_heads_its_report_with_it() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 20_000.0, "workers:4": 10_000.0})
    fake = FakeProver(a_proof(1.4, 1.35, 1.45, script_us=36_000.0))
    s = session(launcher, clock, "workers:4", blocks=0, budget_s=200.0)
    s.prover = fake
    report = s.run()
    assert fake.round_s == [10.0]  # the baseline round's length: 60 s kept back of 200 s
    # the fix's four process pairs (80 s) fit beside it; the proof gets what is left
    assert report.final == ("workers:4",) and len(fake.requests) == 1
    (req,) = fake.requests
    assert req.fixes == ("workers:4",) and req.seconds_left == pytest.approx(
        200.0 - clock.now + 0.0, abs=1e-6
    )
    assert report.proof is fake.proof and report.headline is not None and report.headline.source == "proof"
    assert report.harness_level is not None and report.harness_level.ratio == pytest.approx(
        20_000 / 36_000, rel=0.02
    )
    assert any(
        n.startswith("the harness's baseline ran 44% faster than the script as a plain process")
        for n in report.notes
    )
    assert any("they disagree beyond their intervals" in n for n in report.notes)  # 2.0× against 1.4×
    again = FixReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.proof == report.proof and again.headline == report.headline and again.recommended


def test_no_proof_where_the_options_say_so_or_nothing_was_kept() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 20_000.0, "workers:4": 20_000.0})
    fake = FakeProver(a_proof(2.0, 1.9, 2.1))
    s = session(launcher, clock, "workers:4", blocks=0)
    s.prover = fake
    report = s.run()
    assert report.proof is None and not fake.requests  # nothing kept: nothing to prove
    # but the script alone, as plain processes, for the harness's level beside them
    assert fake.alone == [3] and len(report.plain_script) == 3
    assert report.harness_level is not None and report.harness_level.plain_us == pytest.approx(21_000.0)
    assert (
        report.harness_level.ratio == pytest.approx(20_000 / 21_000, rel=0.01)
        and report.harness_level.warning is None
    )
    again = FixReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.plain_script == report.plain_script and again.harness_level == report.harness_level
    launcher = FakeLauncher(clock, {"baseline": 20_000.0, "workers:4": 10_000.0})
    options = FixOptions(only=("workers:4",), blocks=0, proof=False)  # --no-proof: no plain process at all
    fake.alone.clear()
    report = FixSession(
        launcher, options, None, argv=("train.py",), started_at="now", clock=clock, prover=fake
    ).run()
    assert report.final == ("workers:4",) and report.proof is None and not fake.requests and not fake.alone
    assert report.headline is not None and report.headline.source == "harness" and report.recommended


def test_a_script_that_failed_plainly_in_the_proof_is_not_run_again_for_the_level() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 20_000.0, "workers:4": 10_000.0})
    failed = PlainProcess("script", None, 0, 0, 0, 60.0, 1, "exit status 1: boom", "script-1.log")
    fake = FakeProver(replace(a_proof(2.0, 1.9, 2.1), verdict="not made", recommended=None, speedup=None,
                              speedup_low=None, speedup_high=None, script_us=None, processes=(failed,)))  # fmt: skip
    s = session(launcher, clock, "workers:4", blocks=0)
    s.prover = fake
    report = s.run()
    assert len(fake.requests) == 1 and not fake.alone and report.harness_level is None


# -- the report -----------------------------------------------------------------------------------------
def reported(proof: Proof | None, diff: str = DIFF) -> FixReport:

    from test_fix_view import REPORT

    level = harness_level(REPORT.baseline_us, script_means(proof))
    return replace(REPORT, diff=diff, proof=proof, harness_level=level,
                   headline=headline_of(proof, REPORT.final, REPORT.final_saving_pct))  # fmt: skip


def terminal(report: FixReport) -> str:
    from io import StringIO

    from rich.console import Console

    from gpudoctor.report.fix_view import render_fix_terminal

    out = StringIO()
    render_fix_terminal(report, Console(file=out, width=300, force_terminal=False, color_system=None))
    return out.getvalue()


def test_the_report_heads_with_the_proof_and_the_harness_beside_it() -> None:
    from gpudoctor.report.fix_view import render_fix_html, render_fix_markdown

    report = reported(a_proof(1.9, 1.8, 2.0, script_us=12_000.0))
    text = terminal(report)
    assert (
        "recommended: workers:32 — 1.90× faster as you run it (95% CI 1.80–2.00×, the diff applied and timed in "
        "plain processes; the harness measured 5.41×)" in text
    )
    assert "proof commands: python train.py  |  python copy/train.py" in text
    assert "the harness's baseline: 12.35 ms a step in its rounds, 12 ms as a plain process (1.03×)" in text
    assert "The change, as a diff" in text and "not recommended" not in text
    assert "1.90× faster as you run it" in render_fix_markdown(report)
    assert "1.90× faster as you run it" in render_fix_html(report)


def test_a_refuted_change_is_not_recommended_and_not_written_as_fix_diff(tmp_path: Path) -> None:

    from gpudoctor.cli.fix import _write_all

    refuted = replace(
        a_proof(1.0, 0.97, 1.03, recommended=False),
        reason="the patched copy ran no faster as you run it: 1.00×",
    )
    report = reported(refuted)
    assert not report.recommended
    text = terminal(report)
    assert "not recommended: workers:32 — the patched copy ran no faster as you run it: 1.00×" in text
    assert "The change, as a diff the harness kept — not recommended (see above)" in text
    (tmp_path / "fix.diff").write_text("an earlier run's diff")
    _write_all(tmp_path, report)
    assert (
        not (tmp_path / "fix.diff").exists()
        and json.loads((tmp_path / "fix.json").read_text())["proof"]["verdict"] == "same"
    )
    _write_all(tmp_path, reported(a_proof(1.9, 1.8, 2.0)))
    assert (tmp_path / "fix.diff").read_text() == DIFF


def test_a_proof_not_made_says_why_under_the_harnesss_figure() -> None:
    not_made = Proof("not made", None, "the kept change has no call site in your files", *[None] * 6, (), (), None,
                     None, 5.0, None, (), (), "", {}, None, (), 0.0)  # fmt: skip
    text = terminal(reported(not_made, diff=""))
    assert "saves 81.5% of the step, 5.41× faster by the harness, not proven as you run it." in text
    assert "proof not made: the kept change has no call site in your files" in text


def test_with_nothing_proven_the_report_still_sets_the_harness_beside_the_script_alone() -> None:
    from gpudoctor.report.fix_view import render_fix_markdown

    alone = tuple(PlainProcess("script", m, 20, 0, 5, 10.0, 0, None, "s.log") for m in (19_000.0, 21_000.0))
    report = reported(None, diff="")
    level = harness_level(report.baseline_us, [p.mean_step_us or 0 for p in alone], proven=False)
    report = replace(report, final=(), plain_script=alone, harness_level=level)
    line = (
        "the harness's baseline: 12.35 ms a step in its rounds, 20 ms as a plain process (the script alone, 2"
    )
    assert line in terminal(report) and line in render_fix_markdown(report)
    assert level is not None and "no proof timed a change as you run it" in (level.warning or "")


def clocked(side: str, sm: float, slowdowns: tuple[tuple[str, float], ...] = ()) -> PlainProcess:
    clocks = ProcessClocks(
        samples=10, sm_mean_mhz=sm, sm_min_mhz=int(sm), sm_max_mhz=1980, slowdowns=slowdowns
    )
    return PlainProcess(side, 1000.0, 50, 0, 5, 3.0, 0, None, "x.log", clocks)


def test_the_proof_says_when_the_gpu_held_its_clocks_down_while_a_side_was_timed() -> None:
    steady = [clocked("script", 1980), clocked("patched", 1975)]
    assert clocks_note(steady) is None  # clocks held and alike: nothing to say
    assert clocks_note([replace(p, clocks=None) for p in steady]) is None  # no NVML: nothing read
    capped = [clocked("script", 1980), clocked("patched", 1600, (("sw_power_cap", 0.6),)),
              clocked("patched", 1700, (("sw_power_cap", 0.2), ("hw_thermal", 0.05)))]  # fmt: skip
    note = clocks_note(capped)
    # the capped side's reason with its share of the side's samples (rare ones left out), the two
    # sides' mean SM clocks, and the GPU's maximum
    assert note is not None and "the patched copy: sw_power_cap in 40% of its samples" in note
    assert "hw_thermal" not in note and "1,980 MHz under the script, 1,650 under the patched copy" in note
    assert "maximum 1,980 MHz" in note


def hosted(
    side: str, step_us: float, probe_us: float, others: float = 0.0, steal: float = 0.0
) -> PlainProcess:
    clocks = ProcessClocks(samples=0, sm_mean_mhz=None, sm_min_mhz=None, sm_max_mhz=None, host_samples=4,
                           others_cores=others, steal_cores=steal, probe_us=probe_us)  # fmt: skip
    return PlainProcess(side, step_us, 50, 0, 5, 3.0, 0, None, "x.log", clocks)


def test_the_proof_says_when_the_host_beside_a_side_was_busy_or_slower() -> None:
    # a quiet host, its probe steady: nothing to say (no NVML here: the GPU's part is empty)
    quiet = [hosted("script", 8_000.0, 100.0), hosted("patched", 1_200.0, 104.0)]
    assert clocks_note(quiet) is None
    # transformer_infer_b1 on 1 × H200: the script's processes 5.1–8.6 ms a step, the first ones the
    # slowest; a host-bound step runs at the speed of its host
    slow = [hosted("script", 8_600.0, 160.0), hosted("patched", 1_150.0, 150.0),
            hosted("script", 5_100.0, 100.0, others=2.0), hosted("patched", 1_140.0, 101.0, steal=0.4)]  # fmt: skip
    note = clocks_note(slow)
    assert note is not None and note.startswith("the host while they were timed: ")
    assert "other processes kept 1.0 cores busy under the script" in note  # the mean of its two
    assert "the hypervisor took 0.2 cores under the patched copy" in note and "took 0.0" not in note
    assert (
        "1.60× longer in one process than in another (the script's 100–160 µs, the patched copy's 101–150 µs)"
        in note
    )
    # AND a busy host under both sides is said once, each side's share beside it
    busy = clocks_note(
        [hosted("script", 5_000.0, 100.0, others=1.0), hosted("patched", 1_000.0, 100.0, others=0.8)]
    )
    assert busy == (
        "the host while they were timed: other processes kept 1.0 cores busy under the script, 0.8 under the "
        "patched copy"
    )
    # AND with the GPU's clocks held down too, both are said, the GPU's first
    both = clocks_note([*slow, clocked("patched", 1600, (("sw_power_cap", 0.6),))])
    assert both is not None and both.index("the GPU's clocks") < both.index(" — the host while")


class Watched:
    """`ChildClocks`' stand-in: what span the prover asked the clocks of."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, float]] = []

    def between(self, start: float, end: float) -> object:
        from gpudoctor.monitor.clocks import ClockReport

        self.asked.append((start, end))
        return ClockReport(0, 4, 1980, 1500, 1700.0, {"sw_power_cap": 0.5}, None, None, 61, 650.0)

    def host_between(self, start: float, end: float) -> object:
        from gpudoctor.monitor.host import HostReport

        return HostReport(samples=4, others_cores=1.5, steal_cores=0.0, probe_us=120.0)


def test_a_plain_process_gets_the_clocks_of_its_timed_windows_alone() -> None:
    watch = Watched()
    doc = {"outcome": "timed", "mean_step_us": 1e3, "windows": [[0.5, 50], [0.5, 50]], "set_aside": [[1.0, 9, 0.8]],
           "monotonic": 100.0}  # fmt: skip
    clocks = prove.timed_clocks(watch, doc, ended=101.0)  # type: ignore[arg-type]
    # the two timed windows and the one set aside end at the stopwatch's last reading: 2 s before it
    assert watch.asked == [(98.0, 100.0)]
    assert clocks == ProcessClocks(
        4, 1700.0, 1500, 1980, (("sw_power_cap", 0.5),), 61, 650.0, 4, 1.5, 0.0, 120.0
    )
    assert prove.timed_clocks(None, doc, ended=101.0) is None
    assert prove.timed_clocks(watch, {"windows": []}, ended=101.0) is None  # type: ignore[arg-type]
