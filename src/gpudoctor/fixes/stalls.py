"""Whether one stall dominates a fix's measurement: a unit (a process or a block) whose mean step is many
times the typical unit's — a process starved of the CPU, a block that met a stall of the machine or a
first use the fix brought (new input shapes meeting kernels not loaded yet) — so
that the saving read from the pairs is the stall's, not the fix's (under CPU contention, two stalled
processes of three once read as a "−5373%" saving). Such a measurement is flagged, with what stalled,
and is no figure to report or to keep a fix on. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from gpudoctor.timing.paired import Pair

STALL_FACTOR = 3.0  # a unit this many times the median unit's mean step has stalled
DOMINATES_PCT = 5.0  # ...and dominates when leaving its pairs out moves the saving by more than this


def geometric_saving_pct(pairs: Sequence[Pair]) -> float:
    """The saving the paired test reads: 1 − the geometric mean of B/A, in %."""
    logs = [math.log(p.b_us / p.a_us) for p in pairs]
    return 100 * (1 - math.exp(statistics.fmean(logs)))


def stall_of(pairs: Sequence[Pair], unit: str) -> str | None:
    """Why the pairs' saving is a stall's, in words; None when no stall dominates it."""
    good = [p for p in pairs if p.a_us > 0 and p.b_us > 0]
    if len(good) < 2:
        return None
    typical = statistics.median([v for p in good for v in (p.a_us, p.b_us)])
    limit = STALL_FACTOR * typical
    stalled = [p for p in good if p.a_us > limit or p.b_us > limit]
    if not stalled:
        return None
    rest = [p for p in good if p not in stalled]
    if len(rest) >= 2 and abs(geometric_saving_pct(good) - geometric_saving_pct(rest)) <= DOMINATES_PCT:
        return None  # the stall is there, and the figure stands without it
    sides = [("baseline", p.a_us) for p in stalled if p.a_us > limit]
    sides += [("candidate", p.b_us) for p in stalled if p.b_us > limit]
    worst = max(v for _, v in sides) / typical
    which = " and ".join(sorted({s for s, _ in sides}))
    one = unit.removesuffix(" pair")
    many = one + ("es" if one.endswith("s") else "s")
    if which == "candidate":  # the fix's side alone: the fix may have brought it
        cause = ("a stall on the fix's side alone — of the machine, or a first use the fix brought (kernels "
                 "for input shapes not seen before) — dominates this measurement (run it again on a quieter "
                 "machine, or with more --warmup steps)")  # fmt: skip
    else:
        cause = "a stall of the machine, not the fix, dominates this measurement (run it again on a quieter machine)"
    return (
        f"stalled: {len(sides)} {which} {one if len(sides) == 1 else many} of {2 * len(good)} ran up to "
        f"{worst:.0f}× the typical {one}'s mean step: {cause}"
    )
