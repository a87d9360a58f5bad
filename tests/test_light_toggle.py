"""benchmarks/light_toggle.py, the in-process A/B of gpudoctor's light phase under torchrun: its CPU
path (gloo, a tiny CNN: each rank installs and removes a real capture block after block), and its
comparison of the ranks' blocks. The figures are the GPU run's; this checks the path to them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from light_toggle import clocks_row, compare, pooled  # noqa: E402


def rank(blocks: list[tuple[bool, float]], steps: int = 10) -> dict:
    return {"block_steps": steps, "blocks": [
        {"candidate": on, "steps": steps, "elapsed_us": us, "settle": 4, "phase": "light" if on else None}
        for on, us in blocks
    ]}  # fmt: skip


def test_each_block_is_the_slowest_ranks_and_the_pairs_are_tested_in_order() -> None:
    # GIVEN two ranks over four block pairs (the order a coin each: A B, B A, …); rank 1 slower in
    # every block, the light phase 1% slower on both
    a0, b0 = 100_000.0, 101_000.0
    order = [
        (False, a0),
        (True, b0),
        (True, b0),
        (False, a0),
        (False, a0),
        (True, b0),
        (True, b0),
        (False, a0),
    ]
    slow = [(on, us * 1.2 + 50 * k) for k, (on, us) in enumerate(order)]
    result = compare([rank(order), rank(slow)])
    # THEN the blocks are rank 1's, the ratio the light phase's 1%, and its interval is stated
    assert result["pairs"] == 4 and result["block_steps"] == 10
    assert result["plain_block_mean_us"] == pytest.approx(sum(us for on, us in slow if not on) / 4 / 10)
    assert result["ratio"] == pytest.approx(1.01, abs=0.002)
    lo, hi = result["ci95"]
    assert lo <= result["ratio"] <= hi and result["within_5pct"] == (lo >= 0.95 and hi <= 1.05)


def test_ranks_that_ran_different_sides_or_a_capture_that_left_its_light_phase_are_refused() -> None:
    base = [(False, 1.0), (True, 1.0), (True, 1.0), (False, 1.0)]
    with pytest.raises(ValueError, match="different sides"):
        compare([rank(base), rank([(True, 1.0), (False, 1.0), (True, 1.0), (False, 1.0)])])
    ended = rank(base)
    ended["blocks"][1]["phase"] = "done"
    with pytest.raises(ValueError, match="left its light phase"):
        compare([rank(base), ended])


@pytest.mark.slow
def test_the_light_toggle_benchmark_runs_its_cpu_path(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, str(REPO / "benchmarks" / "light_toggle.py"), "--cpu", "--out", str(tmp_path),
           "--pairs", "2", "--cases", "ddp,straggler", "--block-s", "0.2"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "light_toggle_2.json").read_text())
    assert result["schema"] == "gpudoctor.bench.light_toggle/1" and result["nproc"] == 2
    assert result["cases_left"] == []  # written after each case too: a run cut short keeps the cases it ended
    for case in ("ddp", "straggler"):
        row = result["table"][case]
        assert row["pairs"] == 2 and row["ratio"] > 0 and len(row["ranks"]) == 2
        # every timed B block ran inside a capture's light phase, on both ranks
        for r in row["ranks"]:
            light = [b for b in r["blocks"] if b["candidate"]]
            assert len(light) == 2 and all(b["phase"] == "light" for b in light)


def test_the_blocks_step_times_are_set_beside_the_gpus_clocks() -> None:
    # GIVEN blocks whose steps slow as the SM clock drops (NVML read at both ends of each block)
    def block(us: float, mhz: int) -> dict:
        return {
            "candidate": False,
            "steps": 10,
            "elapsed_us": 10 * us,
            "gpu": [{"sm_mhz": mhz}, {"sm_mhz": mhz}],
        }

    rank = {
        "rank": 0,
        "blocks": [block(27_000, 1980), block(30_000, 1755), block(36_000, 1410), block(28_000, 1900)],
    }
    row = clocks_row(
        [rank, {"rank": 1, "blocks": [{"candidate": False, "steps": 10, "elapsed_us": 1.0}] * 4}]
    )
    # THEN the correlation is strongly negative, the range named; a rank without NVML readings is left out
    assert row is not None and [r["rank"] for r in row["ranks"]] == [0]
    assert row["ranks"][0]["step_vs_sm_clock_r"] < -0.9
    assert (row["ranks"][0]["sm_mhz_min"], row["ranks"][0]["sm_mhz_max"]) == (1410, 1980)
    assert (
        clocks_row([{"rank": 0, "blocks": [{"steps": 1, "elapsed_us": 1.0, "gpu": [None, None]}] * 4}])
        is None
    )


def test_two_runs_pairs_are_judged_together_and_no_pair_spans_the_runs() -> None:
    # GIVEN two runs of two ranks: the first 3 pairs at 100 ms with the light side 2% slower, the second
    # 3 pairs at 140 ms (another host's pace) with it 4% slower, each run's last block a B
    def run(pace: float, cost: float, steps: int) -> dict:
        order = [(False, pace), (True, pace * cost), (True, pace * cost), (False, pace), (False, pace),
                 (True, pace * cost)]  # fmt: skip
        return {"table": {"ddp": {"ranks": [rank(order, steps), rank(order, steps)]}}}

    table = pooled([run(100_000.0, 1.02, 10), run(140_000.0, 1.04, 7)])
    # THEN the six pairs are judged at once, each within its run (the pace between runs cancels): the
    # ratio lies between the two runs' costs, and the blocks' lengths of each run are named
    t = table["ddp"]
    assert t["pairs"] == 6 and t["runs"] == 2 and t["block_steps"] == [10, 7]
    assert 1.02 < t["ratio"] < 1.04
