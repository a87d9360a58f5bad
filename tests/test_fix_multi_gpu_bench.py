"""benchmarks/fix_multi_gpu.py, the judge of `gpudoctor fix --nproc 2`: the command lines it builds, the
rank files it reads (a group's step is its slowest rank's), the share of the expert's gain by the proof's
figure and the control's goal, the timing of groups with their intervals; and one real torchrun group of
its rank timer (fix_multi_gpu/_rank_timer.py) over the CPU path of the tuned control script (gloo)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))  # fix_vs_expert's and patched_copy's helpers, as the script has


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fmg = _load("fix_multi_gpu_bench", REPO / "benchmarks" / "fix_multi_gpu.py")


def _rank(rank: int, step_s: float, steps: int = 20, warmup: int = 10) -> dict[str, Any]:
    return {
        "rank": rank,
        "step_s": step_s,
        "window_s": step_s * steps,
        "steps": steps,
        "warmup_steps": warmup,
    }


def _group(label: str, step_s: float, steps: int = 20) -> dict[str, Any]:
    return {"label": label, "steps": steps, "step_s": step_s, "window_s": step_s * steps}


def test_the_timer_group_is_torchrun_of_the_rank_timer_over_the_script(tmp_path: Path) -> None:
    cmd = fmg.timer_command(Path("w.py"), ["--expert", "--small"], tmp_path, 10, 40)
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert cmd[6] == str(fmg.TIMER)
    assert cmd[7:] == ["--out", str(tmp_path), "--warmup-steps", "10", "--steps", "40", "--", "w.py",
                       "--expert", "--small"]  # fmt: skip
    hangs = fmg.timer_command(Path("w.py"), [], tmp_path, 10, 40, stacks_after_s=280.0)
    assert hangs[hangs.index("--stacks-after-s") + 1] == "280" and hangs[-2:] == ["--", "w.py"]


def test_the_fix_command_is_gpudoctor_fix_on_two_ranks(tmp_path: Path) -> None:
    cmd = fmg.fix_command(Path("w.py"), ["--small"], tmp_path / "fix", "3m", ["--seed", "1"])
    assert cmd[1:] == ["-m", "gpudoctor", "fix", "--nproc", "2", "--budget", "3m", "--out",
                       str(tmp_path / "fix"), "--seed", "1", "w.py", "--small"]  # fmt: skip
    # a fix run that outlives twice its budget and ten minutes is stopped
    assert fmg.parse(["--out", str(tmp_path), "--budget", "3m"]).fix_timeout_s == 2 * 180 + 600
    assert [fmg.budget_s(b) for b in ("90", "90s", "1.5h", "10min")] == [90, 90, 5400, 600]


def test_every_process_has_nvlink_multicast_off_and_pinning_where_asked() -> None:
    env = fmg.run_env(pin=True, smoke=False)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["PIN_CORES"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO / "src")
    cpu = fmg.run_env(pin=False, smoke=True)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and "PIN_CORES" not in cpu


def test_a_group_is_paced_by_its_slowest_rank(tmp_path: Path) -> None:
    for r, s in ((0, 0.010), (1, 0.013)):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(_rank(r, s)))
    ranks, error = fmg.read_ranks(tmp_path)
    assert error is None and fmg.slowest(ranks)["rank"] == 1


def test_a_missing_or_disagreeing_rank_is_no_figure(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps(_rank(0, 0.01)))
    assert fmg.read_ranks(tmp_path)[1] == "rank 1 wrote no result (FileNotFoundError)"
    (tmp_path / "rank1.json").write_text(json.dumps(_rank(1, 0.01, steps=30)))
    assert "different steps" in str(fmg.read_ranks(tmp_path)[1])


def test_windows_are_sized_from_calibration_and_rounds_alternate() -> None:
    a = argparse.Namespace(window_s=2.0, min_steps=10)
    calibration = {"plain": {"step_s": 0.1}, "expert": {"step_s": 0.025}}
    assert fmg.calibrated_steps(calibration, ["plain", "expert", "patched"], a) == {
        "plain": 20, "expert": 80, "patched": 80
    }  # fmt: skip
    assert fmg.calibrated_steps({"plain": {"step_s": 1.0}, "expert": {"step_s": None}}, ["expert"], a) == {
        "expert": 10
    }
    assert fmg.calibrated_steps({"plain": {"step_s": None}}, ["plain"], a) == {}
    assert fmg.round_order(0, ["a", "b", "c"]) == ["a", "b", "c"]
    assert fmg.round_order(1, ["a", "b", "c"]) == ["c", "b", "a"]


def test_timing_takes_each_configurations_median_group_with_intervals() -> None:
    groups = [_group("plain", s) for s in (0.100, 0.104, 0.102)]
    groups += [_group("expert", s) for s in (0.050, 0.051, 0.049)]
    groups += [_group("patched", s) for s in (0.055, 0.056, 0.054)]
    groups.append({"label": "patched", "steps": 20, "step_s": None, "error": "rank 1 wrote no result"})
    t = fmg.timing_result(groups)
    assert t["step_ms"]["plain"] == pytest.approx(102.0) and t["groups"]["patched"] == 3
    assert t["expert_speedup"] == pytest.approx(0.102 / 0.050)
    assert t["patched_speedup"] == pytest.approx(0.102 / 0.055)
    low, high = t["expert_speedup_ci"]
    assert low <= t["expert_speedup"] <= high
    low, high = t["share_of_expert_by_patched_ci"]
    assert low < (0.102 / 0.055 - 1) / (0.102 / 0.050 - 1) < high
    assert t["errors"]["patched"] == ["rank 1 wrote no result"]


PROOF = {"speedup": 1.9, "speedup_low": 1.85, "speedup_high": 1.95, "script_us": 1.9e5, "patched_us": 1e5}


def test_the_share_is_the_proofs_gain_over_the_experts() -> None:
    timing = {"expert_speedup": 2.0, "patched_speedup": 1.8}
    j = fmg.judged("ddp_hf_lm", ["autocast"], timing, PROOF)
    assert j["proof_speedup"] == 1.9 and j["meets_goal"] is True
    assert j["proof_check"]["share_of_expert_by_proof"] == pytest.approx(0.9)
    assert j["proof_check"]["share_of_expert_by_patched"] == pytest.approx(0.8)
    ranged = fmg.judged("ddp_hf_lm", ["autocast"], timing | {"expert_speedup_ci": [1.9, 2.1]}, PROOF)
    assert ranged["share_of_expert_by_proof_range"] == pytest.approx([0.85 / 1.1, 0.95 / 0.9])
    missed = fmg.judged("ddp_hf_lm", ["autocast"], {"expert_speedup": 3.0}, PROOF)
    assert missed["meets_goal"] is False  # 0.9 / 2.0 = 45%


def test_a_fix_that_kept_nothing_proves_no_speedup() -> None:
    j = fmg.judged("ddp_resnet_loader", [], {"expert_speedup": 2.0}, None)
    assert j["proof_speedup"] == 1.0 and j["proof_check"]["share_of_expert_by_proof"] == 0.0
    assert j["meets_goal"] is False
    assert fmg.judged("ddp_resnet_loader", None, {"expert_speedup": 2.0}, None)["meets_goal"] is None


def test_where_the_expert_gains_nothing_the_proof_must_be_no_slower() -> None:
    assert fmg.judged("accelerate_ddp", ["tf32"], {"expert_speedup": 1.01}, PROOF)["meets_goal"] is True
    slower = PROOF | {"speedup": 0.9}
    assert fmg.judged("accelerate_ddp", ["tf32"], {"expert_speedup": 1.01}, slower)["meets_goal"] is False


def test_the_control_meets_its_goal_by_keeping_nothing() -> None:
    assert fmg.judged(fmg.CONTROL, [], {"expert_speedup": 1.0}, None)["meets_goal"] is True
    assert fmg.judged(fmg.CONTROL, ["compile"], {"expert_speedup": 1.0}, PROOF)["meets_goal"] is False
    ran = {"exit_code": 0}
    records = [{"workload": "ddp_hf_lm", "meets_goal": True, "control": False, "fix_run": ran},
               {"workload": "accelerate_ddp", "control": False, "fix_run": {"error": "no fix.json"}},
               {"workload": fmg.CONTROL, "kept": [], "control": True, "meets_goal": True, "fix_run": ran}]  # fmt: skip
    assert fmg.status(records) == (
        "1 of 2 scripts reach 80% of the expert's gain by the proof's figure; the control kept nothing; "
        "gpudoctor fix failed on accelerate_ddp"
    )
    assert fmg.status([{"workload": "ddp_hf_lm", "kept": None}]).startswith("no gpudoctor fix run")


@pytest.mark.slow
def test_the_rank_timer_times_the_same_steps_on_both_ranks_and_ends_them(tmp_path: Path) -> None:
    """A real gloo group of two ranks over the control's CPU path: both write their window, timed over
    the same steps after the warm-up and the loader's batches in flight, and the group ends at once."""
    pytest.importorskip("torch.distributed")
    script = REPO / "benchmarks" / "fix_multi_gpu" / "ddp_tuned_control.py"
    cmd = fmg.timer_command(script, ["--small"], tmp_path, 2, 4)
    env = fmg.run_env(pin=False, smoke=True)
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks, error = fmg.read_ranks(tmp_path)
    assert error is None, error
    for r in ranks:
        assert r["steps"] == 4 and r["warmup_steps"] == 2 + r["in_flight"] and r["in_flight"] >= 4
        assert r["window_s"] > 0 and r["device"] == "cpu"


