"""benchmarks/multi_gpu.py, the script of the 2-GPU check, runs its CPU path here (gloo, a tiny CNN):
the all-reduce benchmark, DDP and FSDP2 (`fully_shard`) under `torchrun -m gpudoctor run`, and the
results document it writes. The figures are the GPU run's; this checks the path to them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_multi_gpu_benchmark_runs_its_cpu_path(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "GPUDOCTOR_COMBINE_WAIT_S": "3"}
    cmd = [sys.executable, str(REPO / "benchmarks" / "multi_gpu.py"), "--cpu", "--out", str(tmp_path),
           "--scenarios", "nccl,ddp,fsdp", "--fixtures", str(tmp_path / "fixtures")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "multi_gpu.json").read_text())
    assert [r["bytes"] for r in result["allreduce_bench"]["rows"]] == [1 << p for p in range(20, 24)]
    for name in ("ddp", "fsdp"):
        run = result["runs"][name]
        assert run["alignment"]["aligned"] and run["alignment"]["ranks_traced"] == [0, 1]
        assert all(t > 0 for t in run["light_step_us"])
        assert result["checks"][f"{name}_aligned"]
        folder = tmp_path / "fixtures" / name
        assert sorted(p.name for p in folder.iterdir()) == [
            "analysis.json",
            "manifest.json",
            "rank-0",
            "rank-1",
        ]
        for rank in (0, 1):  # what the CPU tests read: as a run directory of several ranks
            assert {p.name for p in (folder / f"rank-{rank}").iterdir()} == {
                "rank.json",
                "record.json",
                "trace.json.gz",
            }
    # AND the findings derived again from those recordings, on the CPU, by this tree (--reanalyze)
    again = tmp_path / "again"
    cmd = [sys.executable, str(REPO / "benchmarks" / "multi_gpu.py"), "--reanalyze", str(tmp_path / "multi_gpu.json"),
           "--fixtures", str(tmp_path / "fixtures"), "--out", str(again)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    redone = json.loads((again / "multi_gpu.json").read_text())
    assert redone["reanalyzed"]["from"] == "fixtures"
    assert redone["runs"]["ddp"]["light_step_us"] == result["runs"]["ddp"]["light_step_us"]  # measured: kept


def test_a_plain_runs_mean_is_set_beside_the_light_phases_like_for_like() -> None:
    # GIVEN a plain run whose first 20 of 100 steps still settle (30 ms, then 20 ms), as the light
    # phase's own steps do before gpudoctor leaves them out (runner.settle)
    sys.path.insert(0, str(REPO / "benchmarks"))
    import multi_gpu

    times = [30e3] * 20 + [20e3] * 80
    # THEN its settled mean leaves out the same head: 20 ms, where every step's mean is 22 ms
    assert multi_gpu.settled_mean_us(times) == pytest.approx(20e3)
    rounds = [{"balanced": {"mean_us": 22e3, "median_us": 20e3, "settled_mean_us": 20e3}}]
    plains = multi_gpu.plain_summary(rounds)
    assert plains["balanced"]["settled_mean_us"] == pytest.approx(20e3)
    # AND the light phase's mean (its head left out) is judged against it as well as against the mean
    run = {"alignment": {"aligned": True}, "destroy_warnings": 0, "light_step_us": [20.2e3, 20.1e3],
           "light_mean_us": [20.4e3, 20.3e3], "across": [], "collectives": [], "ranks": []}  # fmt: skip
    got = multi_gpu.checks({"plain": plains}, {"ddp": run})["ddp_unprofiled_vs_plain"]
    assert got["settled_mean_ratio"] == pytest.approx(1.02) and got["mean_ratio"] == pytest.approx(20.4 / 22)
