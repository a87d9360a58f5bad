"""`gpudoctor fix`'s A/B: a baseline round that also observes the script, the candidate fixes chosen from
the findings and what it saw, then per fix baseline and candidate rounds in turn (A B A B …, each a fresh
process from a `Launcher`), the verdict from `verify`, the kept fixes combined and verified the same way,
and the permanent change. Within a time budget; a Ctrl-C ends it with the results so far. Progress and
the report so far go to callbacks after every round (the CLI draws bars and writes files)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpudoctor.fixes.candidates import Candidate, ManualFix, choose
from gpudoctor.fixes.catalog import TF32_TOLERANCE, spec_of, title_of
from gpudoctor.fixes.diff import unified_diff
from gpudoctor.fixes.frameworks import in_framework_terms
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.result import CalibrationEntry, FixReport, FixVerdict
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.verify import NumericsCheck, check_numerics, compare_rounds, decision, noise_floor
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.timing.compare import SAME_WITHIN

NOISY_SPREAD_PCT = 10.0  # the baseline's processes further apart than this: the report says so
FALLBACK_RANDOM_NOTE = (
    "timed with Inductor's fallback_random=True, so that dropout draws as in eager mode and the losses "
    "compare; plain torch.compile may be a little faster"
)


@dataclass(frozen=True)
class FixOptions:
    rounds: int = 3  # timed rounds per side and fix
    warmup: int = 5  # steps skipped in each round (compilation included)
    steps: int = 20  # steps timed in each round
    record: int = 5  # steps whose losses or outputs are compared
    seed: int = 0
    budget_s: float | None = None
    child_timeout_s: float = 600.0
    allow_batch: bool = False
    compile_mode: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    same_within: float = SAME_WITHIN
    fork: bool = True  # rounds forked from a server that imported the libraries (fixes.forkserver)
    # one baseline process per round for all the fixes (A B C D, A C D B, …) instead of one per fix
    shared_baseline: bool = False
    # fixes not faster alone tried on top of the recommended configuration (FixSession._stack)
    stack: bool = True


@dataclass(frozen=True)
class Progress:
    stage: str  # baseline, fix, combination, stack
    fix: str | None
    index: int  # of the fix, from 1
    count: int
    round: int  # from 1
    rounds: int
    side: str  # baseline, candidate
    together: bool = False  # every fix in each round, beside one baseline (FixOptions.shared_baseline)


RAN_OUT = "the time budget ran out"  # a fix's failure when the budget cut its rounds short (_ran_out)


class Launcher(Protocol):
    """Runs one round in a fresh process: the script with `fixes` applied (none: the baseline)."""

    def __call__(self, label: str, fixes: tuple[str, ...], exact_random: bool) -> RoundResult: ...


@dataclass
class _Attempt:
    """A configuration being tried: its rounds so far (kept when a Ctrl-C ends it half-way)."""

    fixes: tuple[str, ...]
    cand: Candidate | None
    base: list[RoundResult] = field(default_factory=list)
    runs: list[RoundResult] = field(default_factory=list)
    numerics: NumericsCheck | None = None
    failure: str | None = None
    on_top: tuple[str, ...] | None = None  # stacked on this recommended configuration (FixSession._stack)


@dataclass
class _Tried:
    fixes: tuple[str, ...]
    baseline: list[RoundResult]
    candidate: list[RoundResult]
    verdict: FixVerdict
    failure: str | None = None


class FixSession:
    def __init__(
        self,
        launcher: Launcher,
        options: FixOptions,
        diagnosis: Diagnosis | None,
        *,
        argv: tuple[str, ...],
        started_at: str,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[Progress], None] | None = None,
        on_update: Callable[[FixReport], None] | None = None,
    ) -> None:
        self.launch, self.options, self.diagnosis = launcher, options, diagnosis
        self.argv, self.started_at, self.clock = argv, started_at, clock
        self.on_progress, self.on_update = on_progress, on_update
        self.start = clock()
        self.reference: RoundResult | None = None
        self.baselines: list[RoundResult] = []
        self.candidates: list[Candidate] = []
        self.manual: list[ManualFix] = []
        self.tried: list[_Tried] = []
        self.combination: _Tried | None = None
        self.stacked: list[_Tried] = []  # fixes not faster alone, tried on top of the recommendation
        self.final: tuple[str, ...] = ()
        self.notes: list[str] = []
        self.complete = self.interrupted = False
        self._round_s: list[float] = []
        self._round_s_by: dict[tuple[str, ...], list[float]] = {}  # per configuration (): the baseline
        self._open: list[_Attempt] = []  # the configurations being tried now

    # -- the run ---------------------------------------------------------------------------------------
    def run(self) -> FixReport:
        try:
            self._run()
            self.complete = True
        except KeyboardInterrupt:
            self.interrupted = True
            self.notes.append("interrupted (Ctrl-C): the results so far")
            for at in self._open:
                at.failure = at.failure or f"interrupted (Ctrl-C) after {len(at.runs)} rounds"
                tried = self._tried(at)
                if at.on_top is not None:
                    self.stacked.append(tried)
                elif at.cand is None:
                    self.combination = tried
                else:
                    self.tried.append(tried)
            self._open = []
        report = self.report()
        self._update(report)
        return report

    def _run(self) -> None:
        self._progress("baseline", None, 0, 1, "baseline")
        ref = self._round("baseline-0", ())
        self.reference = ref
        if ref.failure is not None or ref.observations is None:
            self.notes.append(f"the baseline did not run: {ref.failure}")
            return
        self.baselines.append(ref)
        o = self.options
        self.candidates, self.manual = choose(
            self.diagnosis,
            ref.observations,
            allow_batch=o.allow_batch,
            compile_mode=o.compile_mode,
            only=o.only,
            skip=o.skip,
        )
        if o.shared_baseline and len(self.candidates) > 1:
            self._try_together()
        else:
            for i, cand in enumerate(self.candidates, 1):
                self.tried.append(self._try((cand.fix,), cand, i, len(self.candidates)))
                self._update(self.report())
        self._combine()
        self._stack()
        self._budget_note()

    def _try(
        self,
        fixes: tuple[str, ...],
        cand: Candidate | None,
        index: int,
        count: int,
        on_top: tuple[str, ...] | None = None,
    ) -> _Tried:
        """A B A B … for one configuration; stops early on a failure or results out of tolerance."""
        label = "+".join(fixes)
        stage = "fix" if cand is not None else "combination" if on_top is None else "stack"
        obs = self.reference.observations if self.reference else None
        at = _Attempt(fixes, cand, on_top=on_top)
        self._open = [at]
        exact = _random_differs(fixes, obs)
        # a fix tried alone keeps back the time to verify it with those kept before it, if it is kept
        together = [*(t.fixes for t in self.tried if t.verdict.kept), fixes] if cand is not None else []
        for k in range(1, self.options.rounds + 1):
            if not _going(at):
                break
            # its rounds left (a baseline and a candidate each), then the time kept back
            left, reserve = 2 * (self.options.rounds - k + 1), self._reserve_s(together)
            if not self._has_budget(left, reserve):
                at.failure = self._ran_out(k, reserved=self._has_budget(left))
                break
            self._progress(stage, label, index, count, "baseline", k)
            a = self._round(f"{index:02d}-{label}-a{k}", ())
            if a.failure:
                at.failure = f"the baseline failed: {a.failure}"
                break
            at.base.append(a)
            self.baselines.append(a)
            self._progress(stage, label, index, count, "candidate", k)
            b = self._round(f"{index:02d}-{label}-b{k}", fixes, exact_random=exact)
            at.failure = b.failure or _not_applied(b, fixes)
            if at.failure:
                break
            at.runs.append(b)
            at.numerics = at.numerics or self._numerics(fixes, b)
        self._open = []
        return self._tried(at)

    def _try_together(self) -> None:
        """Every fix in each round, beside one baseline process: A B C D, A C D B, A D B C, … (the order
        turns each round, so no fix always runs right after the baseline). Each fix is still timed in
        `rounds` processes against as many baseline processes interleaved with them, in fewer processes
        than A B A B per fix. A fix that fails or changes the results leaves the rounds after it."""
        obs = self.reference.observations if self.reference else None
        count, rounds = len(self.candidates), self.options.rounds
        attempts = [_Attempt((c.fix,), c) for c in self.candidates]
        self._open = list(attempts)
        base: list[RoundResult] = []
        for k in range(1, rounds + 1):
            live = [(i, at) for i, at in enumerate(attempts, 1) if _going(at)]
            # the first n (the most promising) whose rounds left fit, a baseline and n fixes each, with
            # the time kept back to verify those looking faster together
            left = rounds - k + 1
            fit = self._fitting([at for _, at in live], left)
            for _, at in live[fit:]:  # the last chosen (least promising) give way first
                at.failure = self._ran_out(k, reserved=self._has_budget((1 + len(live)) * left))
            live = live[:fit]
            if not live:
                break
            self._progress("fix", None, 0, count, "baseline", k, together=True)
            a = self._round(f"base-a{k}", ())
            if a.failure:
                for _, at in live:
                    at.failure = f"the baseline failed: {a.failure}"
                break
            base.append(a)
            self.baselines.append(a)
            turn = (k - 1) % len(live)
            for i, at in live[turn:] + live[:turn]:
                at.base = list(base)
                label = "+".join(at.fixes)
                self._progress("fix", label, i, count, "candidate", k, together=True)
                b = self._round(
                    f"{i:02d}-{label}-b{k}", at.fixes, exact_random=_random_differs(at.fixes, obs)
                )
                at.failure = b.failure or _not_applied(b, at.fixes)
                if at.failure:
                    continue
                at.runs.append(b)
                at.numerics = at.numerics or self._numerics(at.fixes, b)
            self._update(self.report(pending=[self._tried(at) for at in attempts]))
        self._open = []
        self.tried.extend(self._tried(at) for at in attempts)

    def _fitting(self, live: list[_Attempt], left: int) -> int:
        """How many of `live` (the most promising first) fit their `left` rounds, a baseline and each
        of them per round, with the time kept back to verify those looking faster together."""
        faster = [at.fixes for at in live if self._looks_faster(at)]
        for n in range(len(live), 0, -1):
            together = [f for f in faster if f in {at.fixes for at in live[:n]}]
            if self._has_budget((1 + n) * left, self._reserve_s(together)):
                return n
        return 0

    def _tried(self, at: _Attempt) -> _Tried:
        return _Tried(at.fixes, at.base, at.runs, self._verdict(at), at.failure)

    def _combine(self) -> None:
        kept = [t for t in self.tried if t.verdict.kept]
        best_per_group: dict[str, _Tried] = {}
        for t in kept:
            group = spec_of(t.fixes[0]).group
            if group not in best_per_group or _saving(t) > _saving(best_per_group[group]):
                best_per_group[group] = t
        members = sorted(best_per_group.values(), key=lambda t: -_saving(t))
        if not members:
            return
        best = members[0]
        self.final = best.fixes
        if len(members) < 2:
            return
        fixes = tuple(f for t in members for f in t.fixes)
        self.combination = self._try(fixes, None, len(self.candidates) + 1, len(self.candidates) + 1)
        combo = self.combination.verdict
        if not combo.kept:
            self.notes.append(
                f"the combination {'+'.join(fixes)} was not kept ({combo.reason}); "
                f"the best single fix is recommended"
            )
            return
        per_sample = _per_sample(fixes)
        against = compare_rounds(
            _times(best.candidate, per_sample),
            _times(self.combination.candidate, per_sample),
            same_within=self.options.same_within,
        )
        if against.verdict == "slower":
            self.notes.append(
                f"the combination is slower than {best.verdict.title} alone: it is recommended alone"
            )
            return
        self.final = fixes

    def _stack(self) -> None:
        """Each fix that was measured alone without gain (nothing failed, the same results) tried on
        top of the recommended configuration, most promising first: some pay only beside another —
        channels_last under bfloat16, autocast under CUDA graphs, pinned memory with workers. Kept when
        faster than its own baseline and than the recommendation alone, beyond noise (both across
        processes and in the saving each measured against its own baseline, which cancels drift)."""
        if not self.options.stack:
            return
        seen: set[str] = set()  # one per group: the most promising (workers:4, workers:8, … are one)
        left: list[str] = []  # those the budget leaves untried
        for t in list(self.tried):
            current = self._final_tried()
            group = spec_of(t.fixes[0]).group
            if current is None or group in seen or not _stackable(t, self.final):
                continue
            seen.add(group)
            fixes = (*self.final, *t.fixes)
            if left or not self._has_budget(2 * self.options.rounds):
                left.append(t.verdict.fix)
                continue
            index = len(self.candidates) + 2 + len(self.stacked)
            tried = self._try(fixes, None, index, index, on_top=self.final)
            kept, reason = self._better_than(current, tried)
            title = " + ".join(title_of(f) for f in t.fixes)
            on = current.verdict.title
            tried.verdict = replace(
                tried.verdict,
                kept=kept,
                reason=reason,
                why_tried=f"{title} on top of {on}: no gain alone, it may pay beside it",
            )
            self.stacked.append(tried)
            if kept:
                self.final = fixes
            self._update(self.report())
        if left:
            self.notes.append(
                f"not tried on top of {'+'.join(self.final)}, the time budget spent: {', '.join(left)}"
            )

    def _better_than(self, current: _Tried, stacked: _Tried) -> tuple[bool, str]:
        v, c = stacked.verdict, current.verdict
        if not v.kept:
            return False, v.reason
        if not (v.candidate_us and v.baseline_us and c.candidate_us and c.baseline_us):
            return False, "not timed against the recommendation"
        own = (v.candidate_us / v.baseline_us) / (c.candidate_us / c.baseline_us)
        across = compare_rounds(
            _times(current.candidate, False),
            _times(stacked.candidate, False),
            same_within=self.options.same_within,
        )
        if across.verdict == "faster" and own <= 1 - self.options.same_within:
            return True, f"faster than {c.title} alone beyond noise ({100 * (1 - own):.1f}% more saved)"
        return False, f"not faster than {c.title} alone beyond noise ({100 * (1 - own):+.1f}% more saved)"

    def _final_tried(self) -> _Tried | None:
        """The attempt that measured the recommended configuration."""
        attempts = [*self.stacked[::-1], *([self.combination] if self.combination else []), *self.tried]
        return next((t for t in attempts if t.fixes == self.final), None) if self.final else None

    # -- one round ---------------------------------------------------------------------------------------
    def _round(self, label: str, fixes: tuple[str, ...], exact_random: bool = False) -> RoundResult:
        t0 = self.clock()
        result = self.launch(label, fixes, exact_random)
        self._round_s.append(self.clock() - t0)
        self._round_s_by.setdefault(fixes, []).append(self._round_s[-1])
        return result

    def _has_budget(self, rounds: int, reserve_s: float = 0.0) -> bool:
        """Do `rounds` more rounds of the typical length fit, with `reserve_s` kept back after them?"""
        if self.options.budget_s is None:
            return True
        return self.clock() - self.start + rounds * self._typical_s() + reserve_s <= self.options.budget_s

    def _typical_s(self, fixes: tuple[str, ...] | None = None) -> float:
        """A round's length: the median of `fixes`' rounds so far, else of all rounds."""
        own = self._round_s_by.get(fixes) if fixes is not None else None
        every = own or self._round_s
        return statistics.median(every) if every else 0.0

    def _reserve_s(self, fixes: Sequence[tuple[str, ...]]) -> float:
        """The time to verify `fixes` together, where they span two groups or more (else nothing is
        combined): `rounds` baseline rounds and as many of the combination, each as long as its
        slowest member's rounds (a compiled configuration's are long)."""
        if self.options.budget_s is None or len({spec_of(f[0]).group for f in fixes}) < 2:
            return 0.0
        slowest = max(self._typical_s(f) for f in fixes)
        return self.options.rounds * (self._typical_s(()) + slowest)

    @staticmethod
    def _looks_faster(at: _Attempt) -> bool:
        """Not yet timed, or its median step so far under the baseline's (it may be kept)."""
        if not at.runs or not at.base:
            return True
        per_sample = _per_sample(at.fixes)

        def median(rounds: list[RoundResult]) -> float:
            return statistics.median(t for r in _times(rounds, per_sample) for t in r)

        return median(at.runs) < median(at.base)

    def _budget_note(self) -> None:
        """Where the budget cut fixes short of their rounds (so none of them could be kept), about how
        long a budget would have let them finish: their rounds left at the length measured so far (a
        compiled configuration's own), the baseline's beside them, and the time to verify the faster
        ones together."""
        budget, rounds = self.options.budget_s, self.options.rounds
        cut = [t for t in self.tried if t.failure and t.failure.startswith(RAN_OUT)]
        if budget is None or not cut:
            return
        left = [rounds - len(t.candidate) for t in cut]
        base_rounds = max(left) if self.options.shared_baseline else sum(left)
        more = sum(n * self._typical_s(t.fixes) for n, t in zip(left, cut, strict=True))
        more += base_rounds * self._typical_s(())
        # kept, or cut short while looking faster (or before it was timed): it may be kept
        faster = [t.fixes for t in self.tried if t.verdict.kept] + [
            t.fixes for t in cut if t.verdict.measured_saving_pct is None or t.verdict.measured_saving_pct > 0
        ]
        needed = self.clock() - self.start + more + self._reserve_s(faster)
        minutes = max(1, math.ceil(needed / 60))
        self.notes.append(
            f"the time budget ({_minutes(budget)}) ran out before {len(cut)} of the {len(self.tried)} "
            f"fixes finished their {rounds} rounds (a fix is kept only when timed in all of them): about "
            f"{minutes} min would let them finish (--budget {minutes}m)"
        )

    def _ran_out(self, k: int, reserved: bool) -> str:
        why = f"{RAN_OUT} after {k - 1} of {self.options.rounds} rounds"
        return why + (" (the rest is kept to verify the faster fixes together)" if reserved else "")

    def _numerics(self, fixes: tuple[str, ...], run: RoundResult) -> NumericsCheck:
        ref = self.reference
        assert ref is not None
        specs = [spec_of(f) for f in fixes]
        tolerance = None if any(s.tolerance is None for s in specs) else max(s.tolerance or 0 for s in specs)
        notes = [s.tolerance_note for s in specs]
        seen = ref.observations
        if tolerance is not None and tolerance < TF32_TOLERANCE and seen is not None and seen.tf32_baseline:
            # reordered TF32 products move the results by TF32's rounding, not float32's
            tolerance = TF32_TOLERANCE
            notes.append("the script's own convolutions or matmuls run in TF32")
        note = "; ".join(dict.fromkeys(notes))
        others = [list(b.outputs) for b in self.baselines[1:]]
        floor = noise_floor(list(ref.outputs), others)
        return check_numerics(
            ref.outputs_kind, list(ref.outputs), run.outputs_kind, list(run.outputs), tolerance, floor, note
        )

    def _verdict(self, at: _Attempt) -> FixVerdict:
        fixes, cand, runs, numerics = at.fixes, at.cand, at.runs, at.numerics
        per_sample = _per_sample(fixes)
        timing = None
        if at.base and runs:
            timing = compare_rounds(
                _times(at.base, per_sample), _times(runs, per_sample), same_within=self.options.same_within
            )
        kept, reason = decision(timing, numerics, at.failure)
        compile_s = (
            statistics.mean(r.compile_s for r in runs) if runs and any(r.compile_s for r in runs) else None
        )
        payback = None
        if compile_s and timing and timing.baseline_us > timing.candidate_us:
            payback = compile_s * 1e6 / (timing.baseline_us - timing.candidate_us)
        changes = tuple(c for r in runs[-1:] for f in fixes for c in r.patches[f].changes)
        if any(r.exact_random for r in runs):
            changes += (FALLBACK_RANDOM_NOTE,)
        recompiled = max((r.compile_timed_s for r in runs), default=0.0)
        if recompiled:
            changes += (
                f"recompiled during the timed steps ({recompiled:.1f} s, counted in them): raise --warmup",
            )
        lo, hi = timing.saving_ci if timing else (None, None)
        return FixVerdict(
            fix="+".join(fixes),
            title=" + ".join(title_of(f) for f in fixes),
            rules=cand.rules if cand else (),
            predicted_saving_pct=cand.predicted_saving_pct if cand else None,
            measured_saving_pct=100 * timing.saving if timing else None,
            ci_low_pct=100 * lo if lo is not None else None,
            ci_high_pct=100 * hi if hi is not None else None,
            p_value=timing.p_value if timing else None,
            verdict=timing.verdict if timing else None,
            baseline_us=timing.baseline_us if timing else None,
            candidate_us=timing.candidate_us if timing else None,
            per_sample=per_sample,
            numerics=numerics,
            compile_s=compile_s,
            payback_steps=payback,
            kept=kept,
            reason=reason,
            changes=changes,
            rounds=len(runs),
            why_tried=cand.why if cand else "the kept fixes together",
        )

    # -- reporting ---------------------------------------------------------------------------------------
    def _progress(
        self,
        stage: str,
        fix: str | None,
        index: int,
        count: int,
        side: str,
        k: int = 1,
        rounds: int | None = None,
        together: bool = False,
    ) -> None:
        if self.on_progress is not None:
            self.on_progress(
                Progress(stage, fix, index, count, k, rounds or self.options.rounds, side, together)
            )

    def _update(self, report: FixReport) -> None:
        if self.on_update is not None:
            self.on_update(report)

    def report(self, pending: Sequence[_Tried] = ()) -> FixReport:
        """The report so far; `pending`: configurations still being tried, as they stand."""
        tried = [*self.tried, *pending]
        ref = self.reference
        obs = ref.observations if ref else None
        final_tried = self._final_tried() or next((t for t in tried if t.fixes == self.final), None)
        edits, snippets = [], []
        for f in self.final:
            outcome = (
                final_tried.candidate[-1].patches.get(f) if final_tried and final_tried.candidate else None
            )
            if outcome is None:
                continue
            edits.extend(outcome.edits)
            if not outcome.edits and outcome.snippet:
                snippets.append(outcome.snippet)
        diff = unified_diff(in_framework_terms(list(dict.fromkeys(edits))))
        timed = [r for r in self.baselines if r.step_times_us]
        spread = _spread_pct([statistics.median(r.step_times_us) for r in timed])
        notes = list(self.notes)
        if spread is not None and spread > NOISY_SPREAD_PCT:
            notes.append(
                f"the baseline's own processes differ by up to {spread:.0f}% of the step: a smaller "
                "saving is hard to tell from that; more --rounds narrow it"
            )
        return FixReport(
            argv=self.argv,
            started_at=self.started_at,
            device=ref.device if ref else "unknown",
            torch=ref.torch if ref else None,
            options={k: list(v) if isinstance(v, tuple) else v for k, v in vars(self.options).items()},
            baseline_us=statistics.median([t for r in timed for t in r.step_times_us]) if timed else None,
            baseline_rounds=len(timed),
            observations=obs,
            verdicts=tuple(t.verdict for t in tried),
            combination=self.combination.verdict if self.combination else None,
            stacked=tuple(t.verdict for t in self.stacked),
            final=self.final,
            final_saving_pct=final_tried.verdict.measured_saving_pct if final_tried else None,
            diff=diff.diff,
            snippets=tuple(dict.fromkeys(snippets)),
            unplaced=tuple(f"{e.op} at {e.file}:{e.line}: {why}" for e, why in diff.unplaced),
            manual=tuple(self.manual),
            calibration=_calibration(tried, self.diagnosis),
            notes=tuple(notes),
            complete=self.complete,
            interrupted=self.interrupted,
            elapsed_s=self.clock() - self.start,
            baseline_spread_pct=spread,
        )