def fake_groups(steps_s: dict[str, float], diff: str, proof: dict[str, Any]) -> Any:
    """run_logged without processes: a fix run leaves fix.json and fix.diff (the single-GPU schema); a
    timed group leaves both ranks' windows, rank 1 the slower, at the step time of its configuration."""

    def run(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, float, int]:
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if cmd[1:4] == ["-m", "gpudoctor", "fix"]:
            report = {"verdicts": [], "final": ["ddp_knobs"], "final_saving_pct": 40.0, "baseline_us": 1e5,
                      "manual": [], "diff": diff, "notes": [], "elapsed_s": 60.0, "complete": True,
                      "proof": proof}  # fmt: skip
            (out / "fix.json").write_text(json.dumps(report))
            (out / "fix.diff").write_text(diff)
            return 0, 1.0, 0
        script, args = cmd[cmd.index("--") + 1], cmd[cmd.index("--") + 2 :]
        label = "expert" if "--expert" in args else "patched" if "/patched/" in script else "plain"
        steps, warmup = int(cmd[cmd.index("--steps") + 1]), int(cmd[cmd.index("--warmup-steps") + 1])
        for r, slower in ((0, 1.0), (1, 1.02)):
            rank = _rank(r, steps_s[label] * slower, steps=steps, warmup=warmup)
            (out / f"rank{r}.json").write_text(json.dumps(rank))
        log.write_text("")
        return 0, 0.5, 0

    return run


