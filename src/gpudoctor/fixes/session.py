"""`gpudoctor fix`'s search over fixes: a baseline round that also observes the script, the candidate
fixes chosen from the findings and what it saw (a fix with nothing to change "does not apply" and is not
run), then per fix, in the order `fixes.order` keeps, an A/B where drift cancels (`fixes.trials`: in
blocks of one process where its fixes switch, else fresh processes side by side) and the verdict from
the paired test. Once a fix is kept, each fix after it is tried on top of what is kept so far (its A
side), as one removes bottlenecks one at a time: a loop starved by its loader shows no gain from
bfloat16 until the loader keeps up, and every later A/B runs at the faster step. The kept configuration
is checked against the script as written in fresh processes (two pairs at least, more while the budget
lasts and the verdict is not yet decisive), fixes without gain alone tried on top, then the proof: the
change applied to a copy and timed as the user runs it. Within a time budget; a Ctrl-C ends it with the
results so far.
Progress and the report so far go to callbacks after every round (the CLI draws bars and writes files)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpudoctor.fixes.applies import why_not, why_not_on_top
from gpudoctor.fixes.attempt import (
    Tried,
    answered,
    calibration,
    not_run,
    saving,
    stackable,
)
from gpudoctor.fixes.budget import RAN_OUT, Budget
from gpudoctor.fixes.candidates import Candidate, ManualFix, choose
from gpudoctor.fixes.catalog import in_users_idiom, spec_of, title_of
from gpudoctor.fixes.diff import unified_diff
from gpudoctor.fixes.guard import numerics_of, reorders
from gpudoctor.fixes.loaders import loader_wait_share
from gpudoctor.fixes.options import FixOptions, Launcher, Progress
from gpudoctor.fixes.order import FIRST_VERDICTS, after_kept, alternative_next, loader_first
from gpudoctor.fixes.proof import (
    LEVEL_PROCESSES,
    PlainProcess,
    Proof,
    ProofRequest,
    Prover,
    disagreement,
    harness_level,
    headline_of,
    script_means,
    spread_pct,
)
from gpudoctor.fixes.result import FixReport
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.trials import Trials
from gpudoctor.fixes.verify import NumericsCheck
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.util.signals import interruption

NOISY_SPREAD_PCT = 10.0  # the baseline's processes further apart than this: the report says so


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
        prover: Prover | None = None,
    ) -> None:
        """`prover`: the proof of the recommendation as the user runs it (`fixes.prove`); None: none."""
        self.options, self.diagnosis = options, diagnosis
        self.prover = prover if options.proof else None
        self.proof: Proof | None = None
        self.plain_script: tuple[PlainProcess, ...] = ()  # the script alone, where no proof timed it
        self.argv, self.started_at, self.clock = argv, started_at, clock
        self.on_progress, self.on_update = on_progress, on_update
        self.start = clock()
        self.candidates: list[Candidate] = []
        self.manual: list[ManualFix] = []
        self.tried: list[Tried] = []
        self.combination: Tried | None = None
        self.stacked: list[Tried] = []  # fixes not faster alone, tried on top of the recommendation
        self.final: tuple[str, ...] = ()
        self.chain: list[Tried] = []  # the kept A/Bs in order: the first against the script, each next on top
        self._yardsticks: dict[str, RoundResult] = {}  # the numerics' yardstick rounds, by their patch
        self.notes: list[str] = []
        self.complete = self.interrupted = False
        self.budget = Budget(options, clock, self.start)
        self.trials = Trials(
            launcher, options, self.budget, clock, progress=self._progress, notes=self.notes,
            keep_back=self._kept_with, kept_step_s=self._kept_step_s, numerics=self._numerics,
            on_pending=lambda pending: self._update(self.report(pending=pending)),
        )  # fmt: skip

    @property
    def reference(self) -> RoundResult | None:
        """The first baseline round, which observed the script."""
        return self.trials.reference

    @property
    def baselines(self) -> list[RoundResult]:
        """Every timed round of the script as written."""
        return self.trials.baselines

    # -- the run ---------------------------------------------------------------------------------------
    def run(self) -> FixReport:
        try:
            self._run()
            self.complete = True
        except KeyboardInterrupt as err:
            self.interrupted = True
            how = interruption(err)
            self.notes.append(f"interrupted ({how}): the results so far")
            for at in self.trials.open:
                at.failure = at.failure or f"interrupted ({how}) after {len(at.runs)} rounds"
                tried = self.trials.tried_of(at)
                if at.cand is not None:
                    self.tried.append(tried)
                elif at.on_top is not None:
                    self.stacked.append(tried)
                else:
                    self.combination = tried
            self.trials.open = []
        report = self.report()
        self._update(report)
        return report

    def _run(self) -> None:
        self._progress("baseline", None, 0, 1, "baseline")
        ref = self.trials.round("baseline-0", ())
        self.trials.reference = ref
        if ref.failure is not None or ref.observations is None:
            self.notes.append(baseline_failure(ref, self.options))
            return
        self.trials.baselines.append(ref)
        if self.prover is not None:  # the budget keeps the proof's time back from the fixes
            self.budget.proof_s = self.prover.reserve_s(self.budget.typical_s(()))
        o = self.options
        step_s = ref.mean_step_us / 1e6 if ref.mean_step_us else None
        self.candidates, self.manual = choose(
            self.diagnosis, ref.observations, allow_batch=o.allow_batch, compile_mode=o.compile_mode,
            only=o.only, skip=o.skip, steps=ref.steps_seen, step_s=step_s,
        )  # fmt: skip
        if not ref.observations.cuda and not o.only:
            applying = [
                c for c in self.candidates if why_not(c.fix, ref.observations, ref.steps_seen) is None
            ]
            self.notes.append(on_the_cpu(applying))
        together: list[tuple[int, Candidate]] = []
        share = loader_wait_share([ref]) if o.stack else None
        queue, note = loader_first(list(enumerate(self.candidates, 1)), share)
        self.notes += [note] if note else []
        while queue:
            i, cand = queue.pop(0)
            why = why_not(cand.fix, ref.observations, ref.steps_seen)
            if why is None and o.stack:
                why = why_not_on_top(cand.fix, self.final)
            if why is not None:
                self.tried.append(not_run(cand, why))
            elif o.shared_baseline and not self.trials.in_blocks((cand.fix,)):
                together.append((i, cand))  # in fresh processes, beside one baseline per round
                continue
            else:
                tried = self._try_candidate(cand, i, len(self.candidates))
                self.tried.append(tried)
                if tried.failure is not None and not tried.failure.startswith(RAN_OUT):
                    queue = alternative_next(queue, cand.fix)
                if tried.verdict.kept and o.stack:
                    done = answered(self.chain, ref.mean_step_us)
                    queue, notes = after_kept(queue, tried, self.final, done, self.notes)
                    self.notes[:] = notes  # the list the trials add to
            self._update(self.report())
        if len(together) > 1:
            self.tried += self.trials.together(together, len(self.candidates))
        else:
            self.tried += [self.trials.try_((c.fix,), c, i, len(self.candidates)) for i, c in together]
        self._combine()
        self._stack()
        self._budget_note()
        self._prove()

    def _prove(self) -> None:
        """The recommendation's diff applied to a copy and timed against the script as plain processes;
        where that timed no process of the script (nothing kept, a diff that does not apply), the script
        alone as a few plain processes, for the harness's level beside them."""
        self.budget.proof_s = 0.0
        if self.prover is None or self.reference is None:
            return
        report = self.report()
        request = ProofRequest(
            self.final,
            report.diff,
            report.snippets,
            self.reference.step,
            self.budget.left_s(),
            self.reference.mean_step_us,
        )
        if self.final:
            self.proof = self.prover(request)
        if self.proof is not None and any(p.side == "script" for p in self.proof.processes):
            return  # the script ran plainly already (where it failed, it would fail again)
        left, round_s = self.budget.left_s(), self.budget.typical_s(())
        count = (
            LEVEL_PROCESSES if left is None or round_s <= 0 else min(LEVEL_PROCESSES, int(left // round_s))
        )
        if count >= 1:
            self.plain_script = self.prover.script_alone(request, count)

    def _try_candidate(self, cand: Candidate, index: int, count: int) -> Tried:
        """A candidate alone against the script while nothing is kept; after that, on top of what is
        kept so far (an alternative of a kept fix's group in its place: workers:16 for workers:32), which
        it joins when faster than it beyond noise. With --no-stack, each against the script alone."""
        base = self.final if self.options.stack else ()
        if base:
            group = spec_of(cand.fix).group
            fixes = (*(f for f in base if spec_of(f).group != group), cand.fix)
            tried = self.trials.try_(fixes, cand, index, count, on_top=base)
            v = tried.verdict
            on = " + ".join(title_of(f) for f in base)
            if v.kept and v.measured_saving_pct is not None:
                reason = f"faster than {on} beyond noise ({v.measured_saving_pct:.1f}% more saved)"
            elif tried.failure is not None and tried.failure.startswith(RAN_OUT):
                reason = v.reason
            else:
                reason = f"{against(base, fixes)}: {v.reason}"
            # its row names the candidate; the reason, what it was timed against
            tried.verdict = replace(v, reason=reason, title=title_of(cand.fix))
        else:
            tried = self.trials.try_((cand.fix,), cand, index, count)
        if tried.verdict.kept and self.options.stack:
            self.final = tried.fixes
            self.chain.append(tried)
        return tried

    def _kept_step_s(self) -> float:
        """The mean step of the configuration kept so far (the script's where none is), in seconds."""
        if self.reference is None:
            return 0.0
        kept = self.chain[-1].candidate if self.chain else [self.reference]
        steps = [r.mean_step_us for r in kept if r.mean_step_us]
        return (statistics.median(steps) if steps else 0.0) / 1e6

    def _kept_with(self, fixes: tuple[str, ...], cand: Candidate | None) -> list[tuple[str, ...]]:
        """A candidate keeps back the time to check it, with those kept before it, against the script —
        from the fifth on: the most promising get their verdicts first (each kept one was faster than
        what it joined; a check the budget then leaves out is said in a note)."""
        if cand is None or len(self.tried) < FIRST_VERDICTS:
            return []
        return [*(t.fixes for t in self.chain), fixes]

    def _combine(self) -> None:
        """The recommendation: the configuration kept fix by fix (each faster on top of those before
        it), with the best kept fix of each other group among those tried against the script beside a
        shared baseline; where it holds two fixes or more, checked against the script in fresh
        processes. Not faster there (slower, the same, failed, or changed results), or saving less
        than the first kept fix alone beyond noise, and the first alone is recommended; not decisive
        within the budget, the fixes kept one on top of another stay (each was faster than what it
        joined), those only tried alone do not."""
        groups = {spec_of(f).group for f in self.final}
        extra: dict[str, Tried] = {}
        for t in self.tried:
            if not t.verdict.kept or t.verdict.on_top_of or any(t is c for c in self.chain):
                continue
            group = spec_of(t.fixes[0]).group
            if group not in groups and (group not in extra or saving(t) > saving(extra[group])):
                extra[group] = t
        members = sorted(extra.values(), key=lambda t: -saving(t))
        if not self.chain and members:
            first = members.pop(0)
            self.final, self.chain = first.fixes, [first]
        if members:
            self.final = (*self.final, *(f for t in members for f in t.fixes))
        if len(self.final) < 2:
            return
        fixes, first = self.final, self.chain[0]
        n = len(self.candidates) + 1
        self.combination = self.trials.processes(fixes, None, n, n, final_check=True)
        combo = self.combination.verdict
        alone = f"{first.verdict.title} alone is recommended"
        if combo.ci_high_pct is not None and combo.ci_high_pct < saving(first):
            self.notes.append(f"the combination is slower than {first.verdict.title} alone: {alone}")
            self.final, self.chain = first.fixes, [first]
            return
        if combo.kept:
            return
        cut = self.combination.failure is not None and self.combination.failure.startswith(RAN_OUT)
        undecided = cut or (combo.verdict == "ambiguous" and self.combination.failure is None)
        if undecided and not members and (combo.numerics is None or combo.numerics.ok):
            self.notes.append(
                f"the check of {'+'.join(fixes)} against the script in fresh processes was not decisive "
                f"({combo.reason}); each of them was kept on top of the fixes kept before it, so "
                "together they are recommended"
            )
            return
        self.notes.append(f"the combination {'+'.join(fixes)} was not kept ({combo.reason}); {alone}")
        self.final, self.chain = first.fixes, [first]

    def _stack(self) -> None:
        """Each fix that was measured alone without gain (nothing failed, the same results) tried on
        top of the recommended configuration, most promising first: some pay only beside another —
        channels_last under bfloat16, autocast under CUDA graphs, pinned memory with workers. Its A
        side is the recommendation itself (in blocks of one process where it switches), so it joins
        the recommendation when faster than it beyond noise."""
        if not self.options.stack:
            return
        seen: set[str] = set()  # one per group: the most promising (workers:4, workers:8, … are one)
        left: list[str] = []  # those the budget leaves untried
        for t in list(self.tried):
            current = self._final_tried()
            group = spec_of(t.fixes[0]).group
            if current is None or group in seen or t.verdict.on_top_of or not stackable(t, self.final):
                continue
            seen.add(group)
            fixes = (*self.final, *t.fixes)
            blocks = self.trials.in_blocks(t.fixes)
            fits = (
                self.budget.fits_s(self.budget.block_round_s())
                if blocks
                else self.budget.has(2 * self.options.rounds)
            )
            if left or not fits:
                left.append(t.verdict.fix)
                continue
            index = len(self.candidates) + 2 + len(self.stacked)
            tried = self.trials.try_(fixes, None, index, index, on_top=self.final)
            title = " + ".join(title_of(f) for f in t.fixes)
            on = " + ".join(title_of(f) for f in self.final)
            v = tried.verdict
            reason = (
                f"faster than {on} alone beyond noise ({v.measured_saving_pct:.1f}% more saved)"
                if v.kept and v.measured_saving_pct is not None
                else f"not faster than {on} alone beyond noise: {v.reason}"
            )
            tried.verdict = replace(
                v, reason=reason, why_tried=f"{title} on top of {on}: no gain alone, it may pay beside it"
            )
            self.stacked.append(tried)
            if v.kept:
                self.final = fixes
                self.chain.append(tried)
            self._update(self.report())
        if left:
            self.notes.append(
                f"not tried on top of {'+'.join(self.final)}, the time budget spent: {', '.join(left)}"
            )

    def _final_tried(self) -> Tried | None:
        """The attempt that measured the recommended configuration."""
        attempts = [*self.stacked[::-1], *([self.combination] if self.combination else []), *self.tried]
        return next((t for t in attempts if t.fixes == self.final), None) if self.final else None

    def _final_saving(self) -> float | None:
        """The recommendation's saving against the script as written: what its check against the
        script measured where that kept it, each fix kept on top after it its share of what was left;
        else the chain's, each kept A/B its share of what the one before left."""
        if not self.final:
            return None
        combo = self.combination
        if (
            combo is not None
            and combo.verdict.kept
            and combo.verdict.measured_saving_pct is not None
            and set(combo.fixes) <= set(self.final)
        ):
            left = 1 - combo.verdict.measured_saving_pct / 100
            for t in self.stacked:
                if t.verdict.kept and t.verdict.measured_saving_pct is not None:
                    left *= 1 - t.verdict.measured_saving_pct / 100
            return 100 * (1 - left)
        left = 1.0
        for t in self.chain:
            if t.verdict.measured_saving_pct is None:
                return None
            left *= 1 - t.verdict.measured_saving_pct / 100
        return 100 * (1 - left) if self.chain else None

    # -- one round ---------------------------------------------------------------------------------------
    def _budget_note(self) -> None:
        # a fix whose A/B in one process failed needs its rounds in fresh processes
        note = self.budget.note(
            self.tried, lambda fixes: self.trials.in_blocks(fixes) and fixes not in self.trials.fell_back
        )
        if note:
            self.notes.append(note)

    def _numerics(self, fixes: tuple[str, ...], run: RoundResult) -> NumericsCheck:
        assert self.reference is not None
        reseeded = self._reseeded(fixes)
        check = numerics_of(fixes, run, self.reference, self.baselines, self.tried, reseeded)
        if check.ok or check.tolerance is None or not reorders(fixes):
            return check
        # past its tolerance: how far does rounding alone move this loop's losses (once, then kept)?
        nudged = self._yardstick("nudge", "nudged")
        return numerics_of(fixes, run, self.reference, self.baselines, self.tried, reseeded, nudged)

    def _reseeded(self, fixes: tuple[str, ...]) -> RoundResult | None:
        """Where a fix draws other dropout masks than the baseline (bf16 autocast) and the step's modules
        draw random numbers, or compiles modules whose forward samples (a VAE encoder's): a round of the unchanged script whose step draws anew (once, then kept), the
        yardstick for how far other draws move the losses; else None."""
        seen = self.reference.observations if self.reference is not None else None
        if seen is None or any(spec_of(f).speed_only for f in fixes):
            return None  # (beside a loader fix the losses are held against that fix's own round)
        roots = seen.step_roots
        masks = any(r.draws_random for r in roots) and any(spec_of(f).draws_differ for f in fixes)
        # compiled code draws as eager does where Inductor falls back to eager's random ops, which does
        # not hold for every sampling (`RootInfo.samples`)
        sampled = any(r.samples for r in roots) and any(spec_of(f).compiled for f in fixes)
        return self._yardstick("reseed", "reseeded") if masks or sampled else None

    def _yardstick(self, patch: str, label: str) -> RoundResult:
        """A round of the unchanged script under `patch` (reseed, nudge), named `label`: run once, then
        kept."""
        if patch not in self._yardsticks:
            self._yardsticks[patch] = self.trials.round(label, (patch,))
        return self._yardsticks[patch]

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

    def report(self, pending: Sequence[Tried] = ()) -> FixReport:
        """The report so far; `pending`: configurations still being tried, as they stand."""
        tried = [*self.tried, *pending]
        ref = self.reference
        obs = ref.observations if ref else None
        final_tried = self._final_tried() or next((t for t in tried if t.fixes == self.final), None)
        edits, snippets = [], []
        script = self.argv[0] if self.argv and self.argv[0].endswith(".py") else None
        for f in self.final:
            source = next((t for t in [final_tried, *self.stacked, *tried] if t and t.candidate
                           and f in t.candidate[-1].patches), None)  # fmt: skip
            outcome = source.candidate[-1].patches.get(f) if source else None
            if outcome is None:
                continue
            own = in_users_idiom(f, outcome.edits, script)
            edits.extend(own)
            if not own and outcome.snippet:
                snippets.append(outcome.snippet)
        diff = unified_diff(list(dict.fromkeys(edits)))
        timed = [r for r in self.baselines if r.step_times_us]
        spread = spread_pct([r.mean_step_us for r in timed if r.mean_step_us])
        notes = list(self.notes)
        if spread is not None and spread > NOISY_SPREAD_PCT:
            notes.append(
                f"the baseline's own processes differ by up to {spread:.0f}% of the step: fixes that "
                "cannot be switched in a running process are judged on process pairs, and a smaller "
                "saving is hard to tell from that; more --rounds narrow it"
            )
        means = [r.mean_step_us for r in timed if r.mean_step_us]
        baseline_us = statistics.fmean(means) if means else None
        final_saving = self._final_saving()
        plain = script_means(self.proof) or [p.mean_step_us for p in self.plain_script if p.mean_step_us]
        proven = self.proof is not None and self.proof.speedup is not None
        level = harness_level(baseline_us, plain, harness_processes=means, proven=proven)
        notes += [n for n in (level.warning if level else None, self._disagreement(final_saving)) if n]
        return FixReport(
            argv=self.argv,
            started_at=self.started_at,
            device=ref.device if ref else "unknown",
            torch=ref.torch if ref else None,
            options={k: list(v) if isinstance(v, tuple) else v for k, v in vars(self.options).items()},
            baseline_us=baseline_us,
            baseline_rounds=len(timed),
            observations=obs,
            verdicts=tuple(t.verdict for t in tried),
            combination=self.combination.verdict if self.combination else None,
            stacked=tuple(t.verdict for t in self.stacked),
            final=self.final,
            final_saving_pct=final_saving,
            diff=diff.diff,
            snippets=tuple(dict.fromkeys(snippets)),
            unplaced=tuple(f"{e.op} at {e.file}:{e.line}: {why}" for e, why in diff.unplaced),
            manual=tuple(self.manual),
            calibration=calibration(tried, self.diagnosis, statistics.fmean(means) if means else None),
            notes=tuple(notes),
            complete=self.complete,
            interrupted=self.interrupted,
            elapsed_s=self.clock() - self.start,
            baseline_spread_pct=spread,
            proof=self.proof,
            headline=headline_of(self.proof, self.final, final_saving),
            harness_level=level,
            plain_script=self.plain_script,
        )

    def _disagreement(self, saving: float | None) -> str | None:
        """The harness's saving against the proof's, with the harness's interval where one A/B against
        the script measured the whole recommendation."""
        t = self._final_tried()
        whole = t is not None and not t.verdict.on_top_of and t.verdict.measured_saving_pct == saving
        lo, hi = (t.verdict.ci_low_pct, t.verdict.ci_high_pct) if whole and t is not None else (None, None)
        return disagreement(self.proof, saving, lo, hi)


def against(base: tuple[str, ...], fixes: tuple[str, ...]) -> str:
    """What a configuration was timed against, said as it was: "on top of A + B", or where it takes a
    kept fix's place (plain compile for compile:reduce-overhead) "in place of C, on top of A"."""
    out = [f for f in base if f not in fixes]
    kept = " + ".join(title_of(f) for f in base if f in fixes)
    if not out:
        return f"on top of {kept}"
    instead = f"in place of {' + '.join(title_of(f) for f in out)}"
    return f"{instead}, on top of {kept}" if kept else instead


GPU_FIXES = ("tf32", "autocast", "compile", "channels_last", "cudnn_benchmark", "pin_memory")


def on_the_cpu(candidates: Sequence[Candidate]) -> str:
    """What a script that never used CUDA is not offered: the fixes for a GPU's step."""
    tried = {c.fix.split(":")[0] for c in candidates}
    left = [title_of(f) for f in GPU_FIXES if f not in tried]
    kinds = ("DataLoader workers" if c.fix.startswith("workers:") else title_of(c.fix) for c in candidates)
    offered = ", ".join(dict.fromkeys(kinds)) or "none"
    return (
        f"the script ran on the CPU (it never used CUDA): the fixes for a GPU's step ({', '.join(left)}) "
        f"are not tried; those for the CPU's side of the loop are: {offered}"
    )


def baseline_failure(ref: RoundResult, o: FixOptions) -> str:
    """Why the script as written gave no baseline, in one line: a script that ended by itself before its
    warm-up was over is too short to time, and says how long each process needs."""
    if (
        ref.outcome in ("completed", "exit")
        and not ref.exit_code
        and ref.error is None
        and not ref.step_times_us
    ):
        return (
            f"the baseline did not run long enough to be timed: the script ended by itself after "
            f"{ref.steps_seen} steps in {ref.wall_s:.1f} s, before a step was timed (each process warms up "
            f"{o.warmup} steps and {o.warmup_s:g} s, then times {o.steps} steps and {o.steps_s:g} s; fixes "
            f"switched in one process time {o.blocks} pairs of {o.block_s:g} s blocks after that): give it "
            f"more steps or epochs"
        )
    return f"the baseline did not run: {ref.failure}"
