"""`gpudoctor fix --aa` (`fixes.aa.run_aa`) on fake rounds: what it records and resamples."""

from __future__ import annotations

from fix_fakes import FakeClock, FakeLauncher
from gpudoctor.fixes.aa import run_aa
from gpudoctor.fixes.options import FixOptions


def test_aa_without_blocks_resamples_its_process_pairs_alone() -> None:
    # GIVEN --blocks 0 (no A/A in blocks of one process), no plain processes (as with --nproc)
    clock = FakeClock()
    launcher = FakeLauncher(clock, {"baseline": 100.0})
    report = run_aa(launcher, None, FixOptions(rounds=2, blocks=0), argv=("train.py",), started_at="now",
                    how="fake", clock=clock)  # fmt: skip
    # THEN four rounds (A B B A), a verdict on them, their false-positive rate; nothing of blocks
    assert report.harness is not None and len(report.harness.means_us) == 4
    assert report.processes is not None and report.blocks is None
    assert [(f.unit, f.pairs) for f in report.false_positives] == [("process pair", 2)]
    assert [label for label, *_ in launcher.calls] == ["aa-a1", "aa-b1", "aa-b2", "aa-a2"]
