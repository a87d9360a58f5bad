"""`gpudoctor fix --aa`: the noise floor of the harness, measured on the user's own script before any
verdict is trusted. The unchanged script against itself, through the same machinery as a fix:

- in processes: pairs of rounds as the session runs them (forked from the fork server where it is on),
  the script as written (A) against a patch that changes nothing (B, `noop`), A B, B A, …; between the
  pairs, the script in a fresh interpreter of its own (plain sequential processes): the harness's
  spread between processes beside the plain processes' spread;
- in blocks of one process: the no-op switched off and on, each pair of blocks in a random order, as a
  switchable fix is timed.

Each live comparison gets a verdict (any but "no significant difference" is a false one), and the
recorded processes and blocks are resampled into 200 A/A comparisons each of the session's own size (up
to 4 process pairs, any pairing of the recorded processes, A B B A …; `--blocks` block pairs, stretches
of adjacent blocks from any block, each pair's order a coin as the schedule draws it): the
false-positive rate of its test on this script and machine."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from gpudoctor.fixes.attempt import Attempt, spread_ratio, verdict_of
from gpudoctor.fixes.proof import spread_pct
from gpudoctor.fixes.result import FixVerdict
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions, Launcher
from gpudoctor.timing.paired import abba, false_positive_rate
from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.fix-aa/1"
COMPARISONS = 200
BLOCK_PAIRS_FACTOR = 3  # the A/A process records this many times the session's block pairs (resampled)


@dataclass(frozen=True)
class ProcessSpread:
    """Mean steps (µs) of processes of the unchanged script, in the order they ran; how far apart."""

    how: str
    means_us: tuple[float, ...]
    spread_pct: float | None  # (largest − smallest) / median
    cv_pct: float | None  # standard deviation / mean


@dataclass(frozen=True)
class FalsePositives:
    """A/A comparisons resampled from recorded units: the share called faster or slower."""

    unit: str  # process pair, block pair
    pairs: int  # of each comparison
    comparisons: int
    rate: float


@dataclass(frozen=True)
class AAReport(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor A/A report"

    argv: tuple[str, ...]
    started_at: str
    device: str
    torch: str | None
    harness: ProcessSpread | None  # the session's own rounds (forked, or fresh interpreters with --no-fork)
    plain: ProcessSpread | None  # the script in fresh interpreters, one after another
    spread_ratio: float | None  # harness spread over plain spread, at equal counts (`attempt.spread_ratio`)
    processes: FixVerdict | None  # the no-op patch in processes, A B, B A, …
    blocks: FixVerdict | None  # the no-op switched in blocks of one process
    false_positives: tuple[FalsePositives, ...]
    notes: tuple[str, ...]
    elapsed_s: float
    schema: str = SCHEMA


def spread_of(how: str, rounds: list[RoundResult]) -> ProcessSpread | None:
    means = [r.mean_step_us for r in rounds if r.failure is None and r.mean_step_us]
    if not means:
        return None
    cv = 100 * statistics.stdev(means) / statistics.fmean(means) if len(means) > 1 else None
    return ProcessSpread(how, tuple(means), spread_pct(means), cv)


def run_aa(
    harness: Launcher,
    plain: Launcher | None,
    options: FixOptions,
    *,
    argv: tuple[str, ...],
    started_at: str,
    how: str,
    clock: Callable[[], float],
    on_stage: Callable[[str], None] | None = None,
) -> AAReport:
    """`options.rounds` pairs of processes through `harness` (a plain process from `plain` after each
    pair), then one process of the no-op switched in blocks; the report of what they measured."""
    start = clock()
    say = on_stage or (lambda s: None)
    notes: list[str] = []
    at = Attempt(("noop",), None)
    fresh: list[RoundResult] = []
    order = abba(max(options.rounds, 2))
    for k, b in enumerate(order):
        say(f"A/A process {k + 1} of {len(order)}" + (" (the no-op patch)" if b else ""))
        r = harness(f"aa-{'b' if b else 'a'}{k // 2 + 1}", ("noop",) if b else (), False)
        if r.failure is not None:
            notes.append(f"round aa-{k + 1} failed: {r.failure}")
            break
        (at.runs if b else at.base).append(r)
        if k % 2 == 1:
            at.b_first.append(order[k - 1])
            if plain is not None:
                say(f"plain process {k // 2 + 1} (a fresh interpreter)")
                p = plain(f"aa-plain{k // 2 + 1}", (), False)
                if p.failure is None:
                    fresh.append(p)
                else:
                    notes.append(f"plain process {k // 2 + 1} failed: {p.failure}")
    rounds = [r for pair in zip(at.base, at.runs, strict=False) for r in pair]
    processes = verdict_of(at, options.same_within) if len(at.b_first) >= 2 else None
    blocks_verdict, block_means = None, []
    if options.blocks >= 2:
        say("A/A in blocks of one process (the no-op switched off and on)")
        # judged as the session judges a fix in blocks: more pairs where the planned ones lean to a saving
        extend = options.extend_blocks
        r = (
            harness("aa-blocks", ("noop",), False, ("noop",), extend)
            if extend
            else harness("aa-blocks", ("noop",), False, ("noop",))
        )
        if r.failure is None:
            blocks_verdict = verdict_of(
                Attempt(("noop",), None, runs=[r], in_blocks=True), options.same_within
            )
            block_means = [b.mean_us for b in r.blocks]
        else:
            notes.append(f"the A/A in blocks failed: {r.failure}")
    found = []
    means = [r.mean_step_us for r in rounds if r.mean_step_us]
    if len(means) >= 4:
        pairs = min(4, len(means) // 2)
        rate, n = false_positive_rate(
            means, pairs, unit="process pair", pairing=True, orders="abba", comparisons=COMPARISONS
        )
        found.append(FalsePositives("process pair", pairs, n, rate))
    if block_means and len(block_means) >= 2 * options.blocks:  # none with --blocks 0
        rate, n = false_positive_rate(block_means, options.blocks, comparisons=COMPARISONS)
        found.append(FalsePositives("block pair", options.blocks, n, rate))
    if (
        options.extend_blocks
        and block_means
        and len(block_means) >= 2 * (options.blocks + options.extend_blocks)
    ):
        # the two looks of an extending schedule, where the A/A's blocks hold them (it extended)
        rate, n = false_positive_rate(
            block_means, options.blocks, extend=options.extend_blocks, comparisons=COMPARISONS
        )
        found.append(FalsePositives("block pair", options.blocks + options.extend_blocks, n, rate))
    h, p = spread_of(how, rounds), spread_of("fresh interpreters, one after another", fresh)
    ratio = spread_ratio(list(h.means_us), list(p.means_us)) if h and p else None
    ref = rounds[0] if rounds else None
    return AAReport(
        argv=argv,
        started_at=started_at,
        device=ref.device if ref else "unknown",
        torch=ref.torch if ref else None,
        harness=h,
        plain=p,
        spread_ratio=ratio,
        processes=processes,
        blocks=blocks_verdict,
        false_positives=tuple(found),
        notes=tuple(notes),
        elapsed_s=clock() - start,
    )