def _minutes(seconds: float) -> str:
    """As --budget was likely given: 2 min, 95 s."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:.0f} s"


def _spread_pct(medians: list[float]) -> float | None:
    """(largest − smallest) / median of the processes' median steps, in %; None under two processes."""
    if len(medians) < 2:
        return None
    return 100 * (max(medians) - min(medians)) / statistics.median(medians)


def _stackable(t: _Tried, final: tuple[str, ...]) -> bool:
    """Measured alone without gain, nothing failed, the same results, of a group the recommended
    configuration has none of (a larger batch is left out: its times are per sample)."""
    v = t.verdict
    groups = {spec_of(f).group for f in final}
    return (
        not v.kept
        and t.failure is None
        and v.verdict in ("same", "ambiguous", "slower")
        and (v.numerics is None or v.numerics.ok)
        and not _per_sample(t.fixes)
        and not {spec_of(f).group for f in t.fixes} & groups
    )


def _going(at: _Attempt) -> bool:
    return at.failure is None and (at.numerics is None or at.numerics.ok)


def _not_applied(r: RoundResult, fixes: tuple[str, ...]) -> str | None:
    missing = [f for f in fixes if f in r.patches and not r.patches[f].applied]
    if not missing:
        return None
    return "; ".join(f"not applicable: {r.patches[f].reason}" for f in missing)


