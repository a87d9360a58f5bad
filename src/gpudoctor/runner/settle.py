"""Whether the light phase's steps have settled, and which to keep, so that the step time reported
unprofiled is the loop's steady state: the unsettled head is cut by MSER-5 (over batches of 5 steps, the
cut that minimizes the squared standard error of the rest's mean), and the rest has settled when every
quarter is within `TOLERANCE` of its mean. An unsettled phase times on, up to `EXTEND_FACTOR` times its
plan; ranks agree through their store on when to end it (`AGREE_CHUNK`, `AGREE_LAG`). Why: the warm-up
only waits out steps many times slower (docs/run.md, "Phases"). Pure Python: the CLI imports it early."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from gpudoctor.runner.record import Settling, StepTimes

TOLERANCE = 0.05  # every quarter of the kept steps within ±5% of their mean
BATCH = 5  # MSER-5's batches
EXTEND_FACTOR = 2.0  # waiting to settle, the light phase runs at most twice its planned length
CHECK_EVERY_S = 0.05  # how often a light phase past its plan looks at its steps
# Ranks extend their light phase alike: each posts whether its steps settled at the plan's end and then
# every AGREE_CHUNK of the plan; AGREE_LAG steps later all read every post and end or go on together
AGREE_LAG = 5
AGREE_CHUNK = 0.25


def unsettled_head(times_us: Sequence[float], batch: int = BATCH) -> int:
    """MSER-`batch`: the steps to leave out at the start (a multiple of `batch`, at most half)."""
    k = len(times_us) // batch
    if k < 4:
        return 0
    means = [math.fsum(times_us[i * batch : (i + 1) * batch]) / batch for i in range(k)]
    best_d, best = 0, math.inf
    total = squares = 0.0
    for d in range(k - 1, -1, -1):  # suffix sums: the batches from d on
        total += means[d]
        squares += means[d] * means[d]
        n = k - d
        if d <= k // 2:
            score = max(squares - total * total / n, 0.0) / (n * n)
            if score <= best:  # ties: the earlier cut, which keeps more steps
                best_d, best = d, score
    return best_d * batch


def quarter_means(times_us: Sequence[float]) -> tuple[float, ...]:
    """The means of four consecutive parts of `times_us`, as even as their count allows."""
    n = len(times_us)
    if n < 4:
        return ()
    cuts = [round(i * n / 4) for i in range(5)]
    return tuple(math.fsum(times_us[a:b]) / (b - a) for a, b in itertools.pairwise(cuts))


def settle(
    times_us: Sequence[float], *, tolerance: float = TOLERANCE, extended_s: float = 0.0
) -> tuple[tuple[float, ...], Settling]:
    """The steps to keep (the unsettled head left out) and how they settled."""
    head = unsettled_head(times_us)
    kept = tuple(times_us[head:])
    quarters = quarter_means(kept)
    mean = math.fsum(kept) / len(kept) if kept else 0.0
    steady = bool(quarters) and all(abs(q - mean) <= tolerance * mean for q in quarters)
    return kept, Settling(tuple(times_us[:head]), steady, quarters, tolerance, extended_s)


def light_done(
    times_us: Sequence[float], *, min_steps: int, min_seconds: float, tolerance: float = TOLERANCE
) -> bool:
    """A light phase past its plan may end: its kept steps have settled and are still at least
    `min_steps` steps and `min_seconds` long."""
    kept, how = settle(times_us, tolerance=tolerance)
    return how.settled and len(kept) >= min_steps and math.fsum(kept) >= 1e6 * min_seconds


def settled(light: StepTimes, start_of: Callable[[int], float | None], extended_s: float = 0.0) -> StepTimes:
    """The light phase's steps without their unsettled head, how they settled, and the host span from
    the first kept step (`start_of(i)`: perf_counter when timed step i began)."""
    kept, how = settle(light.times_us, extended_s=extended_s)
    span, start = light.host_span_s, start_of(len(how.dropped_us)) if how.dropped_us else None
    if span is not None and start is not None:
        span = (start, span[1])
    return StepTimes(light.clock, kept, span, how)


def notes(light: StepTimes, *, agreed: bool) -> list[str]:
    """What `gpudoctor run` says about a settled light phase: a head that was still settling and made a
    difference, and a phase that did not settle (`agreed`: its length was agreed among ranks with no
    store to extend it through)."""
    settling, kept_us = light.settling, light.times_us
    if settling is None:
        return []
    out = []
    kept_mean = math.fsum(kept_us) / len(kept_us) if kept_us else 0.0
    head = settling.dropped_us
    if head and kept_mean > 0:
        head_mean = math.fsum(head) / len(head)
        if abs(head_mean - kept_mean) > settling.tolerance * kept_mean:
            out.append(
                f"the light phase's first {len(head)} steps ({head_mean / 1e3:.1f} ms a step, against "
                f"{kept_mean / 1e3:.1f} ms after them) were still settling: left out of the unprofiled step"
            )
    if not settling.settled and settling.quarter_means_us:
        lo, hi = min(settling.quarter_means_us), max(settling.quarter_means_us)
        how = (
            "its length is agreed among the ranks, so it was not extended"
            if agreed
            else f"after {settling.extended_s:.1f} s more than planned"
        )
        out.append(
            f"the light phase did not settle ({how}): the quarters of its steps took {lo / 1e3:.1f}–"
            f"{hi / 1e3:.1f} ms a step, more than ±{100 * settling.tolerance:.0f}% apart; the unprofiled "
            f"step ({kept_mean / 1e3:.1f} ms) is their mean — time it again, or longer (--light-seconds; "
            "light_seconds= in gpudoctor.profile())"
        )
    return out