def knob_diff() -> tuple[Path, str, str]:
    """ddp_hf_lm.py, its text, and a diff of it that turns find_unused_parameters off."""
    import difflib

    script = fmg.WORKLOADS_DIR / "ddp_hf_lm.py"
    text = script.read_text()
    patched = text.replace("find_unused_parameters=True)", "find_unused_parameters=False)")
    assert patched != text
    rel = script.relative_to(REPO).as_posix()
    diff = "".join(
        difflib.unified_diff(text.splitlines(True), patched.splitlines(True), f"a/{rel}", f"b/{rel}")
    )
    return script, text, diff


def test_a_workload_is_fixed_patched_timed_in_alternating_rounds_and_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a fix run that keeps a DDP knob, writes it as a diff and proves it 1.85×, and groups whose
    # script steps in 100 ms, the expert's version in 50 ms and the patched copy in 55 ms
    script, text, diff = knob_diff()
    proof = {"speedup": 1.85, "speedup_low": 1.8, "speedup_high": 1.9, "script_us": 1e5, "patched_us": 5.4e4}
    monkeypatch.setattr(
        fmg, "run_logged", fake_groups({"plain": 0.1, "expert": 0.05, "patched": 0.055}, diff, proof)
    )
    a = fmg.parse(["--out", str(tmp_path), "--only", "ddp_hf_lm"])
    # WHEN the benchmark runs the workload
    record = fmg.one_workload("ddp_hf_lm", a, fmg.run_env(pin=False, smoke=False))
    # THEN the diff was applied to a copy, the copy timed beside the script and the expert's version
    assert (
        record["patched"]["applied"]
        and "find_unused_parameters=False)" in Path(record["patched"]["script"]).read_text()
    )
    assert script.read_text() == text
    t = record["timing"]
    assert t["steps"] == {"plain": 20, "expert": 40, "patched": 40}  # 2 s windows from each calibration
    order = [g["label"] for g in t["group_records"]]
    assert order == ["plain", "expert", "patched", "patched", "expert", "plain", "plain", "expert", "patched"]
    # each group paced by its slower rank
    assert t["step_ms"] == pytest.approx({"plain": 102.0, "expert": 51.0, "patched": 56.1})
    assert t["expert_speedup"] == pytest.approx(2.0) and t["patched_speedup"] == pytest.approx(102 / 56.1)
    # and judged by the proof's figure: (1.85 - 1) / (2 - 1) = 85% of the expert's gain
    assert record["kept"] == ["ddp_knobs"] and record["proof_speedup"] == 1.85 and record["meets_goal"]
    assert record["proof_check"]["share_of_expert_by_proof"] == pytest.approx(0.85)
    assert record["fix_run"]["command"].split()[1:7] == ["-m", "gpudoctor", "fix", "--nproc", "2", "--budget"]