def _random_differs(fixes: tuple[str, ...], obs: Observations | None) -> bool:
    """Compiled code draws other random numbers than eager: with dropout the losses differ unless
    Inductor is told to draw them as eager does (`fallback_random`), which every round of such a
    configuration then does — a little slower than plain compile, so its saving is understated."""
    return any(f.startswith("compile") for f in fixes) and bool(obs and obs.root and obs.root.dropout)


def _per_sample(fixes: tuple[str, ...]) -> bool:
    return any(f.startswith("batch") for f in fixes)


def _times(rounds: list[RoundResult], per_sample: bool) -> list[list[float]]:
    """Step times per round, or per-sample times where a fix changes the batch."""
    out = []
    for r in rounds:
        n = (r.observations.samples_per_step if r.observations and per_sample else None) or 1
        out.append([t / n for t in r.step_times_us])
    return out


def _saving(t: _Tried) -> float:
    return t.verdict.measured_saving_pct or 0.0


def _calibration(tried: list[_Tried], diagnosis: Diagnosis | None) -> tuple[CalibrationEntry, ...]:
    """Each rule's own estimate against what each fix answering it measured (a fix answering several
    findings is predicted the largest of their savings; each finding is judged by its own)."""
    own = {f.id: f.est_saving_pct for f in diagnosis.findings} if diagnosis else {}
    return tuple(
        CalibrationEntry(
            rule,
            t.verdict.fix,
            own.get(rule, t.verdict.predicted_saving_pct or 0.0),
            t.verdict.measured_saving_pct,
            t.verdict.ci_low_pct,
            t.verdict.ci_high_pct,
            t.verdict.kept,
        )
        for t in tried
        for rule in t.verdict.rules
    )
