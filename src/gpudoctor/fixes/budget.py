"""`gpudoctor fix --budget`: how long rounds take (per configuration, and the in-process A/Bs apart),
whether more of them fit the time left with the time kept back to verify the kept fixes together, and —
where the budget cut fixes short — about how long a budget would have let them finish."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpudoctor.fixes.attempt import Tried, minutes
from gpudoctor.fixes.catalog import spec_of

if TYPE_CHECKING:
    from gpudoctor.fixes.options import FixOptions

RAN_OUT = "the time budget ran out"  # a fix's failure when the budget cut its rounds short
RESERVED = " (the rest is kept to verify the faster fixes together)"
FINAL_MIN_PAIRS = 2  # the final check's pairs before it may stop on a decisive verdict


class Budget:
    def __init__(self, options: FixOptions, clock: Callable[[], float], start: float) -> None:
        self.options, self.clock, self.start = options, clock, start
        self.round_s: list[float] = []
        self.round_s_by: dict[tuple[str, ...], list[float]] = {}  # per configuration (): the baseline
        self.block_s: list[float] = []  # in-process A/B rounds' lengths
        self.proof_s = 0.0  # kept back for the proof (`fixes.prove`) until it runs

    def record(self, fixes: tuple[str, ...], seconds: float) -> None:
        self.round_s.append(seconds)
        self.round_s_by.setdefault(fixes, []).append(seconds)

    def has(self, rounds: int, reserve_s: float = 0.0) -> bool:
        """Do `rounds` more rounds of the typical length fit, with `reserve_s` kept back after them?"""
        return self.fits_s(rounds * self.typical_s() + reserve_s)

    def fits_s(self, seconds: float) -> bool:
        if self.options.budget_s is None:
            return True
        return self.clock() - self.start + seconds + self.proof_s <= self.options.budget_s

    def left_s(self) -> float | None:
        """Seconds of the budget left (none kept back); None without a budget."""
        if self.options.budget_s is None:
            return None
        return max(0.0, self.options.budget_s - (self.clock() - self.start))

    def typical_s(self, fixes: tuple[str, ...] | None = None) -> float:
        """A round's length: the median of `fixes`' rounds so far, else of all rounds."""
        own = self.round_s_by.get(fixes) if fixes is not None else None
        every = own or self.round_s
        return statistics.median(every) if every else 0.0

    def block_round_s(self) -> float:
        """An in-process A/B's length: the median of those so far, else a round's, its calibration and
        its blocks (each rounded up to whole cycles of the loop, after an untimed step)."""
        if self.block_s:
            return statistics.median(self.block_s)
        return self.typical_s(()) + (2 * self.options.blocks + 1) * self.options.block_s * 1.5

    def reserve_s(self, fixes: Sequence[tuple[str, ...]]) -> float:
        """The time to check `fixes` together against the script as written, where they span two
        groups or more (else nothing is combined): FINAL_MIN_PAIRS baseline rounds and as many of the
        combination (the check stops there when it is decisive, and goes on while the budget lasts),
        each as long as its slowest member's rounds (a compiled configuration's are long)."""
        if self.options.budget_s is None or len({spec_of(f).group for c in fixes for f in c}) < 2:
            return 0.0
        slowest = max(self.typical_s(f) for f in fixes)
        return min(FINAL_MIN_PAIRS, self.options.rounds) * (self.typical_s(()) + slowest)

    def ran_out(self, k: int, reserved: bool) -> str:
        why = f"{RAN_OUT} after {k - 1} of {self.options.rounds} rounds"
        return why + (RESERVED if reserved else "")

    def note(self, tried: list[Tried], in_blocks: Callable[[tuple[str, ...]], bool]) -> str | None:
        """Where the budget cut fixes short of their rounds (so none of them could be kept), about how
        long a budget would have let them finish: their rounds left at the length measured so far (a
        compiled configuration's own), the baseline's beside them, and the time to verify the faster
        ones together."""
        budget, rounds = self.options.budget_s, self.options.rounds
        cut = [t for t in tried if t.failure and t.failure.startswith(RAN_OUT)]
        if budget is None or not cut:
            return None
        more, base_rounds = 0.0, 0
        for t in cut:
            if in_blocks(t.fixes):
                more += self.block_round_s()
                continue
            n = rounds - len(t.candidate)
            more += n * self.typical_s(t.fixes)
            base_rounds = max(base_rounds, n) if self.options.shared_baseline else base_rounds + n
        more += base_rounds * self.typical_s(())
        # kept, or cut short while looking faster (or before it was timed): it may be kept
        faster = [t.fixes for t in tried if t.verdict.kept] + [
            t.fixes for t in cut if t.verdict.measured_saving_pct is None or t.verdict.measured_saving_pct > 0
        ]
        needed = self.clock() - self.start + more + self.reserve_s(faster) + self.proof_s
        mins = max(1, math.ceil(needed / 60))
        return (
            f"the time budget ({minutes(budget)}) ran out before {len(cut)} of the {len(tried)} "
            f"fixes finished their rounds (a fix is kept only when timed in all of them): about "
            f"{mins} min would let them finish (--budget {mins}m)"
        )
