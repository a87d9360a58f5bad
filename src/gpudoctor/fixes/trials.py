"""How `gpudoctor fix` times one configuration against another: each round a process from the
`Launcher` (its time recorded in the budget), an A/B in blocks of one process where the fixes switch
(the process failing after a switch: in fresh processes instead), else fresh processes side by side —
A B, B A, … — or, with a shared baseline, every fresh-process fix beside one baseline per round. What
to try, and what joins what is kept, is the search's (`fixes.session`): it tells these the time each
configuration keeps back for its check against the script, the kept configuration's step, and how
results are compared."""

from __future__ import annotations

from collections.abc import Callable

from gpudoctor.fixes.attempt import (
    Attempt,
    Tried,
    beyond_early_effect,
    going,
    looks_faster,
    no_effect,
    not_applied,
    random_differs,
    timing_of,
    verdict_of,
)
from gpudoctor.fixes.budget import FINAL_MIN_PAIRS, RAN_OUT, RESERVED, Budget
from gpudoctor.fixes.candidates import Candidate, worker_count
from gpudoctor.fixes.catalog import can_switch
from gpudoctor.fixes.options import FixOptions, Launcher
from gpudoctor.fixes.patches.loader import PREFETCH
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.verify import NumericsCheck

LEFTOVER = "rounds left processes running after they ended"


