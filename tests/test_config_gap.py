"""benchmarks/config_gap.py: configurations of a fix workload timed in fresh processes, their mean steps
and ratios to the first, in files whose names a device run brings back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_configurations_timed_in_turn_with_their_ratio_to_the_first(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "benchmarks" / "config_gap.py"), "--workload", "item_logging", "--small",
           "--out", str(tmp_path), "--rounds", "2", "--warmup", "5", "--windows", "1", "--window-s", "0.2",
           "--config", "plain+fused=fused_optimizer", "--config", "expert=@expert"]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads((tmp_path / "config_gap.json").read_text())["table"]
    assert list(table) == ["plain+fused", "expert"]
    assert table["plain+fused"]["ratio_to_first"] == 1.0
    assert table["plain+fused"]["fixes"] == ["fused_optimizer"] and table["expert"]["expert"]
    for row in table.values():
        assert row["step_ms"] > 0 and len(row["per_round_ms"]) == 2
    # no '+' in a file name (a device run leaves such files out)
    names = sorted(p.name for p in (tmp_path / "timing").glob("*plain_fused-*.json"))
    assert names == ["item_logging-plain_fused-0.json", "item_logging-plain_fused-1.json"]


def test_a_config_that_is_neither_fixes_nor_a_named_form_is_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "benchmarks" / "config_gap.py"), "--workload", "item_logging",
           "--out", str(tmp_path), "--config", "x=@nothing"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (
        done.returncode == 2
        and "neither @expert nor @plain" in done.stderr
        and "Traceback" not in done.stderr
    )
