"""benchmarks/fix_vs_expert.py's proof side: the fix's `fix.diff` applied by `patch` to a copy of the
workload (benchmarks/patched_copy.py), the patched copy timed plainly as a fourth configuration beside
the script, the expert's and gpudoctor's, and the fix's own proof (fix.json's `proof`) set against that
timing — their agreement and the share of the expert's gain by each — through to the merged results."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))  # fix_vs_expert's helpers beside it, as when run as a script

import patched_copy  # noqa: E402


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fve = _load("fve_patched", REPO / "benchmarks" / "fix_vs_expert.py")
plain_timer = _load("plain_timer_patched", REPO / "benchmarks" / "fix_workloads" / "plain_timer.py")

# Two modules called from one function; the loop sleeps in place of its GPU work.
TINY = """\
import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--expert", action="store_true")
parser.add_argument("--small", action="store_true")
args = parser.parse_args()

encoder = torch.nn.Linear(4, 4)
head = torch.nn.Sequential(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.01)


def forward_step(x):
    return head(encoder(x))


for step in range(100_000):
    time.sleep(0.003 if args.expert else 0.012)
    loss = forward_step(torch.randn(8, 4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

# What a fix would recommend, written by hand: the loop's slow line made faster.
DIFF = """\
--- a/bench/tiny.py
+++ b/bench/tiny.py
@@ -20,3 +20,3 @@
 for step in range(100_000):
-    time.sleep(0.003 if args.expert else 0.012)
+    time.sleep(0.003 if args.expert else 0.004)
     loss = forward_step(torch.randn(8, 4)).sum()
"""

PROOF = {"verdict": "faster", "recommended": True, "speedup": 2.4, "speedup_low": 2.3, "speedup_high": 2.5,
         "script_us": 12_500.0, "patched_us": 5_200.0, "pairs": [{}, {}, {}]}  # fmt: skip


def fix_dir(previous: Path, name: str, diff: str, proof: dict[str, Any] | None) -> Path:
    """A fix directory as `gpudoctor fix` leaves it: fix.json (what fix_vs_expert reads) and fix.diff."""
    folder = previous / "fix" / name
    folder.mkdir(parents=True)
    report = {"verdicts": [], "final": [], "final_saving_pct": None, "baseline_us": 12_500.0, "manual": [],
              "diff": diff, "notes": [], "elapsed_s": 60.0, "complete": True}  # fmt: skip
    if proof is not None:
        report["proof"] = proof
    (folder / "fix.json").write_text(json.dumps(report))
    (folder / "fix.diff").write_text(diff)
    return folder


def tiny_workload(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "tiny.py").write_text(TINY)
    return root, root / "bench" / "tiny.py"


def in_process(cmd: list[str], limit: float | None) -> subprocess.CompletedProcess[str]:
    """The timer's command line run by the timer in this process (no fresh interpreter)."""
    assert cmd[1] == str(fve.TIMER)
    argv = sys.argv
    sys.argv = ["plain_timer.py", *cmd[2:]]
    try:
        code = plain_timer.main()
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(cmd, code, "", "")


def test_the_fixs_diff_is_applied_to_a_copy_and_the_patched_copy_is_timed_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a workload whose step calls two modules from one function, and a fix run that left a diff
    # and a proof
    root, script = tiny_workload(tmp_path)
    fix_dir(tmp_path / "previous", "tiny", DIFF, PROOF)
    monkeypatch.setattr(fve, "ROOT", root)
    monkeypatch.setattr(fve, "WORKLOADS_DIR", root / "bench")
    monkeypatch.setattr(fve, "WORKLOADS", {"tiny": ([], "sleep less", None)})
    monkeypatch.setattr(fve, "run_timer", in_process)
    a = argparse.Namespace(out=tmp_path / "out", phase="time", previous=tmp_path / "previous", timing_rounds=1,
                           timing_max_rounds=1, timing_max_s=600.0, timer_warmup=3, window_s=0.15, windows=2,
                           smoke=False, timer_timeout_s=None)  # fmt: skip
    for k in fve.OPTIONS:
        a.__dict__.setdefault(k, None)
    (tmp_path / "out").mkdir()
    # WHEN the benchmark times it
    record = fve.one_workload("tiny", a)
    # THEN the diff was applied by patch to a copy — the script itself untouched — and the copy timed
    assert record["patched"]["applied"] and record["patched"]["files"] == ["bench/tiny.py"]
    copy = Path(record["patched"]["script"])
    assert copy == tmp_path / "out" / "patched" / "tiny" / "bench" / "tiny.py"
    assert "else 0.004)" in copy.read_text() and "else 0.012)" in script.read_text()
    t = record["timing"]
    assert len(t["runs"]["patched"]) == 1 and not t["errors"]["patched"]
    # the copy sleeps 4 ms a step where the script sleeps 12: faster, as plain processes tell
    assert t["patched_speedup"] > 1.5 and t["patched_speedup_ci"][0] > 1.0
    # AND the proof's figure stands beside that timing: their disagreement, the share by each
    check = t["proof_check"]
    assert check["proof"]["speedup"] == 2.4 and check["proof"]["pairs"] == 3
    assert check["proof_vs_patched"] == pytest.approx(2.4 / t["patched_speedup"] - 1)
    assert check["proof_agrees"] == (abs(check["proof_vs_patched"]) <= 0.10)
    expert = t["expert_speedup"]
    assert check["share_of_expert_by_proof"] == pytest.approx((2.4 - 1) / (expert - 1))
    assert check["share_of_expert_by_patched"] == pytest.approx((t["patched_speedup"] - 1) / (expert - 1))
    # AND the plain script's step was seen to call two top-level modules
    assert record["modules_per_step"] == 2 and sorted(t["modules"]["names"]) == ["Linear", "Sequential"]
    assert "patched copy" in fve._line(record | {"wall_s": 1.0}) and "modules per step 2" in fve._line(record)


@pytest.mark.parametrize(
    ("diff", "why"),
    [
        (None, "no fix.diff in the fix directory"),
        ("", "fix.diff is empty: nothing to apply"),
        (
            DIFF.replace("-    time.sleep(0.003 if args.expert else 0.012)", "-    time.sleep(0.5)"),
            "patch -p1 exited 1",
        ),
        (DIFF.replace("b/bench/tiny.py", "b/../outside.py"), "the diff names paths outside its folder"),
        (DIFF.replace("bench/tiny.py", "bench/gone.py"), "the diff names bench/gone.py, found neither"),
    ],
)
def test_a_diff_that_cannot_be_applied_leaves_no_patched_copy_and_says_why(
    tmp_path: Path, diff: str | None, why: str
) -> None:
    root, script = tiny_workload(tmp_path)
    folder = fix_dir(tmp_path / "previous", "tiny", diff or "", None)
    if diff is None:
        (folder / "fix.diff").unlink()
    copy = patched_copy.make_patched_copy(script, folder / "fix.diff", tmp_path / "copy", root)
    assert copy.script is None and not copy.applied and copy.why is not None and copy.why.startswith(why)
    assert "else 0.012)" in script.read_text()


def test_the_proofs_figure_against_the_patched_copys_plain_timing() -> None:
    timing = {"patched_speedup": 2.0, "expert_speedup": 2.5}
    # a proof 5% above the plain timing agrees; 25% above does not; the share by each figure
    near = patched_copy.proof_check(PROOF | {"speedup": 2.1}, timing, 0.02)
    assert near["proof_vs_patched"] == pytest.approx(0.05) and near["proof_agrees"] is True
    assert near["share_of_expert_by_proof"] == pytest.approx(1.1 / 1.5)
    assert near["share_of_expert_by_patched"] == pytest.approx(1.0 / 1.5)
    assert patched_copy.proof_check(PROOF | {"speedup": 2.5}, timing, 0.02)["proof_agrees"] is False
    # a proof with its two sides' means and no speedup: the ratio of the means
    means = {"script_us": 10_000.0, "patched_us": 5_000.0, "verdict": "faster"}
    assert patched_copy.proof_check(means, timing, 0.02)["proof"]["speedup"] == pytest.approx(2.0)
    # no proof in fix.json (a fix run before it had one, or --no-proof): nothing to agree or not
    none = patched_copy.proof_check(None, timing, 0.02)
    assert none["proof"] is None and none["proof_agrees"] is None and none["share_of_expert_by_proof"] is None
    # an expert that gains nothing: no share to take
    assert (
        patched_copy.proof_check(PROOF, {"patched_speedup": 2.0, "expert_speedup": 1.01}, 0.02)[
            "share_of_expert_by_proof"
        ]
        is None
    )


def test_merged_timings_keep_the_patched_copy_and_the_proof_and_the_status_counts_them(
    tmp_path: Path,
) -> None:
    # GIVEN one workload timed on two GPUs with its patched copy, its fix run's proof 3% off that timing
    rounds = {"plain": 0.100, "expert": 0.040, "gpudoctor": 0.045, "patched": 0.044}
    for gpu in ("0", "1"):
        source = tmp_path / "runs" / f"fve_gpu{gpu}"
        source.mkdir(parents=True)
        runs = {c: [[[1.0, round(1.0 / s)] for _ in range(5)] for _ in range(3)] for c, s in rounds.items()}
        record = {"workload": "gan_dcgan", "expert": "x", "fix_run": {"exit_code": 0}, "modules_per_step": 2,
                  "fix": {"verdicts_on_first_4": 4, "candidates": 6, "final": ["autocast", "compile"],
                          "findings": {}, "kept_all_faster": True, "kept_all_numerics_ok": True,
                          "proof": PROOF | {"speedup": 2.35}},
                  "patched": {"applied": True, "script": "x", "why": None, "files": [], "patch_output": ""},
                  "timing": {"runs": runs, "rounds": 3, "errors": {}, "step_ms": {},
                             "modules": {"modules_per_step": 2, "names": ["Discriminator", "Generator"]}},
                  "environment": {"device": "NVIDIA H100 80GB HBM3", "cuda_visible_devices": gpu},
                  "options": {"budget": "10m", "smoke": False, "timing_rounds": 3}}  # fmt: skip
        (source / "fix_vs_expert_gan_dcgan.json").write_text(json.dumps(record))
    into = tmp_path / "fix_vs_expert.json"
    # WHEN they are merged
    fve.merge(tmp_path / "runs", into, "abc1234")
    # THEN one record, its patched processes pooled and judged against the proof
    (w,) = json.loads(into.read_text())["workloads"]
    t = w["timing"]
    patched = round(1 / 0.044) / round(1 / 0.100)  # as whole steps in 1 s windows
    assert len(t["runs"]["patched"]) == 6 and t["patched_speedup"] == pytest.approx(patched)
    assert t["proof_check"]["proof_vs_patched"] == pytest.approx(2.35 / patched - 1)
    assert t["proof_check"]["proof_agrees"] is True
    assert w["modules_per_step"] == 2 and t["modules"]["names"] == ["Discriminator", "Generator"]
    status = json.loads(into.read_text())["status"]
    assert (
        "1 with a proof, 1 timed with their patched copy" in status
        and "1 of the 1 with both within ±10%" in status
    )
    assert "1 reach 80% of the expert's gain by the proof's figure" in status


@pytest.mark.parametrize(
    ("ci", "more"),
    [((1.40, 1.80), True), ((1.90, 2.10), False), ((2.10, 2.40), True), ((1.00, 1.50), False)],
)
def test_the_patched_copy_is_timed_again_while_its_interval_holds_an_end_of_the_agreement_band(
    ci: tuple[float, float], more: bool
) -> None:
    # a proof of 1.98×: the patched copy agrees within ±10% between 1.80× and 2.20×. Its processes 20%
    # apart (a compiled, host-bound step), an interval across 1.80× or 2.20× cannot yet tell agreement
    # from disagreement; one wholly inside or wholly outside the band can
    result = {"proof_check": {"proof": {"speedup": 1.98}}, "patched_speedup_ci": list(ci)}
    assert fve.proof_undecided(result) is more
    assert fve.undecided("tuned_control", [], result) is more  # whatever the share says
    assert not fve.proof_undecided({"patched_speedup_ci": list(ci)})  # no proof: nothing to agree with


def test_a_disagreement_within_the_two_timers_processes_spread_is_said_and_timed_again() -> None:
    # vit_train on 1 × H200: the script 95.9 ms a step in every process; the proof's 7 patched processes
    # 18.8–25.8 ms, the benchmark's 2 at 17.5 and 14.9 ms — 27% apart in their means, and no further
    # than such processes' spread allows
    ms = [23.04, 21.91, 23.58, 20.28, 22.78, 25.81, 18.76]
    proof = {"pairs": [{"script_us": 95_900.0, "patched_us": 1e3 * v} for v in ms]}
    runs = {"plain": [[[1.0, 10], [1.0, 11]], [[1.0, 10], [1.0, 11]]],  # 95.2 ms
            "patched": [[[1.0, 57], [1.0, 57]], [[1.0, 67], [1.0, 67]]]}  # 17.5 and 14.9 ms  # fmt: skip
    timers = patched_copy.timers_compared(proof, runs)
    assert timers is not None and timers["proof_pairs"] == 7
    assert timers["benchmark_processes"] == {"plain": 2, "patched": 2}
    assert timers["benchmark_over_proof_speedup"] == pytest.approx(1.365, abs=0.005)
    assert timers["ci"][0] < 1 < timers["ci"][1] and timers["differ"] is False
    # which side moved: the patched copy's step, not the script's
    assert timers["script_step"] == pytest.approx(0.993, abs=0.002)
    assert timers["patched_step"] == pytest.approx(0.727, abs=0.005)
    # THEN the benchmark times the patched copy again, though its own interval lies outside the band
    result = {"proof_check": {"proof": {"speedup": 4.31}, "proof_agrees": False, "timers": timers},
              "patched_speedup_ci": [5.2, 6.5]}  # fmt: skip
    assert fve.proof_undecided(result)
    assert not fve.proof_undecided(
        {**result, "proof_check": {**result["proof_check"], "timers": {"differ": True}}}
    )
    # AND one process on a side: no interval
    assert patched_copy.timers_compared(proof, {**runs, "plain": runs["plain"][:1]}) is None


def test_a_disagreement_beyond_the_processes_spread_says_which_side_moved() -> None:
    # transformer_infer_b1 on 1 × H200: the proof's script processes 5.1–8.6 ms a step (the first ones,
    # early in the proof, the slowest), the benchmark's three 5.0–5.6 ms; the patched copy 1.14–1.39 ms
    # under the proof, 1.27–1.36 under the benchmark
    pairs = [(8099.3, 1146.7), (7203.0, 1272.3), (8552.9, 1137.7), (6282.3, 1137.3), (5284.2, 1141.9),
             (5116.0, 1390.7), (6323.3, 1271.7), (5204.1, 1165.4)]  # fmt: skip
    proof = {"pairs": [{"script_us": a, "patched_us": b} for a, b in pairs]}
    per_s = {
        "plain": [(182, 185, 180, 136, 145), (196, 195, 191, 189, 204), (197, 206, 202, 199, 200)],
        "patched": [(736, 738, 735, 737, 743), (775, 780, 828, 739, 707), (733, 810, 819, 800, 816)],
    }
    runs = {side: [[[1.0, n] for n in process] for process in v] for side, v in per_s.items()}
    timers = patched_copy.timers_compared(proof, runs)
    assert timers is not None and timers["differ"] is True and timers["ci"][1] < 1
    assert timers["benchmark_over_proof_speedup"] == pytest.approx(0.776, abs=0.005)
    assert timers["script_step"] == pytest.approx(0.841, abs=0.005)  # the script moved the most
    assert timers["patched_step"] == pytest.approx(1.084, abs=0.005)


def test_with_no_runtime_the_patched_copy_stands_for_the_kept_fixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN kept fixes whose diff applied: the patched copy is what the user runs
    steps = {"plain": 0.100, "expert": 0.040, "gpudoctor": 0.045, "patched": 0.050}
    timed: list[str] = []

    def time_config(name: str, label: str, *args: object, **kwargs: object) -> dict[str, Any]:
        timed.append(label)
        return {"step_s": steps[label], "windows": [[1.0, round(1 / steps[label])]] * 5}

    monkeypatch.setattr(fve, "time_config", time_config)
    a = argparse.Namespace(timing_rounds=2, timing_max_rounds=2, timing_max_s=600.0, no_runtime=True)
    # WHEN the benchmark times it with --no-runtime
    result = fve.measure("gan_dcgan", ["compile"], tmp_path, a, patched=tmp_path / "copy.py", proof=PROOF)
    # THEN the kept fixes are not also timed applied at runtime: a quarter fewer processes, and the
    # patched copy's figure is gpudoctor's
    assert "gpudoctor" not in timed and timed.count("patched") == 2 and len(timed) == 6
    assert result["gpudoctor_speedup"] == pytest.approx(result["patched_speedup"]) == pytest.approx(2.0)
    # AND without it, both are timed, as before
    timed.clear()
    fve.measure("gan_dcgan", ["compile"], tmp_path, argparse.Namespace(**(vars(a) | {"no_runtime": False})),
                patched=tmp_path / "copy.py", proof=PROOF)  # fmt: skip
    assert timed.count("gpudoctor") == 2 and len(timed) == 8


def test_a_timer_process_gets_the_clocks_of_its_windows_as_the_proofs_do() -> None:
    asked: list[tuple[float, float]] = []

    class Clocks:  # `runner.samplers.ChildClocks`' stand-in
        def between(self, start: float, end: float) -> object:
            from gpudoctor.monitor.clocks import ClockReport

            asked.append((start, end))
            return ClockReport(0, 5, 1980, 1600, 1800.0, {"sw_power_cap": 0.4}, None, None, 70, 690.0)

        def host_between(self, start: float, end: float) -> object:
            from gpudoctor.monitor.host import HostReport

            return HostReport(samples=4, others_cores=0.2, steal_cores=0.0, probe_us=95.0)

    result = {"windows": [[1.0, 50], [1.0, 50]], "monotonic": 50.0}
    clocks = fve.timed_clocks(Clocks(), result)
    assert asked == [(48.0, 50.0)]  # its two 1 s windows, up to its last reading
    assert (
        clocks is not None
        and clocks["sm_mean_mhz"] == 1800.0
        and clocks["slowdowns"] == (("sw_power_cap", 0.4),)
        and clocks["others_cores"] == 0.2  # the host beside it, over the same windows
        and clocks["probe_us"] == 95.0
    )
    assert fve.timed_clocks(None, result) is None and fve.timed_clocks(Clocks(), {"windows": []}) is None
