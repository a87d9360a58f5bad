"""A configuration being tried by `gpudoctor fix` and the verdict read from its rounds: the pairs its
timing is judged on (blocks of one process, each pair in a random order, where its fixes can be switched
in a running process; else fresh processes side by side, A B, B A, …), each unit's mean step over a window
synchronized at its ends, the paired test, and the per-step distribution beside it. Pure: no processes,
no clock."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field, replace

from gpudoctor.fixes.candidates import Candidate
from gpudoctor.fixes.catalog import spec_of, title_of
from gpudoctor.fixes.kinds.base import round_work
from gpudoctor.fixes.loaders import LOADER_PACES, loader_wait_share
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.proof import spread_pct
from gpudoctor.fixes.result import CalibrationEntry, FixVerdict, StepDistribution
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.stalls import stall_of
from gpudoctor.fixes.verify import NumericsCheck, compare_pairs, decision
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.timing.blocks import block_pairs
from gpudoctor.timing.paired import ALPHA_EXTENDED, Pair, PairedComparison

FALLBACK_RANDOM_NOTE = (
    "timed with Inductor's fallback_random=True, so that dropout draws as in eager mode and the losses "
    "compare; plain torch.compile may be a little faster"
)


@dataclass
class Attempt:
    """A configuration being tried: its rounds so far (kept when a Ctrl-C ends it half-way). In blocks,
    `runs` holds the one process that timed A and B; else `base` and `runs` are processes paired in
    order, `b_first[k]` saying whether the candidate of pair k ran first."""

    fixes: tuple[str, ...]
    cand: Candidate | None
    base: list[RoundResult] = field(default_factory=list)
    runs: list[RoundResult] = field(default_factory=list)
    numerics: NumericsCheck | None = None
    failure: str | None = None
    on_top: tuple[str, ...] | None = None  # tried on top of this recommended configuration (its A side)
    b_first: list[bool] = field(default_factory=list)
    in_blocks: bool = False


@dataclass
class Tried:
    fixes: tuple[str, ...]
    baseline: list[RoundResult]
    candidate: list[RoundResult]
    verdict: FixVerdict
    failure: str | None = None


def going(at: Attempt) -> bool:
    return at.failure is None and (at.numerics is None or at.numerics.ok)


def per_sample(fixes: tuple[str, ...]) -> bool:
    return any(f.startswith("batch") for f in fixes)


def unit_pairs(at: Attempt) -> tuple[list[Pair], str]:
    """The pairs the verdict is judged on, and what one is."""
    if at.in_blocks:
        return ([p for r in at.runs for p in block_pairs(r.blocks)], "block pair")
    per = per_sample(at.fixes)
    pairs = []
    for a, b, b_first in zip(at.base, at.runs, at.b_first, strict=False):
        ma, mb = _per_sample_mean(a, per), _per_sample_mean(b, per)
        if ma and mb:
            pairs.append(Pair(ma, mb, b_first))
    return pairs, "process pair"


def _per_sample_mean(r: RoundResult, per: bool) -> float | None:
    mean = r.mean_step_us
    n = (r.observations.samples_per_step if r.observations and per else None) or 1
    return mean / n if mean else None


def step_distributions(at: Attempt) -> tuple[StepDistribution | None, StepDistribution | None]:
    """Each side's per-step times, beside the verdict's mean steps (a stall shows in its tail)."""
    if at.in_blocks:
        blocks = [b for r in at.runs for b in r.blocks]
        a = [t for b in blocks if not b.candidate for t in b.step_times_us]
        b_ = [t for b in blocks if b.candidate for t in b.step_times_us]
    else:
        a = [t for r in at.base for t in r.step_times_us]
        b_ = [t for r in at.runs for t in r.step_times_us]
    return StepDistribution.of(a), StepDistribution.of(b_)


def timing_of(at: Attempt, same_within: float) -> PairedComparison | None:
    """The paired test over the attempt's pairs; over blocks extended past their plan (their planned
    pairs leaned to a saving undecided), at ALPHA_EXTENDED (`timing.paired`)."""
    pairs, unit = unit_pairs(at)
    extended = sum(r.block_layout.extended for r in at.runs if r.block_layout) if at.in_blocks else 0
    if not extended:
        return compare_pairs(pairs, unit=unit, same_within=same_within)
    c = compare_pairs(pairs, unit=unit, same_within=same_within, alpha=ALPHA_EXTENDED)
    more = f"; {extended} pairs added to those planned (they leaned to a saving, undecided): α {ALPHA_EXTENDED:g}"
    return replace(c, test=c.test + more) if c is not None else None


# a change whose whole 95% interval after two process pairs lies beyond this (a saving or a loss) is
# settled there; under A/A, on the H100's recorded harness processes, a 2-pair interval beyond ±40% came
# in 0.16% of 5,000 resampled comparisons (hf_trainer_bert, processes 36–48 ms), 0% on the other three
# workloads (`tests/test_fix_session_plan.py`); loader fixes on starved loops save 70–90%
EARLY_EFFECT = 0.4


def beyond_early_effect(timing: PairedComparison) -> bool:
    """Faster or slower, its whole interval past ±EARLY_EFFECT: more pairs would not change it."""
    if timing.verdict == "faster":
        return timing.ci_high < 1 - EARLY_EFFECT
    if timing.verdict == "slower":
        return timing.ci_low > 1 + EARLY_EFFECT
    return False


def frees_the_training_thread(at: Attempt, timing: PairedComparison, same_within: float) -> str | None:
    """Why a worker count that was not faster beyond noise is kept all the same, or None: it took the
    loader's batches off the training thread — the share of its step spent on them fell by LOADER_PACES
    or more — and it is no slower. The loop was bound by the GPU as well (the batches were made while
    it ran); the GPU's fixes timed on top of it now show their gain, where against the script the loader
    would have hidden it. The whole configuration is checked against the script at the end."""
    fix = at.cand.fix if at.cand else ""
    if not fix.startswith("workers:") or timing.verdict == "slower" or timing.ratio > 1 + same_within:
        return None
    before, after = loader_wait_share(at.base), loader_wait_share(at.runs)
    if before is None or after is None or before - after < LOADER_PACES:
        return None
    return (
        f"it frees the training thread, which spent {100 * before:.0f}% of its step on the DataLoader's "
        f"batches and now {100 * after:.0f}% waiting for them (the GPU paces the loop: fixes on top show "
        "their gain)"
    )


def verdict_of(at: Attempt, same_within: float) -> FixVerdict:
    fixes, cand, runs = at.fixes, at.cand, at.runs
    timing = timing_of(at, same_within) if runs else None
    failure = at.failure
    if failure is None and runs and timing is None and (at.numerics is None or at.numerics.ok):
        failure = "fewer than two pairs were timed: no verdict"
    stalled = stall_of(*unit_pairs(at)) if timing is not None else None
    kept, reason = decision(timing, at.numerics, failure)
    if stalled is not None and failure is None:
        kept, reason = False, stalled  # no verdict on a stall's figure
    elif not kept and failure is None and timing is not None and (at.numerics is None or at.numerics.ok):
        freed = frees_the_training_thread(at, timing, same_within)
        if freed is not None:
            kept, reason = True, f"{reason}; kept: {freed}"
    compile_s = (
        statistics.mean(r.compile_s for r in runs) if runs and any(r.compile_s for r in runs) else None
    )
    payback = None
    if compile_s and timing and timing.baseline_us > timing.candidate_us:
        payback = compile_s * 1e6 / (timing.baseline_us - timing.candidate_us)
    changes = tuple(c for r in runs[-1:] for f in fixes if f in r.patches for c in r.patches[f].changes)
    if any(r.exact_random for r in runs):
        changes += (FALLBACK_RANDOM_NOTE,)
    recompiled = max((r.compile_timed_s for r in runs), default=0.0)
    if recompiled:
        changes += (
            f"recompiled during the timed steps ({recompiled:.1f} s, counted in them): raise --warmup",
        )
    redone = [b for r in runs for b in r.redone]
    if redone:
        n = len(redone)
        changes += (
            f"{n} block{'s' if n > 1 else ''} timed again: the process compiled inside "
            f"{'them' if n > 1 else 'it'} ({sum(b.disturbed_s for b in redone):.1f} s, a recompilation "
            "paid once — a new input shape, say — not the configuration's pace)",
        )
    restarted = [s for r in [*at.base, *runs] for s in r.restarted_s]
    if restarted:
        n = len(restarted)
        changes += (
            f"the light phase started again after a recompilation, {n} time{'s' if n > 1 else ''} "
            f"({sum(restarted):.1f} s compiling, paid once: not in the step times)",
        )
    lo, hi = timing.saving_ci if timing else (None, None)
    base_steps, cand_steps = step_distributions(at) if runs else (None, None)
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
        per_sample=per_sample(fixes),
        numerics=at.numerics,
        compile_s=compile_s,
        payback_steps=payback,
        kept=kept,
        reason=reason,
        changes=changes,
        rounds=len(runs),
        why_tried=cand.why
        if cand
        else ("on top of the recommendation" if at.on_top else "the kept fixes together"),
        unit=timing.unit if timing else None,
        pairs=timing.pairs if timing else 0,
        test=timing.test if timing else None,
        baseline_steps=base_steps,
        candidate_steps=cand_steps,
        on_top_of=at.on_top or (),
        stalled=stalled,
        evidence=evidence_of(at, tuple(f for f in fixes if f not in (at.on_top or ()))),
    )


def not_run(cand: Candidate, why: str) -> Tried:
    """A fix that does not apply: reported with the reason, never timed."""
    at = Attempt((cand.fix,), cand, failure=why)
    return Tried(at.fixes, [], [], verdict_of(at, 0.0), why)


def not_applied(r: RoundResult, fixes: tuple[str, ...]) -> str | None:
    missing = [f for f in fixes if f in r.patches and not r.patches[f].applied]
    if not missing:
        return None
    return "; ".join(f"does not apply: {r.patches[f].reason}" for f in missing)


def no_effect(r: RoundResult, fixes: tuple[str, ...]) -> str | None:
    """Why `fixes` did not take effect in round `r` (bfloat16 autocast that ran no matmul in bfloat16,
    torch.compile that compiled nothing), or None where they did or the round cannot tell."""
    obs = r.observations
    if obs is None:
        return None
    seen = round_work(obs)
    reasons = [f"{title_of(f)} {why}" for f in fixes if (why := spec_of(f).not_in_effect(seen)) is not None]
    return "; ".join(reasons) or None


def evidence_of(at: Attempt, moving: tuple[str, ...]) -> tuple[str, ...]:
    """What the attempt's last round shows of each moving fix's effect, with the script's own share
    beside it where the baseline's round measured another (bfloat16: 97% of the work, the script's 0%)."""
    if not at.runs or at.runs[-1].observations is None:
        return ()
    seen = round_work(at.runs[-1].observations)
    base = at.base[-1].observations if at.base else None
    before = round_work(base) if base is not None else None
    out = []
    for f in moving:
        fix = spec_of(f)
        words = fix.evidence(seen)
        if words is None:
            continue
        was = fix.evidence(before) if before is not None else None
        share, _, _ = (was or "").partition(" of ")
        if was is not None and was != words and share.endswith("%"):
            words += f" (the script's: {share})"
        out.append(f"{title_of(f)}: {words}")
    return tuple(out)


def random_differs(fixes: tuple[str, ...], obs: Observations | None) -> bool:
    """Compiled code draws other random numbers than eager: with dropout, or a sampling in a module's
    forward (a VAE encoder's `randn_like`), the losses differ unless Inductor is told to draw them as
    eager does (`fallback_random`), which every round of such a
    configuration then does — a little slower than plain compile, so its saving is understated. The
    step's functions compiled whole draw what the code between the modules draws too (a policy's
    samples, an environment's resets): always as eager does."""
    if any(f.split(":")[0] == "compile_fn" for f in fixes):
        return True
    return any(f.startswith("compile") for f in fixes) and bool(
        obs and any(r.draws_random for r in obs.step_roots)
    )


def saving(t: Tried) -> float:
    return t.verdict.measured_saving_pct or 0.0


def spread_ratio(harness: list[float], plain: list[float]) -> float | None:
    """How far apart `harness` processes are beside `plain` ones, fairly when their counts differ: the
    range of n values grows with n (for normal samples its expected width is 2.06 σ at 4, 2.85 σ at 8),
    so the larger set's spread is the mean over its subsets of the smaller set's size, each as
    `spread_pct`, over the smaller set's own."""
    if len(harness) < 2 or len(plain) < 2:
        return None
    n = min(len(harness), len(plain))

    def at_n(values: list[float]) -> float:
        if len(values) == n:
            return spread_pct(values) or 0.0
        subsets = list(itertools.combinations(values, n))
        if len(subsets) > MAX_SUBSETS:  # evenly spaced ones: the mean is what is wanted, not each
            subsets = subsets[:: len(subsets) // MAX_SUBSETS + 1]
        return statistics.fmean(spread_pct(list(c)) or 0.0 for c in subsets)

    base = at_n(plain)
    return at_n(harness) / base if base > 0 else None


MAX_SUBSETS = 2000


def minutes(seconds: float) -> str:
    """As --budget was likely given: 2 min, 95 s."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:.0f} s"


def looks_faster(at: Attempt) -> bool:
    """Not yet timed, or its mean step so far under the baseline's (it may be kept)."""
    if not at.runs or not at.base:
        return True
    per = per_sample(at.fixes)

    def mean(rounds: list[RoundResult]) -> float:
        n = [(r.observations.samples_per_step if r.observations and per else None) or 1 for r in rounds]
        return statistics.fmean((r.mean_step_us or 0.0) / k for r, k in zip(rounds, n, strict=True))

    return mean(at.runs) < mean(at.base)


def stackable(t: Tried, final: tuple[str, ...]) -> bool:
    """Measured alone without gain, nothing failed, the same results, of a group the recommended
    configuration has none of (a larger batch is left out: its times are per sample)."""
    v = t.verdict
    groups = {spec_of(f).group for f in final}
    return (
        not v.kept
        and t.failure is None
        and v.verdict in ("same", "ambiguous", "slower")
        and (v.numerics is None or v.numerics.ok)
        and not per_sample(t.fixes)
        and not {spec_of(f).group for f in t.fixes} & groups
    )


def script_share(v: FixVerdict, pct: float | None, script_us: float | None) -> float | None:
    """A saving of `v` (a % of its A side's step) as a % of the script's step (`script_us`, the
    baseline's mean), as the rules predict: for a fix timed on top of kept ones, times their step over
    the script's; None where either step is unknown."""
    if pct is None or not v.on_top_of:
        return pct
    return pct * v.baseline_us / script_us if script_us and v.baseline_us else None


def answered(chain: list[Tried], script_us: float | None) -> set[str]:
    """The findings the kept fixes answered: each rule of a kept fix that saved at least half what the
    fix was predicted to (as a share of the script's step)."""
    out: set[str] = set()
    for t in chain:
        v = t.verdict
        pct = script_share(v, v.measured_saving_pct, script_us)
        if pct is not None and v.predicted_saving_pct and pct >= ANSWERED * v.predicted_saving_pct:
            out.update(v.rules)
    return out


ANSWERED = 0.5  # a kept fix that saved this share of its prediction answered its findings


def calibration(
    tried: list[Tried], diagnosis: Diagnosis | None, script_us: float | None = None
) -> tuple[CalibrationEntry, ...]:
    """Each rule's own estimate against what each fix answering it measured (a fix answering several
    findings is predicted the largest of their savings; each finding is judged by its own). A fix
    timed on top of kept ones saved a share of their step: as a share of the script's step
    (`script_us`, the baseline's mean), as the rules predict, it is that times their step over it."""
    own = {f.id: f.est_saving_pct for f in diagnosis.findings} if diagnosis else {}
    return tuple(
        CalibrationEntry(
            rule,
            t.verdict.fix,
            own.get(rule, t.verdict.predicted_saving_pct or 0.0),
            script_share(t.verdict, t.verdict.measured_saving_pct, script_us),
            script_share(t.verdict, t.verdict.ci_low_pct, script_us),
            script_share(t.verdict, t.verdict.ci_high_pct, script_us),
            t.verdict.kept,
        )
        for t in tried
        if t.verdict.rounds and t.verdict.stalled is None  # a stall's figure calibrates nothing
        for rule in t.verdict.rules
    )
