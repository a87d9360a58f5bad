"""What `gpudoctor fix` found (schema `gpudoctor.fix/1`): per fix tried, the predicted and measured saving
with its interval, the numerics check, compile time and its payback, kept or reverted and why; the kept
fixes combined and verified; the permanent change as a unified diff (or snippets); the changes left to the
user; predicted against measured per rule (the calibration); the proof — the diff applied to a copy and
timed against the script as plain processes — and the headline figure it gives. Written after every
round, so an interrupted run leaves what it had."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from gpudoctor.fixes.candidates import ManualFix
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.proof import HarnessLevel, Headline, PlainProcess, Proof
from gpudoctor.fixes.verify import NumericsCheck
from gpudoctor.runner.userfiles import WrittenFiles
from gpudoctor.util.serial import Serialized, to_jsonable

SCHEMA = "gpudoctor.fix/1"
CALIBRATION_SCHEMA = "gpudoctor.calibration/1"


@dataclass(frozen=True)
class StepDistribution:
    """One side's per-step times (µs), beside the mean step a verdict is judged on: a loop's periodic
    stalls show in the tail."""

    steps: int
    median_us: float
    p90_us: float
    max_us: float

    @classmethod
    def of(cls, times: list[float] | tuple[float, ...]) -> StepDistribution | None:
        if not times:
            return None
        ordered = sorted(times)
        return cls(
            len(ordered), statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))], ordered[-1]
        )


@dataclass(frozen=True)
class FixVerdict:
    fix: str  # id, e.g. "workers:8", or "+".join of the combination's
    title: str
    rules: tuple[str, ...]
    predicted_saving_pct: float | None
    # share of the baseline's mean step (or sample) time saved: the mean over a window synchronized at
    # its ends, what the loop's throughput pays, per unit (a block or a process)
    measured_saving_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    p_value: float | None
    verdict: str | None  # faster, slower, same, ambiguous; None when not timed
    baseline_us: float | None  # mean step time over the units (per sample for a batch change)
    candidate_us: float | None
    per_sample: bool
    numerics: NumericsCheck | None
    compile_s: float | None
    payback_steps: float | None  # steps at the new speed that win the compile time back
    kept: bool
    reason: str
    changes: tuple[str, ...]
    rounds: int  # timed candidate rounds (processes)
    why_tried: str = ""
    unit: str | None = None  # what was paired: "block pair" (one process) or "process pair"
    pairs: int = 0
    test: str | None = None  # the test, in words
    baseline_steps: StepDistribution | None = None
    candidate_steps: StepDistribution | None = None
    on_top_of: tuple[str, ...] = ()  # timed against this configuration, not the script as written
    # one stall dominates the measurement (`fixes.stalls`): why; the saving is then no figure to report
    stalled: str | None = None
    # what its rounds show of its effect (the share of the forward's matmul work in bfloat16, graphs
    # compiled, convolutions fed channels_last), the script's own beside it where it differs
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class CalibrationEntry:
    rule: str
    fix: str
    predicted_pct: float
    measured_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    kept: bool


@dataclass(frozen=True)
class FixReport(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor fix report"

    argv: tuple[str, ...]
    started_at: str
    device: str  # the GPU's name, or "cpu"
    torch: str | None
    options: dict[str, Any]
    baseline_us: float | None  # median step time over the baseline's rounds
    baseline_rounds: int
    observations: Observations | None
    verdicts: tuple[FixVerdict, ...]
    combination: FixVerdict | None
    final: tuple[str, ...]  # the fixes of the configuration gpudoctor recommends
    final_saving_pct: float | None
    diff: str  # unified diff against the user's files
    snippets: tuple[str, ...]  # kept changes with no known call site
    unplaced: tuple[str, ...]  # edits that could not be placed, with why
    manual: tuple[ManualFix, ...]
    calibration: tuple[CalibrationEntry, ...]
    notes: tuple[str, ...]
    complete: bool
    interrupted: bool
    elapsed_s: float
    # how far apart the baseline's processes' median steps are: (largest − smallest) / median, in %
    baseline_spread_pct: float | None = None
    # fixes not faster alone, tried on top of the recommended configuration (each against its baseline)
    stacked: tuple[FixVerdict, ...] = ()
    # what the script wrote under its directories while gpudoctor ran it, and the user's files put back
    user_files: WrittenFiles | None = None
    # the recommendation's diff applied to a copy and timed against the script as plain processes
    # (`fixes.prove`); the headline figure is the proof's where it timed pairs, else the harness's
    proof: Proof | None = None
    headline: Headline | None = None
    # the harness's baseline beside plain processes of the script (the proof's A side, or else these)
    harness_level: HarnessLevel | None = None
    # the script alone as plain processes, where no proof timed it (nothing kept, a diff that does not
    # apply): the harness's level beside them
    plain_script: tuple[PlainProcess, ...] = ()
    schema: str = SCHEMA

    @property
    def recommended(self) -> bool:
        """A change is recommended: kept by the harness, and not refuted by the proof (a diff that does
        not apply, a patched script that does not run or is not faster)."""
        return bool(self.final) and (self.headline is None or self.headline.recommended)

    def calibration_json(self) -> dict[str, Any]:
        """Predicted against measured per rule, for fixing the rules' estimates."""
        return {
            "schema": CALIBRATION_SCHEMA,
            "argv": list(self.argv),
            "device": self.device,
            "entries": [to_jsonable(e) for e in self.calibration],
        }