class Trials:
    def __init__(
        self,
        launch: Launcher,
        options: FixOptions,
        budget: Budget,
        clock: Callable[[], float],
        *,
        progress: Callable[..., None],
        notes: list[str],
        keep_back: Callable[[tuple[str, ...], Candidate | None], list[tuple[str, ...]]],
        kept_step_s: Callable[[], float],
        numerics: Callable[[tuple[str, ...], RoundResult], NumericsCheck],
        on_pending: Callable[[list[Tried]], None],
    ) -> None:
        """`notes`: the session's, which these add to; `keep_back(fixes, cand)`: the configurations whose
        check against the script a candidate keeps time back for; `kept_step_s()`: the kept
        configuration's mean step (the script's where none is kept); `numerics(fixes, run)`: a round's
        results against the script's; `on_pending`: the attempts of a shared-baseline round as they stand."""
        self.launch, self.options, self.budget, self.clock = launch, options, budget, clock
        self.progress, self.notes = progress, notes
        self.keep_back, self.kept_step_s, self.numerics = keep_back, kept_step_s, numerics
        self.on_pending = on_pending
        self.reference: RoundResult | None = None  # the first baseline round, which observed the script
        self.baselines: list[RoundResult] = []  # every timed round of the script as written
        self.fell_back: set[tuple[str, ...]] = set()  # fixes whose A/B in one process could not run
        self.open: list[Attempt] = []  # the configurations being tried now

    def in_blocks(self, fixes: tuple[str, ...], replaced: tuple[str, ...] = ()) -> bool:
        return self.options.blocks >= 2 and can_switch(fixes, replaced)

    def try_(
        self,
        fixes: tuple[str, ...],
        cand: Candidate | None,
        index: int,
        count: int,
        on_top: tuple[str, ...] | None = None,
    ) -> Tried:
        """The A/B of one configuration: in blocks of one process where its fixes switch (those not
        in `on_top`, the configuration it is tried on top of, switched on; those of `on_top` it
        replaces, an alternative in a kept fix's place, switched off), else in fresh processes."""
        moving = tuple(f for f in fixes if f not in (on_top or ()))
        replaced = tuple(f for f in on_top or () if f not in fixes)  # compile:reduce-overhead for compile
        if self.in_blocks(moving, replaced):
            tried = self._blocks(fixes, moving, replaced, cand, index, count, on_top)
            if tried is not None:
                return tried
        return self.processes(fixes, cand, index, count, on_top)

    def _blocks(
        self,
        fixes: tuple[str, ...],
        moving: tuple[str, ...],
        replaced: tuple[str, ...],
        cand: Candidate | None,
        index: int,
        count: int,
        on_top: tuple[str, ...] | None,
    ) -> Tried | None:
        """One process: every fix on from the start (its first losses recorded so), then `moving`
        switched off and on in blocks (each pair in a random order), `replaced` on where they are off
        (the A side is `on_top`: each side's forward built from its own wrappers, both held at once).
        None when a fix could not be switched there (the caller then tries it in fresh processes)."""
        label = "+".join(moving)
        at = Attempt(fixes, cand, on_top=on_top, in_blocks=True)
        self.open = [at]
        stage = "fix" if on_top is None else "stack"
        round_s = self.budget.block_round_s() + self.lag_s(fixes, moving)
        if not self.budget.fits_s(round_s + self.budget.reserve_s(self.keep_back(fixes, cand))):
            at.failure = f"{RAN_OUT} before its A/B in one process" + (
                RESERVED if self.budget.fits_s(round_s) else ""
            )
            self.open = []
            return self.tried_of(at)
        self.progress(stage, label, index, count, "blocks", 1, rounds=1)
        obs = self.reference.observations if self.reference else None
        t0 = self.clock()
        exact = random_differs((*fixes, *replaced), obs)
        extend = self._extension(fixes, moving, round_s, cand)
        r = self.round(
            f"{index:02d}-{label}-blocks", fixes, exact, switch=(*moving, *replaced), extend=extend
        )
        if not self.lag_s(fixes, moving):  # the typical A/B in one process: a lagging one is longer
            self.budget.block_s.append(self.clock() - t0)
        self.open = []
        if r.switch_error is not None:
            self.notes.append(f"{label}: {r.switch_error}; its A/B ran in fresh processes")
            self.fell_back.add(fixes)
            return None
        missing = not_applied(r, moving)
        if missing is not None:
            at.failure = missing
            return self.tried_of(at)
        if r.outcome == "exception" and not r.switches and not r.oom:
            # the script raised with every fix on, before the first switch, as a fresh process runs them:
            # its rounds there would fail alike (CUDA graphs' outputs overwritten: 60 s more on a UNet).
            # A process that crashed or timed out wrote no count of its switches: fresh processes tell
            at.failure = f"{r.failure} (with every fix on, before any switch)"
            return self.tried_of(at)
        if r.failure is not None:
            # switching may be what broke it (CUDA graphs beside eager steps, say): fresh processes tell
            self.notes.append(
                f"{label}: its A/B in one process failed ({r.failure}); it ran in fresh processes"
            )
            self.fell_back.add(fixes)
            return None
        at.runs.append(r)
        at.failure = no_effect(r, moving)
        at.numerics = self.numerics(fixes, r)
        return self.tried_of(at)

    def lag_s(self, fixes: tuple[str, ...], moving: tuple[str, ...]) -> float:
        """The untimed steps an A/B in one process spends on its switch's lag, in seconds: pinned
        batches switched with the loader's batches in flight (its workers × prefetch_factor, and one)
        settled out before every block and the calibration — 129 steps of 106 ms with 32 workers."""
        if "pin_memory" not in moving or self.reference is None or self.reference.observations is None:
            return 0.0
        own = [lo.num_workers for lo in self.reference.observations.loaders]
        workers = max([worker_count(f) for f in fixes if f.startswith("workers:")] + own + [0])
        if not workers:
            return 0.0
        return (2 * self.options.blocks + 1) * (workers * PREFETCH + 1) * self.kept_step_s()

    def _extension(
        self, fixes: tuple[str, ...], moving: tuple[str, ...], round_s: float, cand: Candidate | None
    ) -> int:
        """Block pairs an A/B in one process may add where its planned pairs lean to a saving undecided
        (`timing.blocks`): `extend_blocks`, where the budget has room for them beside the round and the
        time kept back — each block at least `block_s` and two steps, a settling step, and its share of
        the switch's lag. Blocks are cheap beside the process start and the compilation they follow;
        where they are not (pinned batches behind 16 workers settle 65 steps before every block: 16
        pairs would add about 2 minutes to a 90 s round), fewer pairs are added, at most what the
        round itself costs, and none where that is under two."""
        more = self.options.extend_blocks
        if not more:
            return 0
        step_s = self.kept_step_s()
        o = self.options
        per_pair = 2 * (max(o.block_s, 2 * step_s) + step_s)
        per_pair += self.lag_s(fixes, moving) * 2 / (2 * o.blocks + 1)
        if per_pair > 0:
            more = min(more, int(round_s // per_pair))
        if more < 2:
            return 0
        reserve = self.budget.reserve_s(self.keep_back(fixes, cand))
        return more if self.budget.fits_s(round_s + more * per_pair + reserve) else 0

    def processes(
        self,
        fixes: tuple[str, ...],
        cand: Candidate | None,
        index: int,
        count: int,
        on_top: tuple[str, ...] | None = None,
        final_check: bool = False,
    ) -> Tried:
        """A B, B A, A B, … in fresh processes (the order turns each pair, so drift cancels over two);
        stops early on a failure or results out of tolerance. `final_check`: the kept configuration
        against the script — FINAL_MIN_PAIRS pairs, then more only while the verdict is not decisive
        and the budget has room for another pair."""
        label = "+".join(fixes)
        moving = tuple(f for f in fixes if f not in (on_top or ()))
        stage = "stack" if on_top is not None else "fix" if cand is not None else "combination"
        obs = self.reference.observations if self.reference else None
        at = Attempt(fixes, cand, on_top=on_top)
        self.open = [at]
        exact = random_differs(fixes, obs)
        base_fixes = on_top or ()
        least = min(FINAL_MIN_PAIRS, self.options.rounds) if final_check else self.options.rounds
        for k in range(1, self.options.rounds + 1):
            if not going(at):
                break
            timing = timing_of(at, self.options.same_within) if k > FINAL_MIN_PAIRS else None
            if k > least:  # the final check, past its least pairs: on while undecided and the time lasts
                if (timing is not None and timing.verdict != "ambiguous") or not self.budget.has(2):
                    break
            elif timing is not None and beyond_early_effect(timing):
                break  # two pairs settle a change this large: the rest would only narrow its interval
            else:
                # its rounds left (a baseline and a candidate each), then the time kept back
                left = 2 * (least - k + 1)
                reserve = self.budget.reserve_s(self.keep_back(fixes, cand))
                if not self.budget.has(left, reserve):
                    at.failure = self.budget.ran_out(k, reserved=self.budget.has(left))
                    break
            b_first = k % 2 == 0
            for side in ("candidate", "baseline") if b_first else ("baseline", "candidate"):
                self.progress(stage, label, index, count, side, k)
                if side == "baseline":
                    a = self.round(f"{index:02d}-{label}-a{k}", base_fixes, random_differs(base_fixes, obs))
                    if a.failure:
                        at.failure = f"the baseline failed: {a.failure}"
                        break
                    if not base_fixes:
                        self.baselines.append(a)
                    at.base.append(a)
                else:
                    b = self.round(f"{index:02d}-{label}-b{k}", fixes, exact_random=exact)
                    at.failure = b.failure or not_applied(b, fixes) or no_effect(b, moving)
                    if at.failure:
                        break
                    at.runs.append(b)
                    at.numerics = at.numerics or self.numerics(fixes, b)
            if at.failure is None:
                at.b_first.append(b_first)
        self.open = []  # a pair cut short (one side failed) is left out: pairs are zipped in order
        return self.tried_of(at)

    def together(self, members: list[tuple[int, Candidate]], count: int) -> list[Tried]:
        """Every fresh-process fix in each round, beside one baseline process: A B C D, then D C B A
        with the baseline last, … (each fix's pair with the baseline turns its order, so drift cancels).
        A fix that fails or changes the results leaves the rounds after it."""
        obs = self.reference.observations if self.reference else None
        rounds = self.options.rounds
        attempts = [(i, Attempt((c.fix,), c)) for i, c in members]
        self.open = [at for _, at in attempts]
        for k in range(1, rounds + 1):
            live = [(i, at) for i, at in attempts if going(at)]
            left = rounds - k + 1
            fit = self._fitting([at for _, at in live], left)
            for _, at in live[fit:]:  # the last chosen (least promising) give way first
                at.failure = self.budget.ran_out(k, reserved=self.budget.has((1 + len(live)) * left))
            live = live[:fit]
            if not live:
                break
            b_first = k % 2 == 0
            order = live[::-1] if b_first else live
            base: RoundResult | None = None
            if not b_first:
                base = self._shared_base(k, live, count)
            for i, at in order:
                if base is None and not b_first:
                    break
                label = "+".join(at.fixes)
                self.progress("fix", label, i, count, "candidate", k, together=True)
                b = self.round(f"{i:02d}-{label}-b{k}", at.fixes, exact_random=random_differs(at.fixes, obs))
                at.failure = b.failure or not_applied(b, at.fixes) or no_effect(b, at.fixes)
                if at.failure is None:
                    at.runs.append(b)
                    at.numerics = at.numerics or self.numerics(at.fixes, b)
            if b_first:
                base = self._shared_base(k, live, count)
            for _, at in live:
                if base is not None and at.failure is None and len(at.runs) > len(at.base):
                    at.base.append(base)
                    at.b_first.append(b_first)
            self.on_pending([self.tried_of(at) for _, at in attempts])
        self.open = []
        return [self.tried_of(at) for _, at in attempts]

    def _shared_base(self, k: int, live: list[tuple[int, Attempt]], count: int) -> RoundResult | None:
        self.progress("fix", None, 0, count, "baseline", k, together=True)
        a = self.round(f"base-a{k}", ())
        if a.failure:
            for _, at in live:
                at.failure = at.failure or f"the baseline failed: {a.failure}"
            return None
        self.baselines.append(a)
        return a

    def _fitting(self, live: list[Attempt], left: int) -> int:
        """How many of `live` (the most promising first) fit their `left` rounds, a baseline and each
        of them per round, with the time kept back to verify those looking faster together."""
        faster = [at.fixes for at in live if looks_faster(at)]
        for n in range(len(live), 0, -1):
            together = [f for f in faster if f in {at.fixes for at in live[:n]}]
            if self.budget.has((1 + n) * left, self.budget.reserve_s(together)):
                return n
        return 0

    def tried_of(self, at: Attempt) -> Tried:
        return Tried(at.fixes, at.base, at.runs, verdict_of(at, self.options.same_within), at.failure)

    def round(
        self,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool = False,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult:
        t0 = self.clock()
        if switch and extend:
            result = self.launch(label, fixes, exact_random, switch, extend)
        elif switch:
            result = self.launch(label, fixes, exact_random, switch)
        else:
            result = self.launch(label, fixes, exact_random)
        if not switch:
            self.budget.record(fixes, self.clock() - t0)
        if result.leftover_processes and not any(n.startswith(LEFTOVER) for n in self.notes):
            self.notes.append(
                f"{LEFTOVER} ({result.leftover_processes} after {label}: the script's DataLoader workers or "
                "others it started); they were killed, so as not to run beside the next round"
            )
        return result