def test_an_interrupted_run_is_read_back_with_what_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a run whose machine was released during its last round: the fix finished, the last patched
    # group wrote no rank's result
    proof = {"speedup": 1.85, "speedup_low": 1.8, "speedup_high": 1.9, "script_us": 1e5, "patched_us": 5.4e4}
    monkeypatch.setattr(
        fmg,
        "run_logged",
        fake_groups({"plain": 0.1, "expert": 0.05, "patched": 0.055}, knob_diff()[2], proof),
    )
    a = fmg.parse(["--out", str(tmp_path), "--only", "ddp_hf_lm"])
    fmg.one_workload("ddp_hf_lm", a, fmg.run_env(pin=False, smoke=False))
    for rank in (tmp_path / "groups" / "ddp_hf_lm" / "patched-2").glob("rank*.json"):
        rank.unlink()
    monkeypatch.setattr(fmg, "run_logged", None)  # nothing may run
    # WHEN it is read back
    assert fmg.main(["--out", str(tmp_path), "--only", "ddp_hf_lm", "--salvage"]) == 0
    record = json.loads((tmp_path / "fix_multi_gpu.json").read_text())["workloads"][0]
    # THEN the fix's verdict and proof, the groups that finished (the calibrations apart) and what was
    # missing are in it, judged as a whole run is
    t = record["timing"]
    assert record["kept"] == ["ddp_knobs"] and record["proof_speedup"] == 1.85 and record["meets_goal"]
    assert t["groups"] == {"plain": 3, "expert": 3, "patched": 2} and set(t["calibration"]) == {
        "plain",
        "expert",
    }
    assert t["salvaged"] == ["patched-2: rank 0 wrote no result (FileNotFoundError)"]
    assert t["step_ms"]["expert"] == pytest.approx(51.0) and t["expert_speedup"] == pytest.approx(2.0)
